"""A stand-in `cupy` for the CPU test suite: gpucheck's CuPy glue runs unchanged, and its kernel
launches run the very same .cu source on the CPU (tests/cudaemu.py).

    fake = fakecupy.install(monkeypatch, free=1 << 20)   # sys.modules["cupy"] = fake.module, this test only
    ... code under test: `import cupy` gets `fake.module` ...
    fake.launches                                        # every launch: kernel, grid, block, stream

Two objects: `fake.module` is the stub `cupy` and holds only names the real CuPy 14.2 has, each
class with only members its real counterpart has (tests/test_cupy_conformance.py checks it,
member by member and signature by signature, against the installed cupy-cuda13x wheel); `fake`
(a FakeCupy) is the test's handle: the device's state and the records and controls below, which
the code under test never sees.

What it models (only what gpucheck uses; anything else is an AttributeError, as it would be on
the real classes, which is itself a check that e.g. no memory pool or managed memory is touched):

- one or more devices (`count`), each with `total` bytes, `free` bytes, `sms` SMs and compute
  capability `cc` ("90": sm_90; "75" for a GPU without the sm_80 tensor-core instructions);
  `cupy.cuda.Memory(n)` takes n bytes (cudaMalloc: out of memory raises CUDARuntimeError
  "cudaErrorMemoryAllocation", the only error CuPy 14's Memory raises for it: cupy/cuda/memory.pyx
  Memory.__init__ -> runtime.malloc) and gives them back when its last reference goes, as CuPy
  does. New memory holds junk (0xA5 bytes), not zeros. `take_after_meminfo(n)`: another process
  allocates n bytes right after the next memGetInfo (the race between sizing and allocating).
- `cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(mem, offset))` over such memory
  (1-D: `.data` is a MemoryPointer whose `.ptr` is the address, `.size`, `.nbytes`, contiguous
  slices, `.get()`, `.set()`), runtime.memcpyAsync (device to device, within live allocations, on
  the current stream), Event / get_elapsed_time, Device, Stream.null, ExternalStream,
  get_current_stream.
- `cupy.RawModule(code=..., options=(...))` (keyword-only, options a tuple, as CuPy's): the
  kernels' parameter lists are read from `code` as the C preprocessor expands it.
  `RawModule.get_function(name)` returns a `RawKernel` (what CuPy 14 returns, cupy/_core/raw.pyx):
  its CUfunction handle is `kernel.ptr` (`RawKernel.kernel` is a cupy.cuda.function.Function; a
  RawKernel has no `ptr` of its own) and `max_threads_per_block` is its `__launch_bounds__` (1024
  without). `RawKernel(grid, block, args, shared_mem=0, stream=None)` checks every launch the way
  CuPy 14 would pass its arguments (cupy/cuda/function.pyx `_pointer`: an ndarray as its pointer,
  None as NULL, a NumPy scalar as its own bytes, a Python int as int64, a float as double).
  gpucheck's contract is stricter (gpucheck/kernels/cupy_module.py: NumPy scalars of the
  parameters' exact C types), and so is this stub: a pointer parameter takes an ndarray, None or a
  np.uint64 address, a `gc_u64` parameter exactly a np.uint64, an `int` exactly a np.int32, a
  `float` exactly a np.float32; anything else raises LaunchArgumentError (an AssertionError: a test
  failure, never mistaken for a GPU fault). So does a grid or block dimension below 1, which CuPy
  silently launches as 1 (function.pyx: `max(1, grid[0])`). Grid and block are checked against
  CUDA's limits like the driver does (CUDADriverError), and so is the block against the kernel's
  `__launch_bounds__` (a kernel compiled for 128 threads refuses a launch of 256). Then the kernel
  runs under the emulator with the geometry asked for: keep problems and grids small (every CUDA
  thread is an OS thread; blocks run one after another).
- `fail_next(kernel, message)`: the next launch of `kernel` faults; the error surfaces at the next
  synchronising call (stream or event synchronize, get/set, Event.done), as an asynchronous CUDA
  fault does.
- For eud.memtest: `Event.done` (cudaEventQuery; `not_done(n)` makes the next n queries answer
  False, a kernel still running; `event_polls` counts them),
  `cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func, blockSize, dynamicSMemSize)`
  with `func` a kernel's `RawKernel.kernel.ptr` (another handle is CUDA_ERROR_INVALID_HANDLE),
  answering `occupancy` (a number, or {kernel: number}; default 8; queries in
  `occupancy_queries`), and the device property `l2CacheSize` (`l2`, default 4 KiB).

Not modelled: the exceptions' constructors (CuPy builds CUDARuntimeError from a status code;
gpucheck only catches them, never makes one, and the conformance test checks that), streams
other than the null stream and external ones, memory pools.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import re
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

import cudaemu

JUNK = 0xA5
MEMCPY_D2D = 3  # cudaMemcpyDeviceToDevice
# C parameter type -> the NumPy scalar type gpucheck must pass for it.
SCALARS = {"gc_u64": np.uint64, "unsigned long long": np.uint64, "gc_i64": np.int64, "long long": np.int64,
           "int": np.int32, "gc_u32": np.uint32, "unsigned": np.uint32, "unsigned int": np.uint32,
           "float": np.float32, "double": np.float64}


class LaunchArgumentError(AssertionError):
    """A launch whose arguments CuPy would pass with other types or sizes than the kernel's."""


