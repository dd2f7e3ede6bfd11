"""The HBM pattern test in one worker process: size, allocate, copy baseline, patterns, errors.

`memtest_worker(args, chan)` is the worker target (gpucheck.workers.pool). It picks a backend and
runs `run_memtest`, which is the same loop for every backend:

- `CupyBackend` (GPU, gpucheck.eud.memtest_cupy): the kernels of gpucheck/kernels/memtest.cu
  through gpucheck.kernels.cupy_module. Memory is allocated plainly with `cupy.cuda.Memory`
  (cudaMalloc: never managed memory, no memory pool) in chunks of `chunk_bytes`, up to `fraction`
  of the free memory while keeping max(headroom_fraction x total, headroom_min_bytes) free.
- `NumpyBackend` (`--device cpu`): the same patterns, steps and error records in NumPy over
  `cpu_bytes` of host memory (gpucheck.eud.patterns.word_values / accumulate_errors).
- tests/test_eud_memtest.py adds an emulated backend that runs the .cu kernels on the CPU.

Per pass, every pattern runs its steps (gpucheck.eud.patterns.steps_for) over every chunk: the
whole region is written before it is read back. When a pattern finds errors, it is run once more
right away ("confirmation"): a word that fails again, or that fails in two different runs of any
pattern, is a persistent fault. Bandwidth is bytes written plus bytes read over the time of the
steps (GPU events on the GPU), next to a plain device-to-device copy measured in the same run
(cudaMemcpyAsync between two chunks; counted as bytes read plus written).

ECC: the GPU's ECC and row-remapping counters are read before the first pass and after every pass
(gpucheck.eud.memtest_ecc); eud.memtest judges their growth.

Headroom round (`headroom_round`, levels 3-4): the first round keeps max(5 %, 1 GiB) free for the
driver and never tests it. After its passes, the lowest chunks of the first round (at least the
headroom's size) are released, the others stay allocated, and a second round allocates all that
is then free but `round2_reserve_bytes` and runs one pass over it: that memory includes the pages
the first round left free.

Fault injection (args["inject"]): flip bit `bit` of the word at region byte `offset` right after
the first fill step of `pattern` (default: the first pattern run), once, or in every run of it
with `sticky` (a stuck bit); args["ecc_inject"]: see gpucheck.eud.memtest_ecc.

Only imported in worker processes, benchmarks and tests; NumPy and CuPy are imported inside.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence, TypedDict

from .memtest_cupy import MAX_BLOCK, MAX_CHUNK_BYTES, CupyBackend, MemtestSetupError
from .memtest_ecc import EccMonitor, EccReadError, NvmlEccReader
from .patterns import (BY_NAME, ErrorLog, NAMES, accumulate_errors, decode_step, new_stats, parse_patterns,
                       pattern_seed, steps_for, word_values)

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import (MemtestChunk, MemtestCopy, MemtestDevice, MemtestHeadroomRound, MemtestMemory,
                                   MemtestPatternTotals, MemtestResult, MemtestStepEvent, SetupError)

MIN_CHUNK_BYTES = 64
ALIGN = 16  # every chunk an even number of words: the kernels move 16 bytes at a time


class MemtestBitflip(TypedDict, total=False):
    """The bitflip injection: flip `bit` of the word at region byte `offset` right after the first
    fill step of `pattern` (None: the middle word, bit 17, the first pattern run), once, or in
    every run of it with `sticky`."""

    bit: int | None
    offset: int | None
    pattern: str | None
    sticky: bool


class MemtestArgs(TypedDict, total=False):
    """memtest_worker's arguments (MemtestConfig.from_args: a key not given keeps MemtestConfig's default)."""

    patterns: Sequence[str] | str
    passes: int
    duration_s: float | None
    seed: int
    fraction: float
    headroom_fraction: float
    headroom_min_bytes: int
    headroom_round: bool
    round2_reserve_bytes: int
    chunk_bytes: int
    cpu_bytes: int
    cpu_chunk_bytes: int
    max_errors: int
    report_errors: int
    confirm: bool
    copy_bytes: int
    copy_repeats: int
    block: int
    blocks_per_sm: int
    stall_timeout_s: float
    inject: MemtestBitflip | None  # injections (the check's --inject)
    ecc_inject: dict[str, int] | None  # gpucheck.eud.memtest_ecc.inject_spec


@dataclass
class MemtestConfig:
    patterns: list[str] = field(default_factory=lambda: list(NAMES))
    passes: int = 1
    duration_s: float | None = None  # loop passes until this many seconds have gone (at least one)
    seed: int = 0
    fraction: float = 0.1  # of the free GPU memory
    headroom_fraction: float = 0.05  # keep this fraction of the total memory free ...
    headroom_min_bytes: int = 1 << 30  # ... and at least this much
    headroom_round: bool = False  # then test that headroom in a second allocation round
    round2_reserve_bytes: int = 256 << 20  # memory left free during the headroom round
    chunk_bytes: int = 1 << 30
    cpu_bytes: int = 16 << 20
    cpu_chunk_bytes: int = 8 << 20
    max_errors: int = 32  # error records kept per verify step
    report_errors: int = 8  # records kept in the summary
    confirm: bool = True
    copy_bytes: int = 1 << 30
    copy_repeats: int = 10
    block: int = 256
    blocks_per_sm: int = 32  # a cap on the occupancy API's answer (the grid is one wave either way)
    stall_timeout_s: float = 60.0  # a step of kernels still running after this long is a hang
    inject: MemtestBitflip | None = None
    ecc_inject: dict[str, int] | None = None  # gpucheck.eud.memtest_ecc.inject_spec

    @classmethod
    def from_args(cls, args: MemtestArgs) -> "MemtestConfig":
        from ..workers.settings import set_given

        cfg = cls()
        set_given(cfg, args, float, ("fraction", "headroom_fraction", "stall_timeout_s", "duration_s"))
        set_given(cfg, args, int, ("passes", "seed", "headroom_min_bytes", "round2_reserve_bytes", "chunk_bytes",
                                   "cpu_bytes", "cpu_chunk_bytes", "max_errors", "report_errors", "copy_bytes",
                                   "copy_repeats", "block", "blocks_per_sm"))
        set_given(cfg, args, bool, ("confirm", "headroom_round"))
        patterns, inject, ecc_inject = args.get("patterns"), args.get("inject"), args.get("ecc_inject")
        if patterns is not None:
            cfg.patterns = parse_patterns(patterns)
        cfg.inject = inject.copy() if inject else None
        cfg.ecc_inject = dict(ecc_inject) if ecc_inject else None
        cfg.check()
        return cfg

    def check(self) -> None:
        """ValueError naming the first setting that cannot be run."""
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"memtest fraction must be in (0, 1], not {self.fraction}")
        if self.passes < 1:
            raise ValueError(f"passes must be at least 1, not {self.passes}")
        if not 1 <= self.max_errors < 1 << 31:
            raise ValueError(f"max_errors must be in 1..2^31-1, not {self.max_errors}")
        if not 1 <= self.block <= MAX_BLOCK:  # a launch the driver refuses would read as a GPU fault
            raise ValueError(f"block must be in 1..{MAX_BLOCK} threads, not {self.block}")
        if self.blocks_per_sm < 1:
            raise ValueError(f"blocks_per_sm must be at least 1, not {self.blocks_per_sm}")
        if self.stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be > 0, not {self.stall_timeout_s}")
        if self.round2_reserve_bytes < 0:
            raise ValueError(f"round2_reserve_bytes must be >= 0, not {self.round2_reserve_bytes}")
        for key in ("chunk_bytes", "cpu_bytes", "cpu_chunk_bytes", "copy_bytes"):
            if getattr(self, key) < MIN_CHUNK_BYTES:
                raise ValueError(f"{key} must be at least {MIN_CHUNK_BYTES} bytes, not {getattr(self, key)}")
        if self.chunk_bytes > MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be at most {MAX_CHUNK_BYTES} (the kernels' 32-bit offsets), "
                             f"not {self.chunk_bytes}")


def memtest_worker(args: MemtestArgs, chan: Any) -> "MemtestResult | SetupError":
    """Worker target: run the pattern test on this worker's device; return plain data."""
    cfg = MemtestConfig.from_args(args)
    try:
        if chan.device == "cuda":
            backend: Any = CupyBackend.create(chan, cfg)
        else:
            backend = NumpyBackend(cfg)
    except ImportError as e:
        return {"setup_error": f"{type(e).__name__}: {e}"}
    except MemtestSetupError as e:
        return {"setup_error": str(e)}
    ecc = ecc_monitor(chan, cfg)
    chan.heartbeat(force=True)
    try:
        return run_memtest(backend, cfg, chan, ecc=ecc)
    finally:
        ecc.close()


