"""memory-remap: HBM row remapping (Ampere and later) and page retirement (earlier GPUs).

Ampere+: a pending remap means a row is marked bad and is swapped for a spare only at the next GPU
reset (reset before new work); a remap failure means a bank ran out of spare rows (NVIDIA's RMA
policy); each GPU has 512 spare rows for remapping, so 512 uncorrectable remaps means the spares
are used up.
Before Ampere: pages pending retirement take effect at the next reset; DCGM treats 60 retired
pages as the RMA limit (DCGM_LIMIT_MAX_RETIRED_PAGES, 63 in newer DCGM) and 15 as its soft limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from ..sdk import (Action, Context, Key, Level, Limit, Need, Result, Rule, Status, apply_unreadable, define, each_gpu,
                   evaluate, get)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import JudgedGpu, RemappedRows, RetiredPages

ID = "memory-remap"
ARCH_AMPERE = 7  # nvmlDeviceArchitecture_t NVML_DEVICE_ARCH_AMPERE
_ARCH_IDS = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
             "hopper": 9, "blackwell": 10}

class RemapParams(TypedDict):
    """memory-remap's parameters (DEFAULTS, merged with the config's [checks.memory-remap])."""

    uncorrectable_remaps_warn: int
    retired_pages_warn: int
    retired_pages_fail: int


DEFAULTS: RemapParams = {
    "uncorrectable_remaps_warn": 512,  # warn when rows remapped for uncorrectable errors >= this
    "retired_pages_warn": 15,  # pre-Ampere: warn when retired pages (SBE + DBE) >= this
    "retired_pages_fail": 60,  # pre-Ampere: fail (rma) when retired pages >= this
}
# The snapshot fields a GPU's result depends on, by the mechanism judged (Ampere+ row remapping,
# or page retirement before Ampere): error where its fail rules need the field; warn for the
# architecture (it chose the mechanism; the GPU's own answers confirm it) and for the other
# mechanism's fields (reported, not judged).
READS_REMAP = {"remapped_rows": Status.ERROR, "retired_pages": Status.WARN, "architecture": Status.WARN,
               "architecture_id": Status.WARN}
READS_RETIRED = {"retired_pages": Status.ERROR, "remapped_rows": Status.WARN, "architecture": Status.WARN,
                 "architecture_id": Status.WARN}

# ">= 0" would fire on every GPU: each limit is at least 1.
LIMITS = {k: Limit("int", 1) for k in DEFAULTS}


def _arch_id(g: "JudgedGpu") -> int | None:
    a = g.get("architecture_id")
    if isinstance(a, int) and not isinstance(a, bool):
        return a
    name = g.get("architecture")
    return _ARCH_IDS.get(str(name).lower()) if name else None


REMAP_RULES = (
    Rule("remap_failure", ">", 0, Status.FAIL, Action.RMA,
         "row remapping failed (a bank has no spare rows left) ({detail})"),
    Rule("remap_pending", ">", 0, Status.FAIL, Action.RESET_GPU,
         "row remap pending: takes effect at the next GPU reset ({detail})"),
    Rule("remapped_uncorrectable", ">=", Key("uncorrectable_remaps_warn"), Status.WARN, Action.INVESTIGATE,
         "spare rows used up by uncorrectable-error remaps ({detail})", "rows"),
)
# The soft limit asks for a look, the hard one for an RMA.
RETIRED_RULES = (
    Rule("retired_pages_pending", ">", 0, Status.FAIL, Action.RESET_GPU,
         "page retirement pending: takes effect at the next GPU reset ({detail})"),
    Rule("retired_pages", ">=", Key("retired_pages_fail"), Status.FAIL, Action.RMA, "many retired pages ({detail})",
         "pages"),
    Rule("retired_pages", ">=", Key("retired_pages_warn"), Status.WARN, Action.INVESTIGATE,
         "many retired pages ({detail})", "pages"),
)


def _flag(v: Any) -> int | None:
    return None if v is None else int(bool(v))


def _remap(g: "JudgedGpu", p: RemapParams) -> Result:
    idx = g.get("index")
    rr: RemappedRows | dict[str, None] = g.get("remapped_rows") or {}
    metrics: dict[str, int | str | None] = {
        "uuid": g.get("uuid"),
        "architecture": g.get("architecture"),
        "remapped_correctable": rr.get("correctable"),
        "remapped_uncorrectable": rr.get("uncorrectable"),
        "remap_pending": _flag(rr.get("pending")),
        "remap_failure": _flag(rr.get("failure")),
    }
    r = evaluate(ID, REMAP_RULES, metrics, limits=p, gpu=idx,
                 units={"remapped_correctable": "rows", "remapped_uncorrectable": "rows"},
                 ok_summary=(f"GPU {idx}: no remap pending or failed ({metrics['remapped_correctable']} correctable, "
                             f"{metrics['remapped_uncorrectable']} uncorrectable rows remapped)"),
                 skip=f"GPU {idx}: remapped rows not supported (MIG with active instances, or driver)")
    return apply_unreadable(r, g, READS_REMAP)


def _retired(g: "JudgedGpu", p: RemapParams) -> Result:
    idx = g.get("index")
    rp: RetiredPages | dict[str, None] = g.get("retired_pages") or {}
    sbe, dbe = rp.get("single_bit"), rp.get("double_bit")
    total = None if sbe is None and dbe is None else (sbe or 0) + (dbe or 0)
    metrics: dict[str, int | str | None] = {
        "uuid": g.get("uuid"),
        "architecture": g.get("architecture"),
        "retired_pages_sbe": sbe,
        "retired_pages_dbe": dbe,
        "retired_pages": total,
        "retired_pages_pending": _flag(rp.get("pending")),
    }
    r = evaluate(ID, RETIRED_RULES, metrics, limits=p, gpu=idx,
                 units={"retired_pages_sbe": "pages", "retired_pages_dbe": "pages", "retired_pages": "pages"},
                 ok_summary=f"GPU {idx}: {total} retired pages, none pending",
                 skip=f"GPU {idx}: retired pages not supported on this GPU/driver")
    return apply_unreadable(r, g, READS_RETIRED)


def judges_retired_pages(g: "JudgedGpu") -> bool:
    """Page retirement is judged before Ampere, and where the architecture is unknown and the GPU
    has no row remapper (judge what the GPU keeps); row remapping otherwise."""
    arch = _arch_id(g)
    if arch is not None:
        return arch < ARCH_AMPERE
    return all(v is None for v in (get(g, "remapped_rows") or {}).values())


def reads_for(g: "JudgedGpu") -> dict[str, Status]:
    return READS_RETIRED if judges_retired_pages(g) else READS_REMAP


def _gpu(g: "JudgedGpu", p: RemapParams) -> Result:
    return _retired(g, p) if judges_retired_pages(g) else _remap(g, p)


@define(
    ID,
    title="HBM row remapping (Ampere+) and retired pages (pre-Ampere): pending, failed, exhausted",
    level=Level.QUICK,
    needs=(Need.NVML,),
    budget_s=5.0,
    detects="pending row remaps / page retirements (reset needed), remap failure and retired-page RMA limits",
    defaults=DEFAULTS,
    limits=LIMITS,
)
def memory_remap(ctx: Context) -> list[Result]:
    return each_gpu(ID, ctx, DEFAULTS, _gpu)


CHECKS = [memory_remap]