class CUDARuntimeError(RuntimeError):  # cupy_backends.cuda.api.runtime.CUDARuntimeError
    pass


class CUDADriverError(RuntimeError):  # cupy_backends.cuda.api.driver.CUDADriverError
    pass


@lru_cache(maxsize=None)
def kernel_params(code: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """{kernel: ((C type, name), ...)} of every `extern "C" __global__` entry of `code`, read after
    the C preprocessor (poet.cu declares its entries through macros)."""
    pre = subprocess.run(["g++", "-E", "-P", "-x", "c++", "-"], input=code, capture_output=True, text=True,
                         check=True).stdout
    out = {}
    entry = r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)'
    for m in re.finditer(entry, pre):
        params = []
        for p in m.group(2).split(","):
            ctype, name = re.fullmatch(r"(.*?)\s*(\w+)", " ".join(p.split())).groups()
            params.append((ctype.replace(" *", "*"), name))
        out[m.group(1)] = tuple(params)
    return out


@lru_cache(maxsize=None)
def launch_bounds(code: str) -> dict[str, int]:
    """{kernel: the most threads per block its __launch_bounds__ allows} of every entry point of
    `code` that declares one."""
    pre = subprocess.run(["g++", "-E", "-P", "-x", "c++", "-"], input=code, capture_output=True, text=True,
                         check=True).stdout
    entry = r'extern\s+"C"\s+__global__\s+void\s+__launch_bounds__\s*\(\s*(\d+)[^)]*\)\s*(\w+)\s*\('
    return {m.group(2): int(m.group(1)) for m in re.finditer(entry, pre)}


def _base(ctype: str) -> str:
    return ctype.removeprefix("const ").strip()


def _ctypes_type(ctype: str) -> Any:
    return ctypes.c_void_p if ctype.endswith("*") else np.ctypeslib.as_ctypes_type(np.dtype(SCALARS[_base(ctype)]))


def _emulator(code: str, options: tuple[str, ...]) -> tuple[Any, dict[str, tuple[tuple[str, str], ...]]]:
    """The emulated kernels of `code` with one launcher `emu_<kernel>` per entry point, flushing fp32
    subnormals to zero exactly when CuPy compiling with `options` would (cudaemu.gpu_flushes_subnormals)."""
    params = kernel_params(code)
    driver = "".join(
        f'extern "C" void emu_{k}(EMU_LAUNCH_PARAMS, {", ".join(f"{t} {n}" for t, n in ps)}) '
        f'{{ EMU_LAUNCH({k}({", ".join(n for _, n in ps)})); }}\n' for k, ps in params.items())
    lib = cudaemu.build_text("fakecupy", code, driver, ftz=cudaemu.gpu_flushes_subnormals(options))
    for k, ps in params.items():
        fn = getattr(lib, f"emu_{k}")
        fn.argtypes = [ctypes.c_uint] * 6 + [_ctypes_type(t) for t, _ in ps]
        fn.restype = None
    return lib, params