def ecc_monitor(chan: Any, cfg: MemtestConfig) -> EccMonitor:
    """NVML's counters of this worker's GPU; none (and why) on a CPU stand-in or where NVML fails."""
    if chan.device != "cuda":
        return EccMonitor(None, cfg.ecc_inject, note="no ECC counters: a CPU worker stands in for the GPU")
    try:
        return EccMonitor(NvmlEccReader(int(chan.gpu or 0), chan.job.visible_device), cfg.ecc_inject)
    except EccReadError as e:
        mon = EccMonitor(None, None)
        mon.failure = str(e)
        return mon


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
        self.stats: Any = None  # the step's stats and error records (NumPy arrays)
        self.errs: Any = None

    def info(self) -> "MemtestDevice":
        return {"name": platform.processor() or platform.machine() or "cpu", "device": "cpu",
                "backend": self.name, "numpy": self.np.__version__}

    def target_bytes(self) -> "tuple[int, MemtestMemory]":
        return int(self.cfg.cpu_bytes), {
            "free_bytes": None, "total_bytes": None, "headroom_bytes": int(self.cfg.cpu_chunk_bytes),
            "note": f"host memory stands in for GPU memory: {self.cfg.cpu_bytes} bytes"}

    def second_round_target(self, released_bytes: int) -> "tuple[int, MemtestMemory]":
        """The CPU stand-in has no headroom to reach: its second round takes the released chunks'
        size plus cpu_chunk_bytes (its stand-in headroom) of new host memory."""
        return released_bytes + int(self.cfg.cpu_chunk_bytes), {"free_bytes": None, "reserve_bytes": None}

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
        self.stats = new_stats()
        self.errs = self.np.zeros(3 * self.cfg.max_errors, self.np.uint64)

    def read_step(self) -> tuple[Any, Any]:
        return self.stats, self.errs

    def _blocks(self, n: int, descending: bool) -> list[tuple[int, int]]:
        b = self.block_words
        out = [(s, min(n, s + b)) for s in range(0, n, b)]
        return out[::-1] if descending else out

    def fill(self, buf: Any, base: int, kind: int, seed: int, xor_write: int) -> None:
        np = self.np
        for s, e in self._blocks(buf.size, False):
            v = word_values(kind, seed, base + s, e - s)
            if xor_write:
                v ^= np.uint64(xor_write)
            buf[s:e] = v

    def check(self, buf: Any, base: int, kind: int, seed: int, xor_expect: int, write: bool, xor_write: int,
              descending: bool) -> None:
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

    def scrub(self) -> None:
        """Host memory has no L2 of a GPU to evict: nothing to do."""

    def flip(self, buf: Any, index: int, mask: int) -> None:
        buf[index] ^= self.np.uint64(mask)

    def timer(self) -> Any:
        return time.perf_counter()

    def elapsed(self, t0: Any, what: str = "kernels") -> float:
        return time.perf_counter() - t0

    def copy(self, dst: Any, src: Any) -> None:
        self.np.copyto(dst, src)

    def sync(self) -> None:
        pass

    def release(self, bufs: list[Any]) -> None:
        bufs.clear()


