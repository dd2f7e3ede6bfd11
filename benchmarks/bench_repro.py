#!/usr/bin/env python3
"""Time the bitwise reproducibility workloads (repro.bitwise) and show that two runs give the
same bits.

    python benchmarks/bench_repro.py --device cpu [--workers 2] [--rounds 3]
    python benchmarks/bench_repro.py --device cuda [--gpus 0-7] [--rounds 3]

Two measurements, each for the level-1 subset (the check's workloads_level1) and for every
workload (level 2):

1. in this process, on one device (CPU worker with one thread, or cuda:<first GPU>): the time of
   the check's worker body (gpucheck.repro.worker.run_all: every workload twice from scratch,
   inputs generated, outputs digested), median over --rounds, with each workload's share;
2. end to end through the worker pool on every selected device at once (one spawned process per
   GPU or CPU worker: process start, torch import, CUDA initialisation, the two runs): the wall
   time a level-1 run of the check spends, median over --rounds.

Every run's digests are compared: run 1 with run 2 inside each worker, round with round, worker
with worker. Any difference is printed and the exit code is 1. Digests are printed so that two
machines of the same fingerprint can be compared by eye.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpucheck.repro.workloads import CUBLAS_WORKSPACE_CONFIG  # noqa: E402

# Before torch creates a cuBLAS handle in this process (the in-process measurement).
os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG


def parse_gpus(text: str | None, count: int) -> list[int]:
    if not text:
        return list(range(count))
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--workers", type=int, default=2, help="CPU workers for the end-to-end measurement")
    ap.add_argument("--gpus", default=None, help="GPUs for the end-to-end measurement (default all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpu-host-share", action="store_true",
                    help="also time, on this CPU, the host-side work of the gpu preset's level-1 subset "
                         "(integer draws of the inputs, SHA-256 of outputs of the same size): what a GPU "
                         "worker spends on its CPU core, GPU time not included")
    args = ap.parse_args()

    import torch

    from gpucheck.repro.fingerprint import describe, short_key
    from gpucheck.repro.worker import run_all
    from gpucheck.repro.workloads import preset_for, select_workloads
    from gpucheck.tests_suite.repro_bitwise import DEFAULTS
    from gpucheck.workers.pool import LocalChannel, WorkerJob, run_workers, torch_device

    preset = preset_for(args.device).name
    level1, _ = select_workloads(DEFAULTS["workloads_level1"], preset)
    everything, not_run = select_workloads(DEFAULTS["workloads_level2"], preset)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print(f"torch {torch.__version__} sees no CUDA device", file=sys.stderr)
            return 2
        devices = parse_gpus(args.gpus, torch.cuda.device_count())
    else:
        devices = list(range(args.workers))

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, Python {platform.python_version()}, torch {torch.__version__}")
    chan = LocalChannel(WorkerJob("bench", gpu=devices[0], device=args.device, args={"threads": 1}))
    dev = torch_device(chan)
    problems: list[str] = []
    seen: dict[str, str] = {}

    def note(where: str, out: dict) -> None:
        for r, run in enumerate(out["runs"]):
            for w, info in run.items():
                ref = seen.setdefault(f"{out['key']}/{w}", info["digest"])
                if info["digest"] != ref:
                    problems.append(f"{where} run {r + 1} {w}: {info['digest']} != {ref}")

    print()
    print(f"in-process, {args.device}:{devices[0]} ({preset} preset), each workload run twice, "
          f"median of {args.rounds} rounds")
    print("| set | workloads | seconds (two runs) | per workload (two runs) |")
    print("|---|---|---|---|")
    fp = None
    for name, ws in (("level 1", level1), ("level 2 (all)", everything)):
        totals, per = [], {w: [] for w in ws}
        for i in range(args.rounds):
            t0 = time.perf_counter()
            out = run_all(torch, dev, chan, ws, preset, {})
            totals.append(time.perf_counter() - t0)
            for w in ws:
                per[w].append(out["runs"][0][w]["seconds"] + out["runs"][1][w]["seconds"])
            note(f"in-process {name} round {i + 1}", out)
            fp = out["fingerprint"]
        shares = ", ".join(f"{w} {statistics.median(v):.3f}" for w, v in per.items())
        print(f"| {name} | {len(ws)} | {statistics.median(totals):.3f} | {shares} |")
    for w, why in not_run.items():
        print(f"({w} not run on {args.device}: {why})")

    print()
    print(f"end to end through the worker pool, level-1 subset on {len(devices)} "
          f"{'GPU' if args.device == 'cuda' else 'CPU worker'}(s) at once, median of {args.rounds} rounds")
    walls, starts, works = [], [], []
    for i in range(args.rounds):
        jobs = [WorkerJob(f"gpu{g}", gpu=g, device=args.device,
                          args={"workloads": level1, "preset": preset}) for g in devices]
        t0 = time.perf_counter()
        outcomes = run_workers("gpucheck.repro.worker:repro_worker", jobs, budget_s=600, startup_timeout_s=300)
        walls.append(time.perf_counter() - t0)
        for wid, oc in outcomes.items():
            if not oc.ok or oc.result is None or "runs" not in oc.result:
                problems.append(f"pool round {i + 1} {wid}: {oc.kind} {oc.error or oc.result}")
                continue
            note(f"pool round {i + 1} {wid}", oc.result)
            works.append(float(oc.result["seconds"]))
            starts.append(oc.duration_s - float(oc.result["seconds"]))
    print("| devices | wall seconds (median) | min | max | per worker: start-up (spawn, imports, device) | "
          "per worker: two runs |\n|---|---|---|---|---|---|")
    print(f"| {len(devices)} | {statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} | "
          f"{statistics.median(starts) if starts else float('nan'):.2f} | "
          f"{statistics.median(works) if works else float('nan'):.3f} |")

    if args.gpu_host_share:
        gpu_host_share(torch, select_workloads(DEFAULTS["workloads_level1"], "gpu")[0], args.rounds)

    print()
    if fp is not None:
        from gpucheck.repro.fingerprint import fingerprint_key

        print(f"fingerprint {short_key(fingerprint_key(fp))}: {describe(fp)}")
    for k, d in sorted(seen.items()):
        print(f"  {k.split('/', 1)[1]:18s} {d}")
    if problems:
        print("DIGESTS DIFFER:")
        for p in problems:
            print("  " + p)
        return 1
    print("every run, round and worker gave identical digests")
    return 0


def gpu_host_share(torch, workloads: list[str], rounds: int) -> None:
    import hashlib

    from gpucheck.repro.workloads import DISTRIBUTIONS, PRESET_DEFS, gemm_operand

    pre = PRESET_DEFS["gpu"]
    print()
    print(f"host-side share of the gpu preset's level-1 subset on this CPU (one run; a check does two), "
          f"median of {rounds} rounds")
    print("| workload | integer draws of the inputs (s) | output bytes | SHA-256 of them (s) |\n|---|---|---|---|")
    for w in workloads:
        dtype = w.split(".", 1)[1]
        size = 4 if dtype in ("fp32", "tf32") else 2
        gen, hashed = [], []
        nbytes = sum(m * n * size for m, n, _ in pre.gemm_shapes) * len(DISTRIBUTIONS)
        buf = bytes(nbytes)
        for _ in range(rounds):
            t0 = time.perf_counter()
            for (m, n, k) in pre.gemm_shapes:
                for dist in DISTRIBUTIONS:
                    label = f"{dist}.{m}x{n}x{k}"
                    gemm_operand(torch, dtype, dist, (m, k), 0, w, label, "A")
                    gemm_operand(torch, dtype, dist, (k, n), 1, w, label, "B")
            gen.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            hashlib.sha256(buf).hexdigest()
            hashed.append(time.perf_counter() - t0)
        print(f"| {w} | {statistics.median(gen):.3f} | {nbytes} | {statistics.median(hashed):.3f} |")


if __name__ == "__main__":
    sys.exit(main())
