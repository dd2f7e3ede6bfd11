"""inventory: are the GPUs that should be here present, visible to NVML and set up as expected?

Node result (subject "node"): NVML usable; GPU count vs [node] expected_gpus; NVIDIA GPUs on the
PCI bus (sysfs) that NVML does not report; one model across GPUs (and vs [node] expected_model);
driver and CUDA versions reported.
Per-GPU results: state (lost / reset required), persistence mode, ECC mode current and pending,
MIG mode current and pending.

When NVML is not usable the verdict comes from sysfs: NVIDIA GPUs on the bus (or an expected count
above 0) mean the node is broken ("driver not loaded or GPU lost", fail, reboot); no NVIDIA device
and no expected count is a machine without GPUs (skip).
"""

from __future__ import annotations

from typing import Any

from ..check import Context, Level, Need, define
from ..result import Action, Result, Status, Threshold, judge
from ..telemetry.fields import judged_view
from . import apply_unreadable, get, gpu_state_result, unreadable_fields

ID = "inventory"

DEFAULTS = {
    "require_persistence_mode": True,  # warn when persistence mode is off
    "require_ecc": True,  # fail when ECC is disabled
    "allow_mig": False,  # warn when MIG mode is enabled
    "compare_pci_bus": True,  # fail for NVIDIA GPUs on the PCI bus that NVML does not report
}


def gpu_reads(p: dict[str, Any]) -> dict[str, Status]:
    """The snapshot fields a GPU's result depends on, and what it is when one could not be read
    (or holds an invalid value): error for the ECC mode where ECC is required (a fail rule), warn
    for the advisory modes and the identity it reports."""
    reads = {k: Status.WARN for k in ("uuid", "name", "serial", "pci_bus_id", "pci_device_id", "persistence_mode",
                                       "mig_mode", "ecc_mode")}
    if p["require_ecc"]:
        reads["ecc_mode"] = Status.ERROR
    return reads


def node_reads(p: dict[str, Any], snap: dict[str, Any]) -> dict[str, Status]:
    """The fields of every GPU the node result depends on: the model (mixed or unexpected models
    fail) and, when NVIDIA GPUs are on the PCI bus and compared, the PCI bus id."""
    reads = {"name": Status.ERROR}
    if p["compare_pci_bus"] and snap.get("pci_nvidia_devices"):
        reads["pci_bus_id"] = Status.ERROR
    return reads


def _no_nvml(ctx: Context, snap: dict[str, Any]) -> list[Result]:
    err = get(snap, "nvml", "error") or {}
    kind = err.get("kind", "other")
    msg = err.get("message", "")
    pci = snap.get("pci_nvidia_devices") or []
    expected = ctx.config.expected_gpus if ctx.config is not None else None
    if kind == "no_permission":
        status, action = Status.ERROR, Action.NONE
        summary = "NVML refused access (no permission): cannot judge the GPUs"
    elif pci:
        status, action = Status.FAIL, Action.REBOOT
        summary = (f"driver not loaded or GPU lost: {len(pci)} NVIDIA GPU(s) on the PCI bus but NVML is "
                   f"unavailable ({kind})")
    elif expected:
        status, action = Status.FAIL, Action.REBOOT
        summary = f"expected {expected} GPU(s), found no NVIDIA GPU on the PCI bus and NVML is unavailable ({kind})"
    else:
        status, action = Status.SKIP, Action.NONE
        summary = f"no NVIDIA GPU on this machine (no NVIDIA device on the PCI bus; NVML: {kind})"
    r = Result(ID, status, summary, action=action)
    r.metric("nvml_ok", False)
    r.metric("nvml_error", kind)
    r.metric("pci_gpu_count", len(pci), "count")
    r.metric("expected_gpus", expected, "count")
    r.thresholds.append(Threshold("pci_gpu_count", ">", 0, Status.FAIL, "count"))
    if expected is not None:
        r.thresholds.append(Threshold("pci_gpu_count", "<", expected, Status.FAIL, "count"))
    r.evidence.append(f"NVML: {kind}: {msg}" if msg else f"NVML: {kind}")
    r.evidence.extend(
        f"PCI {d.get('bus_id')} class {d.get('class')} device {d.get('device')} driver {d.get('driver') or 'none'}"
        for d in pci
    )
    return [r]


