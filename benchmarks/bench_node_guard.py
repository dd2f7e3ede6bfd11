"""The cost of the sweep's node-side guard (gpucheck.fleet.sweep.die_with_session: the command in
the background under `timeout`, a watcher on the session's standard input) on a node.

    python benchmarks/bench_node_guard.py [--runs 200] [--rounds 5]

Runs the sweep's remote wrapper around `true` with and without the guard, `--runs` times each
per round, interleaved, through `/bin/sh -c` with an open standard-input pipe as under sshd;
prints the median per-run wall time of each and the difference (the guard's cost per node).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpucheck.fleet.sweep import die_with_session, one_line  # noqa: E402


def per_run(command: str, runs: int) -> float:
    t0 = time.perf_counter()
    for _ in range(runs):
        p = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        p.wait()
        p.stdin.close()
    return (time.perf_counter() - t0) / runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    plain, guarded = one_line("true"), one_line(die_with_session("true", 600))
    times: dict[str, list[float]] = {"plain": [], "guarded": []}
    for _ in range(a.rounds):
        times["plain"].append(per_run(plain, a.runs))
        times["guarded"].append(per_run(guarded, a.runs))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"machine: {platform.machine()}, {platform.python_version()}, /bin/sh -> {Path('/bin/sh').resolve()}")
    print(f"plain one_line(true):  {med['plain'] * 1000:.2f} ms a run")
    print(f"guarded:               {med['guarded'] * 1000:.2f} ms a run")
    print(f"the guard's cost:      {(med['guarded'] - med['plain']) * 1000:.2f} ms a node")


if __name__ == "__main__":
    main()