# ---------------------------------------------------------------------------------------------
# allocation and the copy baseline


@dataclass
class _Chunk:
    index: int
    base: int  # region word index of its first word
    words: int
    buf: Any
    address: int


def _allocate(backend: Any, target: int, chan: Any) -> tuple[list[_Chunk], str | None]:
    """Chunks covering `target` bytes (rounded down to 16), or fewer where memory ran out, and why."""
    target -= target % ALIGN
    chunks: list[_Chunk] = []
    base = 0
    note = None
    step = max(MIN_CHUNK_BYTES, backend.chunk_bytes() - backend.chunk_bytes() % ALIGN)
    while base * 8 < target:
        want = min(step, target - base * 8) // 8
        try:
            buf = backend.alloc(want)
        except MemoryError as e:
            note = (f"allocated {base * 8} of {target} bytes: out of memory at chunk {len(chunks)} "
                    f"(memory taken by another process?): {e}")
            break
        chunks.append(_Chunk(len(chunks), base, want, buf, backend.address(buf)))
        base += want
        chan.heartbeat()
    return chunks, note


def _copy_bandwidth(backend: Any, chunks: list[_Chunk], cfg: MemtestConfig, chan: Any) -> "MemtestCopy":
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
        samples.append(backend.elapsed(t0, "the copy baseline"))
        chan.heartbeat()
    med = statistics.median(samples)
    return {"gbps": 2.0 * n * 8 / med / 1e9 if med > 0 else None, "bytes": n * 8, "repeats": len(samples),
            "samples_s": [round(s, 9) for s in samples], "counted": "bytes read + bytes written"}


