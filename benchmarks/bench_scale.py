"""The paper's logs at their real size, phase by phase (issue: Taobao's 100M rows,
Tmall's 55M): each phase's wall seconds, peak RSS, bytes written and rate, beside
the same phase on a 1M-row log of the same kind (how the cost grows with size).

Parts, each program in its own process: `generate` (`python -m data.synthetic
--like=taobao|tmall`), `prepare` (`python -m data.prepare`, the in-memory
driver, Tmall with `--fields=seller,brand`), `beam` (the same with
`--runner=beam` on Beam's DirectRunner, multi-processing on both cores, and
whether its records are the in-memory driver's), and the phases of
benchmarks/scale_phases.py: `train` (with `evaluate`), `input`, `export`,
`histories`, `load` (a prepared dataset's histories into LMDB at the lifelong cap),
`retrieval`, `recommend`.

The logs and prepared datasets stay in `--work_dir` between runs (each part
makes what it needs that is not there yet, untimed), so that parts can be
run one at a time; `--fraction` sizes the large log (the tables: 1.0).

Usage: python benchmarks/bench_scale.py [--parts generate,prepare,...] [--fraction 1.0]
           [--logs taobao,tmall] [--work_dir /tmp/bench_scale] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import scale_phases  # noqa: E402
from benchmarks.bench_prepare import measure, measure_with_children  # noqa: E402
from benchmarks.common import print_table, selected_parts, write_parts  # noqa: E402

SMALL_ROWS = 1_000_000
PARTS = ("generate", "prepare", "beam", "train", "input", "export", "histories", "load", "retrieval", "recommend")
# The targets on this 2-core machine, in seconds: a log of either real size generated,
# and the full Taobao log prepared (at no more than 12 GB peak); Beam at most twice the in-memory time.
GENERATE_TARGET_S, PREPARE_TARGET_S, BEAM_OVER_IN_MEMORY = 300, 1200, 2.0
HISTORIES_TARGET_S = {"lmdb": 600, "redis": 900}  # every user of the full log into the history service
BEAM_WORKERS = 2
BEAM_OPTIONS = f"--direct_num_workers={BEAM_WORKERS} --direct_running_mode=multi_processing"
MEMORY_TARGET_MIB = 12 * 1024  # the full Taobao log prepared, by either driver


def small_fraction(like: str) -> float:
    """The fraction of a log like `like` that has SMALL_ROWS rows."""
    from dare_tf.data.generation.lifelike import LIKE

    return SMALL_ROWS / LIKE[like].rows


def log_path(work: str, like: str, fraction: float) -> str:
    return os.path.join(work, f"{like}-{fraction:g}.csv")


def prepare_flags(like: str) -> list[str]:
    return ["--fields=seller,brand"] if like == "tmall" else []


def generate(like: str, fraction: float, work: str) -> dict:
    """The `generate` row of a log like `like` (written into `work`, kept for the other parts)."""

    out = log_path(work, like, fraction)
    for stale in (out, out + ".truth.json"):  # (this program's own output of an earlier run)
        if os.path.exists(stale):
            os.remove(stale)
    seconds, peak_mib = measure(["data.synthetic", f"--like={like}", f"--fraction={fraction}", f"--output={out}"])
    rows = _rows(like, fraction)
    with open(out + ".truth.json") as f:
        auc = json.load(f)["generator_auc"]
    return {"log": like, "fraction": round(fraction, 6), "rows": rows, "seconds": round(seconds, 1),
            "rows_per_s": round(rows / seconds), "peak_rss_mib": round(peak_mib),
            "mb_written": round(os.path.getsize(out) / 1e6), "generator_auc": round(auc, 4)}


def _prepared(like: str, log: str, out: str, runner: tuple = ()) -> tuple[float, float, float]:
    """Seconds, peak RSS (MiB) and the largest child process's peak RSS of `data.prepare` into `out`."""
    shutil.rmtree(out, ignore_errors=True)  # (this program's own output of an earlier run)
    return measure_with_children(REPO, ["data.prepare", f"--dataset={like}", f"--input={log}", f"--output_dir={out}",
                                        *prepare_flags(like), *runner])


