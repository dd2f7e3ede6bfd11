"""Startup benchmark: a whole `gpucheck run --level 1 --snapshot ... --json` process against
`python -c pass` (the interpreter's own start), median of N runs each, interleaved.

    python benchmarks/bench_startup.py [--runs 20] [--snapshot tests/fixtures/snapshots/h100-healthy.json]

Goal (issue 2): under 0.4 s for the gpucheck process.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    return time.perf_counter() - t0, p.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--snapshot", default=str(ROOT / "tests/fixtures/snapshots/h100-healthy.json"))
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    gpucheck = [sys.executable, "-m", "gpucheck.cli.main", "run", "--level", "1",
                "--snapshot", args.snapshot, "--json", "--no-history"]
    bare = [sys.executable, "-c", "pass"]
    timed(gpucheck, env)  # warm the page cache and .pyc files
    g, b = [], []
    for _ in range(args.runs):
        t, rc = timed(bare, env)
        b.append(t)
        t, rc = timed(gpucheck, env)
        if rc not in (0, 1):
            print(f"gpucheck exited {rc}", file=sys.stderr)
            return 1
        g.append(t)
    mg, mb = statistics.median(g), statistics.median(b)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}")
    print(f"python -c pass      median {mb*1000:7.1f} ms  (min {min(b)*1000:.1f})")
    print(f"gpucheck run -l 1   median {mg*1000:7.1f} ms  (min {min(g)*1000:.1f})  over {args.runs} runs")
    print(f"gpucheck overhead   {(mg-mb)*1000:7.1f} ms;  goal < 400 ms total: {'met' if mg < 0.4 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