def _node(ctx: Context, snap: dict[str, Any], p: dict[str, Any]) -> Result:
    gpus = [judged_view(g) for g in snap.get("gpus") or []]
    pci = snap.get("pci_nvidia_devices") or []
    expected = ctx.config.expected_gpus if ctx.config is not None else None
    expected_model = ctx.config.expected_model if ctx.config is not None else None
    count = len(gpus)
    unseen, not_in_nvml = _bus_ids_not_in_nvml(gpus, pci) if p["compare_pci_bus"] else ([], 0)
    names = sorted({g.get("name") for g in gpus if g.get("state", "ok") == "ok" and g.get("name")})
    mismatched = [
        g.get("index") for g in gpus
        if expected_model and g.get("state", "ok") == "ok" and g.get("name") and g.get("name") != expected_model
    ]
    metrics: dict[str, Any] = {
        "gpu_count": count,
        "expected_gpus": expected,
        "missing_gpus": None if expected is None else max(expected - count, 0),
        "extra_gpus": None if expected is None else max(count - expected, 0),
        "pci_gpu_count": len(pci),
        "pci_gpus_not_in_nvml": not_in_nvml if p["compare_pci_bus"] else None,
        "models": ", ".join(names) if names else None,
        "model_count": len(names),
        "expected_model": expected_model,
        "gpus_not_expected_model": len(mismatched) if expected_model else None,
        "driver_version": snap.get("driver_version"),
        "cuda_driver_version": snap.get("cuda_driver_version"),
        "driver_version_missing": int(snap.get("driver_version") is None),
        "cuda_version_missing": int(snap.get("cuda_driver_version") is None),
    }
    thresholds = [
        Threshold("missing_gpus", ">", 0, Status.FAIL, "count"),
        Threshold("extra_gpus", ">", 0, Status.WARN, "count"),
        Threshold("pci_gpus_not_in_nvml", ">", 0, Status.FAIL, "count"),
        Threshold("model_count", ">", 1, Status.FAIL, "count"),
        Threshold("gpus_not_expected_model", ">", 0, Status.FAIL, "count"),
        Threshold("driver_version_missing", ">", 0, Status.WARN),
        Threshold("cuda_version_missing", ">", 0, Status.WARN),
    ]
    if expected is None:
        thresholds = [t for t in thresholds if t.metric not in ("missing_gpus", "extra_gpus")]
    if not expected_model:
        thresholds = [t for t in thresholds if t.metric != "gpus_not_expected_model"]
    if not p["compare_pci_bus"]:
        thresholds = [t for t in thresholds if t.metric != "pci_gpus_not_in_nvml"]
    r = judge(
        ID,
        thresholds,
        metrics,
        units={"gpu_count": "count", "expected_gpus": "count", "missing_gpus": "count", "extra_gpus": "count",
               "pci_gpu_count": "count", "pci_gpus_not_in_nvml": "count", "model_count": "count",
               "gpus_not_expected_model": "count"},
        ok_summary=(f"{count} GPU(s) {'(' + ', '.join(names) + ') ' if names else ''}visible to NVML"
                    f"{'' if expected is None else f', {expected} expected'}; driver {snap.get('driver_version')}, "
                    f"CUDA {snap.get('cuda_driver_version')}"),
        causes={
            "missing_gpus": f"GPU(s) missing: NVML reports {count}, {expected} expected",
            "extra_gpus": f"more GPUs than expected: NVML reports {count}, {expected} expected (stale config?)",
            "pci_gpus_not_in_nvml": "NVIDIA GPU(s) on the PCI bus that NVML does not report (driver failed to bring them up)",
            "model_count": f"mixed GPU models: {', '.join(names)}",
            "gpus_not_expected_model": f"GPU model is not the expected {expected_model!r}: GPUs {mismatched}",
            "driver_version_missing": "NVML did not report the driver version",
            "cuda_version_missing": "NVML did not report the CUDA driver version",
        },
        actions={
            "missing_gpus": Action.REBOOT,
            "extra_gpus": Action.INVESTIGATE,
            "pci_gpus_not_in_nvml": Action.REBOOT,
            "model_count": Action.INVESTIGATE,
            "gpus_not_expected_model": Action.INVESTIGATE,
            "driver_version_missing": Action.INVESTIGATE,
            "cuda_version_missing": Action.INVESTIGATE,
        },
    )
    if unseen:
        r.evidence.append("on the PCI bus without a readable NVML GPU: " + ", ".join(unseen))
    lost = [f"GPU {g.get('index')} {g.get('state')}" for g in gpus if g.get("state", "ok") != "ok"]
    if lost:
        r.evidence.append("GPUs NVML lists but cannot read (see their results): " + ", ".join(lost))
    if expected is not None and count < expected and pci:
        r.evidence.append("NVIDIA GPUs on the PCI bus: " + ", ".join(d["bus_id"] for d in pci))
    return _unreadable_on_the_node(r, gpus, node_reads(p, snap))


def _bus_ids_not_in_nvml(gpus: list[dict[str, Any]], pci: list[dict[str, Any]]) -> tuple[list[str], int]:
    """The sysfs bus ids no NVML GPU has, and how many of them no GPU without a readable bus id
    (NVML lists it but cannot open it, or the read failed) can account for: those are theirs
    first."""
    nvml_bus = {g.get("pci_bus_id") for g in gpus if g.get("pci_bus_id")}
    unseen = [d["bus_id"] for d in pci if d.get("bus_id") not in nvml_bus]
    unreadable = [g.get("index") for g in gpus if not g.get("pci_bus_id")
                  and (g.get("state", "ok") != "ok" or "pci_bus_id" in unreadable_fields(g))]
    return unseen, max(len(unseen) - len(unreadable), 0)


