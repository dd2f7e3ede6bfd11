"""The HBM pattern test in one worker process: size, allocate, copy baseline, patterns, errors.

`memtest_worker(args, chan)` is the worker target (gpucheck.workers.pool). It picks a backend and
runs `run_memtest`, which is the same loop for every backend:

- `CupyBackend` (GPU): the kernels of gpucheck/kernels/memtest.cu through
  gpucheck.kernels.cupy_module. Memory is allocated plainly with `cupy.cuda.Memory` (cudaMalloc:
  never managed memory, no memory pool) in chunks of `chunk_bytes`, up to `fraction` of the free
  memory while keeping max(headroom_fraction x total, headroom_min_bytes) free.
- `NumpyBackend` (`--device cpu`): the same patterns, steps and error records in NumPy over
  `cpu_bytes` of host memory (gpucheck.eud.patterns.word_values / accumulate_errors).
- tests/test_eud_memtest.py adds an emulated backend that runs the .cu kernels on the CPU.

Per pass, every pattern runs its steps (gpucheck.eud.patterns.steps_for) over every chunk: the
whole region is written before it is read back. When a pattern finds errors, it is run once more
right away ("confirmation"): a word that fails again, or that fails in two different runs of any
pattern, is a persistent fault. Bandwidth is bytes written plus bytes read over the time of the
steps (GPU events on the GPU), next to a plain device-to-device copy measured in the same run
(cudaMemcpyAsync between two chunks; counted as bytes read plus written).

Fault injection (args["inject"]): flip bit `bit` of the word at region byte `offset` right after
the first fill step of `pattern` (default: the first pattern run), once, or in every run of it
with `sticky` (a stuck bit).

Only imported in worker processes, benchmarks and tests; NumPy and CuPy are imported inside.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from .patterns import (
    BY_NAME,
    MASK64,
    NAMES,
    STATS_WORDS,
    ErrorLog,
    decode_step,
    parse_patterns,
    pattern_seed,
    steps_for,
)

MIN_CHUNK_BYTES = 64
MAX_BLOCK = 1024  # threads per block: CUDA's limit on every GPU gpucheck supports
MAX_GRID_X = (1 << 31) - 1  # gridDim.x limit


@dataclass
class MemtestConfig:
    patterns: list[str] = field(default_factory=lambda: list(NAMES))
    passes: int = 1
    duration_s: float | None = None  # loop passes until this many seconds have gone (at least one)
    seed: int = 0
    fraction: float = 0.1  # of the free GPU memory
    headroom_fraction: float = 0.05  # keep this fraction of the total memory free ...
    headroom_min_bytes: int = 1 << 30  # ... and at least this much
    chunk_bytes: int = 1 << 30
    cpu_bytes: int = 16 << 20
    cpu_chunk_bytes: int = 8 << 20
    max_errors: int = 32  # error records kept per verify step
    report_errors: int = 8  # records kept in the summary
    confirm: bool = True
    copy_bytes: int = 1 << 30
    copy_repeats: int = 10
    block: int = 256
    blocks_per_sm: int = 8
    inject: dict[str, Any] | None = None  # {"pattern", "offset", "bit", "sticky"}

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "MemtestConfig":
        cfg = cls()
        for key in ("fraction", "headroom_fraction"):
            if args.get(key) is not None:
                setattr(cfg, key, float(args[key]))
        if args.get("duration_s") is not None:
            cfg.duration_s = float(args["duration_s"])
        for key in ("passes", "seed", "headroom_min_bytes", "chunk_bytes", "cpu_bytes", "cpu_chunk_bytes",
                    "max_errors", "report_errors", "copy_bytes", "copy_repeats", "block", "blocks_per_sm"):
            if args.get(key) is not None:
                setattr(cfg, key, int(args[key]))
        if args.get("confirm") is not None:
            cfg.confirm = bool(args["confirm"])
        if args.get("patterns") is not None:
            cfg.patterns = parse_patterns(args["patterns"])
        cfg.inject = dict(args["inject"]) if args.get("inject") else None
        if not 0.0 < cfg.fraction <= 1.0:
            raise ValueError(f"memtest fraction must be in (0, 1], not {cfg.fraction}")
        if cfg.passes < 1:
            raise ValueError(f"passes must be at least 1, not {cfg.passes}")
        if cfg.max_errors < 1:
            raise ValueError(f"max_errors must be at least 1, not {cfg.max_errors}")
        if not 1 <= cfg.block <= MAX_BLOCK:  # a launch the driver refuses would read as a GPU fault
            raise ValueError(f"block must be in 1..{MAX_BLOCK} threads, not {cfg.block}")
        if cfg.blocks_per_sm < 1:
            raise ValueError(f"blocks_per_sm must be at least 1, not {cfg.blocks_per_sm}")
        for key in ("chunk_bytes", "cpu_bytes", "cpu_chunk_bytes", "copy_bytes"):
            if getattr(cfg, key) < MIN_CHUNK_BYTES:
                raise ValueError(f"{key} must be at least {MIN_CHUNK_BYTES} bytes, not {getattr(cfg, key)}")
        return cfg


def memtest_worker(args: dict[str, Any], chan: Any) -> dict[str, Any]:
    """Worker target: run the pattern test on this worker's device; return plain data."""
    cfg = MemtestConfig.from_args(args)
    try:
        if chan.device == "cuda":
            backend: Any = CupyBackend.create(chan, cfg)
        else:
            backend = NumpyBackend(cfg)
    except ImportError as e:
        return {"setup_error": f"{type(e).__name__}: {e}"}
    except _SetupError as e:
        return {"setup_error": str(e)}
    chan.heartbeat(force=True)
    return run_memtest(backend, cfg, chan)


