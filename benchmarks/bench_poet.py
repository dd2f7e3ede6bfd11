"""POET kernels against torch, in one process, on one device.

    python benchmarks/bench_poet.py --device cuda                  # GPU sizes: bf16, m=16384, n=4096, b=32..256
    python benchmarks/bench_poet.py --device cuda --dtype bf16,fp16,fp32 --block 64,256
    python benchmarks/bench_poet.py --device cpu --threads 1       # (b) on the torch path, and (c)
    python benchmarks/bench_poet.py --resources-only               # (c) only (NVRTC, no GPU)
    python benchmarks/bench_poet.py --device cpu --check-only --dtype fp32,bf16,fp16   # (d) only

(a) the block-orthogonal apply Y = X[:, perm] . BD(G) with the permutation gather fused in, on
    the tensor-core kernel poet_bd_mma (bf16/fp16) and the CUDA-core kernel poet_bd_apply
    (gpucheck/kernels/poet.cu through CuPy), against torch on the same shapes and dtype:
    `bmm+gather` (X[:, perm] gathered, laid out (k, m, b), torch.bmm, laid back out: what a torch
    implementation of the same operation does), `bmm only` (the bmm alone on operands already
    laid out: torch's floor for the arithmetic). TFLOP/s = 2 m n b / time; ratio = torch time /
    kernel time (> 1: the kernel is faster; the goal is >= 1.0 against bmm+gather at b <= 128).
    Every kernel result is checked against torch's before it is timed. GPU only.
(b) the whole POET forward, y = x Pi_in BD(G_in) W^T BD(G_out) Pi_out (two block-diagonal
    applies around the dense GEMM; on a GPU once with the CUDA kernels and once all-torch), against
    a plain dense x . W^T of the same size; ratio = forward time / dense time (the public POET code
    reports about 1.25x of a plain linear layer for forward plus backward in its fast path).
(c) what the kernels compile to for sm_80 and sm_90 (registers, spills, static shared memory,
    the resident blocks per SM that allows on an A100 / an H100 or H200, and the static counts of
    HMMA, LDSM, LDS and STS in the SASS): no GPU needed (NVRTC, ptxas, nvdisasm; tests/sass.py).
(d) what one verified problem of the check costs (gpucheck.poet.invariants.check_problem: every
    kernel operation twice, both units, and the float64 verification), at the check's sizes (on
    a GPU n = m = 4096 on the CuPy kernels; on a CPU n = 2 b, m = 64 on the torch path): ms per
    problem, median of --problems problems after one warm-up.

Times are medians of windows (each window a batch of calls between two device synchronizations),
after a warm-up; the kernels are launched as the check launches them (no host sync per launch).
Prints markdown tables for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpucheck.poet.bounds import BLOCK_SIZES, parse_blocks, parse_dtypes  # noqa: E402


def timeit(fn, sync, seconds: float, window_s: float = 0.1) -> float:
    """Median seconds per call."""
    fn()
    sync()
    t = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t, 1e-7)
    batch = max(1, int(window_s / one))
    per_call: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(per_call) < 3:
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        sync()
        per_call.append((time.perf_counter() - t) / batch)
    return statistics.median(per_call[1:] if len(per_call) > 3 else per_call)


def resources() -> int:
    """(c): what poet.cu compiles to, per kernel, for sm_80 and sm_90 (tests/sass.py: NVRTC with CuPy's
    options -> ptxas -> nvdisasm): ptxas's figures, the resident blocks per SM they allow, and the
    static instruction counts of the tensor-core path in the SASS."""
    sys.path.insert(0, str(ROOT / "tests"))
    import sass  # noqa: PLC0415

    from gpucheck.poet.cupy_ops import block_of

    print("## (c) machine code (NVRTC with CuPy's options, ptxas, nvdisasm; blocks/SM from registers (per warp, "
          "in units of 256) and shared memory (+ 1 KiB per block): sm_80 on an A100 (164 KiB), sm_90 on an "
          "H100/H200 (228 KiB); instructions: static counts in the SASS)\n")
    print("| arch | kernel | threads | registers | spills (st/ld bytes) | smem bytes | blocks/SM | warps/SM | "
          "HMMA | LDSM | LDS | STS |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for arch, gpu in (("sm_80", sass.AMPERE), ("sm_90", sass.HOPPER)):
        try:
            fns = sass.compile_source("poet", arch)
        except (FileNotFoundError, OSError) as e:
            print(f"(c) not measured: {e}\n")
            return 0
        for kernel in sorted(fn for fn, f in fns.items() if f.registers is not None):
            f, threads = fns[kernel], block_of(kernel)[0]
            blocks = sass.blocks_per_sm(f.registers, f.smem, threads, gpu)
            print(f"| {arch} | {kernel} | {threads} | {f.registers} | {f.spill_stores}/{f.spill_loads} | {f.smem} | "
                  f"{blocks} | {blocks * threads // 32} | {f.count('HMMA')} | {f.count('LDSM')} | {f.count('LDS')} | "
                  f"{f.count('STS')} |")
    print()
    return 0


def kernel_table(torch, dev, cupy_ops, tops, pool, dtypes, blocks, m, n, seconds, sync) -> None:
    """(a): the two kernels against torch.bmm, one row per dtype and block size."""
    from gpucheck.poet.ortho import make_problem

    print(f"## (a) Y = X[:, perm] · BD(G), m = {m}, n = {n}: TFLOP/s (ratio = torch time / kernel time)\n")
    print("| dtype | b | tensor cores | CUDA cores | torch bmm+gather | torch bmm only | TC vs bmm+gather | "
          "TC vs bmm only | CUDA cores vs bmm+gather |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dt in dtypes:
        for b in blocks:
            p = make_problem(torch, dev, pool, index=0, seed=b, dtype=dt, b=b, n=n, m=m, rho_min=0.1, rho_max=0.5,
                             chain_steps=1)
            k = n // b
            G = tops.cnp(p.t_in.Q, dt)
            X, perm = p.x, p.t_in.perm
            perm32 = perm.to(torch.int32)
            Xl = X.index_select(1, perm).reshape(m, k, b).transpose(0, 1).contiguous()
            out3 = torch.empty((k, m, b), dtype=X.dtype, device=dev)

            def bmm_gather():
                A = X.index_select(1, perm).reshape(m, k, b).transpose(0, 1)
                return torch.bmm(A, G).transpose(0, 1).reshape(m, n)

            def bmm_only():
                torch.bmm(Xl, G, out=out3)

            ref = bmm_gather().float()
            flops = 2.0 * m * n * b
            cells, times = [], {}
            for unit in ("tensor", "cuda"):
                if unit not in cupy_ops.units(dt):
                    cells.append("—")
                    continue
                Y = cupy_ops.bd(X, G, in_idx=perm32, unit=unit)
                cupy_ops.sync()
                err = float((Y.float() - ref).abs().max())
                scale = float(ref.abs().max())
                if not err <= 2.0**-6 * max(scale, 1.0):  # a kernel that computes something else is not timed
                    raise SystemExit(f"{unit} kernel, {dt} b={b}: max |kernel - torch| = {err:.3g} (max |ref| "
                                     f"{scale:.3g}): wrong result, not benchmarked")
                times[unit] = timeit(lambda u=unit: cupy_ops.bd(X, G, in_idx=perm32, unit=u), sync, seconds)
                cells.append(f"{flops / times[unit] / 1e12:.2f}")
            tg = timeit(bmm_gather, sync, seconds)
            to = timeit(bmm_only, sync, seconds)
            ratio = [f"{tg / times['tensor']:.2f}" if "tensor" in times else "—",
                     f"{to / times['tensor']:.2f}" if "tensor" in times else "—",
                     f"{tg / times['cuda']:.2f}"]
            print(f"| {dt} | {b} | {' | '.join(cells)} | {flops / tg / 1e12:.2f} | {flops / to / 1e12:.2f} | "
                  f"{' | '.join(ratio)} |")
    print()


def forward_table(torch, dev, cupy_ops, tops, pool, dtypes, blocks, m, n, seconds, sync) -> None:
    """(b): the POET forward against a dense layer."""
    from gpucheck.poet.ortho import make_problem

    print(f"## (b) POET forward x·Π_in·BD(G_in)·Wᵀ·BD(G_out)·Π_out vs dense x·Wᵀ, m = {m}, n = {n} "
          "(ms, ratio = forward / dense)\n")
    cols = ["dtype", "b", "dense ms", "forward (torch) ms", "ratio torch"]
    if cupy_ops is not None:
        cols += ["forward (kernels) ms", "ratio kernels"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|")
    for dt in dtypes:
        for b in blocks:
            p = make_problem(torch, dev, pool, index=0, seed=b, dtype=dt, b=b, n=n, m=m, rho_min=0.1, rho_max=0.5,
                             chain_steps=1)
            x, W = p.x, p.W
            Gi, Go = tops.cnp(p.t_in.Q, dt), tops.cnp(p.t_out.Q, dt)
            pi, po = p.t_in.perm, p.t_out.inv
            pi32, po32 = pi.to(torch.int32), po.to(torch.int32)

            def dense():
                return tops.dense(x, W)

            def fwd(ops, i_in, i_out):
                return lambda: ops.bd(tops.dense(ops.bd(x, Gi, in_idx=i_in), W), Go, out_idx=i_out)

            td = timeit(dense, sync, seconds)
            tt = timeit(fwd(tops, pi, po), sync, seconds)
            row = [dt, str(b), f"{td * 1e3:.3f}", f"{tt * 1e3:.3f}", f"{tt / td:.2f}"]
            if cupy_ops is not None:
                tk = timeit(fwd(cupy_ops, pi32, po32), sync, seconds)
                row += [f"{tk * 1e3:.3f}", f"{tk / td:.2f}"]
            print("| " + " | ".join(row) + " |")
    print()


def check_table(torch, dev, ops, pool, dtypes, blocks, problems, sync) -> None:
    """(d): ms per verified problem at the check's sizes."""
    from gpucheck.poet.invariants import VerifyConfig, check_problem
    from gpucheck.poet.ortho import make_problem

    cuda = dev.type == "cuda"
    print(f"## (d) one verified problem of poet.ortho ({ops.name} backend; chain_steps 3; ms, median of "
          f"{problems})\n")
    print("| dtype | b | n | m | launches | ms per problem |")
    print("|---|---:|---:|---:|---:|---:|")
    for dt in dtypes:
        for b in blocks:
            n, m = (4096, 4096) if cuda else (2 * b, 64)
            times, launches = [], 0
            for i in range(problems + 1):
                p = make_problem(torch, dev, pool, index=i, seed=1000 + i, dtype=dt, b=b, n=n, m=m, rho_min=0.1,
                                 rho_max=0.5, chain_steps=3)
                sync()
                t = time.perf_counter()
                out = check_problem(torch, ops, p, VerifyConfig())
                sync()
                if out["violations"]:
                    raise SystemExit(f"{dt} b={b}: violations on a healthy problem: {out['violations'][:1]}")
                if i:  # the first one warms up (kernel compile, allocator)
                    times.append(time.perf_counter() - t)
                launches = out["launches"]
            print(f"| {dt} | {b} | {n} | {m} | {launches} | {statistics.median(times) * 1e3:.1f} |")
    print()