def prepare(like: str, fraction: float, work: str) -> dict:
    """`data.prepare` (the in-memory driver, its default protocol) of a generated log:
    Tmall's with its sellers and brands as fields."""
    from dare_tf.data.storage.spec import DatasetSpec

    log = log_path(work, like, fraction)
    seconds, peak_mib, _ = _prepared(like, log, log + ".prepared")
    return _prepared_row(like, fraction, log + ".prepared", seconds, peak_mib) | {
        "users": DatasetSpec.load(log + ".prepared").users}


def _prepared_row(like: str, fraction: float, out: str, seconds: float, peak_mib: float) -> dict:
    from dare_tf.data.storage.spec import DatasetSpec

    spec, rows = DatasetSpec.load(out), _rows(like, fraction)
    written = sum(os.path.getsize(os.path.join(out, name)) for name in os.listdir(out))
    return {"log": like, "fraction": round(fraction, 6), "rows": rows, "seconds": round(seconds, 1),
            "rows_per_s": round(rows / seconds), "peak_rss_mib": round(peak_mib), "mb_written": round(written / 1e6),
            "examples": sum(spec.counts.values())}


def _rows(like: str, fraction: float) -> int:
    from dare_tf.data.generation.lifelike import LIKE

    return LIKE[like].rows if fraction == 1 else LIKE[like].scaled(fraction).rows


def beam(like: str, fraction: float, work: str, in_memory: dict | None) -> dict:
    """`data.prepare --runner=beam` on the DirectRunner (multi-processing, both
    cores): its row, its time over the in-memory driver's, its memory (the
    driver's peak, the largest worker's, and their bound: the driver and every
    worker at its peak at once), and whether every record is the in-memory
    driver's (the shards' digests in spec.json, the id maps)."""
    from dare_tf.data.storage.spec import DatasetSpec

    log = log_path(work, like, fraction)
    out = log + ".beam"
    seconds, peak_mib, worker_mib = _prepared(like, log, out, ("--runner=beam", f"--beam_options={BEAM_OPTIONS}"))
    row = _prepared_row(like, fraction, out, seconds, peak_mib)
    ours, theirs = DatasetSpec.load(out), DatasetSpec.load(ensure_prepared(like, fraction, work))
    same = {name: entry["sha256"] for name, entry in ours.files.items()} == {
        name: entry["sha256"] for name, entry in theirs.files.items()} and ours.counts == theirs.counts
    shutil.rmtree(out)
    bound = peak_mib + BEAM_WORKERS * worker_mib
    return row | {"worker_peak_rss_mib": round(worker_mib), "memory_bound_mib": round(bound),
                  "memory/target": round(bound / MEMORY_TARGET_MIB, 2), "records_identical": same,
                  "in_memory_s": in_memory["seconds"] if in_memory else None,
                  "over_in_memory": round(seconds / in_memory["seconds"], 2) if in_memory else None,
                  "target_over_in_memory": BEAM_OVER_IN_MEMORY}


def ensure_log(like: str, fraction: float, work: str) -> str:
    if not os.path.exists(log_path(work, like, fraction)):
        generate(like, fraction, work)
    return log_path(work, like, fraction)


def ensure_prepared(like: str, fraction: float, work: str) -> str:
    out = log_path(work, like, fraction) + ".prepared"
    if not os.path.exists(os.path.join(out, "spec.json")):
        ensure_log(like, fraction, work)
        prepare(like, fraction, work)
    return out


def targets(parts: dict, full: bool) -> None:
    """Each row's rate against the same phase's on the 1M-row log of its kind, and
    its target where the issue names one (seconds: generate, prepare, histories)."""
    for phase, target_s in (("generate", GENERATE_TARGET_S), ("prepare", PREPARE_TARGET_S)):
        for row, small in _with_small(parts.get(phase)):
            row["rate/1M-row rate"] = round(row["rows_per_s"] / small["rows_per_s"], 2)
            large = row is not small and full
            row["target_s"] = target_s if large else None
            row["seconds/target"] = round(row["seconds"] / target_s, 2) if large else None
    for row, small in _with_small(parts.get("train"), "optimizer"):
        row["rate/1M-row rate"] = round(row["samples_per_s"] / small["samples_per_s"], 2)
    for row, small in _with_small(parts.get("export")):
        row["rank_p50/1M-row p50"] = round(row["rank_p50_ms"] / small["rank_p50_ms"], 2)
    for row, small in _with_small(parts.get("histories"), "store"):
        large = row is not small and full
        row["target_s"] = HISTORIES_TARGET_S[row["store"]] if large else None
        row["seconds/target"] = round(row["seconds"] / row["target_s"], 2) if large else None


