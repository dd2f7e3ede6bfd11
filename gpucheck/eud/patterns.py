"""HBM pattern test: the patterns, their reference values, and the error summaries (pure).

Definitions (the CUDA kernels in gpucheck/kernels/memtest.cu compute exactly the same):

- A **word** is 64 bits, stored little-endian (as the GPU stores a `uint64`).
- The **tested region** is the concatenation of the chunks the test allocated, in allocation
  order. Word `w` of the region is at **byte offset** `8 * w` from its start. Every pattern value
  is a function of `w` (and a seed), so a word's expected value never depends on which chunk it
  lives in or on the order the GPU wrote it. Error offsets are region byte offsets; the error
  record also carries the chunk and the device address of the word.
- Bit `b` of a word (0 = least significant) lives in byte `offset + b // 8`.

Patterns (value of word w):

| name | value |
|---|---|
| zeros | 0x0000000000000000 |
| ones | 0xFFFFFFFFFFFFFFFF |
| walking-ones | 1 << (w mod 64): every bit position is the lone one in one of each 64 consecutive words |
| walking-zeros | ~(1 << (w mod 64)) |
| checkerboard | 0x5555555555555555 for even w, 0xAAAAAAAAAAAAAAAA for odd w (every bit differs from its neighbours in the word and in the next word) |
| checkerboard-inv | the inverse: 0xAAAA... for even w, 0x5555... for odd w |
| address | 8 * w, the word's own byte offset (address-in-address: every word distinct, catches address-decoder faults that alias two locations); then its complement ~(8 * w): fill A; verify A and write ~A; verify ~A (bits 0-2, always 0 in a byte offset, and the bits above the region's size then hold 1s) |
| random | splitmix64(seed, w): `gc_mix64` on the device, gpucheck.kernels.splitmix64 here; regenerated from the seed for checking, never stored |
| moving-inversions | a random base pattern P (seed ^ MI_SALT), four steps: fill P; ascending: verify P and write ~P word by word; descending: verify ~P and write P; verify P |

Moving inversions, gpucheck's variant: memtest86's "moving inversions" walks memory one word at a
time, ascending then descending, so that a write to one cell that disturbs a neighbour is seen
when the neighbour is read later in the walk. On a GPU thousands of words are in flight at once,
so "ascending" means the grid-stride sweep starts at the bottom of each chunk and the chunks are
taken in order (and the reverse for "descending"): the order is ascending at the granularity of a
sweep (blocks x threads x 4 words), not of a word. What it still catches: a cell that cannot hold
the inverse of what it held (each bit goes 0->1 and 1->0 in place, read back right after),
coupling between words written at different times within the sweep, and retention over the time
between the steps. The base pattern is random (memtest86 test 7 uses a random pattern with its
complement) so neighbouring bits take all combinations.

Every other pattern is a fill step (every chunk) followed by a verify step (every chunk): the whole
region is written before the first word is read back, so a write that corrupts a word elsewhere
(an address fault) is caught whatever the distance. `address` adds the complement step: its verify
writes ~(8 w) back, and a last verify reads the complement, so every address bit is stored both
as 0 and as 1 in every word (8 w alone never sets bits 0-2, nor the bits above the region size).

Between the moving-inversions steps the GPU backend scrubs the L2 cache (a read and rewrite of a
scratch buffer twice the L2's size): a sweep ends where the next one starts, and without the scrub
the next sweep's first ~50 MB would be read back from dirty L2 lines instead of HBM.

Verification results (both on the GPU and in the NumPy path) use one layout, `STATS_WORDS`
uint64 per step:

    [0] miscompared words      [1] error slots claimed (records kept: min(this, max_errors))
    [2] OR of all flipped bits [3] lowest error word (2**64-1 when none)  [4] highest error word
    [8 + b]  errors where bit b read 1 but 0 was written (0 -> 1)
    [72 + b] errors where bit b read 0 but 1 was written (1 -> 0)

and an error buffer of `max_errors` records (word, expected, actual).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import (MemtestConfirmation, MemtestErrorRecord, MemtestErrors, MemtestStep,
                                   MemtestStepEvent)

MASK64 = (1 << 64) - 1

# Pattern kinds, as the kernels number them (memtest.cu mt_word).
KIND_ZEROS = 0
KIND_ONES = 1
KIND_WALKING_ONES = 2
KIND_WALKING_ZEROS = 3
KIND_CHECKERBOARD = 4
KIND_CHECKERBOARD_INV = 5
KIND_ADDRESS = 6
KIND_RANDOM = 7

CHECKER_EVEN = 0x5555555555555555
CHECKER_ODD = 0xAAAAAAAAAAAAAAAA
MI_SALT = 0x6D6F76696E67  # "moving": the moving-inversions base differs from the random pattern

# Stats layout (memtest.cu MT_*).
STATS_COUNT = 0
STATS_SLOTS = 1
STATS_OR = 2
STATS_MIN = 3
STATS_MAX = 4
STATS_UP = 8
STATS_DOWN = 72
STATS_WORDS = 136


@dataclass(frozen=True)
class Pattern:
    name: str
    kind: int  # kernel kind of the (base) pattern
    description: str
    moving_inversions: bool = False


PATTERNS: tuple[Pattern, ...] = (
    Pattern("zeros", KIND_ZEROS, "all bits 0"),
    Pattern("ones", KIND_ONES, "all bits 1"),
    Pattern("walking-ones", KIND_WALKING_ONES, "one bit set, walking through the 64 positions word by word"),
    Pattern("walking-zeros", KIND_WALKING_ZEROS, "one bit clear, walking through the 64 positions"),
    Pattern("checkerboard", KIND_CHECKERBOARD, "0x5555... / 0xAAAA... alternating by word"),
    Pattern("checkerboard-inv", KIND_CHECKERBOARD_INV, "0xAAAA... / 0x5555... alternating by word"),
    Pattern("address", KIND_ADDRESS, "each word holds its own byte offset"),
    Pattern("random", KIND_RANDOM, "splitmix64(seed, word), regenerated for checking"),
    Pattern("moving-inversions", KIND_RANDOM,
            "random base P: fill P; ascending verify P / write ~P; descending verify ~P / write P; verify P",
            moving_inversions=True),
)
BY_NAME: dict[str, Pattern] = {p.name: p for p in PATTERNS}
NAMES: tuple[str, ...] = tuple(p.name for p in PATTERNS)


class PatternError(ValueError):
    pass


def parse_patterns(value: str | Iterable[str] | None) -> list[str]:
    """'zeros,random' or ['zeros', 'random'] (or None / 'all' = every pattern) -> names in the
    order given; `_` and `-` are interchangeable. PatternError for an unknown name."""
    if value is None:
        return list(NAMES)
    from ..core.choices import parse_choices

    return parse_choices(value, NAMES, what="pattern", error=PatternError, dash_underscore=True, allow_all=True)

# ---------------------------------------------------------------------------------------------
# steps


@dataclass(frozen=True)
class Step:
    """One sweep over every chunk: a fill, or a verify that may write a new value back.

    fill:   word w := pattern(w) ^ xor_write
    check:  expect pattern(w) ^ xor_expect; with write, word w := pattern(w) ^ xor_write
    descending: chunks last to first, each swept from its top.
    """

    op: str  # "fill" | "check"
    label: str
    xor_expect: int = 0
    xor_write: int = 0
    write: bool = False
    descending: bool = False
    scrub_before: bool = False  # evict the L2 cache first: this sweep starts where the last one ended

    def bytes_moved(self, region_bytes: int) -> int:
        """Bytes written plus bytes read by this step over the region."""
        if self.op == "fill":
            return region_bytes
        return region_bytes * (2 if self.write else 1)


def steps_for(pattern: str) -> list[Step]:
    p = BY_NAME[pattern]
    inv = MASK64
    if p.moving_inversions:
        return [
            Step("fill", "fill P"),
            Step("check", "ascending verify P, write ~P", xor_expect=0, xor_write=inv, write=True),
            Step("check", "descending verify ~P, write P", xor_expect=inv, xor_write=0, write=True, descending=True,
                 scrub_before=True),
            Step("check", "verify P", scrub_before=True),
        ]
    if p.kind == KIND_ADDRESS:  # the address and its complement: every address bit stored as 0 and as 1
        return [
            Step("fill", "fill"),
            Step("check", "verify, write the complement", xor_write=inv, write=True),
            Step("check", "verify the complement", xor_expect=inv),
        ]
    return [Step("fill", "fill"), Step("check", "verify")]


def pattern_seed(pattern: str, seed: int, pass_index: int) -> int:
    """The seed a pattern uses in a pass: every pass of a loop writes different random data."""
    s = (int(seed) + 0x9E3779B97F4A7C15 * (int(pass_index) + 1)) & MASK64
    return s ^ MI_SALT if BY_NAME[pattern].moving_inversions else s


# ---------------------------------------------------------------------------------------------
# kernels


# Pattern families of memtest.cu (one kernel pair per family): the value of word w is
# family(w; p0, p1) ^ xor.
FAMILIES: tuple[str, ...] = ("pair", "walk", "address", "random")


@dataclass(frozen=True)
class KernelPattern:
    family: str
    p0: int = 0
    p1: int = 0
    xor: int = 0  # folded by the host into the kernels' xexp / xwrite


def kernel_pattern(kind: int, seed: int) -> KernelPattern:
    """The memtest.cu family and parameters that compute pattern `kind` (word_value's values)."""
    if kind == KIND_ZEROS:
        return KernelPattern("pair", 0, 0)
    if kind == KIND_ONES:
        return KernelPattern("pair", MASK64, MASK64)
    if kind == KIND_WALKING_ONES:
        return KernelPattern("walk")
    if kind == KIND_WALKING_ZEROS:
        return KernelPattern("walk", xor=MASK64)
    if kind == KIND_CHECKERBOARD:
        return KernelPattern("pair", CHECKER_EVEN, CHECKER_ODD)
    if kind == KIND_CHECKERBOARD_INV:
        return KernelPattern("pair", CHECKER_ODD, CHECKER_EVEN)
    if kind == KIND_ADDRESS:
        return KernelPattern("address")
    if kind == KIND_RANDOM:
        return KernelPattern("random", int(seed) & MASK64)
    raise ValueError(f"unknown pattern kind {kind}")


# ---------------------------------------------------------------------------------------------
# reference values


def word_value(kind: int, seed: int, w: int) -> int:
    """Pattern value of word w (Python ints), as mt_word computes it."""
    if kind == KIND_ZEROS:
        return 0
    if kind == KIND_ONES:
        return MASK64
    if kind == KIND_WALKING_ONES:
        return 1 << (w & 63)
    if kind == KIND_WALKING_ZEROS:
        return MASK64 ^ (1 << (w & 63))
    if kind == KIND_CHECKERBOARD:
        return CHECKER_ODD if w & 1 else CHECKER_EVEN
    if kind == KIND_CHECKERBOARD_INV:
        return CHECKER_EVEN if w & 1 else CHECKER_ODD
    if kind == KIND_ADDRESS:
        return (w << 3) & MASK64
    from ..kernels import splitmix64

    return splitmix64(seed & MASK64, w)


def word_values(kind: int, seed: int, first_word: int, count: int):
    """Pattern values of words first_word .. first_word + count - 1 as a NumPy uint64 array."""
    import numpy as np  # noqa: PLC0415

    w = np.arange(first_word, first_word + count, dtype=np.uint64)
    if kind == KIND_ZEROS:
        return np.zeros(count, np.uint64)
    if kind == KIND_ONES:
        return np.full(count, MASK64, np.uint64)
    if kind in (KIND_WALKING_ONES, KIND_WALKING_ZEROS):
        v = np.left_shift(np.uint64(1), w & np.uint64(63))
        return v if kind == KIND_WALKING_ONES else ~v
    if kind in (KIND_CHECKERBOARD, KIND_CHECKERBOARD_INV):
        odd = (w & np.uint64(1)).astype(bool)
        a, b = (CHECKER_ODD, CHECKER_EVEN) if kind == KIND_CHECKERBOARD else (CHECKER_EVEN, CHECKER_ODD)
        return np.where(odd, np.uint64(a), np.uint64(b))
    if kind == KIND_ADDRESS:
        return np.left_shift(w, np.uint64(3))
    from ..kernels import splitmix64

    return splitmix64(seed & MASK64, w)


def new_stats():
    """A zeroed stats vector (NumPy) with the 'lowest error word' slot at its neutral value."""
    import numpy as np  # noqa: PLC0415

    s = np.zeros(STATS_WORDS, np.uint64)
    s[STATS_MIN] = np.uint64(MASK64)
    return s


def accumulate_errors(stats, errs, max_errors: int, words, expected, actual) -> None:
    """Fold miscompared words (NumPy arrays of word index, expected, actual, in the order found)
    into `stats` and the error records `errs` (3 * max_errors uint64), as the kernel does."""
    import numpy as np  # noqa: PLC0415

    n = int(words.size)
    if n == 0:
        return
    diff = expected ^ actual
    stats[STATS_COUNT] += np.uint64(n)
    stats[STATS_OR] |= np.bitwise_or.reduce(diff)
    stats[STATS_MIN] = min(int(stats[STATS_MIN]), int(words.min()))
    stats[STATS_MAX] = max(int(stats[STATS_MAX]), int(words.max()))
    for start in range(0, n, 65536):  # bounded memory: 64 x 64 Ki booleans at a time
        d = diff[start:start + 65536]
        e = expected[start:start + 65536]
        shifts = np.arange(64, dtype=np.uint64)
        flipped = ((d[:, None] >> shifts) & np.uint64(1)).astype(bool)
        was_one = ((e[:, None] >> shifts) & np.uint64(1)).astype(bool)
        stats[STATS_UP:STATS_UP + 64] += (flipped & ~was_one).sum(axis=0).astype(np.uint64)
        stats[STATS_DOWN:STATS_DOWN + 64] += (flipped & was_one).sum(axis=0).astype(np.uint64)
    slot = int(stats[STATS_SLOTS])
    take = max(0, min(n, max_errors - slot))
    if take:
        rec = np.stack([words[:take], expected[:take], actual[:take]], axis=1).reshape(-1)
        errs[3 * slot:3 * (slot + take)] = rec
    stats[STATS_SLOTS] += np.uint64(n)


# ---------------------------------------------------------------------------------------------
# decoding and summaries


def flipped_bits(expected: int, actual: int) -> list[int]:
    d = (int(expected) ^ int(actual)) & MASK64
    return [b for b in range(64) if d >> b & 1]


def decode_step(stats, errs, max_errors: int) -> "MemtestStep":
    """A step's stats vector and error records (from the kernel or the NumPy path) as plain data.
    Records are sorted by offset (the GPU finds errors in no particular order)."""
    count = int(stats[STATS_COUNT])
    out: MemtestStep = {"errors": count, "records": [], "or_bits": int(stats[STATS_OR]),
                           "up": [int(x) for x in stats[STATS_UP:STATS_UP + 64]],
                           "down": [int(x) for x in stats[STATS_DOWN:STATS_DOWN + 64]]}
    if count == 0:
        out["first_word"] = out["last_word"] = None
        return out
    out["first_word"] = int(stats[STATS_MIN])
    out["last_word"] = int(stats[STATS_MAX])
    kept = min(int(stats[STATS_SLOTS]), int(max_errors), count)
    recs: list[MemtestErrorRecord] = []
    for i in range(kept):
        w, e, a = int(errs[3 * i]), int(errs[3 * i + 1]), int(errs[3 * i + 2])
        recs.append({"word": w, "offset": 8 * w, "expected": e, "actual": a, "bits": flipped_bits(e, a)})
    out["records"] = sorted(recs, key=lambda r: r["word"])
    return out


def human_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024.0 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} TiB"  # pragma: no cover


