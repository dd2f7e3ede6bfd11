"""The burn: GEMMs in one worker process, verified while they run.

`burn_worker(args, chan)` is the worker target (gpucheck.workers.pool). For each dtype in turn,
for its share of the duration:

- operand *sets*: fresh A and B (n x n) from a seeded generator, rotating through four value
  distributions, because silent data corruption has been seen only for some dtypes and input
  ranges:
    normal  N(0, 1)
    wide    N(0, 1) scaled by 2^e per row and per column of each operand (e drawn per row and
            column), so that terms inside one dot product and results across the matrix span
            many binades (ranges per dtype in WIDE_EXP; no overflow)
    small   N(0, s) with s near the bottom of the dtype's range (SMALL_STD): subnormal inputs for
            fp16, tiny products elsewhere
    mixed   integers uniform in [-m, m]: mixed signs and exact cancellation; in fp32/tf32/fp64
            every partial sum is exact, so the reference must match exactly
  fp8 (e4m3fn) operands are generated in fp8 itself, one byte per element and no temporary (an
  fp8 GEMM is twice as fast as bf16, so three passes over a bf16 temporary cost as much as the
  verification budget): uniform random bytes, then one AND with the distribution's mask
  (FP8_CODE_MASKS), which also keeps the only NaN codes (0x7F, 0xFF) out:
    normal  +-(2^-9 .. 1.875): both signs, exponents 0-7, the eight binades up to 1
    wide    +-(2^-9 .. 240): even exponents 0-14, sixteen binades
    small   +-k 2^-9, k = 0..7: subnormal inputs only
    mixed   0 and +-2^-6 .. +-1: signed powers of two, exact products, exact cancellation
- each set is multiplied `repeats` times (R, default 16). The first result (C0) and the last (C1)
  are compared bitwise on the device: an integer checksum of each result's raw bits (no host
  copy), one host sync per set. Coverage is 2 of R results per set; the cost is one read of each
  compared result plus the operand generation, both amortised over R GEMMs.
- at most once per `ref_every_s`, C0 of the current set is compared on `ref_rows` random rows with
  a float64 reference computed from the same operands, within the dtype's rounding bound
  (reference_tolerance) relative to |A|.|B|.
- throughput: FLOPs of the R GEMMs per set over wall time, in windows of `window_s`; the median
  window (the first, warm-up window left out when there are three or more) is the GPU's TFLOP/s.
  The verification cost is inside the measured time.

Any mismatch is an SDC event (kind "repeat" or "reference") with dtype, set, iteration,
distribution and the size of the error; a third run tells which of the two repeats was wrong.

Fault injection (args): `bitflip` flips one bit in one verified result (C1 of one set), `slow`
sleeps (1/factor - 1) x the set's time after each set, `hang` stops the loop dead after
`after_s` seconds: no heartbeat, deaf to stop requests, like a kernel that never returns.

torch is imported only in burn_worker (inside the worker) and by callers that pass it in.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence, TypedDict

from ..workers.alloc import allocation_failure

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import BurnDtype, BurnResult, BurnRun, DeviceInfo, SdcEvent, SetupError

DTYPES: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8")
# Device types whose fp8 GEMM (torch._scaled_mm) a burn runs: CUDA GPUs of compute capability 8.9
# or later. torch has a CPU _scaled_mm too, but CPU workers stand in for GPUs with small sizes and
# a product burn never times it; the test suite adds "cpu" here (a fixture, tests/test_burn.py) to
# run the fp8 path on the CPU, and benchmarks/bench_burn.py does so to measure it.
FP8_DEVICE_TYPES: frozenset[str] = frozenset({"cuda"})
DISTRIBUTIONS: tuple[str, ...] = ("normal", "wide", "small", "mixed")
_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "float64": "fp64",
    "double": "fp64",
    "float8": "fp8",
    "e4m3": "fp8",
    "fp8_e4m3": "fp8",
}

# Unit roundoff per dtype: of the inputs as the GEMM reads them (u_in: TF32 reads only the top 10
# mantissa bits of an FP32 input, which may truncate: 2^-10; the other dtypes are generated in
# their own format, so they are exact),
# of the output (u_out), and of the accumulator (u_acc: FP32 on tensor cores; FP8 on Hopper is
# budgeted at 2^-14, its accumulator is narrower than FP32).
ROUNDOFF: dict[str, tuple[float, float, float]] = {
    "bf16": (0.0, 2.0**-8, 2.0**-24),
    "fp16": (0.0, 2.0**-11, 2.0**-24),
    "tf32": (2.0**-10, 2.0**-24, 2.0**-24),
    "fp32": (0.0, 2.0**-24, 2.0**-24),
    "fp64": (0.0, 2.0**-53, 2.0**-53),
    "fp8": (0.0, 2.0**-8, 2.0**-14),
}
# Standard deviation of the "small" distribution (see the module doc; fp8: FP8_CODE_MASKS).
SMALL_STD: dict[str, float] = {
    "bf16": 2.0**-50,
    "fp16": 2.0**-7,
    "tf32": 2.0**-50,
    "fp32": 2.0**-50,
    "fp64": 2.0**-400,
}
# Exponent range [lo, hi] of the per-row and per-column scales of the "wide" distribution. A
# result element is a sum of terms scaled by up to 2^(4*hi): for fp16 that keeps |C| (about
# 6 standard deviations of a K = 32768 dot product, times 16) far below 65504.
WIDE_EXP: dict[str, tuple[int, int]] = {
    "bf16": (-20, 10),
    "fp16": (-6, 1),
    "tf32": (-20, 10),
    "fp32": (-20, 10),
    "fp64": (-100, 50),
}
# fp8 e4m3fn codes (sign, 4 exponent bits, 3 mantissa bits; bias 7; NaN only at 0x7F and 0xFF):
# each distribution is uniform random bytes ANDed with its mask (see the module doc). Every mask
# clears at least one exponent bit, so no code is NaN, and the largest magnitude is 240: a K-term
# dot product stays below 2^30, far inside bf16 (the output) and the fp32 accumulator.
FP8_CODE_MASKS: dict[str, int] = {
    "normal": 0b1_0111_111,  # exponents 0..7
    "wide": 0b1_1110_111,  # even exponents 0..14
    "small": 0b1_0000_111,  # exponent 0: subnormals
    "mixed": 0b1_0111_000,  # mantissa 0: signed powers of two (and zero)
}


class DtypeError(ValueError):
    pass


def parse_dtypes(value: str | Sequence[str]) -> list[str]:
    """'bf16,fp32' or ['bf16', 'fp32'] -> ['bf16', 'fp32']; DtypeError for an unknown name."""
    from ..core.choices import parse_choices

    return parse_choices(value, DTYPES, what="dtype", error=DtypeError, aliases=_ALIASES)

def reference_tolerance(dtype: str, k: int) -> float:
    """Largest |C - ref| / (|A|.|B|) a healthy GEMM of inner size k shows for `dtype`: twice
    (2 u_in + u_out + 4 sqrt(k) u_acc). Input rounding and output rounding are bounded worst case;
    accumulation error grows like sqrt(k) for the sums of mixed-sign terms a burn produces."""
    u_in, u_out, u_acc = ROUNDOFF[dtype]
    return 2.0 * (2.0 * u_in + u_out + 4.0 * math.sqrt(k) * u_acc)


def mixed_max(dtype: str, k: int) -> int:
    """Largest |integer| of the "mixed" distribution: fp16 sums must stay below 65504."""
    if dtype == "fp16":
        return 2 if k * 4 <= 60000 else 1
    return 8


def exact_mixed(dtype: str, k: int) -> bool:
    """Whether a "mixed" GEMM must match the reference exactly: every partial sum is an integer
    below 2^24, exact in an FP32 (or FP64) accumulator, and the output keeps it."""
    return dtype in ("fp32", "tf32", "fp64") and k * mixed_max(dtype, k) ** 2 < 2**24


def flops_per_gemm(n: int) -> float:
    return 2.0 * float(n) ** 3


class BurnBitflip(TypedDict):
    """The bitflip injection: flip `bit` of element (row, col) of the last GEMM of operand set
    `set` (None: the top mantissa bit, the middle row, a third of the columns)."""

    set: int
    bit: int | None
    row: int | None
    col: int | None


class BurnArgs(TypedDict, total=False):
    """burn_worker's arguments (BurnConfig.from_args: a key not given keeps BurnConfig's default)."""

    duration_s: float
    dtypes: list[str] | str  # names, or a comma list (parse_dtypes)
    size: int
    repeats: int
    window_s: float
    ref_rows: int
    ref_every_s: float
    seed: int
    max_events: int
    distributions: list[str]
    bitflip: BurnBitflip  # injections (the check's --inject)
    slow: float
    hang_after_s: float


@dataclass
class BurnConfig:
    duration_s: float = 30.0
    dtypes: list[str] = field(default_factory=lambda: ["bf16"])
    size: int = 8192
    repeats: int = 16
    window_s: float = 1.0
    ref_rows: int = 8
    ref_every_s: float = 1.0
    seed: int = 0
    bitflip: BurnBitflip | None = None
    slow: float | None = None  # factor in (0, 1]
    hang_after_s: float | None = None
    max_events: int = 8
    distributions: tuple[str, ...] = DISTRIBUTIONS  # the benchmark isolates verification with ("normal",)
    # A fixed amount of work: each dtype stops after this many sets (the duration still bounds it);
    # None: the duration alone. Tests that count work set it, so a loaded machine does the same work.
    sets: int | None = None

    @classmethod
    def from_args(cls, args: BurnArgs) -> "BurnConfig":
        from ..workers.settings import set_given

        cfg = cls()
        set_given(cfg, args, float, ("duration_s", "window_s", "ref_every_s"))
        set_given(cfg, args, int, ("size", "repeats", "ref_rows", "seed", "max_events"))
        if args.get("dtypes") is not None:
            cfg.dtypes = parse_dtypes(args["dtypes"])
        bitflip = args.get("bitflip")
        cfg.bitflip = bitflip.copy() if bitflip is not None else None
        cfg.slow = float(args["slow"]) if args.get("slow") is not None else None
        cfg.hang_after_s = float(args["hang_after_s"]) if args.get("hang_after_s") is not None else None
        if args.get("distributions") is not None:
            cfg.distributions = tuple(str(d) for d in args["distributions"])
            unknown = [d for d in cfg.distributions if d not in DISTRIBUTIONS]
            if unknown or not cfg.distributions:
                raise ValueError(f"unknown distribution(s) {unknown} (use {', '.join(DISTRIBUTIONS)})")
        if cfg.size < 2:
            raise ValueError(f"size must be at least 2, not {cfg.size}")
        if cfg.repeats < 2:
            raise ValueError(f"repeats must be at least 2 (two results are compared), not {cfg.repeats}")
        if cfg.slow is not None and not 0.0 < cfg.slow <= 1.0:
            raise ValueError(f"slow factor must be in (0, 1], not {cfg.slow}")
        return cfg


def burn_worker(args: BurnArgs, chan: Any) -> "BurnResult | SetupError":
    """Worker target: burn, verify, measure; return plain data (see Burner.run)."""
    from ..workers.pool import torch_and_device

    cfg = BurnConfig.from_args(args)
    torch, dev, setup_error = torch_and_device(chan)
    if setup_error:
        return setup_error
    return Burner(torch, dev, chan, cfg).run()


class Burner:
    """The burn loop on one device. `torch` is passed in so that this module never imports it."""

    def __init__(self, torch: Any, dev: Any, chan: Any, cfg: BurnConfig):
        self.torch = torch
        self.dev = dev
        self.chan = chan
        self.cfg = cfg
        self.events: list[SdcEvent] = []
        self.event_count = 0
        self.injected: list[str] = []
        self.flipped = False
        self.iterations = 0
        self.t_start = time.monotonic()
        self.deadline = self.t_start + cfg.duration_s
        self.notes: list[str] = []

    # -- device -------------------------------------------------------------------------------
    def device_info(self) -> "DeviceInfo":
        from ..workers.pool import device_info

        return device_info(self.torch, self.dev)

    def unsupported(self, dtype: str, info: "DeviceInfo") -> str | None:
        torch = self.torch
        if dtype == "fp8":
            if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
                return f"torch {torch.__version__} has no float8 matmul (torch._scaled_mm)"
            if self.dev.type == "cuda":
                cap = tuple(info.get("capability") or (0, 0))
                if cap < (8, 9):
                    return (f"fp8 needs a GPU with compute capability >= 8.9 (Ada, Hopper or later); "
                            f"this GPU is {cap[0]}.{cap[1]}")
            elif self.dev.type not in FP8_DEVICE_TYPES:
                return "fp8 runs only on CUDA GPUs with compute capability >= 8.9 (torch._scaled_mm)"
            if self.cfg.size % 16:
                return f"fp8 needs a size divisible by 16 (torch._scaled_mm), not {self.cfg.size}"
        return None

    def _set_precision(self, dtype: str) -> None:
        m = self.torch.backends.cuda.matmul
        if dtype in ("tf32", "fp32"):
            mode = "tf32" if dtype == "tf32" else "ieee"
            if hasattr(m, "fp32_precision"):  # torch >= 2.9: the only API to use (mixing raises)
                m.fp32_precision = mode
            else:
                m.allow_tf32 = dtype == "tf32"
        # fp16/bf16 GEMMs reduce split-K partial sums in FP32, not in the output type, so that the
        # reference tolerance can stay tight (the benchmark's bare loop uses the same setting).
        for flag in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
            try:
                setattr(m, flag, False)
            except (AttributeError, RuntimeError):
                pass

    # -- the whole run --------------------------------------------------------------------------
    def run(self) -> "BurnResult":
        info = self.device_info()
        out: BurnRun = {
            "device": info,
            "config": {"size": self.cfg.size, "repeats": self.cfg.repeats, "duration_s": self.cfg.duration_s,
                       "window_s": self.cfg.window_s, "ref_rows": self.cfg.ref_rows, "seed": self.cfg.seed},
            "dtypes": {},
            "skipped": {},
            "sdc": [],
            "sdc_count": 0,
            "injected": [],
            "notes": [],
            "stopped": None,
        }
        plan = []
        for dt in self.cfg.dtypes:
            why = self.unsupported(dt, info)
            if why:
                out["skipped"][dt] = why
            else:
                plan.append(dt)
        if self.dev.type == "cpu" and "tf32" in plan:
            self.notes.append("tf32 on the CPU computes in full fp32 (TF32 is a tensor-core format)")
        self.t_start = time.monotonic()
        self.deadline = self.t_start + self.cfg.duration_s
        for i, dt in enumerate(plan):
            if self.chan.should_stop():
                out["stopped"] = self.chan.stop_reason
                out["skipped"][dt] = f"not run: stopped ({self.chan.stop_reason})"
                continue
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                out["skipped"][dt] = "not run: the burn's time was used up"
                continue
            try:
                out["dtypes"][dt] = self.burn_dtype(dt, remaining / (len(plan) - i))
            except _AllocationError as e:
                out["skipped"][dt] = str(e)
                out.setdefault("allocation_errors", []).append(dt)
        if out["stopped"] is None and self.chan.should_stop():
            out["stopped"] = self.chan.stop_reason
        out["sdc"] = self.events
        out["sdc_count"] = self.event_count
        out["injected"] = self.injected
        out["notes"] = self.notes
        return {**out, "iterations": self.iterations, "seconds": round(time.monotonic() - self.t_start, 3)}

    # -- one dtype ----------------------------------------------------------------------------
    def burn_dtype(self, dtype: str, seconds: float) -> "BurnDtype":
        torch, dev, cfg = self.torch, self.dev, self.cfg
        n, reps = cfg.size, cfg.repeats
        self._set_precision(dtype)
        A, B, C0, C1, mm, fill = self._operands(dtype)
        self.chan.heartbeat(force=True)
        esize = C0.element_size()
        sum_view = torch.int16 if esize == 2 else torch.int32  # fp64: checksum over 32-bit halves
        flip_view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[esize]

        def checksum(C: Any) -> Any:
            return C.view(sum_view).sum(dtype=torch.int64)

        res: BurnDtype = {
            "dtype": dtype, "size": n, "repeats": reps, "iterations": 0, "sets": 0, "seconds": 0.0,
            "tflops": None, "tflops_windows": [], "repeat_checks": 0, "repeat_mismatches": 0,
            "reference_checks": 0, "reference_elements": 0, "reference_failures": 0,
            "reference_max_error": 0.0, "reference_tolerance": reference_tolerance(dtype, n),
            "distributions": {d: 0 for d in DISTRIBUTIONS}, "sdc_events": 0,
        }
        gen = torch.Generator(device=dev)
        rng = random.Random((self.cfg.seed * 1_000_003) ^ (DTYPES.index(dtype) + 1))
        flop_set = flops_per_gemm(n) * reps
        t0 = time.monotonic()
        end = min(t0 + seconds, self.deadline)
        w_start, w_flops = t0, 0.0
        last_ref = -math.inf
        s = 0
        now = t0
        while True:
            now = time.monotonic()
            if now >= end or self.chan.should_stop() or (cfg.sets is not None and s >= cfg.sets):
                break
            set_start = now
            dist = cfg.distributions[s % len(cfg.distributions)]
            gen.manual_seed(self._seed(dtype, s))
            fill(dist, gen)
            mm(C0)
            s0 = checksum(C0)
            for _ in range(1, reps):
                mm(C1)
            flip = self._flip_due(s)
            if flip is not None:
                self._flip(C1, flip_view, dtype, s, flip)
            s1 = checksum(C1)
            mismatch = bool((s0 != s1).item())  # the one host sync of the set
            res["repeat_checks"] += 1
            res["iterations"] += reps
            res["sets"] += 1
            res["distributions"][dist] += 1
            self.iterations += reps
            if mismatch:
                res["repeat_mismatches"] += 1
                self._repeat_event(res, dtype, dist, s, C0, C1, mm, sum_view, flip is not None)
            if time.monotonic() - last_ref >= cfg.ref_every_s:
                last_ref = time.monotonic()
                self._reference_check(res, dtype, dist, s, A, B, C0, rng)
            if cfg.slow is not None and cfg.slow < 1.0:
                time.sleep((time.monotonic() - set_start) * (1.0 / cfg.slow - 1.0))
            if cfg.hang_after_s is not None and time.monotonic() - self.t_start >= cfg.hang_after_s:
                self._hang()
            s += 1
            now = time.monotonic()
            w_flops += flop_set
            if now - w_start >= cfg.window_s:
                self._close_window(res, dtype, w_flops, now - w_start)
                w_start, w_flops = now, 0.0
            else:
                self.chan.heartbeat()
        if w_flops and (now - w_start >= 0.5 * cfg.window_s or not res["tflops_windows"]):
            self._close_window(res, dtype, w_flops, max(now - w_start, 1e-9))
        res["seconds"] = round(now - t0, 4)
        ws = res["tflops_windows"]
        if ws:
            res["tflops"] = statistics.median(ws[1:] if len(ws) >= 3 else ws)
        return res

    def _operands(self, dtype: str) -> tuple[Any, Any, Any, Any, Any, Any]:
        """A, B, C0, C1 (n x n), the set's GEMM `mm(out)` and operand fill `fill(dist, gen)`.
        fp8: B is column-major (torch._scaled_mm's layout), the output bf16, the operands filled
        in fp8 itself (_fill_fp8). _AllocationError when they do not fit."""
        torch, dev, n = self.torch, self.dev, self.cfg.size
        fp8 = dtype == "fp8"
        store = torch.float8_e4m3fn if fp8 else {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
                                                 "fp32": torch.float32, "fp64": torch.float64}[dtype]
        out_dtype = torch.bfloat16 if fp8 else store
        try:
            A = torch.empty((n, n), dtype=store, device=dev)
            Bt = torch.empty((n, n), dtype=store, device=dev)
            C0 = torch.empty((n, n), dtype=out_dtype, device=dev)
            C1 = torch.empty((n, n), dtype=out_dtype, device=dev)
            one = torch.ones((), dtype=torch.float32, device=dev) if fp8 else None
        except Exception as e:  # noqa: BLE001 - only allocation failures are caught; the rest re-raised
            why = allocation_failure(e)
            if why is None:
                raise  # a CUDA error while allocating is a finding, not a sizing problem
            raise _AllocationError(f"could not allocate the {n}x{n} operands "
                                   f"(memory in use by another process? a smaller --size?): {why}") from None
        if fp8:
            B = Bt.t()  # column-major, as torch._scaled_mm wants its second operand

            def mm(out: Any) -> None:
                torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, out=out)

            def fill(dist: str, gen: Any) -> None:
                self._fill_fp8(A, dist, gen)
                self._fill_fp8(Bt, dist, gen)
        else:
            B = Bt

            def mm(out: Any) -> None:
                torch.mm(A, B, out=out)

            def fill(dist: str, gen: Any) -> None:
                self._fill(A, dist, dtype, gen)
                self._fill(B, dist, dtype, gen)
        return A, B, C0, C1, mm, fill

    def _fill_fp8(self, X: Any, dist: str, gen: Any) -> None:
        """An fp8 operand in place, in two passes over its own bytes and no temporary: uniform random
        bytes, then the distribution's mask (FP8_CODE_MASKS: no NaN code survives it)."""
        codes = X.view(self.torch.uint8)
        codes.random_(0, 256, generator=gen)
        codes.bitwise_and_(FP8_CODE_MASKS[dist])

    def _seed(self, dtype: str, s: int) -> int:
        # Every worker uses the same operand sets (same seed): results are comparable across GPUs.
        return (self.cfg.seed * 7919 + DTYPES.index(dtype) * 104729 + s) % (2**63 - 1)

    def _fill(self, X: Any, dist: str, dtype: str, gen: Any) -> None:
        torch = self.torch
        n = X.shape[0]
        if dist == "normal":
            X.normal_(0.0, 1.0, generator=gen)
        elif dist == "small":
            X.normal_(0.0, SMALL_STD[dtype], generator=gen)
        elif dist == "mixed":
            m = mixed_max(dtype, n)
            X.random_(-m, m + 1, generator=gen)
        elif dist == "wide":
            lo, hi = WIDE_EXP[dtype]
            X.normal_(0.0, 1.0, generator=gen)
            r = torch.randint(lo, hi + 1, (n, 1), generator=gen, device=self.dev).to(torch.float64).exp2_()
            c = torch.randint(lo, hi + 1, (1, n), generator=gen, device=self.dev).to(torch.float64).exp2_()
            X.mul_(r.to(X.dtype)).mul_(c.to(X.dtype))
        else:
            raise ValueError(f"unknown distribution {dist!r}")

    # -- windows and progress -------------------------------------------------------------------
    def _close_window(self, res: "BurnDtype", dtype: str, flops: float, seconds: float) -> None:
        tf = flops / seconds / 1e12
        res["tflops_windows"].append(tf)
        ws = res["tflops_windows"]
        self.chan.progress({
            "dtype": dtype,
            "tflops": tf,
            "tflops_median": statistics.median(ws[1:] if len(ws) >= 3 else ws),
            "iterations": self.iterations,
            "errors": self.event_count,
            "time_left_s": max(0.0, self.deadline - time.monotonic()),
            "windows": len(ws),
        })

    # -- verification ---------------------------------------------------------------------------
    def _add_event(self, res: "BurnDtype", ev: "SdcEvent") -> None:
        self.event_count += 1
        res["sdc_events"] += 1
        if len(self.events) < self.cfg.max_events:
            self.events.append(ev)

    def _repeat_event(self, res: "BurnDtype", dtype: str, dist: str, s: int, C0: Any, C1: Any,
                      mm: Any, sum_view: Any, injected: bool) -> None:
        torch = self.torch
        n, reps = self.cfg.size, self.cfg.repeats
        v0, v1 = C0.view(sum_view), C1.view(sum_view)
        per = v0.shape[1] // n  # 32-bit words per element (fp64: 2)
        ne_words = v0 != v1
        ne = ne_words.view(n, n, per).any(dim=2) if per > 1 else ne_words
        count = int(ne.sum().item())
        first = ne.flatten().nonzero()
        f = int(first[0].item()) if first.numel() else 0
        a, b = C0.to(torch.float64), C1.to(torch.float64)
        d = (a - b).abs()
        d = torch.where(ne, d, torch.zeros_like(d))
        max_abs = float(torch.nan_to_num(d, nan=math.inf).max().item())
        rel = d / a.abs().clamp_min(torch.finfo(torch.float64).tiny)
        max_rel = float(torch.nan_to_num(rel, nan=math.inf).max().item())
        # A third run says which of the two was the odd one out.
        C2 = torch.empty_like(C0)
        mm(C2)
        v2 = C2.view(sum_view)
        same0, same1 = bool(torch.equal(v2, v0)), bool(torch.equal(v2, v1))
        if same0 and not same1:
            odd = f"repeat {reps - 1}"
        elif same1 and not same0:
            odd = "repeat 0"
        else:
            odd = "all three runs differ"
        self._add_event(res, {
            "kind": "repeat", "dtype": dtype, "distribution": dist, "set": s,
            "iteration": s * reps + reps - 1, "elements": count, "first": [f // n, f % n],
            "max_abs_error": max_abs, "max_rel_error": max_rel, "odd_one_out": odd,
            "time_s": round(time.monotonic() - self.t_start, 3), "injected": injected,
        })

    def _reference_check(self, res: "BurnDtype", dtype: str, dist: str, s: int, A: Any, B: Any,
                         C: Any, rng: random.Random) -> None:
        torch = self.torch
        n = self.cfg.size
        k = max(1, min(self.cfg.ref_rows, n))
        rows_list = sorted(rng.sample(range(n), k))
        rows = torch.tensor(rows_list, dtype=torch.long, device=self.dev)
        f64 = torch.float64

        def wide(x: Any) -> Any:  # exact conversion to float64 (float8 goes through float32)
            return x.to(torch.float32).to(f64) if x.dtype == getattr(torch, "float8_e4m3fn", None) else x.to(f64)

        a = wide(A.index_select(0, rows))
        aa = a.abs()
        ref = torch.empty((k, n), dtype=f64, device=self.dev)
        den = torch.empty((k, n), dtype=f64, device=self.dev)
        blk = max(1, min(n, (1 << 26) // n))  # at most 64 Mi float64 of B at a time
        for j in range(0, n, blk):
            b = wide(B[:, j:j + blk])
            ref[:, j:j + blk] = a @ b
            den[:, j:j + blk] = aa @ b.abs()
        got = C.index_select(0, rows).to(f64)
        err = (got - ref).abs()
        if dist == "mixed" and exact_mixed(dtype, n):
            tol, floor = 0.0, 0.0
        else:
            tol, floor = reference_tolerance(dtype, n), float(torch.finfo(C.dtype).tiny)
        bad = ~(err <= den * tol + floor)  # NaN is bad
        nbad = int(bad.sum().item())
        norm = torch.nan_to_num(err / den.clamp_min(torch.finfo(f64).tiny), nan=math.inf)
        worst = float(norm.max().item())
        res["reference_checks"] += 1
        res["reference_elements"] += k * n
        res["reference_max_error"] = max(res["reference_max_error"], worst)
        if nbad:
            res["reference_failures"] += 1
            score = torch.where(bad, torch.nan_to_num(err, nan=math.inf), torch.full_like(err, -1.0))
            idx = int(score.flatten().argmax().item())
            r, col = rows_list[idx // n], idx % n
            self._add_event(res, {
                "kind": "reference", "dtype": dtype, "distribution": dist, "set": s,
                "iteration": s * self.cfg.repeats, "elements": nbad, "first": [r, col],
                "got": float(got.flatten()[idx].item()), "expected": float(ref.flatten()[idx].item()),
                "max_abs_error": float(torch.nan_to_num(err, nan=math.inf).max().item()),
                "normalized_error": worst, "tolerance": tol,
                "time_s": round(time.monotonic() - self.t_start, 3), "injected": False,
            })

    # -- fault injection ------------------------------------------------------------------------
    def _flip_due(self, s: int) -> BurnBitflip | None:
        bf = self.cfg.bitflip
        if bf is None or self.flipped:
            return None
        return bf if s == int(bf.get("set", 1)) else None

    def _flip(self, C: Any, view_dtype: Any, dtype: str, s: int, bf: BurnBitflip) -> None:
        torch = self.torch
        n = self.cfg.size
        nbits = C.element_size() * 8
        mantissa = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}[C.dtype]
        # Default: the top mantissa bit (a relative change of up to 1/2, like a flipped bit in a
        # multiplier's output).
        given_bit, given_row, given_col = bf.get("bit"), bf.get("row"), bf.get("col")
        bit = int(given_bit) if given_bit is not None else mantissa - 1
        if not 0 <= bit < nbits:
            raise ValueError(f"bitflip bit must be in 0..{nbits - 1} for {dtype}, not {bit}")
        row = int(given_row) % n if given_row is not None else n // 2
        col = int(given_col) % n if given_col is not None else n // 3
        mask = -(1 << bit) if bit == nbits - 1 else (1 << bit)
        flat = C.view(view_dtype).view(-1)
        flat[row * n + col:row * n + col + 1].bitwise_xor_(torch.tensor([mask], dtype=view_dtype, device=self.dev))
        self.flipped = True
        self.injected.append(
            f"bitflip: {dtype} set {s} result {self.cfg.repeats - 1}, element ({row}, {col}), bit {bit}")

    def _hang(self) -> None:
        """Stand-in for a kernel that never returns: no heartbeat, no progress, no reaction to a
        stop request or SIGTERM. Only SIGKILL from the supervisor ends it."""
        while True:
            time.sleep(1.0)


class _AllocationError(RuntimeError):
    pass