def _with_small(rows: list[dict] | None, *keys: str):
    """Each row with the row of the smallest fraction of the same log (and `keys`)."""
    rows = rows or []
    for row in rows:
        same = [r for r in rows if r["log"] == row["log"] and all(r[k] == row[k] for k in keys)]
        yield row, min(same, key=lambda r: r["fraction"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--fraction", type=float, default=1.0, help="of the real size (the tables: 1.0)")
    parser.add_argument("--logs", default="taobao,tmall")
    parser.add_argument("--work_dir", default="/tmp/bench_scale", help="logs and datasets kept between runs")
    parser.add_argument("--beam_fraction", type=float, default=None,
                        help="the large log Beam prepares (default --fraction)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    chosen = selected_parts(parser, args.parts, PARTS)
    parts = {part: [] for part in PARTS if part in chosen}
    os.makedirs(args.work_dir, exist_ok=True)
    for like in args.logs.split(","):
        for fraction in (small_fraction(like), args.fraction):
            size = {"log": like, "fraction": round(fraction, 6), "rows": _rows(like, fraction)}
            work = os.path.join(args.work_dir, f"{like}-{fraction:g}")
            os.makedirs(work, exist_ok=True)
            if "generate" in parts:
                parts["generate"].append(generate(like, fraction, args.work_dir))
            if "prepare" in parts:
                ensure_log(like, fraction, args.work_dir)
                parts["prepare"].append(prepare(like, fraction, args.work_dir))
            if "beam" in parts and (args.beam_fraction is None or fraction != args.fraction):
                ensure_log(like, fraction, args.work_dir)
                in_memory = _same(parts.get("prepare"), size) or prepare(like, fraction, args.work_dir)
                parts["beam"].append(beam(like, fraction, args.work_dir, in_memory))
            data_dir = ensure_prepared(like, fraction, args.work_dir) if chosen - {"generate", "prepare",
                                                                                     "beam"} else None
            for phase in ("train", "input", "export", "retrieval", "recommend", "histories", "load"):
                if phase in parts:
                    call = getattr(scale_phases, "input_pipeline" if phase == "input" else phase)
                    given = {"train": (data_dir, work), "input": (data_dir,), "export": (data_dir, work),
                             "retrieval": (data_dir, work), "recommend": (data_dir, work),
                             "histories": (log_path(args.work_dir, like, fraction), like, work),
                             "load": (data_dir, work)}[phase]
                    parts[phase] += call(*given, size)
        if "beam" in parts and args.beam_fraction is not None:
            ensure_log(like, args.beam_fraction, args.work_dir)
            in_memory = prepare(like, args.beam_fraction, args.work_dir)
            parts["beam"].append(beam(like, args.beam_fraction, args.work_dir, in_memory))
    kept = keep_other_logs(parts, args.logs.split(","), args.json)
    targets(parts, args.fraction == 1)
    for phase, rows in parts.items():
        print(phase)
        print_table(rows, list(rows[-1]))
    path = write_parts("bench_scale", parts, list(parts), args.json)
    with open(path) as f:
        written = json.load(f)
    for part, command in kept.items():  # each table names every command that measured its rows
        written["meta"][part]["command"] = f"{command}; {written['meta'][part]['command']}"
    with open(path, "w") as f:
        json.dump(written, f, indent=2)


def keep_other_logs(parts: dict, logs: list[str], path: str | None) -> dict:
    """Puts ahead of each part's rows the rows of the logs not measured now from the
    results file (one log at a time is a run of its own); returns, per part that
    kept rows, the command that measured them."""
    from benchmarks.common import RESULTS_DIR

    path = path or os.path.join(RESULTS_DIR, "bench_scale.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        previous = json.load(f)
    kept = {}
    for part, rows in parts.items():
        others = [r for r in previous.get(part, []) if r["log"] not in logs]
        if others:
            parts[part] = others + rows
            kept[part] = previous["meta"][part]["command"]
    return kept


def _same(rows: list[dict] | None, size: dict) -> dict | None:
    return next((r for r in rows or [] if r["log"] == size["log"] and r["fraction"] == size["fraction"]), None)


if __name__ == "__main__":
    main()
