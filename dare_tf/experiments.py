"""Grids of training runs, reported as tables shaped like the paper's Table 1."""

from __future__ import annotations

import csv
import math
import os

from dare_tf.model.presets import PRESET_NOTES
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.training import train

LOWER_IS_BETTER = {"logloss"}


def reproduce(data_dirs, models, dims, output_dir, config_for, metric="auc", overwrite=False,
              report=print):
    """Trains every (dataset, dim, model) cell with `config_for(model, dim, data_dir)`; writes
    table1.md and table1.csv of the test `metric` (mean, std and number of seeds;
    the best of each column and the cells tied with it marked) and prints the
    table with every run's undertraining warnings beneath it.
    Finished cells are reused and interrupted ones resumed; a cell holding a run of
    another configuration or dataset is refused unless `overwrite`.

    Returns the columns and the cells: (model, column) -> (mean, std, seeds)."""
    columns, cells, warnings = [], {}, []
    said: set[str] = set()

    def once(line: str) -> None:  # a warning the runs share (a small log's schedule) is said once
        if not line.startswith("warning: ") or line not in said:
            said.add(line)
            report(line)

    for data_dir in data_dirs:
        DatasetSpec.load(data_dir)  # fail early on a directory that is not a prepared dataset
        name = os.path.basename(os.path.normpath(data_dir))
        for dim in dims:
            column = f"{name} d={dim}"
            columns.append(column)
            for model in models:
                out = os.path.join(output_dir, name, f"d{dim}", model)
                results = train(data_dir, out, config_for(model, dim, data_dir), overwrite=overwrite,
                                report=once)
                cells[(model, column)] = (results["test"][metric], results["test_std"][metric],
                                          len(results["seeds"]))
                warnings += [(model, column, w) for w in results.get("warnings", [])]
    report(write_tables(output_dir, models, columns, cells, metric, warnings))
    return columns, cells


def tied_with_best(cells: dict, models, column: str, metric: str = "auc") -> set[str]:
    """The models of `column` whose mean is the best or within two standard errors
    of the best (the standard error of the difference of two means over seeds); a
    single-seed cell ties only with itself, having no standard error."""
    sign = -1 if metric in LOWER_IS_BETTER else 1
    best = max(models, key=lambda m: sign * cells[(m, column)][0])
    b_mean, b_std, b_n = cells[(best, column)]
    out = {best}
    for model in models:
        mean, std, n = cells[(model, column)]
        if n > 1 and b_n > 1 and sign * (b_mean - mean) <= 2 * math.sqrt(b_std ** 2 / b_n + std ** 2 / n):
            out.add(model)
    return out


def _cell(mean: float, std: float, seeds: int, tied: bool) -> str:
    spread = f"{std:.5f}" if seeds > 1 else "n/a"
    return f"{'**' if tied else ''}{mean:.5f}{'**' if tied else ''} ({spread}, n={seeds})"


def write_tables(output_dir, models, columns, cells, metric, warnings=()) -> str:
    """table1.md and table1.csv: per model and column the test `metric`, mean, std
    and number of seeds; a single seed's std is "n/a" (blank in the CSV). In each
    column the best mean and every mean within two standard errors of it (a tie)
    are bold (`tied` in the CSV). Returns the table as printed: title, table,
    legend (what a column and a cell say, and each ablation row) and the runs'
    `warnings`, `(model, column, text)`: one line per text and column, naming
    every model that got it."""
    os.makedirs(output_dir, exist_ok=True)
    ties = {c: tied_with_best(cells, models, c, metric) for c in columns}
    lines = ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for model in models:
        lines.append(f"| {model} | " + " | ".join(_cell(*cells[(model, c)], model in ties[c]) for c in columns) + " |")
    counts = sorted({cells[key][2] for key in cells})
    seeds = " or ".join(str(n) for n in counts)
    name = metric.upper() if metric in ("auc", "gauc") else metric
    title = f"Test {name}, mean (std, n seeds) over {seeds} seed(s) per cell"
    legend = (f"Bold: the best of its column ({'lowest' if metric in LOWER_IS_BETTER else 'highest'} {name}) and "
              "every model within two standard errors of it (a tie: the difference is not resolved by these seeds).")
    legend += (" A column is a dataset and the embedding dimension d; a cell, the mean (its standard deviation "
               "over seeds, n/a with one seed; n seeds).")
    legend += "".join(f"\n{m}: {PRESET_NOTES[m]}." for m in models if m in PRESET_NOTES)
    text = f"{title}\n\n" + "\n".join(lines) + f"\n\n{legend}\n"
    grouped: dict[tuple[str, str], list[str]] = {}
    for model, column, warning in warnings:
        grouped.setdefault((column, warning), []).append(model)
    if grouped:
        text += "\nWarnings (see each run's results.json):\n" + "".join(
            f"- {', '.join(names)} on {column}, {warning}\n" for (column, warning), names in grouped.items())
    with open(os.path.join(output_dir, "table1.md"), "w") as f:
        f.write(text)
    with open(os.path.join(output_dir, "table1.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model"] + [f"{c} {part}" for part in ("mean", "std", "seeds", "tied") for c in columns])
        for model in models:
            w.writerow([model] + [cells[(model, c)][0] for c in columns]
                       + [cells[(model, c)][1] if cells[(model, c)][2] > 1 else "" for c in columns]
                       + [cells[(model, c)][2] for c in columns] + [int(model in ties[c]) for c in columns])
    return text
