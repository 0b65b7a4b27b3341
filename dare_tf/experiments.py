"""Grids of training runs, reported as tables shaped like the paper's Table 1."""

from __future__ import annotations

import csv
import os

from dare_tf.data.spec import DatasetSpec
from dare_tf.training import train


def reproduce(data_dirs, models, dims, output_dir, config_for, strategy, metric="auc", overwrite=False):
    """Trains every (dataset, dim, model) cell with `config_for(model, dim)`; writes
    table1.md and table1.csv of the test `metric` (mean (std) over seeds).
    Finished cells are reused and interrupted ones resumed; a cell holding a run of
    another configuration or dataset is refused unless `overwrite`."""
    columns, cells = [], {}
    for data_dir in data_dirs:
        DatasetSpec.load(data_dir)  # fail early on a directory that is not a prepared dataset
        name = os.path.basename(os.path.normpath(data_dir))
        for dim in dims:
            column = f"{name} d={dim}"
            columns.append(column)
            for model in models:
                out = os.path.join(output_dir, name, f"d{dim}", model)
                results = train(data_dir, out, config_for(model, dim), strategy, overwrite=overwrite)
                cells[(model, column)] = (results["test"][metric], results["test_std"][metric])
    write_tables(output_dir, models, columns, cells, metric)
    return columns, cells


def write_tables(output_dir, models, columns, cells, metric):
    os.makedirs(output_dir, exist_ok=True)
    lines = [f"| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for model in models:
        lines.append(f"| {model} | " + " | ".join(
            f"{cells[(model, c)][0]:.5f} ({cells[(model, c)][1]:.5f})" for c in columns) + " |")
    table = "\n".join(lines)
    with open(os.path.join(output_dir, "table1.md"), "w") as f:
        f.write(f"Test {metric}, mean (std) over seeds\n\n{table}\n")
    with open(os.path.join(output_dir, "table1.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model"] + [f"{c} mean" for c in columns] + [f"{c} std" for c in columns])
        for model in models:
            w.writerow([model] + [cells[(model, c)][0] for c in columns] + [cells[(model, c)][1] for c in columns])
    print(table)
