"""The POET operations on the CUDA kernels of gpucheck/kernels/poet.cu, launched through CuPy.

    ops = CupyOps(torch, dev)        # compiles poet.cu once (KernelError if it cannot)
    G = ops.cnp(Q, "bf16")           # 3 launches of poet_cnp_step_*, each checked and synced
    Y = ops.bd(X, G, in_idx=perm)    # 1 launch of poet_bd_apply_*

Tensors stay torch tensors (torch allocates, the kernels write through raw device pointers) on
torch's current stream, so the verification in gpucheck.poet.invariants reads them directly and
an injected bit flip lands on exactly the kernel's output. The launch geometry and argument lists
are built by `KernelOps` in plain Python: the CPU tests run the very same plans on the same .cu
source under tests/cudaemu.py, so everything but the CuPy call itself is tested without a GPU.
"""

from __future__ import annotations

from typing import Any

from .ortho import TorchOps, storage_dtype

THREADS = 256
TN = 32  # columns per tile (POET_TN)
BD_TM = 128  # rows per tile of poet_bd_apply (POET_BD_TM)
CNP_TM = 64  # rows per tile of poet_cnp_step (POET_CNP_TM)
SUFFIX = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
DTYPE_OF = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

# An argument of a launch: (kind, value) with kind "ptr" (a tensor or None), "i64", "i32", "f32".
Arg = tuple[str, Any]
Launch = tuple[str, tuple[int, int, int], list[Arg]]


def dtype_name(t: Any) -> str:
    return DTYPE_OF[str(t.dtype).removeprefix("torch.")]


