"""ECC and row-remapping counters read around every pass of the HBM pattern test (eud.memtest).

With ECC on, a weak cell that flips one bit is corrected on the way out of HBM: the pattern test
reads the right word and sees nothing, and only NVML's counters show that the memory is failing.
The worker (gpucheck.eud.memtest_worker) reads these counters of its GPU before the first pass
and after every pass; eud.memtest judges their growth with ECC_RULES (rules as data, limits from
the check's config; gpucheck.core.result.Rule) and names every counter that grew in the result.

| counter | NVML |
|---|---|
| volatile_corrected | nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE): single-bit errors ECC corrected |
| volatile_uncorrected | nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE): double-bit errors |
| remapped_correctable, remapped_uncorrectable | nvmlDeviceGetRemappedRows: rows remapped for corrected / uncorrectable errors |
| remap_pending, remap_failure | nvmlDeviceGetRemappedRows: a remapping waits for a GPU reset / a remapping failed |

A counter NVML does not support (ECC off, a GPU without row remapping) is None: its rule is not
judged and the result says so. A counter that could not be read for another reason (no
permission, a lost GPU, NVML not loaded) is an unread field: the check cannot claim the memory
passed.

Fault injection (`--inject ecc:gpu=N[,corrected=K][,uncorrected=K][,remapped=K][,pending=1][,after_pass=P]`)
adds K to the counters of every reading taken after pass P (default 0) of the first round, on
real NVML readings as on a CPU stand-in (which has no counters: there the injection reads from a
synthetic all-zero baseline, and says so).

Only NVML is touched here (gpucheck.platform.telemetry.nvml), in the worker; the rules are pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from ..core.result import Action, Key, Rule, Status

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import EccData, EccReading

COUNTERS: tuple[str, ...] = ("volatile_corrected", "volatile_uncorrected", "remapped_correctable",
                             "remapped_uncorrectable", "remap_pending", "remap_failure")
FLAGS = ("remap_pending", "remap_failure")  # booleans: judged on turning true during the test

# nvml.h enums
_CORRECTED, _UNCORRECTED = 0, 1  # nvmlMemoryErrorType_t
_VOLATILE = 0  # nvmlEccCounterType_t

# What an injection may add (key -> counter).
INJECT_KEYS = {"corrected": "volatile_corrected", "uncorrected": "volatile_uncorrected",
               "remapped": "remapped_uncorrectable", "pending": "remap_pending"}


class EccReadError(RuntimeError):
    """The GPU's counters cannot be read at all (no NVML, the index is another GPU)."""


class CounterGrowth(TypedDict):
    """One counter over a run's readings (growth)."""

    value: int | None  # the growth (a flag: 1 if it turned true); None: not supported
    unread: str | None  # NVML's failure kind when a reading failed ("missing": absent in one)
    steps: list[tuple[str, str, int]]  # (from label, to label, delta) where it grew


def empty_reading(label: str) -> "EccReading":
    return {"label": label, "counters": {c: None for c in COUNTERS}, "errors": {}}


def read_counters(session: Any, handle: Any, label: str) -> "EccReading":
    """One reading: {"label", "counters": {name: int | bool | None}, "errors": {name: NVML failure kind}}.
    None with no error: not supported. Never raises."""
    from ..platform.telemetry import nvml as N

    out = empty_reading(label)
    c, errors = out["counters"], out["errors"]

    def keep(names: tuple[str, ...], failure: Any) -> None:
        if failure is not None and failure.kind != N.NOT_SUPPORTED:
            for name in names:
                errors[name] = failure.kind

    for name, kind in (("volatile_corrected", _CORRECTED), ("volatile_uncorrected", _UNCORRECTED)):
        v, err = session.read("nvmlDeviceGetTotalEccErrors", handle, kind, _VOLATILE)
        c[name] = None if v is None else int(v)
        keep((name,), err)
    v, err = session.read("nvmlDeviceGetRemappedRows", handle)
    if v is not None:
        corr, unc, pending, failure = v
        c.update(remapped_correctable=int(corr), remapped_uncorrectable=int(unc), remap_pending=bool(pending),
                 remap_failure=bool(failure))
    keep(("remapped_correctable", "remapped_uncorrectable", "remap_pending", "remap_failure"), err)
    return out