class _Injector:
    def __init__(self, spec: MemtestBitflip | None, cfg: MemtestConfig, chunks: list[_Chunk]):
        self.spec = spec
        self.done = 0
        self.texts: list[str] = []
        self.problem: str | None = None
        self.target: tuple[_Chunk, int] | None = None
        if not spec:
            return
        region_words = sum(c.words for c in chunks)
        self.pattern = spec.get("pattern") or cfg.patterns[0]
        bit = spec.get("bit")
        self.bit = int(bit) if bit is not None else 17
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
            chunk = _chunk_of(chunks, word)
            self.target = (chunk, word - chunk.base) if chunk else None
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


def _chunk_of(chunks: list[_Chunk], word: int) -> _Chunk | None:
    for c in chunks:
        if c.base <= word < c.base + c.words:
            return c
    return None


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass
class _Round:
    number: int  # 1: the main region; 2: the headroom round
    chunks: list[_Chunk]
    log: ErrorLog
    injector: _Injector | None = None

    @property
    def region_bytes(self) -> int:
        return 8 * sum(c.words for c in self.chunks)


class _Memtest:
    """One run_memtest: the rounds, passes, patterns and steps over a backend."""

    def __init__(self, backend: Any, cfg: MemtestConfig, chan: Any, ecc: EccMonitor):
        self.backend, self.cfg, self.chan, self.ecc = backend, cfg, chan, ecc
        self.per_pattern: dict[str, MemtestPatternTotals] = {
            name: {"runs": 0, "bytes": 0, "seconds": 0.0, "errors": 0} for name in cfg.patterns}
        self.t_start = time.monotonic()
        self.passes = 0
        self.stopped: str | None = None

    def step(self, rnd: _Round, name: str, si: int, seed: int, pass_index: int, confirming: bool) -> int:
        """One step of a pattern over every chunk of the round; the errors it found."""
        be, p, step = self.backend, BY_NAME[name], steps_for(name)[si]
        order = list(reversed(rnd.chunks)) if step.descending else rnd.chunks
        if step.op == "check":
            be.new_step()
        t0 = be.timer()
        if step.scrub_before:
            be.scrub()
        for c in order:
            if step.op == "fill":
                be.fill(c.buf, c.base, p.kind, seed, step.xor_write)
            else:
                be.check(c.buf, c.base, p.kind, seed, step.xor_expect, step.write, step.xor_write, step.descending)
            self.chan.heartbeat()
        secs = be.elapsed(t0, f"{name}: {step.label}")
        pp = self.per_pattern[name]
        pp["bytes"] += step.bytes_moved(rnd.region_bytes)
        pp["seconds"] += secs
        if step.op == "fill":
            if si == 0 and rnd.injector is not None and rnd.injector.due(name, confirming):
                rnd.injector.apply(be, name, pass_index, confirming)
            return 0
        stats, errs = be.read_step()
        ev = decode_step(stats, errs, self.cfg.max_errors)
        if not ev["errors"]:
            return 0
        for r in ev["records"]:
            hit = _chunk_of(rnd.chunks, r["word"])
            r["chunk"] = hit.index if hit else None
            r["address"] = hit.address + 8 * (r["word"] - hit.base) if hit else None
            if rnd.number == 2:
                r["round"] = 2
        event: MemtestStepEvent = {**ev, "pattern": name,
                                   "step": step.label + (" (confirmation run)" if confirming else ""),
                                   "pass": pass_index}
        rnd.log.add(event, run_key=(name, pass_index, si, confirming))
        return int(ev["errors"])

    def pattern(self, rnd: _Round, name: str, pass_index: int, confirming: bool) -> int:
        seed = pattern_seed(name, self.cfg.seed, pass_index)
        found = sum(self.step(rnd, name, si, seed, pass_index, confirming) for si in range(len(steps_for(name))))
        self.per_pattern[name]["runs"] += 1
        self.per_pattern[name]["errors"] += found
        return found

    def one_pass(self, rnd: _Round, pass_index: int, deadline: float | None) -> bool:
        """Every pattern once (and its confirmation run); False when a stop request cut it short."""
        for name in self.cfg.patterns:
            if self.chan.should_stop():
                self.stopped = self.chan.stop_reason or "stop"
                return False
            found = self.pattern(rnd, name, pass_index, False)
            if found and self.cfg.confirm:
                again = self.pattern(rnd, name, pass_index, True)
                rnd.log.confirm(name, pass_index, found, again)
            pp = self.per_pattern[name]
            self.chan.progress({
                "pattern": name, "pass": pass_index, "round": rnd.number, "errors": rnd.log.errors,
                "gbps": pp["bytes"] / pp["seconds"] / 1e9 if pp["seconds"] > 0 else None,
                "bytes_tested": rnd.region_bytes,
                "time_left_s": None if deadline is None else max(0.0, deadline - time.monotonic()),
                "first_error": rnd.log.first_record(),
            })
        return True

    def main_passes(self, rnd: _Round) -> None:
        deadline = None if self.cfg.duration_s is None else self.t_start + self.cfg.duration_s
        self.ecc.read("before pass 0", 0)
        while self.one_pass(rnd, self.passes, deadline):
            self.passes += 1
            self.ecc.read(f"after pass {self.passes - 1}", self.passes)
            if (self.passes >= self.cfg.passes) if deadline is None else (time.monotonic() >= deadline):
                break
        if self.stopped is None and self.chan.should_stop():
            self.stopped = self.chan.stop_reason

    def headroom_round(self, r1: _Round, headroom: int) -> "MemtestHeadroomRound":
        """Release the lowest chunks of round 1 (at least `headroom` bytes), keep the rest, allocate
        what is then free (but the reserve) and run one pass over it."""
        released: list[_Chunk] = []
        while r1.chunks and 8 * sum(c.words for c in released) < headroom:
            released.append(r1.chunks.pop(0))
        released_bytes = 8 * sum(c.words for c in released)
        bufs = [c.buf for c in released]
        released.clear()
        self.backend.release(bufs)
        round2: tuple[int, MemtestMemory] = self.backend.second_round_target(released_bytes)
        target, mem = round2
        chunks, note = _allocate(self.backend, target, self.chan)
        rnd = _Round(2, chunks, ErrorLog(report_errors=self.cfg.report_errors))
        region_bytes, first_chunks = rnd.region_bytes, _chunk_list(chunks)
        passes = 0
        if chunks and self.one_pass(rnd, 0, None):
            passes = 1
            self.ecc.read("after the headroom round", self.passes)
        info: MemtestHeadroomRound = {
            "released_bytes": released_bytes, "held_bytes": r1.region_bytes, "target_bytes": target,
            "chunk_count": len(chunks), **mem, "allocation_note": note, "region_bytes": region_bytes,
            "chunks": first_chunks, "passes": passes, "errors": rnd.log.summary()}
        self.backend.release([c.buf for c in rnd.chunks])
        rnd.chunks.clear()
        return info


