"""gpucheck's burn throughput against a bare matmul loop, in one process, on one device, per dtype.

    python benchmarks/bench_burn.py --device cuda --dtype all --size 8192 --seconds 10
    python benchmarks/bench_burn.py --device cuda --dtype bf16,fp8 --size 8192 --seconds 20
    python benchmarks/bench_burn.py --device cpu --dtype fp32 --size 512 --seconds 5
    python benchmarks/bench_burn.py --device cpu --dtype all --size 256 --seconds 3   # fp8: torch's CPU _scaled_mm

Rounds alternate (bare, burn, burn with normal operands only) so that clock and thermal drift hit
all three alike. Each measurement is the median of 1 s windows, the first (warm-up) window left
out, exactly as burn.gemm reports a GPU's TFLOP/s:

- bare: `torch.mm(A, B, out=C)` (fp8: `torch._scaled_mm`) on fixed N(0,1) operands, same torch
  settings as the burn (fp16/bf16 split-K reductions in FP32; TF32 on for tf32 only);
- burn: gpucheck.compute.gemm.Burner, the code the burn.gemm workers run: fresh operands every
  `repeats` GEMMs, rotating distributions, bitwise repeat check, float64 reference rows;
- burn-normal: the same with N(0,1) operands only, which isolates the cost of verification
  (operand values change a GPU's power draw, and with it its clocks under a power cap).

The goal (issues 4 and 20) is burn / bare >= 0.97 for every dtype. `--dtype all` (or a comma list)
measures each dtype in turn and prints one row per dtype (and, with --json, one JSON document).
Results go to benchmarks/RESULTS.md with the SKU, driver and torch version this script prints.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpucheck.compute import gemm  # noqa: E402
from gpucheck.compute.gemm import DTYPES, BurnConfig, Burner, flops_per_gemm, parse_dtypes  # noqa: E402
from gpucheck.workers.pool import LocalChannel, WorkerJob, torch_device  # noqa: E402


def bare_loop(torch, dev, dtype: str, n: int, seconds: float, window_s: float) -> list[float]:
    """TFLOP/s per window of a plain GEMM loop."""
    Burner(torch, dev, LocalChannel(), BurnConfig(size=n))._set_precision(dtype)  # same settings as the burn
    store = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32,
             "fp64": torch.float64}.get(dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    if dtype == "fp8":
        A = torch.randn((n, n), generator=g, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        B = torch.randn((n, n), generator=g, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
        C = torch.empty((n, n), dtype=torch.bfloat16, device=dev)
        one = torch.ones((), dtype=torch.float32, device=dev)

        def mm():
            torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, out=C)
    else:
        A = torch.randn((n, n), generator=g, device=dev, dtype=store)
        B = torch.randn((n, n), generator=g, device=dev, dtype=store)
        C = torch.empty((n, n), dtype=store, device=dev)

        def mm():
            torch.mm(A, B, out=C)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    # Calibrate a batch of GEMMs to ~1/20 of a window, so the loop syncs rarely.
    mm()
    sync()
    t = time.perf_counter()
    mm()
    sync()
    batch = max(1, int(window_s / 20 / max(time.perf_counter() - t, 1e-6)))
    windows: list[float] = []
    end = time.perf_counter() + seconds
    w_start, w_gemms = time.perf_counter(), 0
    while time.perf_counter() < end:
        for _ in range(batch):
            mm()
        w_gemms += batch
        if time.perf_counter() - w_start >= window_s:
            sync()
            now = time.perf_counter()
            windows.append(w_gemms * flops_per_gemm(n) / (now - w_start) / 1e12)
            w_start, w_gemms = now, 0
    sync()
    return windows


def median_tflops(windows: list[float]) -> float:
    return statistics.median(windows[1:] if len(windows) >= 3 else windows)


def burn_loop(torch, dev, dtype: str, n: int, seconds: float, window_s: float, repeats: int,
              distributions: tuple[str, ...] | None) -> tuple[float, dict]:
    cfg = BurnConfig(duration_s=seconds, dtypes=[dtype], size=n, repeats=repeats, window_s=window_s)
    if distributions:
        cfg.distributions = distributions
    out = Burner(torch, dev, LocalChannel(WorkerJob("bench", gpu=0, device=dev.type)), cfg).run()
    r = out["dtypes"][dtype]
    if out["sdc_count"]:
        print(f"WARNING: {out['sdc_count']} SDC event(s) during the benchmark: {out['sdc'][:1]}", file=sys.stderr)
    return float(r["tflops"]), r


def environment(torch, dev) -> dict:
    env = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "cuda_runtime": getattr(torch.version, "cuda", None), "device": dev.type}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count)
        try:
            from gpucheck.platform.telemetry.nvml import NvmlSession

            with NvmlSession() as nv:
                env["driver"] = nv.driver_version()
        except ImportError:
            env["driver"] = None
    else:
        env.update(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                   threads=torch.get_num_threads())
    return env


def breakdown(torch, dev, dtype: str, n: int, repeats: int, sets: int = 5) -> dict:
    """Per operand set, in ms: generating both operands (each distribution; Burner._operands' fill,
    the code the burn runs), the two checksums, and `repeats` GEMMs; and generation + checksums as
    a fraction of the GEMMs (the part of the burn's time that is not GEMM, host sync and the
    float64 reference aside)."""
    from gpucheck.compute.gemm import DISTRIBUTIONS

    b = Burner(torch, dev, LocalChannel(), BurnConfig(size=n, repeats=repeats))
    b._set_precision(dtype)
    A, B, C0, C1, mm, fill = b._operands(dtype)
    gen = torch.Generator(device=dev)
    view = torch.int16 if C0.element_size() == 2 else torch.int32

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def ms(fn, k):
        fn()
        sync()
        t = time.perf_counter()
        for _ in range(k):
            fn()
        sync()
        return (time.perf_counter() - t) / k * 1e3

    fill(DISTRIBUTIONS[0], gen)
    out = {f"fill_{d}_ms": ms(lambda d=d: fill(d, gen), sets) for d in DISTRIBUTIONS}
    out["checksums_ms"] = ms(lambda: (C0.view(view).sum(dtype=torch.int64), C1.view(view).sum(dtype=torch.int64)), sets)
    out["gemms_ms"] = ms(lambda: mm(C0), sets) * repeats
    fill_mean = statistics.mean(out[f"fill_{d}_ms"] for d in DISTRIBUTIONS)
    out["overhead_fraction"] = (fill_mean + out["checksums_ms"]) / out["gemms_ms"]
    return out


def measure_dtype(torch, dev, a: argparse.Namespace, dtype: str) -> dict:
    """Rounds of bare / burn / burn-normal for one dtype; medians and ratios."""
    bare, burn, burn_normal = [], [], []
    detail: dict = {}
    for _ in range(a.rounds):
        bare.append(median_tflops(bare_loop(torch, dev, dtype, a.size, a.seconds, a.window)))
        tf, detail = burn_loop(torch, dev, dtype, a.size, a.seconds, a.window, a.repeats, None)
        burn.append(tf)
        tf, _ = burn_loop(torch, dev, dtype, a.size, a.seconds, a.window, a.repeats, ("normal",))
        burn_normal.append(tf)
    b, u, un = statistics.median(bare), statistics.median(burn), statistics.median(burn_normal)
    return {
        "dtype": dtype, "bare_tflops": b, "burn_tflops": u, "burn_normal_tflops": un, "ratio": u / b,
        "ratio_normal": un / b, "rounds": {"bare": bare, "burn": burn, "burn_normal": burn_normal},
        "burn_detail": {k: detail.get(k) for k in ("sets", "iterations", "repeat_checks", "reference_checks",
                                                   "reference_max_error", "reference_tolerance")},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", default="bf16", help=f"comma list of {','.join(DTYPES)}, or all")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=16, help="burn GEMMs per operand set (burn.gemm default 16)")
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (cpu device)")
    ap.add_argument("--breakdown", action="store_true",
                    help="per dtype, also time operand generation, checksums and GEMMs of one set")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of text")
    a = ap.parse_args(argv)
    dtypes = list(DTYPES) if a.dtype == "all" else parse_dtypes(a.dtype)

    import torch

    chan = LocalChannel(WorkerJob("bench", gpu=0, device=a.device, args={"threads": a.threads}))
    dev = torch_device(chan)
    env = environment(torch, dev)
    # The benchmark times the fp8 path on the CPU too (torch's CPU _scaled_mm); a product burn
    # runs fp8 on CUDA GPUs only (gemm.FP8_DEVICE_TYPES).
    gemm.FP8_DEVICE_TYPES = gemm.FP8_DEVICE_TYPES | {dev.type}
    if not a.json:
        print(json.dumps(env))
        print(f"{a.device} {a.size}x{a.size}, {a.seconds:g} s x {a.rounds} rounds per measurement, repeats {a.repeats}")
        print("| dtype | bare TFLOP/s | burn TFLOP/s | burn / bare | burn N(0,1) TFLOP/s | burn N(0,1) / bare |")
        print("|---|---|---|---|---|---|")
    rows = []
    for dt in dtypes:
        why = Burner(torch, dev, chan, BurnConfig(size=a.size)).unsupported(
            dt, env if dev.type != "cuda" else {"capability": [int(x) for x in env["capability"].split(".")]})
        if why:
            rows.append({"dtype": dt, "skipped": why})
            if not a.json:
                print(f"| {dt} | skipped: {why} | | | | |")
            continue
        r = measure_dtype(torch, dev, a, dt)
        if a.breakdown:
            r["breakdown"] = breakdown(torch, dev, dt, a.size, a.repeats)
        rows.append(r)
        if not a.json:
            print(f"| {dt} | {r['bare_tflops']:.4g} | {r['burn_tflops']:.4g} | {r['ratio']:.3f} | "
                  f"{r['burn_normal_tflops']:.4g} | {r['ratio_normal']:.3f} |", flush=True)
    if a.breakdown and not a.json:
        print("\nper operand set, ms: | dtype | fill normal | wide | small | mixed | 2 checksums | "
              f"{a.repeats} GEMMs | (fill + checksums) / GEMMs |")
        for r in rows:
            if "breakdown" in r:
                d = r["breakdown"]
                print(f"| {r['dtype']} | {d['fill_normal_ms']:.3g} | {d['fill_wide_ms']:.3g} | {d['fill_small_ms']:.3g} "
                      f"| {d['fill_mixed_ms']:.3g} | {d['checksums_ms']:.3g} | {d['gemms_ms']:.4g} "
                      f"| {d['overhead_fraction']:.4f} |")
    if a.json:
        print(json.dumps({"env": env, "args": vars(a), "dtypes": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