class Ptr(int):
    """A pointer argument as a launch record keeps it: the address only (holding the array would
    keep its memory alive, which CuPy does not)."""

    def __repr__(self) -> str:
        return f"Ptr({int(self):#x})"


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    stream: int  # the stream's ptr (0: the null stream)
    device: int
    args: tuple  # as passed, with arrays as Ptr


class FakeCupyModule(types.ModuleType):
    """The type of the stub `cupy` module (`FakeCupy.module`): a plain module holding only names
    the real `cupy` has."""


class FakeCupy:
    """The test's handle on one stub `cupy` (see the module doc). `module` is the stub itself;
    to read in tests: launches, modules (RawModules made), live (ptr -> bytes of every Memory not
    freed yet), free, total, syncs (stream ptrs). Devices share one memory account; launches run
    synchronously."""

    def __init__(self, *, count: int = 1, free: int = 1 << 20, total: int = 1 << 30, sms: int = 2,
                 name: str = "Fake GPU", l2: int = 4 << 10, occupancy: int | dict = 8, cc: str = "90"):
        self.count, self.free, self.total, self.sms, self.gpu_name = count, free, total, sms, name
        self.cc = cc
        self.launches: list[Launch] = []
        self.modules: list[Any] = []
        self.live: dict[int, int] = {}  # ptr -> size of every Memory not freed yet (no reference kept)
        self.syncs: list[int] = []  # stream ptrs synchronised
        self.current_device = 0
        self._take_after_meminfo = 0
        self._fail: dict[str, str] = {}
        self._pending: str | None = None
        self._streams: list[Any] = []
        # -- memtest additions: L2 size, occupancy answers, events that are not done at once --
        self.l2 = int(l2)  # getDeviceProperties()["l2CacheSize"]
        self.occupancy = occupancy  # blocks per SM: one number, or {kernel: number} (default 8)
        self.occupancy_queries: list[tuple[str, int, int]] = []  # (kernel, block, dynamic smem)
        self.kernel_handles: dict[int, str] = {}  # RawKernel.kernel.ptr -> kernel name
        self.event_polls = 0  # Event.done queries answered
        self._not_done = 0  # Event.done answers False this many more times
        self.module = _make_module(self)

    # -- test controls -----------------------------------------------------------------------
    def take_after_meminfo(self, nbytes: int) -> None:
        self._take_after_meminfo = int(nbytes)

    def fail_next(self, kernel: str, message: str = "cudaErrorIllegalAddress: an illegal memory access was "
                                                        "encountered") -> None:
        self._fail[kernel] = message

    def live_bytes(self) -> int:
        return sum(self.live.values())

    def not_done(self, polls: int) -> None:
        """The next `polls` Event.done queries answer False (a kernel still running)."""
        self._not_done = int(polls)

    # -- used by the stub classes ------------------------------------------------------------
    def _raise_pending(self) -> None:
        if self._pending is not None:
            msg, self._pending = self._pending, None
            raise CUDARuntimeError(msg)

    def _current_stream(self) -> Any:
        return self._streams[-1] if self._streams else self.module.cuda.Stream.null

    def _check_range(self, ptr: int, nbytes: int, what: str) -> None:
        for start, size in self.live.items():
            if start <= ptr and ptr + nbytes <= start + size:
                return
        raise AssertionError(f"{what}: {nbytes} bytes at {ptr:#x} are not inside a live allocation")


def _namespace(name: str, members: dict[str, Any]) -> types.ModuleType:
    ns = types.ModuleType(name)
    for k, v in members.items():
        setattr(ns, k, v)
    return ns