def run_memtest(backend: Any, cfg: MemtestConfig, chan: Any, ecc: EccMonitor | None = None) -> "MemtestResult":
    """Allocate, measure the copy baseline, run the passes (and the headroom round); return plain
    data (see the module doc)."""
    run = _Memtest(backend, cfg, chan, ecc if ecc is not None else EccMonitor())
    out: MemtestResult = {"device": backend.info(), "backend": backend.name, "patterns": list(cfg.patterns),
                           "stopped": None, "notes": [], "injected": []}
    target, mem = backend.target_bytes()
    chunks, note = _allocate(backend, target, chan)
    mem.update(target_bytes=target - target % ALIGN, region_bytes=8 * sum(c.words for c in chunks),
               chunk_count=len(chunks), chunk_bytes=backend.chunk_bytes(), allocation_note=note)
    out["memory"] = mem
    out["chunks"] = _chunk_list(chunks)
    if not chunks:
        out["setup_error"] = (f"could not allocate memory to test (target {mem['target_bytes']} bytes"
                              + (f"; {note}" if note else "") + ")")
        return out
    r1 = _Round(1, chunks, ErrorLog(report_errors=cfg.report_errors))
    out["region_bytes"] = r1.region_bytes
    if note:
        out["notes"].append(note)
    out["copy"] = _copy_bandwidth(backend, chunks, cfg, chan)
    r1.injector = _Injector(cfg.inject, cfg, chunks)
    if r1.injector.problem:
        out["inject_problem"] = r1.injector.problem
    run.main_passes(r1)
    injected = r1.injector.texts + ([f"... and {r1.injector.done - 3} more flips (sticky)"]
                                    if r1.injector.done > 3 else [])
    r1.injector = None  # it holds a chunk: drop every reference so that the memory is freed when released
    out["headroom_round"] = None
    if cfg.headroom_round and run.stopped is None:
        out["headroom_round"] = run.headroom_round(r1, int(mem.get("headroom_bytes") or 0))
    backend.release([c.buf for c in r1.chunks])
    r1.chunks.clear()
    _finish(out, run, r1, injected)
    return out