def hex64(v: int) -> str:
    return f"0x{int(v) & MASK64:016x}"


def describe_error(e: "MemtestErrorRecord") -> str:
    """One error record, one line: where, what was expected and read, which bits flipped."""
    bits = e.get("bits") or flipped_bits(e["expected"], e["actual"])
    where = f"offset {e['offset']:#x}"
    if e.get("chunk") is not None:
        where += f" (chunk {e['chunk']}"
        where += f", address {e['address']:#x})" if e.get("address") is not None else ")"
    ctx = []
    if e.get("round") == 2:
        ctx.append("headroom round")
    if e.get("pattern"):
        ctx.append(f"pattern {e['pattern']}")
    step = e.get("step")
    if step:
        ctx.append(step)
    if e.get("pass") is not None:
        ctx.append(f"pass {e['pass']}")
    tail = f" [{', '.join(ctx)}]" if ctx else ""
    return (f"{where}: expected {hex64(e['expected'])}, read {hex64(e['actual'])}, "
            f"bit{'s' if len(bits) != 1 else ''} {','.join(map(str, bits))} flipped{tail}")


def histogram_text(up: list[int], down: list[int], limit: int = 16) -> str:
    """'bit 17: 3 (0->1 3), bit 40: 1 (1->0 1)', most frequent first, at most `limit` bits."""
    rows = [(up[b] + down[b], b) for b in range(64) if up[b] + down[b]]
    rows.sort(key=lambda t: (-t[0], t[1]))
    parts = []
    for total, b in rows[:limit]:
        dirs = []
        if up[b]:
            dirs.append(f"0->1 {up[b]}")
        if down[b]:
            dirs.append(f"1->0 {down[b]}")
        parts.append(f"bit {b}: {total} ({', '.join(dirs)})")
    more = f", {len(rows) - limit} more bit(s)" if len(rows) > limit else ""
    return ", ".join(parts) + more if parts else "none"