def _make_module(fake: FakeCupy) -> FakeCupyModule:
    """The stub `cupy` of `fake`: cupy, cupy.cuda, cupy.cuda.runtime and cupy.cuda.driver with the
    names gpucheck uses."""
    mem = _memory_classes(fake)
    streams = _stream_classes(fake)
    kernels = _kernel_classes(fake)
    runtime = _namespace("cupy_backends.cuda.api.runtime", {"CUDARuntimeError": CUDARuntimeError,
                                                            **_runtime_functions(fake)})
    driver = _namespace("cupy_backends.cuda.api.driver", {
        "CUDADriverError": CUDADriverError,
        "occupancyMaxActiveBlocksPerMultiprocessor": _occupancy_function(fake)})
    cuda = _namespace("cupy.cuda", {"runtime": runtime, "driver": driver, "Memory": mem["Memory"],
                                    "MemoryPointer": mem["MemoryPointer"], **streams,
                                    "Device": _device_class(fake)})
    module = FakeCupyModule("cupy")
    module.__spec__ = importlib.machinery.ModuleSpec("cupy", None)  # importlib.util.find_spec works
    module.__version__ = "14.2.0+fakecupy"  # the CuPy it models (tests/test_cupy_conformance.py)
    module.cuda = cuda
    module.ndarray = mem["ndarray"]
    module.RawModule = kernels["RawModule"]
    module.RawKernel = kernels["RawKernel"]
    module.uint64 = np.uint64
    return module


def _memory_classes(fake: FakeCupy) -> dict[str, type]:
    """cupy.cuda.Memory, cupy.cuda.MemoryPointer and cupy.ndarray over the fake's memory."""

    class Memory:  # cupy.cuda.memory.Memory
        def __init__(self, size: int):
            size = int(size)
            if size > fake.free:
                raise CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")
            self.size = size
            self._buf = np.full((size + 7) // 8, JUNK * 0x0101010101010101, np.uint64)
            self.ptr = int(self._buf.ctypes.data)
            self.device_id = fake.current_device
            fake.free -= size
            fake.live[self.ptr] = size

        def __del__(self):
            if fake.live.pop(getattr(self, "ptr", None), None) is not None:  # None: __init__ raised
                fake.free += self.size

    class MemoryPointer:  # cupy.cuda.memory.MemoryPointer
        def __init__(self, mem: Memory, offset: int):
            self.mem, self._offset = mem, int(offset)
            self.ptr = mem.ptr + self._offset
            self.device_id = mem.device_id

    class ndarray:  # noqa: N801 - cupy's name
        def __init__(self, shape: tuple, dtype: Any = float, memptr: MemoryPointer | None = None):
            if memptr is None:  # gpucheck allocates explicitly (cupy.cuda.Memory), never from the pool
                raise AssertionError("the stub only makes arrays over explicit cupy.cuda.Memory")
            self.dtype = np.dtype(dtype)
            (n,) = shape
            raw = memptr.mem._buf.view(np.uint8)[memptr._offset:memptr._offset + n * self.dtype.itemsize]
            if raw.size != n * self.dtype.itemsize:
                raise AssertionError("array larger than its memory")
            self._host = raw.view(self.dtype)
            self.data = memptr

        size = property(lambda self: int(self._host.size))
        nbytes = property(lambda self: int(self._host.nbytes))
        shape = property(lambda self: self._host.shape)

        def __getitem__(self, key: slice) -> "ndarray":
            if not isinstance(key, slice) or (key.step or 1) != 1:
                raise AssertionError("the stub supports contiguous slices only")
            view = self._host[key]
            start = int(view.ctypes.data) - self.data.mem.ptr if view.size else self.data._offset
            return ndarray(view.shape, self.dtype, MemoryPointer(self.data.mem, start))

        def get(self) -> np.ndarray:
            fake._raise_pending()
            return self._host.copy()

        def set(self, arr: np.ndarray) -> None:
            fake._raise_pending()
            if arr.dtype != self.dtype:
                raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
            if arr.shape != self._host.shape:
                raise ValueError(f"shape mismatch: {arr.shape} vs {self._host.shape}")
            self._host[...] = arr

    return {"Memory": Memory, "MemoryPointer": MemoryPointer, "ndarray": ndarray}


def _stream_classes(fake: FakeCupy) -> dict[str, Any]:
    """cupy.cuda.Stream (its null stream only), ExternalStream, Event, get_elapsed_time and
    get_current_stream."""

    class _BaseStream:  # cupy.cuda.stream._BaseStream
        def __init__(self, ptr: int, device_id: int):
            self.ptr, self.device_id = int(ptr), device_id

        def synchronize(self) -> None:
            fake.syncs.append(self.ptr)
            fake._raise_pending()

        def __enter__(self) -> "_BaseStream":
            fake._streams.append(self)
            return self

        def __exit__(self, *args: Any) -> None:
            fake._streams.pop()

    class Stream(_BaseStream):  # cupy.cuda.stream.Stream
        def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False):
            if not null:
                raise AssertionError("the stub makes no streams of its own: gpucheck uses Stream.null and torch's")
            super().__init__(0, -1)

    Stream.null = Stream(null=True)

    class ExternalStream(_BaseStream):  # cupy.cuda.stream.ExternalStream
        def __init__(self, ptr: int, device_id: int = -1):
            if not ptr:
                raise AssertionError("ExternalStream of the null stream: use Stream.null")
            super().__init__(ptr, device_id)

    class Event:  # cupy.cuda.stream.Event
        def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
            self._timing = not disable_timing
            self._t: float | None = None
            self.ptr = id(self)  # the cudaEvent_t handle

        def record(self, stream: Any = None) -> None:  # on `stream`, else the current stream
            self._t = time.perf_counter()

        def synchronize(self) -> None:
            fake._raise_pending()

        @property
        def done(self) -> bool:  # cudaEventQuery: False while work before it runs; a fault raises
            fake.event_polls += 1
            if fake._not_done > 0:
                fake._not_done -= 1
                return False
            fake._raise_pending()
            return True

    def get_elapsed_time(start_event: Event, end_event: Event) -> float:
        if not (start_event._timing and end_event._timing) or start_event._t is None or end_event._t is None:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: event not recorded or without timing")
        return (end_event._t - start_event._t) * 1000.0

    def get_current_stream(device_id: int = -1) -> Any:
        return fake._current_stream()

    return {"Stream": Stream, "ExternalStream": ExternalStream, "Event": Event, "get_elapsed_time": get_elapsed_time,
            "get_current_stream": get_current_stream}