def bd_plan(X: Any, G: Any, Y: Any, *, in_idx: Any = None, out_idx: Any = None, transpose: bool = False,
            x_t: bool = False, y_t: bool = False) -> Launch:
    """The launch of poet_bd_apply_<dtype> computing Y (allocated, contiguous) from X and G; the
    index tensors must be int32 (or None)."""
    if x_t:
        n, m = X.shape
        x_rs, x_cs = 1, m
    else:
        m, n = X.shape
        x_rs, x_cs = n, 1
    k, b, _ = G.shape
    if k * b != n or b % TN:
        raise ValueError(f"{k} blocks of {b} do not tile {n} columns in tiles of {TN}")
    if not (X.is_contiguous() and G.is_contiguous() and Y.is_contiguous()):
        raise ValueError("bd_plan needs contiguous tensors")
    y_rs, y_cs = (1, m) if y_t else (n, 1)
    if tuple(Y.shape) != ((n, m) if y_t else (m, n)):
        raise ValueError(f"output shape {tuple(Y.shape)} does not fit")
    dt = dtype_name(X)
    if dtype_name(G) != dt or dtype_name(Y) != dt:
        raise ValueError("X, G and Y must have the same storage dtype")
    grid = (k * (b // TN), (m + BD_TM - 1) // BD_TM, 1)
    args: list[Arg] = [("ptr", X), ("i64", x_rs), ("i64", x_cs), ("ptr", G), ("ptr", Y), ("i64", y_rs),
                       ("i64", y_cs), ("ptr", in_idx), ("ptr", out_idx), ("i32", m), ("i32", b), ("i32", k),
                       ("i32", 1 if transpose else 0)]
    return f"poet_bd_apply_{SUFFIX[dt]}", grid, args


def cnp_plan(Q: Any, H1: Any, H2: Any, G: Any) -> list[Launch]:
    """The three Horner launches of poet_cnp_step: H1 = 2I + Q(2I + Q), H2 = 2I + Q H1 (fp32
    scratch), G = I + Q H2 (storage dtype)."""
    k, b, _ = Q.shape
    if b % TN:
        raise ValueError(f"block size {b} is not a multiple of {TN}")
    grid = (k * (b // TN), (b + CNP_TM - 1) // CNP_TM, 1)
    last = f"poet_cnp_step_{SUFFIX[dtype_name(G)]}"
    return [
        ("poet_cnp_step_f32", grid, [("ptr", Q), ("ptr", None), ("ptr", H1), ("i32", b), ("i32", k), ("f32", 2.0),
                                     ("i32", 1)]),
        ("poet_cnp_step_f32", grid, [("ptr", Q), ("ptr", H1), ("ptr", H2), ("i32", b), ("i32", k), ("f32", 2.0),
                                     ("i32", 0)]),
        (last, grid, [("ptr", Q), ("ptr", H2), ("ptr", G), ("i32", b), ("i32", k), ("f32", 1.0), ("i32", 0)]),
    ]


class KernelOps(TorchOps):
    """The operations on poet.cu's kernels; subclasses say how a launch runs (`_run`). The dense
    GEMM stays torch's (TorchOps.dense)."""

    name = "kernels"
    cuda_kernels = True

    def _run(self, kernel: str, grid: tuple[int, int, int], args: list[Arg]) -> None:  # pragma: no cover
        raise NotImplementedError

    def cnp(self, Q: Any, dtype: str) -> Any:
        torch = self.torch
        Q = Q.to(torch.float32).contiguous()
        H1, H2 = torch.empty_like(Q), torch.empty_like(Q)
        G = torch.empty(Q.shape, dtype=storage_dtype(torch, dtype), device=Q.device)
        for kernel, grid, args in cnp_plan(Q, H1, H2, G):
            self._run(kernel, grid, args)
            self.launches += 1
        return G

    def bd(self, X: Any, G: Any, *, in_idx: Any = None, out_idx: Any = None, transpose: bool = False,
           x_t: bool = False, y_t: bool = False) -> Any:
        torch = self.torch
        X = X.contiguous()
        G = G.contiguous()
        m, n = (X.shape[1], X.shape[0]) if x_t else tuple(X.shape)
        Y = torch.empty((n, m) if y_t else (m, n), dtype=X.dtype, device=X.device)
        i32 = [None if t is None else t.to(torch.int32).contiguous() for t in (in_idx, out_idx)]
        kernel, grid, args = bd_plan(X, G, Y, in_idx=i32[0], out_idx=i32[1], transpose=transpose, x_t=x_t, y_t=y_t)
        self._run(kernel, grid, args)
        self.launches += 1
        return Y


class CupyOps(KernelOps):
    """KernelOps on a CUDA device through CuPy: every launch checked and synchronized
    (gpucheck.kernels.cupy_module.launch raises KernelError on a refused launch or a fault)."""

    name = "cupy"

    def __init__(self, torch: Any, dev: Any):
        super().__init__(torch, dev)
        import cupy  # noqa: PLC0415 - worker processes and GPU tests only
        import numpy  # noqa: PLC0415

        from ..kernels import cupy_module

        self._np = numpy
        self._cm = cupy_module
        self._device = cupy.cuda.Device(dev.index if dev.index is not None else 0)
        with self._device:
            cupy_module.module("poet")  # compile now: a compile error is a setup problem
            ptr = int(torch.cuda.current_stream(dev).cuda_stream)
            # torch's default stream is the legacy null stream (0): the same one CuPy's null stream is
            self._stream = cupy.cuda.Stream.null if ptr == 0 else cupy.cuda.ExternalStream(ptr)

    def _run(self, kernel: str, grid: tuple[int, int, int], args: list[Arg]) -> None:
        np = self._np
        conv = []
        for kind, v in args:
            if kind == "ptr":
                conv.append(np.uint64(0 if v is None else v.data_ptr()))
            elif kind == "i64":
                conv.append(np.int64(v))
            elif kind == "i32":
                conv.append(np.int32(v))
            else:
                conv.append(np.float32(v))
        with self._device:
            self._cm.launch("poet", kernel, grid, (THREADS, 1, 1), tuple(conv), sync=True, stream=self._stream)
