"""The HBM pattern test's bandwidth against a plain device-to-device copy, in the same run.

    python benchmarks/bench_memtest.py --device cuda --fraction 0.9 --rounds 3
    python benchmarks/bench_memtest.py --device cpu --bytes 64M --rounds 3

Each round is one `run_memtest` (gpucheck.eud.memtest_worker, the code the eud.memtest workers
run) over every pattern: on a GPU the CuPy kernels over `--fraction` of the free memory (minus
the check's headroom), on the CPU the NumPy path over `--bytes` of host memory. Inside each round
the copy baseline is measured first on the same allocation (cudaMemcpyAsync between two chunks /
numpy.copyto; median of 10), then the patterns. The memtest number is bytes written plus bytes
read over the time of the fill and verify sweeps (CUDA events; the L2 scrubs of moving inversions
inside that time, their bytes not counted); the copy number counts the bytes read plus written by
the copy. Reported: the median over rounds of each, of their ratio, and each pattern's rate. The
environment line names the kernels' blocks per SM (the occupancy API's answer: one wave), the L2
size and the scrub buffer.

Goal (issue 20): memtest / copy >= 0.9 on a GPU (issue 9 had asked for 0.8). An H100 SXM copies
about 3.0 TB/s device to device (read + write), an H200 about 4.3 TB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpucheck.eud.memtest_worker import CupyBackend, MemtestConfig, NumpyBackend, run_memtest  # noqa: E402
from gpucheck.eud.patterns import NAMES, human_bytes, parse_patterns  # noqa: E402
from gpucheck.workers.pool import LocalChannel, WorkerJob  # noqa: E402


def parse_bytes(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def environment(backend) -> dict:
    env = {"host": platform.node(), "python": platform.python_version(), **backend.info()}
    if backend.device == "cpu":
        env.update(cpu=platform.processor() or platform.machine(), cores=os.cpu_count())
    else:
        try:
            from gpucheck.platform.telemetry.nvml import NvmlSession

            with NvmlSession() as nv:
                env["driver"] = nv.driver_version()
        except ImportError:
            env["driver"] = None
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--fraction", type=float, default=0.9, help="of the free GPU memory (headroom kept)")
    ap.add_argument("--bytes", default="64M", help="host memory tested on the CPU")
    ap.add_argument("--chunk", default="1G", help="allocation chunk (GPU); the CPU uses --bytes / 2")
    ap.add_argument("--patterns", default="all", help=f"comma list of {', '.join(NAMES)}, or all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    cpu_bytes = parse_bytes(a.bytes)
    cfg = MemtestConfig(patterns=parse_patterns(a.patterns), fraction=a.fraction, chunk_bytes=parse_bytes(a.chunk),
                        cpu_bytes=cpu_bytes, cpu_chunk_bytes=max(64, cpu_bytes // 2),
                        copy_bytes=min(parse_bytes(a.chunk), 1 << 30), confirm=False)
    chan = LocalChannel(WorkerJob("bench", gpu=a.gpu, device=a.device))
    backend = CupyBackend.create(chan, cfg) if a.device == "cuda" else NumpyBackend(cfg)
    env = environment(backend)
    rounds = []
    for _ in range(a.rounds):
        out = run_memtest(backend, cfg, chan)
        if out.get("setup_error"):
            print(out["setup_error"], file=sys.stderr)
            return 1
        if out["errors"]["errors"]:
            print(f"WARNING: {out['errors']['errors']} memory error(s) during the benchmark", file=sys.stderr)
        rounds.append({"memtest_gbps": out["gbps"], "copy_gbps": out["copy"]["gbps"],
                       "ratio": out["gbps"] / out["copy"]["gbps"], "region_bytes": out["region_bytes"],
                       "per_pattern": {k: v["gbps"] for k, v in out["per_pattern"].items()}})
    med = {k: statistics.median(r[k] for r in rounds) for k in ("memtest_gbps", "copy_gbps", "ratio")}
    per = {p: statistics.median(r["per_pattern"][p] for r in rounds) for p in cfg.patterns}
    result = {"env": env, "args": vars(a), **med, "per_pattern_gbps": per, "rounds": rounds}
    if a.json:
        print(json.dumps(result))
        return 0
    print(json.dumps(env))
    print(f"{a.device}: {human_bytes(rounds[0]['region_bytes'])} tested, {len(cfg.patterns)} patterns, {a.rounds} rounds")
    print(f"memtest (written + read)   {med['memtest_gbps']:10.2f} GB/s   rounds "
          f"{['%.2f' % r['memtest_gbps'] for r in rounds]}")
    print(f"D2D copy (read + written)  {med['copy_gbps']:10.2f} GB/s   rounds {['%.2f' % r['copy_gbps'] for r in rounds]}")
    print(f"ratio                      {med['ratio']:10.3f}        rounds {['%.3f' % r['ratio'] for r in rounds]}")
    for p, v in per.items():
        print(f"  {p:18s} {v:10.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
