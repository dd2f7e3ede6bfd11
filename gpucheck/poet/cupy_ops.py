"""The POET operations on the CUDA kernels of gpucheck/kernels/poet.cu, launched through CuPy.

    ops = CupyOps(torch, dev)        # compiles poet.cu once (KernelError if it cannot)
    G = ops.cnp(Q, "bf16")           # 3 launches of poet_cnp_step_*
    Y = ops.bd(X, G, in_idx=perm)    # 1 launch: poet_bd_mma_* (tensor cores) for bf16/fp16 on
                                     # sm_80+, poet_bd_apply_* (CUDA cores) otherwise
    Ys = ops.bd(X, G, in_idx=perm, unit="cuda")   # the same on the CUDA-core kernel
    ops.sync()                       # wait once where the results are needed; KernelError on a fault

Tensors stay torch tensors (torch allocates, the kernels write through raw device pointers) on
torch's current stream, so the verification in gpucheck.poet.invariants reads them directly and
an injected bit flip lands on exactly the kernel's output. Launches are not synchronised one by
one: `sync()` waits for those since the last one and names them if one faulted. The launch
geometry and argument lists are built by `KernelOps` in plain Python: the CPU tests run the very
same plans on the same .cu source under tests/cudaemu.py, so everything but the CuPy call itself
is tested without a GPU.
"""

from __future__ import annotations

import abc
from typing import Any

from .ortho import TorchOps, storage_dtype

THREADS = 256  # threads per block (POET_THREADS, the kernels' __launch_bounds__)
TN = 32  # columns per tile (POET_TN)
TK = 32  # inner-dimension chunk per tile (POET_TK)
BD_TM = 128  # rows per tile of poet_bd_apply (POET_BD_TM)
CNP_TM = 64  # rows per tile of poet_cnp_step (POET_CNP_TM)
# poet_bd_mma (tensor cores): 4 warps, 64 rows x one whole diagonal block per thread block
MMA_THREADS = 128  # POET_MMA_THREADS
MMA_TM = 64  # POET_MMA_TM: rows per thread block (sub-tiles of 64 rows for b <= 128, of 32 above)
MMA_TN = 32  # POET_MMA_TN: output columns per warp and pass
MMA_KC = 64  # POET_MMA_KC: inner-dimension chunk of G staged per pass (32 with sub-tiles of 32 rows)
MMA_BMAX = 256  # POET_MMA_BMAX: the largest block size
MMA_PAD = 8  # POET_MMA_PAD: 16-bit elements of padding per shared row
MMA_MIN_BLOCKS = 8  # POET_MMA_MIN_BLOCKS: __launch_bounds__' resident blocks per SM (registers <= 64)
MMA_DTYPES = ("bf16", "fp16")  # fp32 has no tensor-core kernel (tf32 would round its inputs)
MMA_MIN_CC = 80  # mma.sync m16n8k16 with bf16: compute capability 8.0 and later
SUFFIX = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
DTYPE_OF = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

# CUDA launch limits (every GPU gpucheck supports, compute capability >= 7.0).
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
MAX_BLOCK_THREADS = 1024
MAX_STATIC_SHARED = 48 * 1024  # bytes of static __shared__ per block
# The most rows one block-diagonal launch covers (gridDim.y <= 65535 row tiles; the tensor-core
# kernel's tiles of MMA_TM rows are the smaller): m of x, and n for the launches on W (n x n).
MAX_ROWS = MAX_GRID_YZ * min(BD_TM, MMA_TM)
INT32_MAX = 2**31 - 1

# An argument of a launch: (kind, value) with kind "ptr" (a tensor or None), "i64", "i32", "f32".
Arg = tuple[str, Any]
Launch = tuple[str, tuple[int, int, int], list[Arg]]


def dtype_name(t: Any) -> str:
    return DTYPE_OF[str(t.dtype).removeprefix("torch.")]


def tile_shared_bytes(tm: int) -> int:
    """Static shared memory of poet_tile_mm<TM>: As[TK][TM + 1] and Bs[TK][TN + 1], fp32."""
    return 4 * (TK * (tm + 1) + TK * (TN + 1))


