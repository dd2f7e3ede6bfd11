"""How far past `--timeout` a whole gpucheck process ends (docs/run.md promises at most 1 s).

    python benchmarks/bench_timeout.py [--runs 3]

Cases (CPU workers standing in for GPUs):
  level1-2s   gpucheck run --level 1 --device cpu --timeout 2s
  level1-5s   gpucheck run --level 1 --device cpu --workers 4 --timeout 5s
  hang-6s     gpucheck burn --device cpu --workers 2 --duration 2s --timeout 6s --inject hang:gpu=0,after=0.2
              (a worker that never answers: it must be stopped and killed inside the limit)

Reported per case: the whole process's wall time (interpreter start included), median and max,
its overshoot past the limit, and the exit codes.
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
CPU = ["--json", "--no-history"]
CASES = {
    "level1-2s": (2.0, ["run", "--level", "1", "--device", "cpu", "--timeout", "2s", *CPU]),
    "level1-5s": (5.0, ["run", "--level", "1", "--device", "cpu", "--workers", "4", "--timeout", "5s", *CPU]),
    "hang-6s": (6.0, ["burn", "--device", "cpu", "--workers", "2", "--size", "64", "--dtype", "fp32", "--duration",
                      "2s", "--timeout", "6s", "--inject", "hang:gpu=0,after=0.2", *CPU]),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python "
          f"{platform.python_version()}, load average at start {os.getloadavg()[0]:.2f}")
    for name, (limit, argv) in CASES.items():
        walls, rcs = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "gpucheck", *argv], capture_output=True, env=env, cwd=ROOT)
            walls.append(time.perf_counter() - t0)
            rcs.append(p.returncode)
        print(f"{name:10s} limit {limit:4.1f} s  wall median {statistics.median(walls):5.2f} s  max {max(walls):5.2f} s"
              f"  overshoot max {max(walls) - limit:+5.2f} s  exit codes {','.join(map(str, rcs))}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