class _SetupError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# backends


class NumpyBackend:
    """The pattern test in NumPy over host memory: same patterns, steps, stats and records as the
    kernels (gpucheck.eud.patterns), block by block."""

    name = "numpy"
    device = "cpu"
    block_words = 1 << 17  # 1 MiB of words per NumPy operation

    def __init__(self, cfg: MemtestConfig):
        import numpy as np  # noqa: PLC0415

        self.np = np
        self.cfg = cfg
        self.stats = None
        self.errs = None

    def info(self) -> dict[str, Any]:
        return {"name": platform.processor() or platform.machine() or "cpu", "device": "cpu",
                "backend": self.name, "numpy": self.np.__version__}

    def target_bytes(self) -> tuple[int, dict[str, Any]]:
        return int(self.cfg.cpu_bytes), {"free_bytes": None, "total_bytes": None, "headroom_bytes": None,
                                         "note": f"host memory stands in for GPU memory: {self.cfg.cpu_bytes} bytes"}

    def chunk_bytes(self) -> int:
        return int(self.cfg.cpu_chunk_bytes)

    def alloc(self, words: int) -> Any:
        try:
            return self.np.empty(words, self.np.uint64)
        except MemoryError as e:
            raise MemoryError(f"host allocation of {words * 8} bytes failed: {e}") from None

    def address(self, buf: Any) -> int:
        return int(buf.ctypes.data)

    def new_step(self) -> None:
        from .patterns import new_stats

        self.stats = new_stats()
        self.errs = self.np.zeros(3 * self.cfg.max_errors, self.np.uint64)

    def read_step(self) -> tuple[Any, Any]:
        return self.stats, self.errs

    def _blocks(self, n: int, descending: bool) -> list[tuple[int, int]]:
        b = self.block_words
        out = [(s, min(n, s + b)) for s in range(0, n, b)]
        return out[::-1] if descending else out

    def fill(self, buf: Any, base: int, kind: int, seed: int, xor_write: int) -> None:
        from .patterns import word_values

        np = self.np
        for s, e in self._blocks(buf.size, False):
            v = word_values(kind, seed, base + s, e - s)
            if xor_write:
                v ^= np.uint64(xor_write)
            buf[s:e] = v

    def check(self, buf: Any, base: int, kind: int, seed: int, xor_expect: int, write: bool, xor_write: int,
              descending: bool) -> None:
        from .patterns import accumulate_errors, word_values

        np = self.np
        for s, e in self._blocks(buf.size, descending):
            pat = word_values(kind, seed, base + s, e - s)
            expect = pat ^ np.uint64(xor_expect) if xor_expect else pat
            got = buf[s:e]
            bad = np.flatnonzero(got != expect)
            if bad.size:
                if descending:
                    bad = bad[::-1]
                accumulate_errors(self.stats, self.errs, self.cfg.max_errors,
                                  (bad + np.uint64(base + s)).astype(np.uint64), expect[bad], got[bad].copy())
            if write:
                buf[s:e] = pat ^ np.uint64(xor_write) if xor_write else pat

    def flip(self, buf: Any, index: int, mask: int) -> None:
        buf[index] ^= self.np.uint64(mask)

    def timer(self) -> Any:
        return time.perf_counter()

    def elapsed(self, t0: Any) -> float:
        return time.perf_counter() - t0

    def copy(self, dst: Any, src: Any) -> None:
        self.np.copyto(dst, src)

    def sync(self) -> None:
        pass

    def release(self, bufs: list[Any]) -> None:
        bufs.clear()


