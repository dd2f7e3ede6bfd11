"""Replay cost: a recorded snapshot read back through the live reader (gpucheck.platform.telemetry.replay),
what `gpucheck run --snapshot FILE` adds to loading the file, per fixture, in this process.

    python benchmarks/bench_replay.py [--runs 50]

Reported per fixture: its GPUs and the median and minimum time of `replay_snapshot(doc)` (the
reader's calls, the replay's answers, the lost-GPU probe) after one warm-up.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpucheck.platform.telemetry.replay import replay_snapshot  # noqa: E402
from gpucheck.platform.telemetry.snapshot import load_snapshot  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    a = ap.parse_args(argv)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| fixture | GPUs | median ms | min ms |")
    print("|---|---|---|---|")
    for path in sorted((ROOT / "tests" / "fixtures" / "snapshots").glob("*.json")):
        doc = load_snapshot(path)
        replay_snapshot(doc)
        times = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            replay_snapshot(doc)
            times.append(time.perf_counter() - t0)
        print(f"| {path.name} | {len(doc['gpus'])} | {statistics.median(times) * 1000:.2f} | {min(times) * 1000:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
