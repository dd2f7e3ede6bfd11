"""fabric.nvswitch: the NVSwitch / NVLink fabric: NVML's GPU fabric registration, the Fabric Manager
service, and the Fabric Manager log.

- **GPU fabric info** (NVML, R535+; `fabric` of each GPU entry): a registration not started or in
  progress fails (the GPU has no NVLink peers yet), one completed with a status other than success
  fails (nvidia-smi "Insufficient Resources"), a health summary "unhealthy" or an unhealthy route
  fails, limited capacity / degraded bandwidth / a route or access-timeout recovery in progress warn.
- **Fabric Manager service** (`systemctl show nvidia-fabricmanager`): on a node with NVSwitches,
  a service that is not active, or not installed, fails (drain: no NVLink P2P for jobs).
- **Fabric Manager log** (/var/log/fabricmanager.log, or a pasted log or journal): a failed start
  after the last successful one, or an NVSwitch fatal error since it, fails; NVSwitch non-fatal
  errors within `nonfatal_window_s` of the log's newest line (live: now) warn. A line whose time
  cannot be read is never old.

"No NVSwitch on this system" (no NVSwitch on the PCI bus and no GPU with fabric info, or Fabric
Manager's NV_WARN_NOTHING_TO_DO) is a plain skip, never a fail. A source that cannot be read on a
node that has NVSwitches is `error`; a replayed snapshot without `fabric_manager` is a skip naming
what to record.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..platform.fabric.fabricmanager import (LOG_PATH, FabricManagerRecord, FmEvent, nvswitch_devices, parse_fm_log,
                                             parse_service_state, read_fabric_manager)
from ..sdk import (NOT_IN_CAPTURE, Action, Context, Level, Limit, Result, Rule, Status, apply_unreadable, define,
                   evaluate, selected_gpus_or_skip, snapshot_time)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import JudgedGpu

ID = "fabric.nvswitch"
SERVICE, LOG = "fabric manager service", "fabric manager log"


class FabricParams(TypedDict):
    """fabric.nvswitch's parameters (DEFAULTS merged with [checks."fabric.nvswitch"])."""

    sysfs_root: str
    log_path: str
    nonfatal_window_s: float


DEFAULTS: FabricParams = {"sysfs_root": "/sys", "log_path": LOG_PATH, "nonfatal_window_s": 86400}
LIMITS = {"nonfatal_window_s": Limit("real", 0, above=True)}
READS = {"fabric": Status.ERROR}

GPU_RULES = (
    Rule("registration_incomplete", ">", 0, Status.FAIL, Action.DRAIN,
         "NVLink fabric registration {state} (no NVLink peers until it completes)"),
    Rule("registration_failed", ">", 0, Status.FAIL, Action.DRAIN, "NVLink fabric registration failed: {status}"),
    Rule("unhealthy", ">", 0, Status.FAIL, Action.DRAIN, "NVLink fabric unhealthy ({health})"),
    Rule("degraded", ">", 0, Status.WARN, Action.INVESTIGATE, "NVLink fabric degraded ({health})"),
)
SERVICE_RULES = (
    Rule("installed", "<", 1, Status.FAIL, Action.DRAIN, "Fabric Manager is not installed on a node with NVSwitches"),
    Rule("active", "<", 1, Status.FAIL, Action.DRAIN, "Fabric Manager service is {state} (no NVLink P2P for jobs)"),
)
LOG_RULES = (
    Rule("failed_starts", ">", 0, Status.FAIL, Action.DRAIN,
         "Fabric Manager failed to start ({failed_starts} failure(s) after its last successful start)"),
    Rule("fatal_errors", ">", 0, Status.FAIL, Action.REBOOT,
         "NVSwitch fatal error(s) since Fabric Manager's last start on {fatal_switches}"),
    Rule("nonfatal_errors", ">", 0, Status.WARN, Action.INVESTIGATE,
         "NVSwitch non-fatal error(s): {nonfatal_errors} on {nonfatal_switches}"),
)

_INCOMPLETE = ("not_started", "in_progress")
_BAD_HEALTH = ("route_unhealthy",)
_DEGRADED_HEALTH = ("degraded_bw", "route_recovery", "access_timeout_recovery")


# -- NVML fabric info --------------------------------------------------------------------------------


