"""Level-1 wall time: the Slurm prolog's run on an 8-GPU node, with `--device cpu --workers 8`
standing in for the GPUs (one torch worker process per GPU, as on the node).

    python benchmarks/bench_level1.py [--runs 5] [--workers 8] [--timeout 15]
    python benchmarks/bench_level1.py --device cuda [--runs 5]     # on a GPU node: its own GPUs

Each round runs `gpucheck run --level 1 --device cpu --workers N --json --no-history` twice,
interleaved: without a time limit (how long level 1 takes) and with `--timeout` (the prolog's
budget: the run must end inside it, plus at most 1 s, and say what it could not fit). Reported
per mode: median and max of the whole process's wall time, the verdict's own duration, the time
in repro.bitwise (the only compute check of level 1) and the exit codes.

Goal (DESIGN.md, level 1): <= 15 s on an 8-GPU node.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(device: str, workers: int, timeout_s: float | None, env: dict[str, str]) -> dict:
    argv = [sys.executable, "-m", "gpucheck", "run", "--level", "1", "--device", device, "--json", "--no-history"]
    if device == "cpu":
        argv += ["--workers", str(workers)]
    if timeout_s is not None:
        argv += ["--timeout", f"{timeout_s:g}s"]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    v = json.loads(p.stdout)
    repro = next(c for c in v["checks"] if c["id"] == "repro.bitwise")
    first = next((r for r in v["results"] if r["check"] == "repro.bitwise"), {})
    return {"wall": wall, "duration": v["duration_s"], "rc": p.returncode, "repro_s": repro["duration_s"],
            "repro": repro["status"], "repro_summary": first.get("summary", "")}


def summary(name: str, runs: list[dict]) -> None:
    walls = [r["wall"] for r in runs]
    durs = [r["duration"] for r in runs]
    repro = [r["repro_s"] for r in runs]
    rcs = ",".join(str(r["rc"]) for r in runs)
    print(f"{name:24s} wall median {statistics.median(walls):6.2f} s  max {max(walls):6.2f} s | verdict duration "
          f"median {statistics.median(durs):6.2f} s max {max(durs):6.2f} s | repro.bitwise median "
          f"{statistics.median(repro):6.2f} s | exit codes {rcs}")
    for r in runs:
        if r["repro"] != "pass":
            print(f"    repro.bitwise {r['repro']}: {r['repro_summary'][:140]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=15.0)
    ap.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    print(f"machine: {platform.node()} {platform.machine()} {cores} usable cpus, Python {platform.python_version()}, "
          f"load average at start {os.getloadavg()[0]:.2f}")
    one(args.device, args.workers, None, env)  # warm the page cache and .pyc files
    free: list[dict] = []
    limited: list[dict] = []
    for _ in range(args.runs):
        free.append(one(args.device, args.workers, None, env))
        limited.append(one(args.device, args.workers, args.timeout, env))
    units = f"{args.workers} CPU workers" if args.device == "cpu" else f"device {args.device}"
    print(f"load average at end {os.getloadavg()[0]:.2f}; {args.runs} runs per mode, {units}")
    summary("no time limit", free)
    summary(f"--timeout {args.timeout:g}s", limited)
    worst = max(r["wall"] for r in limited)
    print(f"--timeout {args.timeout:g}s: worst whole-process wall {worst:.2f} s, limit + 1 s margin "
          f"{'kept' if worst <= args.timeout + 1.0 else 'NOT kept'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
