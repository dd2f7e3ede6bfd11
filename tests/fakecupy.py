"""A stand-in `cupy` for the CPU test suite: gpucheck's CuPy glue runs unchanged, and its kernel
launches run the very same .cu source on the CPU (tests/cudaemu.py).

    fake = fakecupy.install(monkeypatch, free=1 << 20)   # sys.modules["cupy"], for this test only
    ... code under test: `import cupy` gets `fake` ...
    fake.launches                                        # every launch: kernel, grid, block, stream

What it models (only what gpucheck uses; anything else is an AttributeError, which is itself a
check that e.g. no memory pool or managed memory is touched):

- one or more devices (`count`), each with `total` bytes, `free` bytes, `sms` SMs and compute
  capability `cc` ("90": sm_90; "75" for a GPU without the sm_80 tensor-core instructions);
  `cupy.cuda.Memory(n)` takes n bytes (cudaMalloc: out of memory raises CUDARuntimeError
  "cudaErrorMemoryAllocation", or cupy.cuda.memory.OutOfMemoryError with `oom="pool"`) and gives
  them back when its last reference goes, as CuPy does. New memory holds junk (0xA5 bytes), not
  zeros. `take_after_meminfo(n)`: another process allocates n bytes right after the next
  memGetInfo (the race between sizing and allocating).
- `cupy.ndarray` over such memory (1-D: `.data.ptr`, `.size`, `.nbytes`, slices, `.get()`,
  `.set()`), `cupy.cuda.MemoryPointer`, runtime.memcpyAsync (device to device, within live
  allocations, on the current stream), Event / get_elapsed_time, Device, Stream.null,
  ExternalStream, get_current_stream.
- `cupy.RawModule(code=...)`: the kernels' parameter lists are read from `code` as the C
  preprocessor expands it, and every launch is checked the way CuPy 14 would pass its arguments
  (cupy/cuda/function.pyx `_pointer`: an ndarray as its pointer, None as NULL, a NumPy scalar as
  its own bytes, a Python int as int64, a float as double). gpucheck's contract is stricter
  (gpucheck/kernels/cupy_module.py: NumPy scalars of the parameters' exact C types), and so is
  this stub: a pointer parameter takes an ndarray, None or a np.uint64 address, a `gc_u64`
  parameter exactly a np.uint64, an `int` exactly a np.int32, a `float` exactly a np.float32;
  anything else raises LaunchArgumentError (an AssertionError: a test failure, never mistaken
  for a GPU fault). Grid and block are checked against CUDA's limits like the driver does
  (CUDADriverError), and so is the block against the kernel's `__launch_bounds__` (a kernel
  compiled for 128 threads refuses a launch of 256). Then the kernel runs under the emulator with the geometry asked for: keep
  problems and grids small (every CUDA thread is an OS thread; blocks run one after another).
- `fail_next(kernel, message)`: the next launch of `kernel` faults; the error surfaces at the next
  synchronising call (stream or event synchronize, get/set, Event.done), as an asynchronous CUDA
  fault does.
- For eud.memtest: `Event.done` (cudaEventQuery; `not_done(n)` makes the next n queries answer
  False, a kernel still running; `event_polls` counts them), `RawModule.get_function(...).ptr` and
  `cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, block, smem)` answering
  `occupancy` (a number, or {kernel: number}; default 8; queries in `occupancy_queries`), and the
  device property `l2CacheSize` (`l2`, default 4 KiB).
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


class CUDARuntimeError(RuntimeError):
    pass


class CUDADriverError(RuntimeError):
    pass


class OutOfMemoryError(MemoryError):  # cupy.cuda.memory.OutOfMemoryError subclasses MemoryError
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


def _emulator(code: str) -> tuple[Any, dict[str, tuple[tuple[str, str], ...]]]:
    """The emulated kernels of `code` with one launcher `emu_<kernel>` per entry point."""
    params = kernel_params(code)
    driver = "".join(
        f'extern "C" void emu_{k}(EMU_LAUNCH_PARAMS, {", ".join(f"{t} {n}" for t, n in ps)}) '
        f'{{ EMU_LAUNCH({k}({", ".join(n for _, n in ps)})); }}\n' for k, ps in params.items())
    lib = cudaemu.build_text("fakecupy", code, driver)
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


class FakeCupy(types.ModuleType):
    """The stub module; see the module doc. To read in tests: launches, modules (RawModules
    made), live (ptr -> bytes of every Memory not freed yet), free, total, syncs (stream ptrs).
    Devices share one memory account; launches run synchronously."""

    def __init__(self, *, count: int = 1, free: int = 1 << 20, total: int = 1 << 30, sms: int = 2,
                 name: str = "Fake GPU", oom: str = "runtime", l2: int = 4 << 10, occupancy: int | dict = 8,
                 cc: str = "90"):
        super().__init__("cupy")
        self.__spec__ = importlib.machinery.ModuleSpec("cupy", None)  # importlib.util.find_spec works
        self.__version__ = "14.0.0+fakecupy"
        self.count, self.free, self.total, self.sms, self.gpu_name, self.oom = count, free, total, sms, name, oom
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
        self.uint64 = np.uint64
        # -- memtest additions: L2 size, occupancy answers, events that are not done at once --
        self.l2 = int(l2)  # getDeviceProperties()["l2CacheSize"]
        self.occupancy = occupancy  # blocks per SM: one number, or {kernel: number} (default 8)
        self.occupancy_queries: list[tuple[str, int, int]] = []  # (kernel, block, dynamic smem)
        self.event_polls = 0  # Event.done queries answered
        self._not_done = 0  # Event.done answers False this many more times
        self.cuda = _make_cuda(self)
        self.ndarray = self.cuda._ndarray
        self.RawModule = self.cuda._RawModule

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
        return self._streams[-1] if self._streams else self.cuda.Stream.null

    def _check_range(self, ptr: int, nbytes: int, what: str) -> None:
        for start, size in self.live.items():
            if start <= ptr and ptr + nbytes <= start + size:
                return
        raise AssertionError(f"{what}: {nbytes} bytes at {ptr:#x} are not inside a live allocation")


def _make_cuda(fake: FakeCupy) -> types.SimpleNamespace:
    """cupy.cuda for `fake` (classes close over it)."""

    class Memory:
        def __init__(self, size: int):
            size = int(size)
            if size > fake.free:
                if fake.oom == "pool":
                    raise OutOfMemoryError(f"Out of memory allocating {size:,} bytes")
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

    class MemoryPointer:
        def __init__(self, mem: Memory, offset: int):
            self.mem, self.offset = mem, int(offset)
            self.ptr = mem.ptr + self.offset

    class ndarray:  # noqa: N801 - cupy's name
        def __init__(self, shape: tuple, dtype: Any = np.float64, memptr: MemoryPointer | None = None,
                     _host: Any = None):
            if memptr is None:  # gpucheck allocates explicitly (cupy.cuda.Memory), never from the pool
                raise AssertionError("the stub only makes arrays over explicit cupy.cuda.Memory")
            self.dtype = np.dtype(dtype)
            self.memptr = memptr
            if _host is None:
                (n,) = shape
                raw = memptr.mem._buf.view(np.uint8)[memptr.offset:memptr.offset + n * self.dtype.itemsize]
                if raw.size != n * self.dtype.itemsize:
                    raise AssertionError("array larger than its memory")
                _host = raw.view(self.dtype)
            self._host = _host
            self.data = types.SimpleNamespace(ptr=int(_host.ctypes.data), mem=memptr.mem)

        size = property(lambda self: int(self._host.size))
        nbytes = property(lambda self: int(self._host.nbytes))
        shape = property(lambda self: self._host.shape)

        def __getitem__(self, key: slice) -> "ndarray":
            view = self._host[key]
            if not isinstance(key, slice) or (key.step or 1) != 1:
                raise AssertionError("the stub supports contiguous slices only")
            return ndarray(view.shape, self.dtype, self.memptr, _host=view)

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

    class Stream:
        def __init__(self, ptr: int = 0, device_id: int = -1):
            self.ptr, self.device_id = int(ptr), device_id

        def synchronize(self) -> None:
            fake.syncs.append(self.ptr)
            fake._raise_pending()

        def __enter__(self) -> "Stream":
            fake._streams.append(self)
            return self

        def __exit__(self, *exc: Any) -> None:
            fake._streams.pop()

    Stream.null = Stream(0)

    class ExternalStream(Stream):
        def __init__(self, ptr: int, device_id: int = -1):
            if not ptr:
                raise AssertionError("ExternalStream of the null stream: use Stream.null")
            super().__init__(ptr, device_id)

    class Event:
        def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
            self.timing = not disable_timing
            self.t: float | None = None
            self.stream: int | None = None

        def record(self, stream: Stream | None = None) -> None:
            self.stream = (stream or fake._current_stream()).ptr
            self.t = time.perf_counter()

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

    def get_elapsed_time(start: Event, end: Event) -> float:
        if not (start.timing and end.timing) or start.t is None or end.t is None:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: event not recorded or without timing")
        return (end.t - start.t) * 1000.0

    class Device:
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

        def __exit__(self, *exc: Any) -> None:
            fake.current_device = self._prev.pop()

        @property
        def compute_capability(self) -> str:
            self._check()
            return fake.cc

    class Function:
        def __init__(self, lib: Any, name: str, params: tuple[tuple[str, str], ...], max_threads: int = 1024):
            self.lib, self.name, self.params, self.max_threads = lib, name, params, max_threads
            self.ptr = id(self)  # the CUfunction handle (driver.occupancy* take it)
            _function_names[self.ptr] = name

        def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, stream: Any = None) -> None:
            if not (isinstance(grid, tuple) and isinstance(block, tuple)):
                raise TypeError("grid and block must be tuples")  # cupy's Function.__call__(tuple, tuple, ...)
            g = tuple(int(x) for x in (grid + (1, 1))[:3])
            b = tuple(int(x) for x in (block + (1, 1))[:3])
            if not (1 <= g[0] <= 2**31 - 1 and 1 <= g[1] <= 65535 and 1 <= g[2] <= 65535
                    and 1 <= b[0] <= 1024 and 1 <= b[1] <= 1024 and 1 <= b[2] <= 64
                    and b[0] * b[1] * b[2] <= min(1024, self.max_threads)):
                raise CUDADriverError("CUDA_ERROR_INVALID_VALUE: invalid argument")
            vals = check_args(self.name, self.params, args)
            s = stream if stream is not None else fake._current_stream()
            kept = tuple(Ptr(v) if hasattr(a, "memptr") else a for a, v in zip(args, vals))
            rec = Launch(self.name, g, b, s.ptr, fake.current_device, kept)
            fake.launches.append(rec)
            getattr(self.lib, f"emu_{self.name}")(*g, *b, *vals)
            if self.name in fake._fail:
                fake._pending = fake._fail.pop(self.name)

    class RawModule:
        def __init__(self, code: str, options: tuple = (), **kw: Any):
            self.code, self.options = code, tuple(options)
            self._lib: Any = None
            self._params: dict[str, tuple[tuple[str, str], ...]] = {}
            fake.modules.append(self)

        def compile(self) -> None:
            if self._lib is None:
                self._lib, self._params = _emulator(self.code)

        def get_function(self, name: str) -> Function:
            self.compile()
            if name not in self._params:
                raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name})")
            return Function(self._lib, name, self._params[name], launch_bounds(self.code).get(name, 1024))

    _function_names: dict[int, str] = {}

    def occupancyMaxActiveBlocksPerMultiprocessor(func: int, block: int, smem: int) -> int:  # noqa: N802
        name = _function_names[int(func)]
        fake.occupancy_queries.append((name, int(block), int(smem)))
        occ = fake.occupancy
        return int(occ.get(name, 8) if isinstance(occ, dict) else occ)

    def memGetInfo() -> tuple[int, int]:  # noqa: N802 - CuPy's names
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

    def getDeviceProperties(dev: int) -> dict[str, Any]:  # noqa: N802
        if not 0 <= dev < fake.count:
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        return {"name": fake.gpu_name.encode(), "multiProcessorCount": fake.sms, "major": int(fake.cc[:-1]),
                "minor": int(fake.cc[-1]), "totalGlobalMem": fake.total, "l2CacheSize": fake.l2}

    runtime = types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError, getDeviceCount=lambda: fake.count, getDevice=lambda: fake.current_device,
        getDeviceProperties=getDeviceProperties, memGetInfo=memGetInfo, runtimeGetVersion=lambda: 13000,
        memcpyAsync=memcpyAsync, memcpyDeviceToDevice=MEMCPY_D2D)
    return types.SimpleNamespace(
        runtime=runtime, driver=types.SimpleNamespace(
            CUDADriverError=CUDADriverError,
            occupancyMaxActiveBlocksPerMultiprocessor=occupancyMaxActiveBlocksPerMultiprocessor),
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError), Memory=Memory, MemoryPointer=MemoryPointer,
        Device=Device, Event=Event, get_elapsed_time=get_elapsed_time, Stream=Stream, ExternalStream=ExternalStream,
        get_current_stream=fake._current_stream, _ndarray=ndarray, _RawModule=RawModule)


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
            ptr = getattr(getattr(a, "data", None), "ptr", None) if hasattr(a, "memptr") else None
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
    """A FakeCupy as `cupy` for one test (monkeypatch undoes it), with gpucheck's compiled-kernel
    caches emptied for the test too, so that no stub module outlives it."""
    from gpucheck.kernels import cupy_module

    fake = FakeCupy(**kw)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cupy_module, "_modules", {})
    monkeypatch.setattr(cupy_module, "_functions", {})
    return fake
