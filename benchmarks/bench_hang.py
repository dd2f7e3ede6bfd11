"""`gpucheck hang` analysis time (issue 16): the pure analysis over a job's recorded stacks.

    python benchmarks/bench_hang.py [--ranks 1024,16384] [--rounds 5]

The ranks are built from the recorded py-spy dumps in tests/fixtures/hang/ (tests/hang_synth.py):
every rank waits in all_reduce (5 frames on the main thread plus a flight-recorder thread, and a
pin-memory thread on a third of them) with its node's own install paths and line numbers, except
two outliers (one stuck in load_batch, one in a lock), 8 ranks per node. Timed per size, median
over rounds:

  analyze             gpucheck.hang.analysis.analyze(ranks, nodes): normalization, grouping,
                      suspects, flight recorder (none here), node sets
  analyze+topology    the same with --topology tp=8,pp=4 (groups built and the eviction planned)
  document+json       the gpucheck.hang document serialized as `--json` prints it

Goal: well under a second at 16k ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hang_synth import synthetic_job  # noqa: E402

from gpucheck.hang.analysis import analyze, document  # noqa: E402
from gpucheck.hang.topology import megatron, parse_spec  # noqa: E402


def _time(fn, rounds: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench(world: int, rounds: int) -> dict[str, float]:
    outliers = {world // 3: "load_batch", world - 7: "lock"}
    ranks = synthetic_job(world, outliers=outliers)
    nodes = [{"node": n, "status": "ok", "reason": ""} for n in sorted({r["node"] for r in ranks})]
    frames = sum(len(t["frames"]) for r in ranks for t in r["threads"])
    t_plain, rep = _time(lambda: analyze(ranks, nodes), rounds)
    assert sorted(s["rank"] for s in rep["suspects"]) == sorted(outliers), rep["summary"]
    spec = parse_spec("tp=8,pp=4")
    t_topo, rep_t = _time(lambda: analyze(ranks, nodes, topology=megatron(spec, world)), rounds)
    assert rep_t["topology"]["evict_dim"] is not None
    t_json, _ = _time(lambda: json.dumps(document(rep_t, source={}, started=time.time())), rounds)
    return {"ranks": world, "frames": frames, "analyze_s": t_plain, "analyze_topology_s": t_topo, "json_s": t_json}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1024,16384")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpu(s), "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'ranks':>7} {'frames':>9} {'analyze':>10} {'+topology':>10} {'json':>8}")
    for world in (int(x) for x in args.ranks.split(",")):
        r = bench(world, args.rounds)
        print(f"{r['ranks']:>7} {r['frames']:>9} {r['analyze_s'] * 1e3:>8.1f}ms {r['analyze_topology_s'] * 1e3:>8.1f}ms "
              f"{r['json_s'] * 1e3:>6.1f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