def mma_shared_bytes() -> int:
    """Static shared memory of poet_bd_mma (struct poet_mma_smem): the operand stripe of a
    sub-tile (64 rows of up to 128 columns or 32 of up to 256, 16-bit, padded rows), a chunk of G
    (64 x 32 or 32 x 64, padded), and the block's input and output indices (int)."""
    return 2 * (MMA_TM * (MMA_BMAX // 2 + MMA_PAD) + MMA_KC * (MMA_TN + MMA_PAD)) + 4 * 2 * MMA_BMAX


def block_of(kernel: str) -> tuple[int, int, int]:
    """The thread block a kernel of poet.cu is launched with."""
    return (MMA_THREADS, 1, 1) if kernel.startswith("poet_bd_mma_") else (THREADS, 1, 1)


def check_grid(grid: tuple[int, int, int], kernel: str) -> None:
    """ValueError when the driver would refuse the launch geometry (rather than a KernelError
    from the launch, which reads as a GPU fault)."""
    x, y, z = grid
    if not (1 <= x <= MAX_GRID_X and 1 <= y <= MAX_GRID_YZ and 1 <= z <= MAX_GRID_YZ):
        raise ValueError(f"{kernel}: grid {grid} is outside CUDA's limits (x <= {MAX_GRID_X}, y, z <= {MAX_GRID_YZ})")


def size_problem(m: int, n: int) -> str | None:
    """Why the kernels cannot run a problem of m rows and n features (None: they can)."""
    for what, v in (("rows (m)", m), ("size (n)", n)):
        if v > MAX_ROWS:
            return (f"{what} {v} is more than the CUDA kernels' {MAX_ROWS} "
                    f"(gridDim.y <= {MAX_GRID_YZ} tiles of {min(BD_TM, MMA_TM)} rows)")
    return None


def launch_args(args: list[Arg], np: Any) -> tuple:
    """The arguments of a launch as NumPy scalars of exactly the kernel parameters' C types, which
    is what CuPy passes (a Python int would go as 8 bytes, misread by an `int` parameter):
    pointers (a tensor's data_ptr(), None: null) as uint64, "i64" (gc_i64) as int64, "i32" (int)
    as int32, "f32" (float) as float32. ValueError for a value out of its type's range."""
    out = []
    for kind, v in args:
        if kind == "ptr":
            out.append(np.uint64(0 if v is None else int(v.data_ptr())))
        elif kind in ("i64", "i32"):
            bits = 64 if kind == "i64" else 32
            iv = int(v)
            if not -(2 ** (bits - 1)) <= iv < 2 ** (bits - 1):
                raise ValueError(f"launch argument {iv} does not fit int{bits}")
            out.append(np.int64(iv) if kind == "i64" else np.int32(iv))
        elif kind == "f32":
            out.append(np.float32(v))
        else:
            raise ValueError(f"unknown launch argument kind {kind!r}")
    return tuple(out)


def bd_plan(X: Any, G: Any, Y: Any, *, in_idx: Any = None, out_idx: Any = None, transpose: bool = False,
            x_t: bool = False, y_t: bool = False, tensor_cores: bool = False) -> Launch:
    """The launch of poet_bd_apply_<dtype> (or, with tensor_cores, poet_bd_mma_<dtype>: bf16 and
    fp16, b <= MMA_BMAX) computing Y (allocated, contiguous) from X and G; the index tensors must
    be int32 (or None). Both kernels take the same arguments."""
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
    for name, t in (("in_idx", in_idx), ("out_idx", out_idx)):
        # the kernel reads `const int*`: an int64 index would be misread, a short one overrun
        if t is not None and (str(t.dtype) != "torch.int32" or not t.is_contiguous() or tuple(t.shape) != (n,)):
            raise ValueError(f"{name} must be a contiguous int32 tensor of length {n}")
    if m > INT32_MAX or n > INT32_MAX:
        raise ValueError(f"{m} x {n} does not fit the kernel's int sizes")
    if tensor_cores:
        if dt not in MMA_DTYPES:
            raise ValueError(f"the tensor-core kernel takes {' and '.join(MMA_DTYPES)}, not {dt}")
        if b > MMA_BMAX:
            raise ValueError(f"the tensor-core kernel takes blocks of up to {MMA_BMAX}, not {b}")
        grid = (k, max(1, (m + MMA_TM - 1) // MMA_TM), 1)
        kernel = f"poet_bd_mma_{SUFFIX[dt]}"
    else:
        grid = (k * (b // TN), max(1, (m + BD_TM - 1) // BD_TM), 1)
        kernel = f"poet_bd_apply_{SUFFIX[dt]}"
    check_grid(grid, kernel)
    args: list[Arg] = [("ptr", X), ("i64", x_rs), ("i64", x_cs), ("ptr", G), ("ptr", Y), ("i64", y_rs),
                       ("i64", y_cs), ("ptr", in_idx), ("ptr", out_idx), ("i32", m), ("i32", b), ("i32", k),
                       ("i32", 1 if transpose else 0)]
    return kernel, grid, args


def cnp_plan(Q: Any, H1: Any, H2: Any, G: Any) -> list[Launch]:
    """The three Horner launches of poet_cnp_step: H1 = 2I + Q(2I + Q), H2 = 2I + Q H1 (fp32
    scratch), G = I + Q H2 (storage dtype)."""
    k, b, _ = Q.shape
    if b % TN:
        raise ValueError(f"block size {b} is not a multiple of {TN}")
    for name, t in (("Q", Q), ("H1", H1), ("H2", H2), ("G", G)):
        if tuple(t.shape) != (k, b, b) or not t.is_contiguous():
            raise ValueError(f"cnp_plan needs contiguous ({k}, {b}, {b}) tensors; {name} is not one")
        if name != "G" and str(t.dtype) != "torch.float32":
            raise ValueError(f"{name} must be float32 (the kernel reads and writes fp32 scratch)")
    grid = (k * (b // TN), (b + CNP_TM - 1) // CNP_TM, 1)
    last = f"poet_cnp_step_{SUFFIX[dtype_name(G)]}"
    check_grid(grid, last)
    return [
        ("poet_cnp_step_f32", grid, [("ptr", Q), ("ptr", None), ("ptr", H1), ("i32", b), ("i32", k), ("f32", 2.0),
                                     ("i32", 1)]),
        ("poet_cnp_step_f32", grid, [("ptr", Q), ("ptr", H1), ("ptr", H2), ("i32", b), ("i32", k), ("f32", 2.0),
                                     ("i32", 0)]),
        (last, grid, [("ptr", Q), ("ptr", H2), ("ptr", G), ("i32", b), ("i32", k), ("f32", 1.0), ("i32", 0)]),
    ]


class KernelOps(TorchOps, abc.ABC):
    """The operations on poet.cu's kernels; subclasses say how a launch runs (`_run`) and how to
    wait for launches (`sync`). The dense GEMM stays torch's (TorchOps.dense).

    Units: bf16 and fp16 block-diagonal applies run on the tensor-core kernel by default, with
    the CUDA-core kernel as the second unit a check compares them with ("tensor", "cuda"); fp32,
    and every dtype where `tensor_cores` is off (a GPU older than sm_80), on the CUDA-core kernel
    only."""

    name = "kernels"
    cuda_kernels = True
    tensor_cores = True

    @abc.abstractmethod
    def _run(self, kernel: str, grid: tuple[int, int, int], args: list[Arg]) -> None:  # pragma: no cover
        """Launch `kernel` of poet.cu with `args` (see launch_args) on `grid`, block_of(kernel)."""

    def units(self, dtype: str) -> tuple[str, ...]:
        return ("tensor", "cuda") if self.tensor_cores and dtype in MMA_DTYPES else ("cuda",)

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
           x_t: bool = False, y_t: bool = False, unit: str | None = None) -> Any:
        torch = self.torch
        units = self.units(dtype_name(X))
        unit = units[0] if unit is None else unit
        if unit not in units:
            raise ValueError(f"no {unit!r} unit for {dtype_name(X)} here (units: {', '.join(units)})")
        X = X.contiguous()
        G = G.contiguous()
        m, n = (X.shape[1], X.shape[0]) if x_t else tuple(X.shape)
        Y = torch.empty((n, m) if y_t else (m, n), dtype=X.dtype, device=X.device)
        i32 = [None if t is None else t.to(torch.int32).contiguous() for t in (in_idx, out_idx)]
        kernel, grid, args = bd_plan(X, G, Y, in_idx=i32[0], out_idx=i32[1], transpose=transpose, x_t=x_t, y_t=y_t,
                                     tensor_cores=unit == "tensor")
        self._run(kernel, grid, args)
        self.launches += 1
        return Y


class CupyUnavailable(RuntimeError):
    """CuPy is installed but cannot use the GPU (a CUDA runtime that the driver does not support,
    no device visible to it, ...): an installation matter, not a GPU fault."""


class CupyOps(KernelOps):
    """KernelOps on a CUDA device through CuPy: a refused launch raises KernelError at once
    (gpucheck.kernels.cupy_module.launch); a fault while a kernel ran surfaces at `sync()`, which
    waits for the launches since the last one and names them. No host sync per launch.

    The kernels write into torch-allocated tensors through their raw device pointers, on torch's
    current stream of the device (looked up at every launch: CuPy's own current stream is not
    torch's), so they are ordered with the torch operations around them; a caller that reads a
    result on the host calls `sync()` first, so that a fault is a KernelError naming our kernel
    rather than torch's report of a sticky CUDA error."""

    name = "cupy"

    def __init__(self, torch: Any, dev: Any):
        super().__init__(torch, dev)
        import cupy  # noqa: PLC0415 - worker processes and GPU tests only
        import numpy  # noqa: PLC0415

        from ..kernels import cupy_module

        self._cp = cupy
        self._np = numpy
        self._cm = cupy_module
        index = dev.index if dev.index is not None else int(torch.cuda.current_device())
        self._index = int(index)
        # The device every tensor of a launch must be on (the kernels get raw pointers). An
        # attribute so that tests/test_poet_fakecupy.py can run this class on CPU tensors.
        self.tensor_device = torch.device("cuda", self._index)
        self._stream_ptr: int | None = None
        self._stream: Any = None
        self._pending: list[tuple[str, tuple[int, int, int], Any]] = []  # (kernel, grid, stream) since sync()
        cuda_errors = (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
            if self._index >= count:
                raise CupyUnavailable(f"CuPy {cupy.__version__} sees {count} GPU(s), not cuda:{self._index}")
            self._device = cupy.cuda.Device(self._index)
            with self._device:
                cc = self._device.compute_capability  # touches the device: a CUDA error surfaces here
            self.tensor_cores = int(cc) >= MMA_MIN_CC
        except cuda_errors as e:
            raise CupyUnavailable(f"CuPy {cupy.__version__} cannot use cuda:{self._index}: {e}") from None
        with self._device:
            cupy_module.module("poet")  # compile now: a compile error (KernelError) is a setup problem

    def _current_stream(self) -> Any:
        """torch's current stream on this device as a CuPy stream."""
        ptr = int(self.torch.cuda.current_stream(self.dev).cuda_stream)
        if ptr != self._stream_ptr:
            # torch's default stream is the legacy null stream (0): the same one CuPy's null stream is
            cp = self._cp
            self._stream = cp.cuda.Stream.null if ptr == 0 else cp.cuda.ExternalStream(ptr, self._index)
            self._stream_ptr = ptr
        return self._stream

    def _run(self, kernel: str, grid: tuple[int, int, int], args: list[Arg]) -> None:
        for kind, v in args:
            if kind == "ptr" and v is not None and v.device != self.tensor_device:
                raise ValueError(f"{kernel}: a tensor on {v.device} passed to a launch on {self.tensor_device}")
        conv = launch_args(args, self._np)
        stream = self._current_stream()
        with self._device:
            self._cm.launch("poet", kernel, grid, block_of(kernel), conv, sync=False, stream=stream)
        gx, gy, gz = grid
        self._pending.append((kernel, (gx, gy, gz), stream))

    def sync(self) -> None:
        """Wait for every launch since the last sync (on each stream they went to); KernelError
        naming them (the one, or all of them) when a kernel faulted."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        cp = self._cp
        streams = list({int(s.ptr): s for _, _, s in pending}.values())  # each stream once
        try:
            with self._device:
                for stream in streams:
                    stream.synchronize()
        except (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError) as e:
            if len(pending) == 1:
                kernel, grid, _ = pending[0]
                raise self._cm.KernelError("poet", kernel, str(e), grid, block_of(kernel)) from e
            names = "; ".join(f"{k} grid={g} block={block_of(k)}" for k, g, _ in pending)
            raise self._cm.KernelError("poet", f"one of {len(pending)} launches ({names})", str(e)) from e