def _cupy_ops(torch, dev):
    """(CupyOps on dev, None) or (None, why not)."""
    try:
        from gpucheck.poet.cupy_ops import CupyOps

        return CupyOps(torch, dev), None
    except ImportError as e:
        return None, f"CuPy not importable ({e}): (a) and the kernel forward are not measured"


def _machine(torch, dev) -> str:
    """The device's name and the software versions."""
    if dev.type != "cuda":
        name = platform.processor() or platform.machine()
        return f"{name} (torch {torch.__version__}, {torch.get_num_threads()} thread(s))"
    versions = f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    try:
        import cupy

        versions += f", CuPy {cupy.__version__}"
    except ImportError:
        pass
    return f"{torch.cuda.get_device_name(dev)} ({versions})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", default=None, help="comma list of fp32,bf16,fp16 (default: bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--block", default=",".join(map(str, BLOCK_SIZES)), help="comma list of block sizes")
    ap.add_argument("--rows", type=int, default=None, help="m (default 16384 on cuda, 256 on cpu)")
    ap.add_argument("--size", type=int, default=None, help="n = features (default 4096 on cuda, 1024 on cpu)")
    ap.add_argument("--seconds", type=float, default=None, help="per measurement (default 1.0 cuda, 0.5 cpu)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    ap.add_argument("--resources-only", action="store_true", help="only (c): the machine code, no device")
    ap.add_argument("--check-only", action="store_true", help="only (d): ms per verified problem")
    ap.add_argument("--problems", type=int, default=5, help="problems per (dtype, block) for (d)")
    a = ap.parse_args()
    if a.resources_only:
        return resources()

    import torch

    from gpucheck.poet.ortho import QPool, TorchOps, set_precision

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    dtypes = parse_dtypes(a.dtype or ("bf16" if cuda else "fp32"))
    blocks = parse_blocks(a.block)
    m = a.rows or (16384 if cuda else 256)
    n = a.size or (4096 if cuda else 1024)
    seconds = a.seconds or (1.0 if cuda else 0.5)
    bad = [b for b in blocks if n % b]
    if bad:
        print(f"--size {n} is not a multiple of block size(s) {bad}", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        set_precision(torch)
    cupy_ops, cupy_note = _cupy_ops(torch, dev) if cuda else (None, None)

    def sync():
        if cupy_ops is not None:
            cupy_ops.sync()
        if cuda:
            torch.cuda.synchronize(dev)

    print(f"# POET benchmark on {_machine(torch, dev)}; x: {m} x {n}, W: {n} x {n}\n")

    pool = QPool(torch, dev, seed=0)
    tops = TorchOps(torch, dev)
    if a.check_only:
        check_table(torch, dev, cupy_ops or tops, pool, dtypes, blocks, a.problems, sync)
        return 0
    if cupy_ops is None:
        print("(a) block-orthogonal kernels vs torch.bmm: needs a GPU with CuPy"
              + (f" ({cupy_note})" if cupy_note else "") + "\n")
    else:
        kernel_table(torch, dev, cupy_ops, tops, pool, dtypes, blocks, m, n, seconds, sync)
    forward_table(torch, dev, cupy_ops, tops, pool, dtypes, blocks, m, n, seconds, sync)
    if not cuda:
        print("(CPU: torch path only; the CUDA kernels and (a) need a GPU with CuPy.)\n")
    check_table(torch, dev, cupy_ops or tops, pool, dtypes, blocks, a.problems, sync)
    return resources()


if __name__ == "__main__":
    sys.exit(main())