# Kernel arguments (pure, so that they are tested without a GPU: tests/test_eud_gpu.py checks them
# against the parameter lists in memtest.cu). CuPy passes a NumPy scalar as its own C type and a
# Python int as a 64-bit integer, so every scalar is an explicit np.uint64 (gc_u64) or np.int32
# (int); pointers are CuPy arrays.


def launch_grid(n: int, per_thread: int, block: int, sms: int, blocks_per_sm: int) -> tuple[int, int, int]:
    """Blocks for a grid-stride kernel over n words, `per_thread` words per thread per sweep step:
    enough to cover n once, at most sms x blocks_per_sm (and gridDim.x's limit), at least 1."""
    per_block = block * per_thread
    want = (n + per_block - 1) // per_block
    return (max(1, min(want, sms * blocks_per_sm, MAX_GRID_X)), 1, 1)


def fill_args(np: Any, buf: Any, n: int, base: int, kind: int, seed: int, xor_write: int) -> tuple:
    """memtest_fill(gc_u64* buf, gc_u64 n, gc_u64 base, int kind, gc_u64 seed, gc_u64 xwrite)."""
    return (buf, np.uint64(n), np.uint64(base), np.int32(kind), np.uint64(seed & MASK64),
            np.uint64(xor_write & MASK64))


def check_args(np: Any, buf: Any, n: int, base: int, kind: int, seed: int, xor_expect: int, write: bool,
               xor_write: int, descending: bool, stats: Any, errs: Any, max_errors: int) -> tuple:
    """memtest_check(gc_u64* buf, gc_u64 n, gc_u64 base, int kind, gc_u64 seed, gc_u64 xexp,
    int write_back, gc_u64 xwrite, int descending, gc_u64* stats, gc_u64* errs, gc_u64 max_errs)."""
    return (buf, np.uint64(n), np.uint64(base), np.int32(kind), np.uint64(seed & MASK64),
            np.uint64(xor_expect & MASK64), np.int32(1 if write else 0), np.uint64(xor_write & MASK64),
            np.int32(1 if descending else 0), stats, errs, np.uint64(max_errors))


def flip_args(np: Any, buf: Any, index: int, mask: int) -> tuple:
    """memtest_flip(gc_u64* buf, gc_u64 i, gc_u64 mask)."""
    return (buf, np.uint64(index), np.uint64(mask & MASK64))


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return "memoryallocation" in text.replace(" ", "") or "out of memory" in text


