"""The check SDK's snapshot helpers, shared by the level-1 checks that judge the telemetry snapshot
(inventory, ecc, memory-remap, clocks, pcie, nvlink, recovery-action). They import nothing heavy.
A check imports them from gpucheck.sdk.

GPU states: a GPU the snapshot marks lost / reset_required / error is reported by *every* per-GPU
check as a result of that GPU naming the state (`gpu_state_result`, through `each_gpu`), not
skipped: a run restricted to one check (`--check ecc`) must not pass a node whose GPU is gone.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from ..core.check import Context
from ..core.result import Action, Basis, Result, Status, settle
from ..platform.telemetry.fields import judged_view
from ..platform.telemetry.nvml import NOT_IN_FORMAT, UNJUDGED_KINDS

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import GpuEntry, JudgedGpu

_Params = TypeVar("_Params", bound=Mapping[str, Any])  # a check's TypedDict of parameters

# The failure kind of a field a converted capture (nvidia-smi -q) does not hold (docs/snapshot.md).
NOT_IN_CAPTURE = "not_in_capture"

STATE_TEXT = {
    "lost": "GPU is lost (fell off the bus or stopped answering; NVML GPU_IS_LOST)",
    "reset_required": "GPU needs a reset (NVML RESET_REQUIRED)",
}


def nvml_unjudged(check_id: str, snap: Mapping[str, Any]) -> Result | None:
    """An `error` (could not judge: exit 3, never a pass and never a fault) when the snapshot was
    not read for a reason that says nothing about the GPUs: NVML did not answer within the time
    the run gave it, or gpucheck's own telemetry reader raised; else None."""
    nv = snap.get("nvml") or {}
    err = nv.get("error") or {}
    if nv.get("ok") or err.get("kind") not in UNJUDGED_KINDS:
        return None
    message = " ".join(str(err.get("message") or err.get("kind")).split())
    return Result(check_id, Status.ERROR, f"could not judge: {message}", evidence=[f"NVML: {err.get('kind')}: {message}"])


def nvml_unavailable(check_id: str, ctx: Context) -> list[Result] | None:
    """A skip when the snapshot says NVML is not usable (the inventory check fails the node for
    it when GPUs should be there); an error when it was not read for a reason that says nothing
    about the GPUs (nvml_unjudged)."""
    nv = ctx.snapshot.get("nvml") if ctx.snapshot else None
    if nv and nv.get("ok"):
        return None
    unjudged = nvml_unjudged(check_id, ctx.snapshot or {})
    if unjudged is not None:
        return [unjudged]
    err = nv.get("error") if nv else None
    kind = err.get("kind", "other") if err else "other"
    message = err.get("message", "") if err else ""
    if kind == NOT_IN_FORMAT:  # captures without GPU telemetry (gpucheck judge): what to add
        return [Result(check_id, Status.SKIP, message or "the captures hold no GPU telemetry")]
    return [Result(check_id, Status.SKIP, f"NVML unavailable: {kind} (judged by the inventory check)",
                   evidence=[f"NVML: {message}"] if message else [])]


def selected_gpus_or_skip(check_id: str, ctx: Context) -> "tuple[list[JudgedGpu], list[Result] | None]":
    """The selected snapshot GPUs as the checks judge them (telemetry.fields.judged_view: values
    a field cannot hold are None and listed as invalid), or a skip saying why there is nothing to
    judge."""
    skip = nvml_unavailable(check_id, ctx)
    if skip:
        return [], skip
    gpus = sorted((judged_view(g) for g in ctx.selected_gpu_entries()), key=lambda g: g.get("index", 0))
    if not gpus:
        total = len(ctx.snapshot.get("gpus", [])) if ctx.snapshot else 0
        why = (f"none of the selected GPUs {ctx.gpus} is among the {total} GPUs NVML reports"
               if ctx.gpus is not None and total else "NVML reports no GPU (judged by the inventory check)")
        return [], [Result(check_id, Status.SKIP, why)]
    return gpus, None


