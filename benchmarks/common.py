"""Shared helpers of the benchmark programs: timing, a printed table, JSON output."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_call(fn, min_seconds: float = 1.0, warmup: int = 2, max_iters: int = 200) -> float:
    """Median seconds per call of `fn` over repeated calls lasting >= `min_seconds`."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while (time.perf_counter() - start < min_seconds or len(times) < 3) and len(times) < max_iters:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def selected_parts(parser, value: str, allowed: tuple[str, ...]) -> set[str]:
    """The parts a comma-separated `--parts` value names; a usage error for unknown ones."""
    parts = {part for part in value.split(",") if part}
    unknown = parts - set(allowed)
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}; expected some of {', '.join(allowed)}")
    return parts


def print_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    widths = {c: max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |",
             "|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")).rjust(widths[c]) for c in columns) + " |")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def write_json(name: str, payload: dict, path: str | None = None) -> str:
    path = path or os.path.join(RESULTS_DIR, f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = dict(payload, machine={"platform": platform.platform(), "cpus": os.cpu_count()},
                   written=time.strftime("%Y-%m-%dT%H:%M:%S"),
                   command=" ".join(["python", os.path.relpath(sys.argv[0], os.path.dirname(RESULTS_DIR) + "/.."),
                                     *sys.argv[1:]]))
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")
    return path


def write_parts(name: str, payload: dict, parts, path: str | None = None) -> str:
    """Writes the parts measured now (`payload[part]`) into `results/NAME.json`, each
    with when, where and how it ran (`meta`); parts not run this time keep their last
    results and meta."""
    path = path or os.path.join(RESULTS_DIR, f"{name}.json")
    run = {"written": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "command": " ".join(["python", os.path.relpath(sys.argv[0], os.path.dirname(RESULTS_DIR) + "/.."),
                                *sys.argv[1:]]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}
    out = {"meta": {}}
    if os.path.exists(path):
        with open(path) as f:
            previous = json.load(f)
        for part, rows in previous.items():
            if part not in parts and isinstance(rows, list):
                out[part] = rows
                out["meta"][part] = previous.get("meta", {}).get(part, {k: previous.get(k) for k in run})
    for part in parts:
        out[part] = payload[part]
        out["meta"][part] = run
    out.update({k: v for k, v in payload.items() if k not in out})
    return write_json(name, out, path)


def start_standin(*flags: str) -> tuple[subprocess.Popen, int, int | None]:
    """`python -m serving.standin_server FLAGS --port=0` in a process of its own:
    `(process, gRPC port, REST port or None)` once it serves."""
    repo = os.path.dirname(os.path.dirname(RESULTS_DIR))
    process = subprocess.Popen([sys.executable, "-m", "serving.standin_server", *flags, "--port=0"], cwd=repo,
                               stdout=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    line = process.stdout.readline()
    rest = int(line.split("REST localhost:")[1].split()[0]) if "REST localhost:" in line else None
    return process, int(line.split("gRPC localhost:")[1].split()[0]), rest


def rss_mb(pid: int) -> float:
    """A process's resident memory (MB)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def run_program(args: list[str], log: str) -> float:
    """Runs `python -m ARGS` in the repository with its output in `log`; its wall
    seconds, or exits naming the log when it fails."""
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO))
    if done.returncode:
        sys.exit(f"{args[0]} failed (exit {done.returncode}); its output: {log}")
    return time.perf_counter() - started