def _device_class(fake: FakeCupy) -> type:
    class Device:  # cupy.cuda.device.Device
        def __init__(self, device: int | None = None):
            self.id = fake.current_device if device is None else int(device)
            self._prev: list[int] = []

        def _check(self) -> None:
            if not 0 <= self.id < fake.count:
                raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

        def use(self) -> None:
            self._check()
            fake.current_device = self.id

        def __enter__(self) -> "Device":
            self._check()
            self._prev.append(fake.current_device)
            fake.current_device = self.id
            return self

        def __exit__(self, *args: Any) -> None:
            fake.current_device = self._prev.pop()

        @property
        def compute_capability(self) -> str:
            self._check()
            return fake.cc

    return Device


def _kernel_classes(fake: FakeCupy) -> dict[str, type]:
    """cupy.RawModule, the cupy.RawKernel its get_function returns, and the
    cupy.cuda.function.Function that is a RawKernel's `kernel`."""

    class Function:  # cupy.cuda.function.Function
        def __init__(self, module: Any, funcname: str):
            self._module = module  # what keeps it loaded
            self.ptr = id(self)  # the CUfunction handle (driver.occupancy* take it)
            fake.kernel_handles[self.ptr] = funcname

    class RawKernel:  # cupy._core.raw.RawKernel
        def __init__(self, code: str, name: str, options: tuple = ()):
            self.code, self.name, self.options = code, name, options
            self._lib: Any = None
            self._params: tuple[tuple[str, str], ...] = ()
            self._function: Any = None

        @property
        def kernel(self) -> Function:
            return self._function

        @property
        def max_threads_per_block(self) -> int:  # cuFuncGetAttribute: __launch_bounds__, else 1024
            return launch_bounds(self.code).get(self.name, 1024)

        def __call__(self, grid: tuple, block: tuple, args: tuple, **kwargs: Any) -> None:
            _launch(fake, self, grid, block, args, **kwargs)

    class RawModule:  # cupy._core.raw.RawModule
        def __init__(self, *, code: str | None = None, options: tuple = ()):
            if not isinstance(options, tuple):
                raise TypeError(f"Argument 'options' has incorrect type (expected tuple, got {type(options).__name__})")
            self.code, self.options = code, options
            self._lib: Any = None
            self._params: dict[str, tuple[tuple[str, str], ...]] = {}
            fake.modules.append(self)

        def compile(self) -> None:
            if self._lib is None:
                self._lib, self._params = _emulator(self.code, self.options)

        def get_function(self, name: str) -> RawKernel:
            self.compile()
            if name not in self._params:
                raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name})")
            ker = RawKernel(self.code, name, self.options)
            ker._lib, ker._params, ker._function = self._lib, self._params[name], Function(self, name)
            return ker

    return {"RawModule": RawModule, "RawKernel": RawKernel}