def gpu_state_result(check_id: str, g: "GpuEntry") -> Result | None:
    """The result for a GPU that cannot be read (state other than ok), or None."""
    state = g.get("state", "ok")
    if state == "ok":
        return None
    idx = g.get("index")
    err = g.get("error")
    msg = err.get("message", "") if err else ""
    kind = err.get("kind", "other") if err else "other"
    evidence = [f"NVML: {msg}"] if msg else []
    if state in STATE_TEXT:
        action = Action.REBOOT if state == "lost" else Action.RESET_GPU
        r = Result(check_id, Status.FAIL, f"GPU {idx}: {STATE_TEXT[state]}", gpu=idx, action=action, evidence=evidence,
                   basis=Basis.GPU_STATE)
    elif kind == "no_permission":
        r = Result(check_id, Status.ERROR, f"GPU {idx} could not be opened: no permission to query NVML",
                   gpu=idx, evidence=evidence, basis=Basis.GPU_STATE)
    else:
        r = Result(check_id, Status.FAIL,
                   f"GPU {idx} could not be opened through NVML ({kind}): unusable for jobs",
                   gpu=idx, action=Action.REBOOT, evidence=evidence, basis=Basis.GPU_STATE)
    r.metric("uuid", g.get("uuid"))
    r.metric("state", state)
    return r


def each_gpu(check_id: str, ctx: Context, defaults: _Params, judge_one: Callable[..., Result],
             setup: Callable[[Context], tuple[Any, ...]] | None = None) -> list[Result]:
    """The prologue of every per-GPU snapshot check: a skip when NVML or the selection leaves no
    GPU to judge, the state result of a GPU that cannot be read, and `judge_one(gpu entry,
    params, *setup(ctx))` for every other selected GPU (`setup` runs once, only when there is a GPU
    to judge: a history read)."""
    gpus, skip = selected_gpus_or_skip(check_id, ctx)
    if skip:
        return skip
    p = ctx.params(check_id, defaults)
    extra = setup(ctx) if setup is not None else ()
    out = []
    for g in gpus:
        bad = gpu_state_result(check_id, g)
        out.append(bad if bad is not None else judge_one(g, p, *extra))
    return out


def unreadable_fields(g: "JudgedGpu") -> dict[str, str]:
    """Every field of GPU entry `g` that could not be read (its `errors` map: field -> kind) or
    holds a value its field cannot hold (the "invalid" map of telemetry.fields.judged_view),
    field -> why, in words that name the field."""
    errors = g.get("errors") if isinstance(g.get("errors"), dict) else {}
    out = {str(f): (f"{f} not in this capture" if kind == NOT_IN_CAPTURE else f"could not read {f} ({kind})")
           for f, kind in sorted(errors.items()) if kind != NOT_IN_FORMAT}
    for f, value in sorted((g.get("invalid") or {}).items()):
        out[f] = f"invalid value in {f} ({value})"
    return out


def format_gaps(g: "JudgedGpu") -> dict[str, str]:
    """Every field of GPU entry `g` that the capture's format does not carry (kind
    `not_in_format`: gpucheck.platform.telemetry.formatgaps), field -> the hint that names what
    to add ("capture has no NVLink state: add `nvidia-smi nvlink -s` ...")."""
    errors = g.get("errors") if isinstance(g.get("errors"), dict) else {}
    capture = g.get("capture")
    hints = capture.get("not_carried") if isinstance(capture, dict) else None
    hints = hints if isinstance(hints, dict) else {}
    return {str(f): str(hints.get(f) or f"capture's format does not carry {f}")
            for f, kind in sorted(errors.items()) if kind == NOT_IN_FORMAT}


def status_if_unreadable(field: str, reads: Mapping[str, Status]) -> Status | None:
    """What an unreadable `field` makes a result that reads `reads` (field or group -> ERROR or
    WARN), or None when the result does not read it. The longest entry that is the field or a
    group holding it counts, and so does every entry inside the field when a whole group (or link)
    is unreadable; ERROR wins over WARN."""
    covering = [k for k in reads if field == k or field.startswith((k + ".", k + "["))]
    inside = [k for k in reads if k.startswith((field + ".", field + "["))]
    found = ([reads[max(covering, key=len)]] if covering else []) + [reads[k] for k in inside]
    if not found:
        return None
    return Status.ERROR if Status.ERROR in found else Status.WARN


