"""POET kernels against torch, in one process, on one device.

    python benchmarks/bench_poet.py --device cuda                      # (a) and (b), every dtype and block
    python benchmarks/bench_poet.py --device cuda --dtype bf16 --block 256 --rows 16384 --size 4096
    python benchmarks/bench_poet.py --device cpu --rows 256 --size 1024 --dtype fp32   # (b) only

(a) the block-orthogonal kernel poet_bd_apply (gpucheck/kernels/poet.cu through CuPy) computing
    Y = X[:, perm] . BD(G) with the permutation gather fused in, against torch on the same shapes
    and dtype: `bmm+gather` (X[:, perm] gathered, laid out (k, m, b), torch.bmm, laid back out: what
    a torch implementation of the same operation does), `bmm only` (the bmm alone on operands
    already laid out: torch's floor for the arithmetic), and `einsum` (with the gather). TFLOP/s =
    2 m n b / time; ratio = kernel / torch (> 1: the kernel is faster). GPU only.
(b) the whole POET forward, y = x Pi_in BD(G_in) W^T BD(G_out) Pi_out (two block-diagonal
    applies around the dense GEMM; on a GPU once with the CUDA kernels and once all-torch), against
    a plain dense x . W^T of the same size; ratio = forward time / dense time (the public POET code
    reports about 1.25x of a plain linear layer for forward plus backward in its fast path).

Times are medians of windows (each window a batch of calls between two device synchronizations),
after a warm-up. The kernels are launched without a sync per launch here (the check syncs every
launch; the benchmark measures the kernel). Prints markdown tables for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", default=None, help="comma list of fp32,bf16,fp16 (default: all on cuda, fp32 on cpu)")
    ap.add_argument("--block", default=",".join(map(str, BLOCK_SIZES)), help="comma list of block sizes")
    ap.add_argument("--rows", type=int, default=None, help="m (default 16384 on cuda, 256 on cpu)")
    ap.add_argument("--size", type=int, default=None, help="n = features (default 4096 on cuda, 1024 on cpu)")
    ap.add_argument("--seconds", type=float, default=None, help="per measurement (default 1.0 cuda, 0.5 cpu)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    a = ap.parse_args()

    import torch

    from gpucheck.poet.ortho import QPool, TorchOps, make_problem, set_precision, storage_dtype

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    dtypes = parse_dtypes(a.dtype or ("fp32,bf16,fp16" if cuda else "fp32"))
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

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    cupy_ops = None
    cupy_note = None
    if cuda:
        try:
            from gpucheck.poet.cupy_ops import CupyOps

            cupy_ops = CupyOps(torch, dev)
        except ImportError as e:
            cupy_note = f"CuPy not importable ({e}): (a) and the kernel forward are not measured"
    name = torch.cuda.get_device_name(dev) if cuda else (platform.processor() or platform.machine())
    versions = f"torch {torch.__version__}"
    if cuda:
        versions += f", CUDA {torch.version.cuda}"
        try:
            import cupy

            versions += f", CuPy {cupy.__version__}"
        except ImportError:
            pass
    else:
        versions += f", {torch.get_num_threads()} thread(s)"
    print(f"# POET benchmark on {name} ({versions}); x: {m} x {n}, W: {n} x {n}\n")

    pool = QPool(torch, dev, seed=0)
    tops = TorchOps(torch, dev)

    # (a) -------------------------------------------------------------------------------------------
    if cupy_ops is None:
        print("(a) block-orthogonal kernel vs torch.bmm: needs a GPU with CuPy"
              + (f" ({cupy_note})" if cupy_note else "") + "\n")
    else:
        from gpucheck.kernels.cupy_module import launch
        from gpucheck.poet.cupy_ops import THREADS, bd_plan

        import numpy as np

        print("## (a) Y = X[:, perm] · BD(G): CUDA kernel vs torch (TFLOP/s, ratio = kernel / torch)\n")
        print("| dtype | b | kernel | torch bmm+gather | torch bmm only | torch einsum | ratio vs bmm+gather | ratio vs bmm only |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for dt in dtypes:
            for b in blocks:
                p = make_problem(torch, dev, pool, index=0, seed=b, dtype=dt, b=b, n=n, m=m, rho_min=0.1,
                                 rho_max=0.5, chain_steps=1)
                k = n // b
                G = tops.cnp(p.t_in.Q, dt)
                X, perm = p.x, p.t_in.perm
                perm32 = perm.to(torch.int32)
                Y = torch.empty_like(X)
                kernel, grid, args = bd_plan(X, G, Y, in_idx=perm32)
                conv = tuple(np.uint64(0 if v is None else v.data_ptr()) if kind == "ptr" else
                             {"i64": np.int64, "i32": np.int32, "f32": np.float32}[kind](v) for kind, v in args)

                def run_kernel():
                    launch("poet", kernel, grid, (THREADS, 1, 1), conv, sync=False, stream=cupy_ops._stream)

                Xl = X.index_select(1, perm).reshape(m, k, b).transpose(0, 1).contiguous()
                out3 = torch.empty((k, m, b), dtype=X.dtype, device=dev)

                def run_bmm_gather():
                    A = X.index_select(1, perm).reshape(m, k, b).transpose(0, 1)
                    return torch.bmm(A, G).transpose(0, 1).reshape(m, n)

                def run_bmm_only():
                    torch.bmm(Xl, G, out=out3)

                def run_einsum():
                    return torch.einsum("mkb,kbc->mkc", X.index_select(1, perm).reshape(m, k, b), G).reshape(m, n)

                flops = 2.0 * m * n * b
                tk = timeit(run_kernel, sync, seconds)
                tg = timeit(run_bmm_gather, sync, seconds)
                to = timeit(run_bmm_only, sync, seconds)
                te = timeit(run_einsum, sync, seconds)
                # the kernel and torch computed the same thing (within the derived bound's spirit)
                ref = run_bmm_gather().float()
                run_kernel()
                sync()
                dev_err = float((Y.float() - ref).abs().max())
                tf = [flops / t / 1e12 for t in (tk, tg, to, te)]
                print(f"| {dt} | {b} | {tf[0]:.2f} | {tf[1]:.2f} | {tf[2]:.2f} | {tf[3]:.2f} | {tg / tk:.2f} | "
                      f"{to / tk:.2f} |" + ("" if dev_err < 1.0 else f" (max |diff| {dev_err:.3g}!)"))
        print()

    # (b) -------------------------------------------------------------------------------------------
    print("## (b) POET forward x·Π_in·BD(G_in)·Wᵀ·BD(G_out)·Π_out vs dense x·Wᵀ (ms, ratio = forward / dense)\n")
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

            def dense():
                return tops.dense(x, W)

            def fwd(ops):
                def run():
                    return ops.bd(tops.dense(ops.bd(x, Gi, in_idx=pi), W), Go, out_idx=po)
                return run

            td = timeit(dense, sync, seconds)
            tt = timeit(fwd(tops), sync, seconds)
            row = [dt, str(b), f"{td * 1e3:.3f}", f"{tt * 1e3:.3f}", f"{tt / td:.2f}"]
            if cupy_ops is not None:
                fast = _FastKernelOps(cupy_ops)
                tkf = timeit(fwd(fast), sync, seconds)
                row += [f"{tkf * 1e3:.3f}", f"{tkf / td:.2f}"]
            print("| " + " | ".join(row) + " |")
    print()
    if not cuda:
        print("(CPU: torch path only; the CUDA kernels and (a) need a GPU with CuPy. "
              f"dtype {storage_dtype(torch, dtypes[0])}.)")
    return 0


class _FastKernelOps:
    """The CuPy kernels without a sync per launch (the check syncs every launch; a benchmark of
    the forward should not)."""

    def __init__(self, cupy_ops):
        self.c = cupy_ops
        self._idx: dict[int, object] = {}

    def bd(self, X, G, **kw):
        import numpy as np

        from gpucheck.kernels.cupy_module import launch
        from gpucheck.poet.cupy_ops import THREADS, bd_plan

        torch = self.c.torch
        m, n = X.shape
        Y = torch.empty((m, n), dtype=X.dtype, device=X.device)
        idx = {}
        for key in ("in_idx", "out_idx"):
            t = kw.get(key)
            if t is not None:
                cached = self._idx.get(id(t))
                if cached is None:
                    cached = self._idx[id(t)] = (t, t.to(torch.int32))
                idx[key] = cached[1]
        kernel, grid, args = bd_plan(X, G, Y, **idx)
        conv = tuple(np.uint64(0 if v is None else v.data_ptr()) if kind == "ptr" else
                     {"i64": np.int64, "i32": np.int32, "f32": np.float32}[kind](v) for kind, v in args)
        launch("poet", kernel, grid, (THREADS, 1, 1), conv, sync=False, stream=self.c._stream)
        return Y


if __name__ == "__main__":
    sys.exit(main())