def _launch(fake: FakeCupy, ker: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0,
            stream: Any = None) -> None:
    """A launch as cupy.cuda.function.Function.__call__(grid, block, args, shared_mem, stream) makes
    it: checked like the driver (and gpucheck's argument contract), then run under the emulator."""
    if not (isinstance(grid, tuple) and isinstance(block, tuple)):
        raise TypeError("grid and block must be tuples")  # Function.__call__(tuple grid, tuple block, ...)
    g = tuple(int(x) for x in (grid + (1, 1))[:3])
    b = tuple(int(x) for x in (block + (1, 1))[:3])
    if min(g + b) < 1:
        raise LaunchArgumentError(f"{ker.name}: grid {g} block {b}: CuPy would launch a dimension below 1 as 1")
    if not (g[0] <= 2**31 - 1 and g[1] <= 65535 and g[2] <= 65535 and b[0] <= 1024 and b[1] <= 1024 and b[2] <= 64
            and b[0] * b[1] * b[2] <= min(1024, ker.max_threads_per_block)):
        raise CUDADriverError("CUDA_ERROR_INVALID_VALUE: invalid argument")
    vals = check_args(ker.name, ker._params, args)
    s = stream if stream is not None else fake._current_stream()
    kept = tuple(Ptr(v) if _device_pointer(a) is not None else a for a, v in zip(args, vals))
    fake.launches.append(Launch(ker.name, g, b, s.ptr, fake.current_device, kept))
    getattr(ker._lib, f"emu_{ker.name}")(*g, *b, *vals)
    if ker.name in fake._fail:
        fake._pending = fake._fail.pop(ker.name)


def _occupancy_function(fake: FakeCupy) -> Any:
    def occupancyMaxActiveBlocksPerMultiprocessor(func: int, blockSize: int, dynamicSMemSize: int) -> int:  # noqa: N802,N803
        name = fake.kernel_handles.get(func) if isinstance(func, int) else None
        if name is None:
            raise CUDADriverError("CUDA_ERROR_INVALID_HANDLE: invalid resource handle")
        fake.occupancy_queries.append((name, int(blockSize), int(dynamicSMemSize)))
        occ = fake.occupancy
        return int(occ.get(name, 8) if isinstance(occ, dict) else occ)

    return occupancyMaxActiveBlocksPerMultiprocessor