class CupyBackend:
    """The kernels of gpucheck/kernels/memtest.cu on one GPU through CuPy."""

    name = "cupy"
    device = "cuda"

    def __init__(self, cupy: Any, numpy: Any, dev: int, cfg: MemtestConfig):
        self.cp = cupy
        self.np = numpy
        self.dev = dev
        self.cfg = cfg
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        name = props.get("name", b"")
        self.gpu_name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        self.sms = int(props.get("multiProcessorCount", 0)) or 1
        self.capability = [int(props.get("major", 0)), int(props.get("minor", 0))]
        self.total_memory = int(props.get("totalGlobalMem", 0))
        # The step buffers are plain allocations too (CuPy's memory pool would keep them, and
        # anything else it was given, after the test).
        self.stats = self.alloc(STATS_WORDS)
        self.errs = self.alloc(3 * cfg.max_errors)
        self.errs.set(numpy.zeros(3 * cfg.max_errors, numpy.uint64))
        from ..kernels.cupy_module import launch, module

        module("memtest")  # compile now: a compile error is a setup problem, not a memory error
        self._launch = launch

    @classmethod
    def create(cls, chan: Any, cfg: MemtestConfig) -> "CupyBackend":
        import cupy  # noqa: PLC0415 - in the worker only
        import numpy  # noqa: PLC0415

        from ..kernels.cupy_module import KernelError

        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as e:  # noqa: BLE001 - no driver, no device: a setup problem
            raise _SetupError(f"CuPy {cupy.__version__} sees no CUDA device: {e}") from None
        # CUDA_VISIBLE_DEVICES=<the GPU's UUID> (the pool sets it) leaves one device: CuPy's 0.
        dev = 0 if chan.job.visible_device is not None else int(chan.gpu or 0)
        if dev >= count:
            raise _SetupError(f"cuda:{dev} does not exist (CuPy sees {count} GPU(s))")
        try:
            cupy.cuda.Device(dev).use()
            return cls(cupy, numpy, dev, cfg)
        except KernelError as e:
            raise _SetupError(str(e)) from None
        except MemoryError as e:  # the CUDA context or the step buffers did not fit: nothing tested
            raise _SetupError(f"out of GPU memory before the test could start (memory taken by another "
                              f"process?): {e}") from None
        except cupy.cuda.runtime.CUDARuntimeError as e:
            if _is_oom(e) or "devicesunavailable" in str(e).lower():  # exclusive-process GPU in use elsewhere
                raise _SetupError(f"could not set up the GPU: {e}") from None
            raise

    def info(self) -> dict[str, Any]:
        return {"name": self.gpu_name, "device": "cuda", "backend": self.name, "cupy": self.cp.__version__,
                "capability": self.capability, "sms": self.sms, "memory_bytes": self.total_memory,
                "cuda_runtime": int(self.cp.cuda.runtime.runtimeGetVersion())}

    def target_bytes(self) -> tuple[int, dict[str, Any]]:
        free, total = (int(x) for x in self.cp.cuda.runtime.memGetInfo())  # current device (CUDA context made)
        headroom = max(int(self.cfg.headroom_fraction * total), int(self.cfg.headroom_min_bytes))
        target = max(0, min(int(self.cfg.fraction * free), free - headroom))
        return target, {"free_bytes": free, "total_bytes": total, "headroom_bytes": headroom, "note": None}

    def chunk_bytes(self) -> int:
        return int(self.cfg.chunk_bytes)

    def alloc(self, words: int) -> Any:
        """`words` uint64 of plain device memory: cudaMalloc (never managed memory, not CuPy's pool),
        freed by cudaFree when the last array over it goes. MemoryError when it does not fit."""
        cp = self.cp
        try:
            mem = cp.cuda.Memory(words * 8)
        except cp.cuda.memory.OutOfMemoryError as e:
            raise MemoryError(str(e)) from None
        except cp.cuda.runtime.CUDARuntimeError as e:  # cudaErrorMemoryAllocation: out of memory
            if _is_oom(e):
                raise MemoryError(str(e)) from None
            raise
        return cp.ndarray((words,), dtype=cp.uint64, memptr=cp.cuda.MemoryPointer(mem, 0))

    def address(self, buf: Any) -> int:
        return int(buf.data.ptr)

    def _grid(self, n: int, per_thread: int) -> tuple[int, int, int]:
        return launch_grid(n, per_thread, self.cfg.block, self.sms, self.cfg.blocks_per_sm)

    def new_step(self) -> None:
        from .patterns import new_stats

        self.stats.set(new_stats())  # on the current stream, ahead of the step's kernels

    def read_step(self) -> tuple[Any, Any]:
        return self.stats.get(), self.errs.get()  # synchronises the stream: faults surface here

    def fill(self, buf: Any, base: int, kind: int, seed: int, xor_write: int) -> None:
        n = int(buf.size)
        self._launch("memtest", "memtest_fill", self._grid(n, 1), (self.cfg.block, 1, 1),
                     fill_args(self.np, buf, n, base, kind, seed, xor_write))

    def check(self, buf: Any, base: int, kind: int, seed: int, xor_expect: int, write: bool, xor_write: int,
              descending: bool) -> None:
        n = int(buf.size)
        self._launch("memtest", "memtest_check", self._grid(n, 4), (self.cfg.block, 1, 1),
                     check_args(self.np, buf, n, base, kind, seed, xor_expect, write, xor_write, descending,
                                self.stats, self.errs, self.cfg.max_errors))

    def flip(self, buf: Any, index: int, mask: int) -> None:
        self._launch("memtest", "memtest_flip", (1, 1, 1), (1, 1, 1), flip_args(self.np, buf, index, mask),
                     sync=True)

    def timer(self) -> Any:
        ev = self.cp.cuda.Event()  # timing enabled; recorded on the current stream
        ev.record()
        return ev

    def elapsed(self, t0: Any) -> float:
        ev = self.cp.cuda.Event()
        ev.record()
        ev.synchronize()
        return self.cp.cuda.get_elapsed_time(t0, ev) / 1000.0  # milliseconds -> seconds

    def copy(self, dst: Any, src: Any) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, int(src.nbytes), rt.memcpyDeviceToDevice,
                       self.cp.cuda.get_current_stream().ptr)

    def sync(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def release(self, bufs: list[Any]) -> None:
        self.sync()  # nothing may still be running on memory about to be freed
        bufs.clear()  # the chunks' Memory objects are freed (cudaFree) with their last array


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass
class _Chunk:
    index: int
    base: int  # region word index of its first word
    words: int
    buf: Any
    address: int


def _allocate(backend: Any, cfg: MemtestConfig, chan: Any) -> tuple[list[_Chunk], dict[str, Any]]:
    target, mem = backend.target_bytes()
    target -= target % 8
    chunks: list[_Chunk] = []
    base = 0
    note = None
    step = max(MIN_CHUNK_BYTES, backend.chunk_bytes() - backend.chunk_bytes() % 8)
    while base * 8 < target:
        want = min(step, target - base * 8) // 8
        if want <= 0:
            break
        try:
            buf = backend.alloc(want)
        except MemoryError as e:
            note = (f"allocated {base * 8} of {target} bytes: out of memory at chunk {len(chunks)} "
                    f"(memory taken by another process?): {e}")
            break
        chunks.append(_Chunk(len(chunks), base, want, buf, backend.address(buf)))
        base += want
        chan.heartbeat()
    mem.update(target_bytes=target, region_bytes=base * 8, chunk_count=len(chunks),
               chunk_bytes=backend.chunk_bytes(), allocation_note=note)
    return chunks, mem


def _copy_bandwidth(backend: Any, chunks: list[_Chunk], cfg: MemtestConfig, chan: Any) -> dict[str, Any]:
    """A plain device-to-device copy between two parts of the region: the bandwidth yardstick."""
    if len(chunks) >= 2:
        n = min(chunks[0].words, chunks[1].words, cfg.copy_bytes // 8)
        src, dst = chunks[0].buf[:n], chunks[1].buf[:n]
    else:
        n = min(chunks[0].words // 2, cfg.copy_bytes // 8)
        src, dst = chunks[0].buf[:n], chunks[0].buf[n:2 * n]
    if n <= 0:
        return {"gbps": None, "bytes": 0, "samples_s": [], "note": "region too small for a copy"}
    backend.copy(dst, src)  # warm-up (clocks up, TLBs)
    backend.copy(src, dst)
    backend.sync()
    samples = []
    for _ in range(max(1, cfg.copy_repeats)):
        t0 = backend.timer()
        backend.copy(dst, src)
        samples.append(backend.elapsed(t0))
        chan.heartbeat()
    med = statistics.median(samples)
    return {"gbps": 2.0 * n * 8 / med / 1e9 if med > 0 else None, "bytes": n * 8, "repeats": len(samples),
            "samples_s": [round(s, 9) for s in samples], "counted": "bytes read + bytes written"}


class _Injector:
    def __init__(self, spec: dict[str, Any] | None, cfg: MemtestConfig, chunks: list[_Chunk]):
        self.spec = spec
        self.done = 0
        self.texts: list[str] = []
        self.problem: str | None = None
        self.target: tuple[_Chunk, int] | None = None
        if not spec:
            return
        region_words = sum(c.words for c in chunks)
        self.pattern = spec.get("pattern") or cfg.patterns[0]
        self.bit = int(spec.get("bit", 17) if spec.get("bit") is not None else 17)
        self.sticky = bool(spec.get("sticky"))
        offset = spec.get("offset")
        word = region_words // 2 + 1 if offset is None else int(offset) // 8
        if self.pattern not in cfg.patterns:
            self.problem = f"bitflip pattern {self.pattern!r} is not among the patterns run ({', '.join(cfg.patterns)})"
        elif not 0 <= self.bit < 64:
            self.problem = f"bitflip bit must be in 0..63, not {self.bit}"
        elif not 0 <= word < region_words:
            self.problem = f"bitflip offset {offset} is outside the tested region of {region_words * 8} bytes"
        else:
            for c in chunks:
                if c.base <= word < c.base + c.words:
                    self.target = (c, word - c.base)
            self.word = word

    def due(self, pattern: str, confirming: bool) -> bool:
        if self.target is None or pattern != self.pattern:
            return False
        return self.sticky or (self.done == 0 and not confirming)

    def apply(self, backend: Any, pattern: str, pass_index: int, confirming: bool) -> None:
        chunk, i = self.target  # type: ignore[misc]
        backend.flip(chunk.buf, i, 1 << self.bit)
        self.done += 1
        if self.done <= 3:
            what = " (confirmation run)" if confirming else ""
            self.texts.append(f"bitflip: bit {self.bit} of the word at offset {self.word * 8:#x} "
                              f"(chunk {chunk.index}) after the fill of {pattern}, pass {pass_index}{what}")


def run_memtest(backend: Any, cfg: MemtestConfig, chan: Any) -> dict[str, Any]:
    """Allocate, measure the copy baseline, run the passes; return plain data (see module doc)."""
    t_start = time.monotonic()
    out: dict[str, Any] = {"device": backend.info(), "backend": backend.name, "patterns": list(cfg.patterns),
                           "stopped": None, "notes": [], "injected": []}
    chunks, mem = _allocate(backend, cfg, chan)
    out["memory"] = mem
    out["chunks"] = [{"index": c.index, "bytes": c.words * 8, "address": c.address} for c in chunks[:8]]
    if not chunks:
        out["setup_error"] = (f"could not allocate memory to test (target {mem['target_bytes']} bytes"
                              + (f"; {mem['allocation_note']}" if mem.get("allocation_note") else "") + ")")
        return out
    region_words = sum(c.words for c in chunks)
    region_bytes = region_words * 8
    out["region_bytes"] = region_bytes
    if mem.get("allocation_note"):
        out["notes"].append(mem["allocation_note"])
    out["copy"] = _copy_bandwidth(backend, chunks, cfg, chan)
    inj = _Injector(cfg.inject, cfg, chunks)
    if inj.problem:
        out["inject_problem"] = inj.problem
    log = ErrorLog(report_errors=cfg.report_errors)
    per_pattern: dict[str, dict[str, Any]] = {
        name: {"runs": 0, "bytes": 0, "seconds": 0.0, "errors": 0} for name in cfg.patterns}
    deadline = None if cfg.duration_s is None else t_start + cfg.duration_s
    passes = 0
    stopped = None

    def run_pattern(name: str, pass_index: int, confirming: bool) -> int:
        p = BY_NAME[name]
        seed = pattern_seed(name, cfg.seed, pass_index)
        found = 0
        for si, step in enumerate(steps_for(name)):
            order = list(reversed(chunks)) if step.descending else chunks
            if step.op == "fill":
                t0 = backend.timer()
                for c in order:
                    backend.fill(c.buf, c.base, p.kind, seed, step.xor_write)
                    chan.heartbeat()
                secs = backend.elapsed(t0)
                if si == 0 and inj.due(name, confirming):
                    inj.apply(backend, name, pass_index, confirming)
            else:
                backend.new_step()
                t0 = backend.timer()
                for c in order:
                    backend.check(c.buf, c.base, p.kind, seed, step.xor_expect, step.write, step.xor_write,
                                  step.descending)
                    chan.heartbeat()
                secs = backend.elapsed(t0)
                stats, errs = backend.read_step()
                ev = decode_step(stats, errs, cfg.max_errors)
                if ev["errors"]:
                    for r in ev["records"]:
                        c = _chunk_of(chunks, r["word"])
                        r["chunk"] = c.index if c else None
                        r["address"] = c.address + 8 * (r["word"] - c.base) if c else None
                    label = step.label + (" (confirmation run)" if confirming else "")
                    ev.update(pattern=name, step=label, **{"pass": pass_index})
                    log.add(ev, run_key=(name, pass_index, si, confirming))
                    found += ev["errors"]
            moved = step.bytes_moved(region_bytes)
            pp = per_pattern[name]
            pp["bytes"] += moved
            pp["seconds"] += secs
        per_pattern[name]["runs"] += 1
        per_pattern[name]["errors"] += found
        return found

    while stopped is None:
        for name in cfg.patterns:
            if chan.should_stop():
                stopped = chan.stop_reason or "stop"
                break
            found = run_pattern(name, passes, False)
            if found and cfg.confirm:
                again = run_pattern(name, passes, True)
                log.confirm(name, passes, found, again)
            pp = per_pattern[name]
            chan.progress({
                "pattern": name, "pass": passes, "errors": log.errors,
                "gbps": pp["bytes"] / pp["seconds"] / 1e9 if pp["seconds"] > 0 else None,
                "bytes_tested": region_bytes,
                "time_left_s": None if deadline is None else max(0.0, deadline - time.monotonic()),
                "first_error": log.first_record(),
            })
        else:
            passes += 1
            if deadline is None:
                if passes >= cfg.passes:
                    break
            elif time.monotonic() >= deadline:
                break
            continue
        break
    if stopped is None and chan.should_stop():
        stopped = chan.stop_reason
    inj.target = None  # it holds a chunk: drop every reference so that the memory is freed now
    backend.release([c.buf for c in chunks])
    chunks.clear()
    total_bytes = sum(pp["bytes"] for pp in per_pattern.values())
    total_s = sum(pp["seconds"] for pp in per_pattern.values())
    for pp in per_pattern.values():
        pp["gbps"] = pp["bytes"] / pp["seconds"] / 1e9 if pp["seconds"] > 0 else None
    out.update(
        passes=passes,
        stopped=stopped,
        per_pattern=per_pattern,
        bytes_moved=total_bytes,
        kernel_seconds=round(total_s, 6),
        gbps=total_bytes / total_s / 1e9 if total_s > 0 else None,
        errors=log.summary(),
        injected=inj.texts + ([f"... and {inj.done - 3} more flips (sticky)"] if inj.done > 3 else []),
        seconds=round(time.monotonic() - t_start, 3),
        config={"fraction": cfg.fraction, "passes": cfg.passes, "duration_s": cfg.duration_s, "seed": cfg.seed,
                "max_errors": cfg.max_errors, "confirm": cfg.confirm},
    )
    return out


def _chunk_of(chunks: list[_Chunk], word: int) -> _Chunk | None:
    for c in chunks:
        if c.base <= word < c.base + c.words:
            return c
    return None