def judge_gpu(g: "JudgedGpu") -> Result:
    """One GPU's fabric registration (its `fabric` group)."""
    idx = g.get("index")
    f: Any = g.get("fabric") or {}
    state, status, summary = f.get("state"), f.get("status"), f.get("health_summary")
    health = f.get("health") or {}
    bad = [k for k in _BAD_HEALTH if health.get(k) == "true"] + (["summary unhealthy"] if summary == "unhealthy" else [])
    degraded = [k for k in _DEGRADED_HEALTH if health.get(k) == "true"] + (
        ["summary limited capacity"] if summary == "limited_capacity" else [])
    metrics = {"registration_incomplete": int(state in _INCOMPLETE),
               "registration_failed": int(state == "completed" and status not in (None, "success")),
               "unhealthy": int(bool(bad)), "degraded": int(bool(degraded)),
               "clique_id": f.get("clique_id"), "cluster_uuid": f.get("cluster_uuid")}
    facts = {"state": str(state).replace("_", " "), "status": str(status).replace("_", " "),
             "health": ", ".join(bad + degraded) or None}
    r = evaluate(ID, GPU_RULES, metrics, facts=facts, gpu=idx, prefix=f"GPU {idx} ",
                 ok_summary=f"GPU {idx}: NVLink fabric {state}, {status}"
                            + (f", clique {f.get('clique_id')}" if f.get("clique_id") else "")
                            + (f", health {summary}" if summary else ""))
    return apply_unreadable(r, g, READS)


def _fabric_gpus(ctx: Context) -> tuple[list[Result], bool, list[str]]:
    """(the results of the GPUs that have fabric info or could not read it, whether any has it,
    the GPUs whose fabric info the capture does not hold)."""
    gpus, skip = selected_gpus_or_skip(ID, ctx)
    if skip:
        return [], False, []
    out: list[Result] = []
    not_in_capture: list[str] = []
    for g in gpus:
        if g.get("state", "ok") != "ok":
            continue  # a lost GPU: every NVML check reports it (inventory, ecc, ...)
        kind = (g.get("errors") or {}).get("fabric")
        fabric = g.get("fabric")
        if kind == NOT_IN_CAPTURE:
            not_in_capture.append(str(g.get("index")))
        elif (kind is not None or any(k.split(".")[0] == "fabric" for k in g.get("invalid") or {})
              or (isinstance(fabric, dict) and fabric.get("state") not in (None, "not_supported"))):
            out.append(judge_gpu(g))
    return out, bool(out), not_in_capture


# -- Fabric Manager ------------------------------------------------------------------------------------


def judge_service(text: str | None, error: str | None) -> Result:
    if error is not None or text is None:
        return Result(ID, Status.ERROR, f"could not read the Fabric Manager service state: {error}", subject=SERVICE)
    try:
        st = parse_service_state(text)
    except ValueError as e:
        return Result(ID, Status.ERROR, f"could not judge the Fabric Manager service state: {e}", subject=SERVICE)
    installed = int(st["load_state"] != "not-found")
    metrics = {"installed": installed, "active": int(st["active_state"] == "active") if installed else None}
    state = f"{st['active_state']}/{st['sub_state']}" + (f" (result {st['result']})" if st["result"] else "")
    return evaluate(ID, SERVICE_RULES, metrics, facts={"state": state}, subject=SERVICE,
                    ok_summary=f"Fabric Manager service {state}")


def _since(events: list[FmEvent], kinds: tuple[str, ...], start: float | None) -> list[FmEvent]:
    """Events of `kinds` at or after `start` (a time) or without one (never old)."""
    return [e for e in events if e.kind in kinds and (start is None or e.time is None or e.time >= start)]


def judge_log(lines: list[str], where: str, now: float | None, p: FabricParams) -> Result:
    """The Fabric Manager log (see the module)."""
    events = parse_fm_log(lines)
    started = [e.time for e in events if e.kind in ("started", "configured") and e.time is not None]
    last_start = max(started) if started else None
    failed = [e for e in _since(events, ("start_failed",), last_start)
              if last_start is None or e.time is None or e.time > last_start]
    fatal = _since(events, ("nvswitch_fatal",), last_start)
    newest = max((e.time for e in events if e.time is not None), default=None) if now is None else now
    nonfatal = _since(events, ("nvswitch_nonfatal",),
                      None if newest is None else newest - float(p["nonfatal_window_s"]))
    switches = (lambda evs: ", ".join(sorted({f"NVSwitch {e.switch}" + (f" port {e.port}" if e.port is not None else "")
                                             for e in evs if e.switch})) or None)
    r = evaluate(ID, LOG_RULES, {"failed_starts": len(failed), "fatal_errors": len(fatal),
                                 "nonfatal_errors": len(nonfatal), "events": len(events)},
                 facts={"fatal_switches": switches(fatal) or "an NVSwitch", "nonfatal_switches": switches(nonfatal)},
                 subject=LOG, ok_summary=f"Fabric Manager log ({where}): no failed start and no NVSwitch error"
                                         + ("" if started else " (no start in the lines read)"))
    r.evidence.extend(e.line[:200] for e in (failed + fatal + nonfatal)[:10])
    others = [e for e in events if e.kind == "error"]
    if others:
        r.evidence.append(f"{len(others)} other [ERROR] line(s), not judged; the last: {others[-1].line[:200]}")
    return r