def _chunk_list(chunks: list[_Chunk]) -> "list[MemtestChunk]":
    """The first chunks of a round, for the result."""
    return [{"index": c.index, "bytes": c.words * 8, "address": c.address} for c in chunks[:8]]


def _finish(out: "MemtestResult", run: _Memtest, r1: _Round, injected: list[str]) -> None:
    cfg, per_pattern = run.cfg, run.per_pattern
    total_bytes = sum(pp["bytes"] for pp in per_pattern.values())
    total_s = sum(pp["seconds"] for pp in per_pattern.values())
    for pp in per_pattern.values():
        pp["gbps"] = pp["bytes"] / pp["seconds"] / 1e9 if pp["seconds"] > 0 else None
    out.update({
        "passes": run.passes,
        "stopped": run.stopped,
        "per_pattern": per_pattern,
        "bytes_moved": total_bytes,
        "kernel_seconds": round(total_s, 6),
        "gbps": total_bytes / total_s / 1e9 if total_s > 0 else None,
        "errors": r1.log.summary(),
        "ecc": run.ecc.to_data(),
        "injected": injected + run.ecc.injected,
        "seconds": round(time.monotonic() - run.t_start, 3),
        "config": {"fraction": cfg.fraction, "passes": cfg.passes, "duration_s": cfg.duration_s, "seed": cfg.seed,
                   "max_errors": cfg.max_errors, "confirm": cfg.confirm, "headroom_round": cfg.headroom_round},
    })