def _unreadable_on_the_node(r: Result, gpus: list[dict[str, Any]], reads: dict[str, Status]) -> Result:
    """The node result depends on every readable GPU's model and bus id: one that could not be
    read (or is invalid) leaves it unjudged (error) unless what was read already fails it."""
    whys = [f"GPU {g.get('index')}: {why}" for g in gpus if g.get("state", "ok") == "ok"
            for f, why in unreadable_fields(g).items() if f in reads]
    if not whys:
        return r
    r.evidence.extend(whys)
    if r.status != Status.FAIL:
        kept = f"; {r.summary}" if r.status in (Status.WARN, Status.ERROR) else ""
        r.status, r.action = Status.ERROR, Action.NONE
        r.summary = "; ".join(whys) + kept
    return r


def _gpu(g: dict[str, Any], p: dict[str, Any]) -> Result:
    bad = gpu_state_result(ID, g)
    if bad is not None:
        return bad
    idx = g.get("index")
    ecc_cur, ecc_pend = get(g, "ecc_mode", "current"), get(g, "ecc_mode", "pending")
    mig_cur, mig_pend = get(g, "mig_mode", "current"), get(g, "mig_mode", "pending")
    metrics: dict[str, Any] = {
        "uuid": g.get("uuid"),
        "name": g.get("name"),
        "serial": g.get("serial"),
        "pci_bus_id": g.get("pci_bus_id"),
        "persistence_mode": g.get("persistence_mode"),
        "ecc_current": ecc_cur,
        "ecc_pending": ecc_pend,
        "mig_current": mig_cur,
        "mig_pending": mig_pend,
        "ecc_change_pending": None if ecc_cur is None or ecc_pend is None else ecc_cur != ecc_pend,
        "mig_change_pending": None if mig_cur is None or mig_pend is None else mig_cur != mig_pend,
    }
    thresholds = [
        Threshold("ecc_change_pending", "==", True, Status.WARN),
        Threshold("mig_change_pending", "==", True, Status.WARN),
    ]
    if p["require_ecc"]:
        thresholds.append(Threshold("ecc_current", "==", False, Status.FAIL))
    if p["require_persistence_mode"]:
        thresholds.append(Threshold("persistence_mode", "==", False, Status.WARN))
    if not p["allow_mig"]:
        thresholds.append(Threshold("mig_current", "==", True, Status.WARN))
    r = judge(
        ID,
        thresholds,
        metrics,
        gpu=idx,
        ok_summary=f"GPU {idx} ({g.get('name') or 'unknown model'}, {g.get('pci_bus_id')}): modes ok",
        causes={
            "ecc_change_pending": (f"ECC mode change pending (current {'on' if ecc_cur else 'off'}, pending "
                                   f"{'on' if ecc_pend else 'off'}): reboot/reset pending"),
            "mig_change_pending": (f"MIG mode change pending (current {'on' if mig_cur else 'off'}, pending "
                                   f"{'on' if mig_pend else 'off'}): reset pending"),
            "ecc_current": "ECC is disabled",
            "persistence_mode": "persistence mode is off (slow first use; enable nvidia-persistenced)",
            "mig_current": "MIG mode is enabled on a node that expects whole GPUs",
        },
        actions={
            "ecc_change_pending": Action.RESET_GPU,
            "mig_change_pending": Action.RESET_GPU,
            "ecc_current": Action.INVESTIGATE,
            "persistence_mode": Action.INVESTIGATE,
            "mig_current": Action.INVESTIGATE,
        },
    )
    return apply_unreadable(r, g, gpu_reads(p))


@define(
    ID,
    title="GPUs present and visible to NVML; driver, persistence, ECC and MIG modes",
    level=Level.QUICK,
    needs=(Need.NVML,),
    budget_s=5.0,
    detects="driver not loaded, GPU fallen off the bus (Xid 79), missing GPUs, mixed models, pending ECC/MIG changes",
    defaults=DEFAULTS,
)
def inventory(ctx: Context) -> list[Result]:
    snap = ctx.snapshot or {}
    p = ctx.params(ID, DEFAULTS)
    if not get(snap, "nvml", "ok"):
        return _no_nvml(ctx, snap)
    gpus = snap.get("gpus") or []
    pci = snap.get("pci_nvidia_devices") or []
    expected = ctx.config.expected_gpus if ctx.config is not None else None
    if not gpus and not pci and not expected:
        return [Result(ID, Status.SKIP, "no NVIDIA GPU on this machine (NVML reports none, none on the PCI bus)")]
    results = [_node(ctx, snap, p)]
    results.extend(_gpu(judged_view(g), p) for g in sorted(ctx.selected_gpu_entries(), key=lambda g: g.get("index", 0)))
    return results


CHECKS = [inventory]