class NvmlEccReader:
    """Reads one GPU's counters through NVML: GPU `index` (NVML's numbering, as the worker's job
    names it), checked against `uuid` (the CUDA_VISIBLE_DEVICES the worker computes on) when given,
    so that the counters read are those of the GPU under test."""

    source = "nvml"

    def __init__(self, index: int, uuid: str | None = None):
        from ..platform.telemetry.nvml import NvmlCallError, NvmlSession, text

        self.session = NvmlSession()
        if not self.session.ok:
            failure = self.session.error
            self.session.close()
            raise EccReadError(f"NVML not usable: {failure}")
        try:
            self.handle = self.session.handle(int(index))
            if uuid and str(uuid).startswith("GPU-"):
                got, err = self.session.read("nvmlDeviceGetUUID", self.handle)
                if err is None and text(got) != uuid:
                    raise EccReadError(f"NVML GPU {index} is {text(got)}, not the GPU under test ({uuid})")
        except NvmlCallError as e:
            self.session.close()
            raise EccReadError(f"NVML GPU {index}: {e.failure}") from None
        except EccReadError:
            self.session.close()
            raise

    def read(self, label: str) -> "EccReading":
        return read_counters(self.session, self.handle, label)

    def close(self) -> None:
        self.session.close()


class EccMonitor:
    """The readings of one run: `read(label)` before the first pass and after every pass, with an
    injection (if any) applied. `reader` None: no counters (a CPU stand-in); with an injection,
    readings start from a synthetic zero baseline."""

    def __init__(self, reader: Any = None, inject: dict[str, int] | None = None, note: str | None = None):
        self.reader = reader
        self.inject = inject.copy() if inject else None
        self.note = note
        self.reads: list[EccReading] = []
        self.injected: list[str] = []
        self.failure: str | None = None  # why the GPU's counters could not be read at all

    @property
    def source(self) -> str | None:
        if self.reader is not None:
            return getattr(self.reader, "source", "nvml")
        return "synthetic (injection on a CPU stand-in)" if self.inject else None

    def read(self, label: str, passes_done: int) -> None:
        if self.reader is None and not self.inject:
            return
        if self.reader is not None:
            r = self.reader.read(label)
        else:
            r = empty_reading(label)
            r["counters"] = {c: (False if c in FLAGS else 0) for c in COUNTERS}
        if self.inject and passes_done > int(self.inject.get("after_pass", 0) or 0):
            self._apply(r)
        self.reads.append(r)

    def _apply(self, r: "EccReading") -> None:
        spec = self.inject or {}
        c = r["counters"]
        added = []
        for key, counter in INJECT_KEYS.items():
            k = int(spec.get(key, 0) or 0)
            now = c.get(counter)
            if not k or now is None:
                continue
            c[counter] = True if counter in FLAGS else int(now) + k
            added.append(f"{counter} +{k}" if counter not in FLAGS else f"{counter} set")
        if added and len(self.injected) < 1:
            self.injected.append(f"ecc: {', '.join(added)} in the readings from {r['label']} on")

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()

    def to_data(self) -> "EccData":
        return {"source": self.source, "reads": list(self.reads), "note": self.note, "failure": self.failure,
                "injected": list(self.injected)}


def inject_spec(params: dict[str, Any]) -> dict[str, int]:
    """An ecc injection's parameters, checked: counts >= 0 (corrected=1 when none is given).
    ValueError names a bad one."""
    unknown = sorted(set(params) - {"gpu", "after_pass", *INJECT_KEYS})
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)} (use {', '.join(INJECT_KEYS)}, after_pass)")
    counts: dict[str, int] = {}  # an INJECT_KEYS key or after_pass -> its count
    for key in (*INJECT_KEYS, "after_pass"):
        if params.get(key) is None:
            continue
        v = int(params[key])
        if v < 0:
            raise ValueError(f"{key} must be >= 0, not {v}")
        counts[key] = v
    if not any(counts.get(k) for k in INJECT_KEYS):
        counts["corrected"] = 1
    return counts


# ---------------------------------------------------------------------------------------------
# judging (pure)


# A counter that grows by more than its limit during the test fails the GPU. Why each action:
# an uncorrectable error or a new remap is repaired by the row remap that a GPU reset applies
# (reset-gpu, as NVIDIA's Xid 48/63/64 guidance); a failed remap cannot be repaired (rma); single-
# bit errors that ECC corrected mean cells that fail under the test's patterns: the node must not
# take work (drain), and a re-test after a reset tells a weak cell (rma) from a one-off upset.
# Limits are config keys, and ecc_flags_new_max (0) for the flags; "{<metric>_steps}" names the
# readings between which the counter grew.
def _rule(metric: str, limit: Any, action: Action, cause: str) -> Rule:
    return Rule(metric, ">", limit, Status.FAIL, action, f"{cause}{{{metric}_steps}} ({{detail}})", "count")