# -- the check -----------------------------------------------------------------------------------------


def _record(ctx: Context, p: FabricParams) -> FabricManagerRecord | None:
    if ctx.options.snapshot_path:
        rec = ctx.snapshot.get("fabric_manager") if ctx.snapshot else None
        return rec if isinstance(rec, dict) else None
    root = Path(str(p["sysfs_root"]))
    if nvswitch_devices(root) == []:  # no NVSwitch on the bus: no systemctl, no log read
        return {"service": None, "log": None, "nvswitch_devices": []}
    return read_fabric_manager(root, str(p["log_path"]))


def _no_nvswitch(rec: FabricManagerRecord | None, has_fabric_gpu: bool) -> str | None:
    """Why this is a system without NVSwitches (a plain skip), or None."""
    switches = rec["nvswitch_devices"] if rec is not None else None
    if has_fabric_gpu or switches:
        return None
    log = rec["log"] if rec is not None else None
    if log is not None and any(e.kind == "nothing_to_do" for e in parse_fm_log(log["lines"])):
        return "no NVSwitch on this system (Fabric Manager: NV_WARN_NOTHING_TO_DO)"
    if switches == []:
        return "no NVSwitch on this system (none on the PCI bus, no GPU with NVLink fabric info)"
    return None


def _fm_results(rec: FabricManagerRecord, now: float | None, p: FabricParams) -> list[Result]:
    out: list[Result] = []
    svc, log = rec["service"], rec["log"]
    if svc is not None:
        out.append(judge_service(svc["text"], svc["error"]))
    if log is not None:
        if log["error"]:
            out.append(Result(ID, Status.ERROR, f"could not read the Fabric Manager log: {log['error']}", subject=LOG))
        elif log["missing"]:
            out.append(Result(ID, Status.SKIP, f"no Fabric Manager log at {log['path']} (set [checks.\"{ID}\"] log_path)",
                              subject=LOG))
        else:
            out.append(judge_log(log["lines"], log["path"], now, p))
    return out


def run(ctx: Context) -> list[Result]:
    p = ctx.params(ID, DEFAULTS)
    gpu_results, has_fabric_gpu, not_in_capture = _fabric_gpus(ctx)
    rec = _record(ctx, p)
    why_none = _no_nvswitch(rec, has_fabric_gpu)
    if why_none is not None:
        return [Result(ID, Status.SKIP, why_none)]
    out = list(gpu_results)
    if not_in_capture and not gpu_results:
        out.append(Result(ID, Status.SKIP, f"NVLink fabric info of GPU(s) {', '.join(not_in_capture)} not in this "
                                           "capture (add nvidia-smi -q of R535+, or a gpucheck telemetry dump)"))
    if rec is None and not out:
        return [Result(ID, Status.SKIP, "not in this capture (record with gpucheck telemetry dump)")]
    if rec is None:
        out.append(Result(ID, Status.SKIP, "Fabric Manager state not in this capture (add a gpucheck telemetry dump, "
                                           "or /var/log/fabricmanager.log)", subject=SERVICE))
    else:
        now = None if ctx.options.snapshot_path else time.time()
        out += _fm_results(rec, now if now is not None else _capture_time(ctx, rec), p)
    return out or [Result(ID, Status.SKIP, "nothing of the NVLink fabric to judge in this capture")]


def _capture_time(ctx: Context, rec: FabricManagerRecord) -> float | None:
    """The time a replayed snapshot was recorded (its log is judged as of then); a pasted log
    without one: None (its own newest line)."""
    return snapshot_time(ctx) if rec["service"] is not None else None


fabric_nvswitch = define(ID, title="NVSwitch fabric: NVML fabric registration and health, Fabric Manager service and log",
                         level=Level.QUICK, needs=(), budget_s=10.0,
                         detects="an NVLink fabric that never finished registering, a stopped or failed Fabric Manager, "
                                 "NVSwitch errors",
                         defaults=DEFAULTS, limits=LIMITS)(run)

CHECKS = [fabric_nvswitch]
