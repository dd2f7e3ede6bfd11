"""The node-local diagnostic checks. Each module exposes `CHECKS`, a list of `gpucheck.check.Check`.

The helpers below are shared by the level-1 checks that judge the telemetry snapshot
(inventory, ecc, memory-remap, clocks, pcie, nvlink, recovery-action). They import nothing heavy.

GPU states: a GPU the snapshot marks lost / reset_required / error is reported by *every* per-GPU
check as a result of that GPU naming the state (fail, or error for a permission problem), not
skipped: a run restricted to one check (`--check ecc`) must not pass a node whose GPU is gone.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..check import Context
from ..result import Action, Result, Status

STATE_TEXT = {
    "lost": "GPU is lost (fell off the bus or stopped answering; NVML GPU_IS_LOST)",
    "reset_required": "GPU needs a reset (NVML RESET_REQUIRED)",
}


def nvml_unavailable(check_id: str, ctx: Context) -> list[Result] | None:
    """A skip when the snapshot says NVML is not usable (the inventory check fails the node for
    it when GPUs should be there)."""
    snap = ctx.snapshot or {}
    nv = snap.get("nvml") or {}
    if nv.get("ok"):
        return None
    err = nv.get("error") or {}
    kind = err.get("kind", "other")
    return [Result(check_id, Status.SKIP, f"NVML unavailable: {kind} (judged by the inventory check)",
                   evidence=[f"NVML: {err.get('message', '')}"] if err.get("message") else [])]


def selected_gpus_or_skip(check_id: str, ctx: Context) -> tuple[list[dict[str, Any]], list[Result] | None]:
    """The selected snapshot GPUs, or a skip saying why there is nothing to judge."""
    skip = nvml_unavailable(check_id, ctx)
    if skip:
        return [], skip
    gpus = sorted(ctx.selected_gpu_entries(), key=lambda g: g.get("index", 0))
    if not gpus:
        total = len((ctx.snapshot or {}).get("gpus", []))
        why = (f"none of the selected GPUs {ctx.gpus} is among the {total} GPUs NVML reports"
               if ctx.gpus is not None and total else "NVML reports no GPU (judged by the inventory check)")
        return [], [Result(check_id, Status.SKIP, why)]
    return gpus, None


def gpu_state_result(check_id: str, g: dict[str, Any]) -> Result | None:
    """The result for a GPU that cannot be read (state other than ok), or None."""
    state = g.get("state", "ok")
    if state == "ok":
        return None
    idx = g.get("index")
    err = g.get("error") or {}
    msg = err.get("message", "")
    evidence = [f"NVML: {msg}"] if msg else []
    if state in STATE_TEXT:
        action = Action.REBOOT if state == "lost" else Action.RESET_GPU
        r = Result(check_id, Status.FAIL, f"GPU {idx}: {STATE_TEXT[state]}", gpu=idx, action=action, evidence=evidence)
    elif err.get("kind") == "no_permission":
        r = Result(check_id, Status.ERROR, f"GPU {idx} could not be opened: no permission to query NVML",
                   gpu=idx, evidence=evidence)
    else:
        r = Result(check_id, Status.FAIL,
                   f"GPU {idx} could not be opened through NVML ({err.get('kind', 'other')}): unusable for jobs",
                   gpu=idx, action=Action.REBOOT, evidence=evidence)
    r.metric("uuid", g.get("uuid"))
    r.metric("state", state)
    return r


def read_failures(g: dict[str, Any], prefixes: Iterable[str]) -> dict[str, str]:
    """The GPU's failed reads (field -> kind) under the given field prefixes."""
    errs = g.get("errors") or {}
    pre = tuple(prefixes)
    return {k: v for k, v in sorted(errs.items()) if k.startswith(pre)}


def apply_read_failures(r: Result, g: dict[str, Any], core: Iterable[str], other: Iterable[str] = ()) -> Result:
    """Note failed reads on a result. A failed read of a field the check needs for its main rule
    (`core` prefixes) turns a pass into `error` (no judgement was possible); failed reads of the
    other fields are evidence only. A fail or warn found from the fields that were read stands."""
    core_f = read_failures(g, core)
    other_f = read_failures(g, other)
    for field, kind in {**core_f, **other_f}.items():
        r.evidence.append(f"could not read {field}: {kind}")
    if core_f and r.status in (Status.PASS, Status.SKIP):
        names = ", ".join(f"{f} ({k})" for f, k in core_f.items())
        r.status = Status.ERROR
        r.summary = f"could not read {names}"
        r.action = Action.NONE
    return r


def get(d: dict[str, Any] | None, *path: str) -> Any:
    """d[path[0]][path[1]]..., None where anything is missing."""
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
    from ..telemetry.snapshot import snapshot_epoch

    return snapshot_epoch(ctx.snapshot or {})


def previous_interval(prev: tuple[dict[str, Any], Any] | None, now: float | None) -> tuple[float | None, str | None]:
    """Seconds between the previous reading and `now`, or (None, why not)."""
    from ..telemetry.snapshot import parse_time

    if prev is None:
        return None, "no previous reading in the history"
    metrics, verdict_time = prev
    then = metrics.get("snapshot_time")
    then = parse_time(then) if then is not None else parse_time(verdict_time)
    if then is None or now is None:
        return None, "the previous reading has no usable time"
    if now < then:
        return None, "the previous reading is newer than this snapshot"
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