ECC_RULES: tuple[Rule, ...] = (
    _rule("ecc_corrected_growth", Key("ecc_corrected_growth_max"), Action.DRAIN,
          "corrected (single-bit) ECC errors during the pattern test: cells that ECC hid from the patterns"),
    _rule("ecc_uncorrected_growth", Key("ecc_uncorrected_growth_max"), Action.RESET_GPU,
          "uncorrectable ECC errors during the pattern test (the row is remapped at the next GPU reset)"),
    _rule("remapped_rows_correctable_growth", Key("remapped_rows_growth_max"), Action.RESET_GPU,
          "rows remapped for corrected errors during the pattern test"),
    _rule("remapped_rows_uncorrectable_growth", Key("remapped_rows_growth_max"), Action.RESET_GPU,
          "rows remapped for uncorrectable errors during the pattern test"),
    _rule("remap_pending_new", Key("ecc_flags_new_max"), Action.RESET_GPU,
          "a row remapping became pending during the pattern test (applied at the next GPU reset)"),
    _rule("remap_failure_new", Key("ecc_flags_new_max"), Action.RMA, "a row remapping failed during the pattern test"),
)
# The counter each rule's metric is the growth of.
COUNTER_OF: dict[str, str] = {
    "ecc_corrected_growth": "volatile_corrected", "ecc_uncorrected_growth": "volatile_uncorrected",
    "remapped_rows_correctable_growth": "remapped_correctable",
    "remapped_rows_uncorrectable_growth": "remapped_uncorrectable",
    "remap_pending_new": "remap_pending", "remap_failure_new": "remap_failure",
}
ECC_LIMIT_KEYS = ("ecc_corrected_growth_max", "ecc_uncorrected_growth_max", "remapped_rows_growth_max")  # config


class EccLimitParams(TypedDict):
    """The check's parameters ECC_RULES take their limits from (ECC_LIMIT_KEYS)."""

    ecc_corrected_growth_max: int
    ecc_uncorrected_growth_max: int
    remapped_rows_growth_max: int


def ecc_limits(p: "EccLimitParams | None") -> dict[str, int | None]:
    """The limits of ECC_RULES from the check's parameters `p`; None: no counter was read, the
    rules are off."""
    if p is None:
        return dict.fromkeys((*ECC_LIMIT_KEYS, "ecc_flags_new_max"))
    return {"ecc_corrected_growth_max": int(p["ecc_corrected_growth_max"]),
            "ecc_uncorrected_growth_max": int(p["ecc_uncorrected_growth_max"]),
            "remapped_rows_growth_max": int(p["remapped_rows_growth_max"]), "ecc_flags_new_max": 0}


def growth(reads: "list[EccReading]") -> dict[str, CounterGrowth]:
    """Per counter: {"value": growth from the first to the last reading (a flag: 1 if it turned
    true), or None when not supported; "unread": NVML's failure kind when a reading failed;
    "steps": [(from label, to label, delta), ...] for every pair of readings where it grew}."""
    out: dict[str, CounterGrowth] = {}
    for c in COUNTERS:
        failed = next((r["errors"][c] for r in reads if c in r.get("errors", {})), None)
        vals = [r["counters"].get(c) for r in reads]
        entry: CounterGrowth = {"value": None, "unread": failed, "steps": []}
        out[c] = entry
        if failed is not None or len(reads) < 2 or all(v is None for v in vals):
            continue  # unread, not read twice, or not supported
        if any(v is None for v in vals):
            entry["unread"] = "missing"  # supported in one reading, absent in another
            continue
        nums = [int(bool(v)) if c in FLAGS else int(v) for v in vals if v is not None]  # none is None here
        entry["value"] = int(nums[-1] > nums[0]) if c in FLAGS else max(0, nums[-1] - nums[0])
        entry["steps"] = [(reads[i]["label"], reads[i + 1]["label"], nums[i + 1] - nums[i])
                          for i in range(len(nums) - 1) if nums[i + 1] != nums[i]]
    return out
