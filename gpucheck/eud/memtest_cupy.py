"""eud.memtest's GPU backend: the kernels of gpucheck/kernels/memtest.cu through CuPy, and their
launch arguments and grids (pure functions, tested without a GPU).

- Memory: plain `cudaMalloc` through `cupy.cuda.Memory` (never managed memory, never CuPy's pool),
  in chunks of at most `MAX_CHUNK_BYTES` (the kernels' offsets within a chunk are 32-bit).
- Kernels: one fill and one check kernel per pattern family (patterns.kernel_pattern), 16-byte
  accesses, MT_UNROLL (4) of them in flight per thread.
- Grids: one wave. `cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor` (the driver's
  cuOccupancyMaxActiveBlocksPerMultiprocessor, as cudaOccupancyMaxActiveBlocksPerMultiprocessor)
  gives how many blocks of each kernel an SM holds with its register and shared-memory use; a
  grid never has more than SMs x that (nor `blocks_per_sm` x SMs), so every block is resident and
  a grid-stride sweep moves through the chunk in order (moving inversions relies on it).
- Waiting: the end of a step is a CUDA event that is polled (`Event.done`), with a heartbeat per
  poll, never a blocking synchronize; a step still running after `stall_timeout_s` is reported
  (progress "stalled") and then waited for without heartbeats, so the supervisor declares the
  worker hung (a kernel that never returns is a hang, a slow one is not).
- L2 scrub: `scrub()` reads and rewrites a scratch buffer of twice the L2 size before a sweep that
  starts where the previous one ended (moving inversions), so that sweep reads HBM, not dirty L2.

Only imported in worker processes, benchmarks and tests; CuPy and NumPy are imported inside.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .patterns import KernelPattern, MASK64, STATS_WORDS, kernel_pattern, new_stats

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import MemtestDevice, MemtestMemory

MAX_BLOCK = 1024  # threads per block: CUDA's limit on every GPU gpucheck supports
MAX_GRID_X = (1 << 31) - 1  # gridDim.x limit
UNROLL = 4  # memtest.cu MT_UNROLL: 16-byte units per thread per sweep step
MAX_CHUNK_BYTES = 16 << 30  # 2^30 16-byte units: the kernels' 32-bit offsets cannot wrap
MAX_THREADS = 1 << 28  # gridDim.x * blockDim.x bound the kernels rely on (see memtest.cu)
DEFAULT_L2_BYTES = 64 << 20  # when the device does not report its L2 size
KERNELS = tuple(f"memtest_{op}_{fam}" for op in ("fill", "check") for fam in ("pair", "walk", "address", "random")) + (
    "memtest_scrub", "memtest_flip")


class MemtestSetupError(RuntimeError):
    """The GPU could not be set up for the test (no device, no memory, a kernel that cannot run):
    not a verdict on its memory."""


def launch_grid(units: int, per_thread: int, block: int, sms: int, resident_per_sm: int,
                blocks_per_sm: int) -> tuple[int, int, int]:
    """Blocks for a grid-stride kernel over `units`, `per_thread` units per thread per sweep step:
    enough to cover them once, never more than one wave (sms x min(resident_per_sm, blocks_per_sm):
    every block resident at once), at least 1, within gridDim.x's and the kernels' thread limits."""
    per_block = block * per_thread
    want = (units + per_block - 1) // per_block
    wave = sms * max(1, min(resident_per_sm, blocks_per_sm))
    return (max(1, min(want, wave, MAX_GRID_X, MAX_THREADS // block)), 1, 1)


def _u64(v: int, np: Any) -> Any:
    return np.uint64(int(v) & MASK64)


def fill_args(np: Any, buf: Any, n16: int, base: int, kp: KernelPattern, xor_write: int) -> tuple:
    """memtest_fill_<family>(mt_u128* buf, gc_u32 n16, gc_u64 base, gc_u64 p0, gc_u64 p1, gc_u64 xwrite)."""
    return (buf, np.uint32(n16), _u64(base, np), _u64(kp.p0, np), _u64(kp.p1, np), _u64(xor_write ^ kp.xor, np))


def check_args(np: Any, buf: Any, n16: int, base: int, kp: KernelPattern, xor_expect: int, write: bool,
               xor_write: int, descending: bool, stats: Any, errs: Any, max_errors: int) -> tuple:
    """memtest_check_<family>(mt_u128* buf, gc_u32 n16, gc_u64 base, gc_u64 p0, gc_u64 p1, gc_u64 xexp,
    int write_back, gc_u64 xwrite, int descending, gc_u64* stats, gc_u64* errs, gc_u32 max_errs)."""
    return (buf, np.uint32(n16), _u64(base, np), _u64(kp.p0, np), _u64(kp.p1, np), _u64(xor_expect ^ kp.xor, np),
            np.int32(1 if write else 0), _u64(xor_write ^ kp.xor, np), np.int32(1 if descending else 0), stats, errs,
            np.uint32(max_errors))


def scrub_args(np: Any, buf: Any, n16: int) -> tuple:
    """memtest_scrub(mt_u128* buf, gc_u32 n16)."""
    return (buf, np.uint32(n16))


def flip_args(np: Any, buf: Any, index: int, mask: int) -> tuple:
    """memtest_flip(gc_u64* buf, gc_u64 i, gc_u64 mask)."""
    return (buf, np.uint64(index), _u64(mask, np))


def units_of(words: int) -> int:
    """16-byte units of a chunk of `words` words (the host allocates an even number of words)."""
    if words % 2:
        raise ValueError(f"a chunk holds an even number of words, not {words}")
    if words // 2 > MAX_CHUNK_BYTES // 16:
        raise ValueError(f"a chunk holds at most {MAX_CHUNK_BYTES} bytes, not {8 * words}")
    return words // 2


def is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return "memoryallocation" in text.replace(" ", "") or "out of memory" in text


class CupyBackend:
    """The kernels of gpucheck/kernels/memtest.cu on one GPU through CuPy (see the module doc)."""

    name = "cupy"
    device = "cuda"

    def __init__(self, cupy: Any, numpy: Any, dev: int, cfg: Any, chan: Any):
        self.cp, self.np, self.dev, self.cfg, self.chan = cupy, numpy, dev, cfg, chan
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        name = props.get("name", b"")
        self.gpu_name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        self.sms = int(props.get("multiProcessorCount", 0)) or 1
        self.capability = [int(props.get("major", 0)), int(props.get("minor", 0))]
        self.total_memory = int(props.get("totalGlobalMem", 0))
        self.l2_bytes = int(props.get("l2CacheSize", 0) or 0)
        from ..kernels.cupy_module import launch, module, occupancy

        module("memtest")  # compile now: a compile error is a setup problem, not a memory error
        self._launch = launch
        self.resident = {k: int(occupancy("memtest", k, cfg.block)) for k in KERNELS if k != "memtest_flip"}
        cannot = [k for k, v in self.resident.items() if v < 1]
        if cannot:
            raise MemtestSetupError(f"{', '.join(cannot)} cannot run in blocks of {cfg.block} threads on this GPU "
                                    "(occupancy 0): use a smaller block")
        # The step buffers and the scrub buffer are plain allocations too (CuPy's memory pool
        # would keep them, and anything else it was given, after the test).
        self.stats = self.alloc(STATS_WORDS)
        self.errs = self.alloc(3 * cfg.max_errors)
        self.errs.set(numpy.zeros(3 * cfg.max_errors, numpy.uint64))
        scrub = 2 * (self.l2_bytes or DEFAULT_L2_BYTES)
        self.scrub_buf = self.alloc(scrub // 8 - (scrub // 8) % 2)

    @classmethod
    def create(cls, chan: Any, cfg: Any) -> "CupyBackend":
        import cupy  # noqa: PLC0415 - in the worker only
        import numpy  # noqa: PLC0415

        from ..kernels.cupy_module import KernelError

        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as e:  # noqa: BLE001 - no driver, no device: a setup problem
            raise MemtestSetupError(f"CuPy {cupy.__version__} sees no CUDA device: {e}") from None
        # CUDA_VISIBLE_DEVICES=<the GPU's UUID> (the pool sets it) leaves one device: CuPy's 0.
        dev = 0 if chan.job.visible_device is not None else int(chan.gpu or 0)
        if dev >= count:
            raise MemtestSetupError(f"cuda:{dev} does not exist (CuPy sees {count} GPU(s))")
        try:
            cupy.cuda.Device(dev).use()
            return cls(cupy, numpy, dev, cfg, chan)
        except KernelError as e:
            raise MemtestSetupError(str(e)) from None
        except MemoryError as e:  # the CUDA context or the step buffers did not fit: nothing tested
            raise MemtestSetupError(f"out of GPU memory before the test could start (memory taken by another "
                                    f"process?): {e}") from None
        except cupy.cuda.runtime.CUDARuntimeError as e:
            if is_oom(e) or "devicesunavailable" in str(e).lower():  # exclusive-process GPU in use elsewhere
                raise MemtestSetupError(f"could not set up the GPU: {e}") from None
            raise

    def info(self) -> "MemtestDevice":
        return {"name": self.gpu_name, "device": "cuda", "backend": self.name, "cupy": self.cp.__version__,
                "capability": self.capability, "sms": self.sms, "memory_bytes": self.total_memory,
                "l2_bytes": self.l2_bytes or None, "scrub_bytes": int(self.scrub_buf.nbytes),
                "blocks_per_sm": dict(self.resident), "cuda_runtime": int(self.cp.cuda.runtime.runtimeGetVersion())}

    # -- memory ----------------------------------------------------------------------------------
    def target_bytes(self) -> "tuple[int, MemtestMemory]":
        free, total = (int(x) for x in self.cp.cuda.runtime.memGetInfo())  # current device (CUDA context made)
        headroom = max(int(self.cfg.headroom_fraction * total), int(self.cfg.headroom_min_bytes))
        target = max(0, min(int(self.cfg.fraction * free), free - headroom))
        return target, {"free_bytes": free, "total_bytes": total, "headroom_bytes": headroom, "note": None}

    def second_round_target(self, released_bytes: int) -> "tuple[int, MemtestMemory]":
        """Bytes to allocate for the headroom round: all that is free now (the headroom and the
        chunks just released) but `round2_reserve_bytes`."""
        free, total = (int(x) for x in self.cp.cuda.runtime.memGetInfo())
        reserve = int(self.cfg.round2_reserve_bytes)
        return max(0, free - reserve), {"free_bytes": free, "reserve_bytes": reserve}

    def chunk_bytes(self) -> int:
        return min(int(self.cfg.chunk_bytes), MAX_CHUNK_BYTES)

    def alloc(self, words: int) -> Any:
        """`words` uint64 of plain device memory: cudaMalloc (never managed memory, not CuPy's pool),
        freed by cudaFree when the last array over it goes. MemoryError when it does not fit."""
        cp = self.cp
        try:
            mem = cp.cuda.Memory(words * 8)
        # cudaErrorMemoryAllocation: out of memory. The only error cupy.cuda.Memory raises for it
        # (CuPy 14: cupy/cuda/memory.pyx Memory.__init__ -> runtime.malloc, a plain cudaMalloc);
        # cupy.cuda.memory.OutOfMemoryError is the memory pool's, which gpucheck never uses.
        except cp.cuda.runtime.CUDARuntimeError as e:
            if is_oom(e):
                raise MemoryError(str(e)) from None
            raise
        return cp.ndarray((words,), dtype=cp.uint64, memptr=cp.cuda.MemoryPointer(mem, 0))

    def address(self, buf: Any) -> int:
        return int(buf.data.ptr)

    def release(self, bufs: list[Any]) -> None:
        self.sync()  # nothing may still be running on memory about to be freed
        bufs.clear()  # the chunks' Memory objects are freed (cudaFree) with their last array

    # -- kernels ---------------------------------------------------------------------------------
    def _grid(self, kernel: str, units: int) -> tuple[int, int, int]:
        return launch_grid(units, UNROLL if kernel != "memtest_scrub" else 1, self.cfg.block, self.sms,
                           self.resident[kernel], self.cfg.blocks_per_sm)

    def _go(self, kernel: str, units: int, args: tuple) -> None:
        self._launch("memtest", kernel, self._grid(kernel, units), (self.cfg.block, 1, 1), args)

    def new_step(self) -> None:
        self.stats.set(new_stats())  # on the current stream, ahead of the step's kernels

    def read_step(self) -> tuple[Any, Any]:
        return self.stats.get(), self.errs.get()  # the step's end was waited for: no long block here

    def fill(self, buf: Any, base: int, kind: int, seed: int, xor_write: int) -> None:
        kp = kernel_pattern(kind, seed)
        n16 = units_of(int(buf.size))
        self._go(f"memtest_fill_{kp.family}", n16, fill_args(self.np, buf, n16, base, kp, xor_write))

    def check(self, buf: Any, base: int, kind: int, seed: int, xor_expect: int, write: bool, xor_write: int,
              descending: bool) -> None:
        kp = kernel_pattern(kind, seed)
        n16 = units_of(int(buf.size))
        self._go(f"memtest_check_{kp.family}", n16,
                 check_args(self.np, buf, n16, base, kp, xor_expect, write, xor_write, descending, self.stats,
                            self.errs, self.cfg.max_errors))

    def scrub(self) -> None:
        n16 = units_of(int(self.scrub_buf.size))
        self._go("memtest_scrub", n16, scrub_args(self.np, self.scrub_buf, n16))

    def flip(self, buf: Any, index: int, mask: int) -> None:
        self._launch("memtest", "memtest_flip", (1, 1, 1), (1, 1, 1), flip_args(self.np, buf, index, mask),
                     sync=True)

    # -- time --------------------------------------------------------------------------------------
    def timer(self) -> Any:
        ev = self.cp.cuda.Event()  # timing enabled; recorded on the current stream
        ev.record()
        return ev

    def elapsed(self, t0: Any, what: str = "kernels") -> float:
        ev = self.cp.cuda.Event()
        ev.record()
        self.wait(ev, what)
        return self.cp.cuda.get_elapsed_time(t0, ev) / 1000.0  # milliseconds -> seconds

    def wait(self, ev: Any, what: str) -> None:
        """Until `ev` is done: poll it, heartbeat meanwhile. Past stall_timeout_s: say so in a
        progress report, then wait without heartbeats (the supervisor kills a hung worker)."""
        t0 = time.monotonic()
        delay = 0.0005
        while not ev.done:  # raises CUDA's error when a kernel before the event faulted
            waited = time.monotonic() - t0
            if waited > float(self.cfg.stall_timeout_s):
                self.chan.progress({"stalled": what, "waited_s": round(waited, 1)})
                ev.synchronize()
                return
            self.chan.heartbeat()
            time.sleep(delay)
            delay = min(2 * delay, 0.02)

    def copy(self, dst: Any, src: Any) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, int(src.nbytes), rt.memcpyDeviceToDevice,
                       self.cp.cuda.get_current_stream().ptr)

    def sync(self) -> None:
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record()
        self.wait(ev, "the last kernels")