def apply_unreadable(r: Result, g: "JudgedGpu", reads: Mapping[str, Status]) -> Result:
    """Note on `r` every field of `g` it reads (`reads`: field -> ERROR where a fail rule needs
    it, WARN where only an advisory rule or the report does) that could not be read or holds an
    invalid value. A pass or skip becomes the worst of those statuses, and the summary names the
    fields; a warn becomes error when a field of an ERROR rule is among them; a fail found from
    the fields that were read stands (the fields are evidence). Never a silent pass.

    A field the capture's format does not carry (`not_in_format`) makes a pass or skip a plain
    skip naming what to add (_apply_format_gaps) when a fail rule needs it; an unreadable field
    of an advisory rule is then only evidence (nothing was judged for it to advise on), one of a
    fail rule still makes it error."""
    hit: dict[str, tuple[str, Status]] = {}
    for f, why in unreadable_fields(g).items():
        st = status_if_unreadable(f, reads)
        if st is not None:
            hit[f] = (why, st)
    r = _apply_format_gaps(r, g, reads)
    if r.status == Status.SKIP and format_gaps(g) and all(st == Status.WARN for _, st in hit.values()):
        r.evidence.extend(why for why, _ in hit.values())
        return r
    if not hit:
        return r
    r.evidence.extend(why for why, _ in hit.values())
    r.unjudged.update({f: st for f, (_, st) in hit.items()})
    if r.status == Status.FAIL:
        return r
    worst = Status.ERROR if any(st == Status.ERROR for _, st in hit.values()) else Status.WARN
    words = "; ".join(why for why, st in hit.values() if st == worst or worst == Status.WARN)
    old_status, old_summary = r.status, r.summary
    settle(r)  # result.outcome: an ERROR field makes it error; a WARN one makes a pass or skip a warn
    if worst == Status.ERROR:
        r.summary = words + (f"; {old_summary}" if old_status in (Status.WARN, Status.ERROR) else "")
    elif old_status in (Status.PASS, Status.SKIP):
        r.summary = f"{words}; {old_summary}"
    else:
        r.summary = f"{old_summary}; {words}"
    return r


def _apply_format_gaps(r: Result, g: "JudgedGpu", reads: Mapping[str, Status]) -> Result:
    """Note on `r` the fields it reads that the capture's format does not carry (format_gaps).
    A pass that a fail rule's field is missing from becomes a plain skip naming what to add
    (never error: nothing is wrong with the node or the capture, and never a pass: it was not
    judged); a field only advice needs is a note in the evidence. Any other status stands."""
    gaps = {f: hint for f, hint in format_gaps(g).items() if status_if_unreadable(f, reads) is not None}
    if not gaps:
        return r
    r.evidence.extend(dict.fromkeys(gaps.values()))
    needed = list(dict.fromkeys(hint for f, hint in gaps.items() if status_if_unreadable(f, reads) == Status.ERROR))
    if needed and r.status in (Status.PASS, Status.SKIP):
        prefix = f"GPU {g.get('index')}: " if g.get("index") is not None else ""
        r.status, r.action = Status.SKIP, Action.NONE
        r.summary = prefix + "; ".join(needed)
    return r


def get(d: Mapping[str, object] | None, *path: str) -> Any:
    """d[path[0]][path[1]]..., None where anything is missing: a path into any JSON document (a
    snapshot, a GPU entry), whatever its type."""
    cur: Any = d
    for p in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(p)
    return cur


def latest_metrics_by(ctx: Context, check_id: str, key: str) -> dict[Any, tuple[dict[str, Any], Any]]:
    """State.latest_metrics_by, or nothing when the run keeps no history."""
    return ctx.state.latest_metrics_by(check_id, key) if ctx.state is not None else {}


def snapshot_time(ctx: Context) -> float | None:
    """The snapshot's capture time, seconds since the epoch."""
    from ..platform.telemetry.snapshot import snapshot_epoch

    return snapshot_epoch(ctx.snapshot or {})


def previous_interval(prev: tuple[dict[str, Any], Any] | None, now: float | None) -> tuple[float | None, str | None]:
    """Seconds between the previous reading and `now`, or (None, why not)."""
    from ..platform.telemetry.snapshot import parse_time

    if prev is None:
        return None, "no previous reading in the history"
    metrics, verdict_time = prev
    then = metrics.get("snapshot_time")
    then = parse_time(then) if then is not None else parse_time(verdict_time)
    if now is None or not math.isfinite(now):
        return None, "this snapshot has no usable time"
    if then is None or not math.isfinite(then) or then < 0:
        return None, "the previous reading has no usable time"
    if now < then:
        return None, "the previous reading is newer than this snapshot (clock stepped back?)"
    return now - then, None


def counter_growth(current: Any, previous: Any) -> tuple[int | None, str | None]:
    """current - previous for a monotonic counter, or (None, why not)."""
    if current is None:
        return None, "counter not read now"
    if previous is None:
        return None, "counter not in the previous reading"
    if current < previous:
        return None, f"counter went back from {previous} to {current} (driver reload or reset since)"
    return int(current) - int(previous), None
