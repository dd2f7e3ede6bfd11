"""ecc: ECC error counters of every GPU (HBM/DRAM and on-chip SRAM).

Volatile counters cover the time since the driver last loaded (or the GPU was reset); aggregate
counters cover the GPU's life (InfoROM). An uncorrectable (double-bit) error in the volatile
counters means this GPU hit one since its last reset: the memory behind it is retired/remapped at
the next reset, so the GPU should be reset before it takes work (Xid 48/94/95). SRAM
uncorrectable errors are judged separately (NVIDIA's RMA policy for SRAM is the driver's
"threshold exceeded" flag).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from ..sdk import (Action, Context, Key, Level, Need, Result, Rule, Status, apply_unreadable, define, each_gpu,
                   evaluate, get)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import EccErrors, JudgedGpu

ID = "ecc"


class EccParams(TypedDict):
    """ecc's parameters (DEFAULTS, merged with the config's [checks.ecc]): the rules' limits."""

    volatile_uncorrected_fail: int
    aggregate_uncorrected_warn: int
    sram_volatile_uncorrected_fail: int
    sram_aggregate_uncorrected_warn: int
    corrected_volatile_warn: int
    corrected_aggregate_warn: int


DEFAULTS: EccParams = {
    "volatile_uncorrected_fail": 0,  # fail when volatile uncorrected (DBE) > this
    "aggregate_uncorrected_warn": 0,  # warn when lifetime uncorrected > this
    "sram_volatile_uncorrected_fail": 0,  # fail when volatile SRAM uncorrected > this
    "sram_aggregate_uncorrected_warn": 0,  # warn when lifetime SRAM uncorrected > this
    "corrected_volatile_warn": 1000,  # warn when corrected (SBE) since driver load > this
    "corrected_aggregate_warn": 10000,  # warn when lifetime corrected > this
}

# The snapshot fields each GPU's result depends on, and what it is when one could not be read
# (or holds an invalid value): error where a fail rule needs it, warn for the advisory limits.
READS = {
    "ecc_errors.volatile_uncorrected": Status.ERROR,
    "ecc_errors.sram_volatile_uncorrected": Status.ERROR,
    "ecc_errors.sram_threshold_exceeded": Status.ERROR,
    "ecc_errors": Status.WARN,  # lifetime uncorrected, corrected volumes
}

_FIELDS = (
    "volatile_uncorrected",
    "aggregate_uncorrected",
    "sram_volatile_uncorrected",
    "sram_aggregate_uncorrected",
    "volatile_corrected",
    "aggregate_corrected",
)

RULES = (
    Rule("volatile_uncorrected", ">", Key("volatile_uncorrected_fail"), Status.FAIL, Action.RESET_GPU,
         "uncorrectable (double-bit) ECC errors since the last reset ({detail})", "count"),
    Rule("sram_volatile_uncorrected", ">", Key("sram_volatile_uncorrected_fail"), Status.FAIL, Action.RESET_GPU,
         "uncorrectable SRAM ECC errors since the last reset ({detail})", "count"),
    Rule("sram_threshold_exceeded", ">", 0, Status.FAIL, Action.RMA,
         "SRAM error threshold exceeded (NVIDIA RMA criterion) ({detail})"),
    Rule("aggregate_uncorrected", ">", Key("aggregate_uncorrected_warn"), Status.WARN, Action.INVESTIGATE,
         "uncorrectable ECC errors in the GPU's lifetime ({detail})", "count"),
    Rule("sram_aggregate_uncorrected", ">", Key("sram_aggregate_uncorrected_warn"), Status.WARN, Action.INVESTIGATE,
         "uncorrectable SRAM ECC errors in the GPU's lifetime ({detail})", "count"),
    Rule("volatile_corrected", ">", Key("corrected_volatile_warn"), Status.WARN, Action.INVESTIGATE,
         "many corrected ECC errors since driver load ({detail})", "count"),
    Rule("aggregate_corrected", ">", Key("corrected_aggregate_warn"), Status.WARN, Action.INVESTIGATE,
         "many corrected ECC errors in the GPU's lifetime ({detail})", "count"),
)


def _gpu(g: "JudgedGpu", p: EccParams) -> Result:
    idx = g.get("index")
    e: EccErrors | dict[str, None] = g.get("ecc_errors") or {}
    metrics: dict[str, int | str | None] = {  # the uuid, then _FIELDS
        "uuid": g.get("uuid"), "volatile_uncorrected": e.get("volatile_uncorrected"),
        "aggregate_uncorrected": e.get("aggregate_uncorrected"),
        "sram_volatile_uncorrected": e.get("sram_volatile_uncorrected"),
        "sram_aggregate_uncorrected": e.get("sram_aggregate_uncorrected"),
        "volatile_corrected": e.get("volatile_corrected"), "aggregate_corrected": e.get("aggregate_corrected")}
    thr = e.get("sram_threshold_exceeded")
    metrics["sram_threshold_exceeded"] = None if thr is None else int(bool(thr))
    if get(g, "ecc_mode", "current") is False:
        return Result(ID, Status.SKIP, f"GPU {idx}: ECC is disabled, no ECC counters (judged by the inventory check)",
                      gpu=idx, metrics=metrics)
    r = evaluate(ID, RULES, metrics, limits=p, gpu=idx, units={k: "count" for k in _FIELDS},
                 ok_summary=(f"GPU {idx}: no uncorrectable ECC errors (corrected: {metrics['volatile_corrected']} "
                             f"since driver load, {metrics['aggregate_corrected']} lifetime)"),
                 skip=f"GPU {idx}: ECC counters not supported on this GPU/driver")
    return apply_unreadable(r, g, READS)


@define(
    ID,
    title="ECC error counters: uncorrectable DRAM/SRAM errors, corrected-error volume",
    level=Level.QUICK,
    needs=(Need.NVML,),
    budget_s=5.0,
    detects="HBM/SRAM uncorrectable errors (Xid 48/94/95), SRAM RMA threshold, heavy corrected-error rates",
    defaults=DEFAULTS,
)
def ecc(ctx: Context) -> list[Result]:
    return each_gpu(ID, ctx, DEFAULTS, _gpu)


CHECKS = [ecc]
