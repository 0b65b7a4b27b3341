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
                cells[(model, column)] = (results["test"][metric], results["test_std"][metric],
                                          len(results["seeds"]))
    write_tables(output_dir, models, columns, cells, metric)
    return columns, cells


def _cell(mean: float, std: float, seeds: int) -> str:
    return f"{mean:.5f} ({std:.5f})" if seeds > 1 else f"{mean:.5f} (n/a)"


def write_tables(output_dir, models, columns, cells, metric):
    """table1.md (printed too) and table1.csv: per model and column the test `metric`,
    mean and std over the cell's seeds; a single seed's std is "n/a" (blank in the CSV)."""
    os.makedirs(output_dir, exist_ok=True)
    lines = ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for model in models:
        lines.append(f"| {model} | " + " | ".join(_cell(*cells[(model, c)]) for c in columns) + " |")
    counts = sorted({cells[key][2] for key in cells})
    seeds = " or ".join(str(n) for n in counts)
    title = f"Test {metric.upper() if metric in ('auc', 'gauc') else metric}, mean (std) over {seeds} seed(s) per cell"
    table = "\n".join(lines)
    with open(os.path.join(output_dir, "table1.md"), "w") as f:
        f.write(f"{title}\n\n{table}\n")
    with open(os.path.join(output_dir, "table1.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model"] + [f"{c} mean" for c in columns] + [f"{c} std" for c in columns])
        for model in models:
            w.writerow([model] + [cells[(model, c)][0] for c in columns]
                       + [cells[(model, c)][1] if cells[(model, c)][2] > 1 else "" for c in columns])
    print(f"{title}\n{table}")