def _runtime_functions(fake: FakeCupy) -> dict[str, Any]:
    """cupy.cuda.runtime's functions gpucheck calls (CuPy's names and parameter names)."""

    def memGetInfo() -> tuple[int, int]:  # noqa: N802
        free = fake.free
        if fake._take_after_meminfo:
            fake.free -= min(fake.free, fake._take_after_meminfo)
            fake._take_after_meminfo = 0
        return free, fake.total

    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:  # noqa: N802
        if kind != MEMCPY_D2D:
            raise AssertionError(f"memcpyAsync kind {kind}: only device-to-device is expected")
        if stream != fake._current_stream().ptr:
            raise AssertionError(f"memcpyAsync on stream {stream:#x}, not the current stream")
        fake._check_range(dst, size, "memcpyAsync destination")
        fake._check_range(src, size, "memcpyAsync source")
        ctypes.memmove(dst, src, size)

    def getDeviceProperties(device: int) -> dict[str, Any]:  # noqa: N802
        if not 0 <= device < fake.count:
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        return {"name": fake.gpu_name.encode(), "multiProcessorCount": fake.sms, "major": int(fake.cc[:-1]),
                "minor": int(fake.cc[-1]), "totalGlobalMem": fake.total, "l2CacheSize": fake.l2}

    def getDeviceCount() -> int:  # noqa: N802
        return fake.count

    def getDevice() -> int:  # noqa: N802
        return fake.current_device

    def runtimeGetVersion() -> int:  # noqa: N802
        return 13000

    return {"getDeviceCount": getDeviceCount, "getDevice": getDevice, "getDeviceProperties": getDeviceProperties,
            "memGetInfo": memGetInfo, "runtimeGetVersion": runtimeGetVersion, "memcpyAsync": memcpyAsync,
            "memcpyDeviceToDevice": MEMCPY_D2D}


def _device_pointer(a: Any) -> int | None:
    """The address CuPy passes for a device array argument (its `.data.ptr`), else None."""
    ptr = getattr(getattr(a, "data", None), "ptr", None)
    return ptr if isinstance(ptr, int) else None


def check_args(kernel: str, params: tuple[tuple[str, str], ...], args: tuple) -> list[Any]:
    """The launch's values for the emulated kernel; LaunchArgumentError where CuPy would pass an
    argument with another type than the parameter's (see the module doc)."""
    if not isinstance(args, tuple):
        raise LaunchArgumentError(f"{kernel}: args must be a tuple, not {type(args).__name__}")
    if len(args) != len(params):
        raise LaunchArgumentError(f"{kernel}: {len(args)} arguments for {len(params)} parameters")
    vals = []
    for i, ((ctype, name), a) in enumerate(zip(params, args)):
        if ctype.endswith("*"):
            if a is None:
                vals.append(None)
                continue
            ptr = _device_pointer(a)
            if ptr is not None:
                vals.append(ptr)
                continue
            if type(a) is np.uint64:
                vals.append(int(a))
                continue
        elif type(a) is SCALARS[_base(ctype)]:
            vals.append(a.item())
            continue
        raise LaunchArgumentError(f"{kernel}: parameter {i} `{ctype} {name}` got {type(a).__name__} {a!r} "
                                  f"({_as_cupy_passes(a)})")
    return vals


def _as_cupy_passes(a: Any) -> str:
    if isinstance(a, bool):
        return "CuPy passes it as 1 byte"
    if isinstance(a, int):
        return "CuPy passes a Python int as 8 bytes (int64)"
    if isinstance(a, float):
        return "CuPy passes a Python float as 8 bytes (double)"
    if isinstance(a, np.generic):
        return f"CuPy passes it as {a.itemsize} bytes ({a.dtype})"
    return "CuPy cannot pass it"


def install(monkeypatch: Any, **kw: Any) -> FakeCupy:
    """A FakeCupy whose stub module is `cupy` for one test (monkeypatch undoes it), with gpucheck's compiled-kernel
    caches emptied for the test too, so that no stub module outlives it."""
    from gpucheck.kernels import cupy_module

    fake = FakeCupy(**kw)
    monkeypatch.setitem(sys.modules, "cupy", fake.module)
    monkeypatch.setattr(cupy_module, "_modules", {})
    monkeypatch.setattr(cupy_module, "_functions", {})
    return fake