class ErrorLog:
    """Every miscompare of a run, folded as it arrives: exact totals and bit histograms, a bounded
    list of error records, which verify runs saw each recorded word (a word seen in two runs, of
    any pattern, pass or confirmation, is a persistent fault), and the confirmation reruns.

    The words tracked are each step's records (the first `max_errors` found: on a GPU, in no fixed
    order, so two runs over a region full of errors may record different words) and each step's
    exact lowest and highest error word (counted over every error, so the same in two runs of a
    region whose errors are all persistent).

    add(event, run_key): `event` is decode_step() output plus pattern / step / pass, its records
    carrying chunk and address; run_key identifies the verify run (pattern, pass, step, confirming).
    """

    MAX_WORDS = 4096  # words whose runs are tracked

    def __init__(self, report_errors: int = 8, max_records: int = 256):
        self.report_errors = int(report_errors)
        self.max_records = int(max_records)
        self.errors = 0
        self.steps_with_errors = 0
        self.up = [0] * 64
        self.down = [0] * 64
        self.records: list[MemtestErrorRecord] = []
        self.first_word: int | None = None
        self.last_word: int | None = None
        self.patterns: list[str] = []
        self.word_runs: dict[int, set[tuple]] = {}
        self.confirmations: list[MemtestConfirmation] = []

    def add(self, ev: "MemtestStepEvent", run_key: tuple) -> None:
        self.errors += int(ev["errors"])
        self.steps_with_errors += 1
        for b in range(64):
            self.up[b] += int(ev["up"][b])
            self.down[b] += int(ev["down"][b])
        first, last = ev.get("first_word"), ev.get("last_word")
        if first is not None and last is not None:  # both, or neither: decode_step
            fw, lw = int(first), int(last)
            self.first_word = fw if self.first_word is None else min(self.first_word, fw)
            self.last_word = lw if self.last_word is None else max(self.last_word, lw)
        pattern = ev.get("pattern")
        if pattern and pattern not in self.patterns:
            self.patterns.append(pattern)
        words = []
        for r in ev["records"]:
            rec = r.copy()
            rec.setdefault("pattern", ev.get("pattern"))
            rec.setdefault("step", ev.get("step"))
            rec.setdefault("pass", ev.get("pass"))
            if len(self.records) < self.max_records:
                self.records.append(rec)
            words.append(int(r["word"]))
        if first is not None and last is not None:
            words += [int(first), int(last)]
        for w in words:
            if w in self.word_runs or len(self.word_runs) < self.MAX_WORDS:
                self.word_runs.setdefault(w, set()).add(tuple(run_key))

    def confirm(self, pattern: str, pass_index: int, found: int, again: int) -> "MemtestConfirmation":
        """Record a confirmation rerun of `pattern` in pass `pass_index`: how many errors the
        first run and the rerun found, and how many tracked words failed in both ("reproduced":
        the same word failed again)."""
        def words(confirming: bool) -> set[int]:
            return {w for w, runs in self.word_runs.items()
                    if any(k[0] == pattern and k[1] == pass_index and k[-1] == confirming for k in runs)}

        same = len(words(False) & words(True))
        c: MemtestConfirmation = {"pattern": pattern, "pass": pass_index, "errors": int(found), "errors_again": int(again),
             "same_words": same, "reproduced": same > 0}
        self.confirmations.append(c)
        return c

    def persistent_words(self) -> list[int]:
        return sorted(w for w, runs in self.word_runs.items() if len(runs) >= 2)

    def first_record(self) -> "MemtestErrorRecord | None":
        return min(self.records, key=lambda r: r["word"]) if self.records else None

    def summary(self) -> "MemtestErrors":
        records = sorted(self.records, key=lambda r: (r["word"], r.get("pass") or 0))
        persistent = self.persistent_words()
        return {
            "errors": self.errors,
            "steps_with_errors": self.steps_with_errors,
            "records": records[:self.report_errors],
            "records_kept": len(records),
            "distinct_words_recorded": len({r["word"] for r in records}),
            "first_offset": None if self.first_word is None else 8 * self.first_word,
            "last_offset": None if self.last_word is None else 8 * self.last_word,
            "up": list(self.up),
            "down": list(self.down),
            "bits": [b for b in range(64) if self.up[b] or self.down[b]],
            "patterns": list(self.patterns),
            "persistent_words": len(persistent),
            "persistent_offsets": [8 * w for w in persistent[:16]],
            "confirmations": list(self.confirmations),
        }
