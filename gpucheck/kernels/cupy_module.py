"""Compile gpucheck's kernel sources with CuPy (NVRTC) once per process and device, and launch
them with every launch checked.

    from gpucheck.kernels.cupy_module import launch
    launch("poet", "poet_bd_apply_f32", grid, block, (numpy.uint64(x_ptr), ..., numpy.int32(m)), sync=True)

Arguments go to the kernel as CuPy passes them: a cupy.ndarray as its pointer, a NumPy scalar as
its own type, but a Python int as 8 bytes (int64) and a float as a double, which an `int` or
`float` parameter misreads: pass NumPy scalars of the parameters' exact C types.

A launch that the driver refuses, or a kernel that faults (illegal address, ...) is raised as
`KernelError`, naming the source, the kernel, the grid and block and CUDA's words: a check turns
it into an `error` or a `fail` for that GPU, never into a traceback. With `sync=True` the launch is
followed by a stream synchronize, so an asynchronous fault is caught at the launch that caused
it. CuPy also keeps compiled binaries on disk (~/.cupy/kernel_cache), so later processes skip
NVRTC. Only imported in worker processes (and GPU tests).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from . import source

# Compile options: C++17, no fast-math (the checks compare against exact bounds). CuPy 14.2's
# RawModule passes NVRTC more than these, in this order (cupy/_core/core.pyx
# assemble_cupy_compiler_options, cupy/cuda/compiler.py _compile_with_cache_cuda and
# _compile_using_nvrtc_no_warning): -I of its bundled CCCL (cub, thrust, libcudacxx); these
# options (plus --std=c++17 only when they name no standard); -I of CuPy's and of the CUDA
# headers (CuPy compiles nothing without CUDA headers: RuntimeError); -ftz=true; -arch=sm_XX (XX: the device's compute capability, capped at NVRTC's
# newest; compute_XX, i.e. PTX, with CUPY_COMPILE_WITH_PTX=1); --device-as-default-execution-space
# (and --pch, --device-debug --generate-line-info only with CUPY_NVRTC_USE_PCH /
# CUPY_CUDA_COMPILE_WITH_DEBUG). CuPy 13 appends -ftz=true too. NVRTC honours the last
# occurrence of an option, so an "-ftz=false" here has no effect: fp32 arithmetic written in C
# (e.g. __fmaf_rn, +) compiles to its .ftz form on the GPU (fp32 subnormal inputs and results
# flushed to zero), unlike the IEEE emulation of the CPU tests. Only inline PTX without .ftz
# keeps gradual underflow under CuPy. tests/cupy_options.py reads the full list from the
# installed CuPy; tests/test_cupy_options.py checks this comment against it and NVRTC.
OPTIONS: tuple[str, ...] = ("--std=c++17",)

_lock = threading.Lock()
_modules: dict[tuple[str, int], Any] = {}


class KernelError(RuntimeError):
    """A kernel could not be compiled or launched, or faulted while running."""

    def __init__(self, module: str, kernel: str, message: str, grid: Any = None, block: Any = None):
        where = f"{module}:{kernel}"
        if grid is not None:
            where += f" grid={tuple(grid)} block={tuple(block or ())}"
        super().__init__(f"CUDA kernel {where}: {message}")
        self.module = module
        self.kernel = kernel


def _device(name: str) -> int:
    """The current CUDA device, or KernelError when CuPy cannot use one."""
    import cupy  # noqa: PLC0415

    try:
        return int(cupy.cuda.runtime.getDevice())
    except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as e:
        raise KernelError(name, "*", f"CuPy cannot use the CUDA device: {e}") from e


def module(name: str, dev: int | None = None) -> Any:
    """The compiled `cupy.RawModule` of source `name` for device `dev` (default: the current
    one), compiled once and cached."""
    import cupy  # noqa: PLC0415

    key = (name, _device(name) if dev is None else dev)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            try:
                mod = cupy.RawModule(code=source(name), options=OPTIONS)
                mod.compile()
            except Exception as e:  # cupy.cuda.compiler.CompileException carries NVRTC's log
                raise KernelError(name, "*", f"compile failed: {e}") from e
            _modules[key] = mod
        return mod


def launch(name: str, kernel: str, grid: Sequence[int], block: Sequence[int], args: tuple,
           *, sync: bool = False, stream: Any = None) -> None:
    """Launch `kernel` of source `name`; raise KernelError on a refused launch or (with `sync`)
    on a fault while it ran."""
    import cupy  # noqa: PLC0415

    fn = _function(name, kernel)
    try:
        if stream is not None:
            with stream:
                fn(tuple(grid), tuple(block), args)
        else:
            fn(tuple(grid), tuple(block), args)
        if sync:
            (stream or cupy.cuda.get_current_stream()).synchronize()
    except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as e:
        raise KernelError(name, kernel, str(e), grid, block) from e
    except (TypeError, ValueError) as e:  # arguments CuPy cannot pass: gpucheck's bug, not the GPU's
        raise KernelError(name, kernel, f"bad launch arguments: {e}", grid, block) from e


def occupancy(name: str, kernel: str, block: int, dynamic_smem: int = 0) -> int:
    """How many blocks of `block` threads of `kernel` one SM of the current device holds at once
    (cuOccupancyMaxActiveBlocksPerMultiprocessor, the driver call behind the runtime's
    cudaOccupancyMaxActiveBlocksPerMultiprocessor), from the compiled kernel's registers and
    shared memory: SMs x this is one wave. KernelError when the driver refuses the question."""
    import cupy  # noqa: PLC0415

    fn = _function(name, kernel)
    try:
        # `fn` is a cupy.RawKernel: its CUfunction handle is `fn.kernel.ptr` (RawKernel.kernel, a
        # cupy.cuda.function.Function, cupy/_core/raw.pyx); a RawKernel has no `ptr` of its own.
        handle = fn.kernel.ptr
        return int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, int(block), int(dynamic_smem)))
    except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as e:
        raise KernelError(name, kernel, f"occupancy query for blocks of {block} threads failed: {e}") from e


_functions: dict[tuple[str, int, str], Any] = {}


def _function(name: str, kernel: str) -> Any:
    """The kernel's `cupy.RawModule.get_function` result (a `cupy.RawKernel`), looked up once per
    device: a launch costs one device query and a dict lookup."""
    dev = _device(name)
    key = (name, dev, kernel)
    fn = _functions.get(key)
    if fn is None:
        mod = module(name, dev)
        try:
            fn = mod.get_function(kernel)
        except Exception as e:
            raise KernelError(name, kernel, f"no such kernel: {e}") from e
        with _lock:
            _functions[key] = fn
    return fn
