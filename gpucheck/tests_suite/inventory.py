"""inventory: are the GPUs that should be here present, visible to NVML and set up as expected?

Node result (subject "node"): NVML usable; GPU count vs [node] expected_gpus; NVIDIA GPUs on the
PCI bus (sysfs) that NVML does not report; GPUs of the run's selection that NVML does not list (a
Slurm job's GPUs: gpucheck.app.RunRequest.gpus_assigned; a user's `--gpus` typo is a usage error
before any check runs); one model across GPUs (and vs [node] expected_model); driver and CUDA
versions reported.
Per-GPU results: state (lost / reset required), persistence mode, ECC mode current and pending,
MIG mode current and pending.

When NVML did not answer within the time the run gave it, or gpucheck's own reader failed, the
result is `error` (could not judge). When NVML is otherwise not usable the verdict comes from
sysfs: NVIDIA GPUs on the bus (or an expected count above 0) mean the node is broken ("driver not
loaded or GPU lost", fail, reboot); no NVIDIA device and no expected count is a machine without
GPUs (skip).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from ..data.ecc import ecc_class
from ..platform.telemetry.fields import judged_view
from ..sdk import (NOT_IN_FORMAT, Action, Context, Key, Level, Need, Result, Rule, Status, apply_unreadable, define, evaluate, get,
                   gpu_state_result, nvml_unjudged, settle, unreadable_fields)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import JudgedGpu, PciDevice, Snapshot

    # The run's snapshot, or {} where none was read.
    SnapshotOrNone = Snapshot | dict[str, None]

ID = "inventory"


class InventoryParams(TypedDict):
    """inventory's parameters (DEFAULTS, merged with the config's [checks.inventory])."""

    require_persistence_mode: bool
    require_ecc: bool
    allow_mig: bool
    compare_pci_bus: bool


DEFAULTS: InventoryParams = {
    "require_persistence_mode": True,  # warn when persistence mode is off
    "require_ecc": True,  # fail when ECC is disabled
    "allow_mig": False,  # warn when MIG mode is enabled
    "compare_pci_bus": True,  # fail for NVIDIA GPUs on the PCI bus that NVML does not report
}


def gpu_reads(p: InventoryParams) -> dict[str, Status]:
    """The snapshot fields a GPU's result depends on, and what it is when one could not be read
    (or holds an invalid value): error for the ECC mode where ECC is required (a fail rule), warn
    for the advisory modes and the identity it reports."""
    reads = {k: Status.WARN for k in ("uuid", "name", "serial", "pci_bus_id", "pci_device_id", "persistence_mode",
                                       "mig_mode", "ecc_mode")}
    if p["require_ecc"]:
        reads["ecc_mode"] = Status.ERROR
    return reads


def node_reads(p: InventoryParams, snap: "SnapshotOrNone") -> dict[str, Status]:
    """The fields of every GPU the node result depends on: the model (mixed or unexpected models
    fail) and, when NVIDIA GPUs are on the PCI bus and compared, the PCI bus id."""
    reads = {"name": Status.ERROR}
    if p["compare_pci_bus"] and snap.get("pci_nvidia_devices"):
        reads["pci_bus_id"] = Status.ERROR
    return reads


NO_NVML_RULES = (
    Rule("pci_gpu_count", ">", 0, Status.FAIL, Action.REBOOT,
         "driver not loaded or GPU lost: {pci_gpu_count} NVIDIA GPU(s) on the PCI bus but NVML is unavailable "
         "({nvml_error})", "count"),
    Rule("pci_gpu_count", "<", Key("expected_gpus"), Status.FAIL, Action.REBOOT,
         "expected {expected_gpus} GPU(s), found no NVIDIA GPU on the PCI bus and NVML is unavailable ({nvml_error})",
         "count"),
)

NODE_RULES = (
    Rule("missing_gpus", ">", 0, Status.FAIL, Action.REBOOT,
         "GPU(s) missing: NVML reports {gpu_count}, {expected_gpus} expected ({detail})", "count"),
    Rule("extra_gpus", ">", 0, Status.WARN, Action.INVESTIGATE,
         "more GPUs than expected: NVML reports {gpu_count}, {expected_gpus} expected (stale config?) ({detail})",
         "count"),
    Rule("pci_gpus_not_in_nvml", ">", 0, Status.FAIL, Action.REBOOT,
         "NVIDIA GPU(s) on the PCI bus that NVML does not report (driver failed to bring them up) ({detail})", "count"),
    Rule("selected_gpus_not_in_nvml", ">", 0, Status.FAIL, Action.REBOOT,
         "GPU(s) {absent} of this run (the job's GPUs) missing: NVML does not list them ({detail})", "count"),
    Rule("model_count", ">", 1, Status.FAIL, Action.INVESTIGATE, "mixed GPU models: {models} ({detail})", "count"),
    Rule("gpus_not_expected_model", ">", 0, Status.FAIL, Action.INVESTIGATE,
         "GPU model is not the expected {expected_model!r}: GPUs {mismatched} ({detail})", "count"),
    Rule("driver_version_missing", ">", 0, Status.WARN, Action.INVESTIGATE,
         "NVML did not report the driver version ({detail})"),
    Rule("cuda_version_missing", ">", 0, Status.WARN, Action.INVESTIGATE,
         "NVML did not report the CUDA driver version ({detail})"),
)

GPU_RULES = (
    Rule("ecc_change_pending", "==", True, Status.WARN, Action.RESET_GPU,
         "ECC mode change pending (current {ecc_now}, pending {ecc_next}): reboot/reset pending ({detail})"),
    Rule("mig_change_pending", "==", True, Status.WARN, Action.RESET_GPU,
         "MIG mode change pending (current {mig_now}, pending {mig_next}): reset pending ({detail})"),
    Rule("ecc_current", "==", False, Status.FAIL, Action.INVESTIGATE, "ECC is disabled ({detail})"),
    Rule("persistence_mode", "==", False, Status.WARN, Action.INVESTIGATE,
         "persistence mode is off (slow first use; enable nvidia-persistenced) ({detail})"),
    Rule("mig_current", "==", True, Status.WARN, Action.INVESTIGATE,
         "MIG mode is enabled on a node that expects whole GPUs ({detail})"),
)


def _no_nvml(ctx: Context, snap: "SnapshotOrNone") -> list[Result]:
    unjudged = nvml_unjudged(ID, snap)  # NVML did not answer in time, or our own reader failed
    if unjudged is not None:
        unjudged.evidence.extend(_pci_evidence(snap))
        return [unjudged]
    err = get(snap, "nvml", "error") or {}
    kind = err.get("kind", "other")
    msg = err.get("message", "")
    pci = snap.get("pci_nvidia_devices") or []
    expected = ctx.config.expected_gpus if ctx.config is not None else None
    metrics: dict[str, bool | int | str | None] = {"nvml_ok": False, "nvml_error": kind, "pci_gpu_count": len(pci),
                                                    "expected_gpus": expected}
    units = {"pci_gpu_count": "count", "expected_gpus": "count"}
    if kind == "no_permission":  # nothing could be compared: no threshold is listed
        r = Result(ID, Status.ERROR, "NVML refused access (no permission): cannot judge the GPUs", metrics=metrics,
                   units=units)
    elif kind == NOT_IN_FORMAT:  # captures without GPU telemetry (gpucheck judge): nothing says the GPUs are gone
        r = Result(ID, Status.SKIP, msg or "the captures hold no GPU telemetry", metrics=metrics, units=units)
    else:
        r = evaluate(ID, NO_NVML_RULES, metrics, limits={"expected_gpus": expected}, units=units,
                     ok_summary=f"no NVIDIA GPU on this machine (no NVIDIA device on the PCI bus; NVML: {kind})")
        if r.status == Status.PASS:  # no GPU on the bus, none expected: nothing to judge
            r.status = Status.SKIP
    r.evidence.append(f"NVML: {kind}: {msg}" if msg else f"NVML: {kind}")
    r.evidence.extend(_pci_evidence(snap))
    return [r]


def _pci_evidence(snap: "SnapshotOrNone") -> list[str]:
    """One line per NVIDIA device on the PCI bus, with the driver bound to it."""
    return [f"PCI {d.get('bus_id')} class {d.get('class')} device {d.get('device')} driver {d.get('driver') or 'none'}"
            for d in snap.get("pci_nvidia_devices") or []]


def _node(ctx: Context, snap: "SnapshotOrNone", p: InventoryParams) -> Result:
    gpus = [judged_view(g) for g in snap.get("gpus") or []]
    pci = snap.get("pci_nvidia_devices") or []
    expected = ctx.config.expected_gpus if ctx.config is not None else None
    expected_model = ctx.config.expected_model if ctx.config is not None else None
    count = len(gpus)
    unseen, not_in_nvml = _bus_ids_not_in_nvml(gpus, pci) if p["compare_pci_bus"] else ([], 0)
    absent = sorted(set(ctx.gpus or ()) - {g.get("index") for g in gpus})  # a job's GPU NVML lacks
    names = sorted({name for g in gpus if g.get("state", "ok") == "ok" and (name := g.get("name"))})
    mismatched = [
        g.get("index") for g in gpus
        if expected_model and g.get("state", "ok") == "ok" and g.get("name") and g.get("name") != expected_model
    ]
    metrics: dict[str, int | str | None] = {
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
    if ctx.gpus is not None:  # the run's GPUs (a Slurm job's) that NVML does not list
        metrics["selected_gpus_not_in_nvml"] = len(absent)
    off = {"missing_gpus": expected is None, "extra_gpus": expected is None,
           "gpus_not_expected_model": not expected_model, "pci_gpus_not_in_nvml": not p["compare_pci_bus"],
           "selected_gpus_not_in_nvml": ctx.gpus is None}
    r = evaluate(
        ID, [rule for rule in NODE_RULES if not off.get(rule.metric)], metrics,
        facts={"mismatched": mismatched, "absent": ",".join(map(str, absent))},
        units={"gpu_count": "count", "expected_gpus": "count", "missing_gpus": "count", "extra_gpus": "count",
               "pci_gpu_count": "count", "pci_gpus_not_in_nvml": "count", "selected_gpus_not_in_nvml": "count",
               "model_count": "count", "gpus_not_expected_model": "count"},
        ok_summary=(f"{count} GPU(s) {'(' + ', '.join(names) + ') ' if names else ''}visible to NVML"
                    f"{'' if expected is None else f', {expected} expected'}; driver {snap.get('driver_version')}, "
                    f"CUDA {snap.get('cuda_driver_version')}"),
    )
    if unseen:
        r.evidence.append("on the PCI bus without a readable NVML GPU: " + ", ".join(unseen))
    lost = [f"GPU {g.get('index')} {g.get('state')}" for g in gpus if g.get("state", "ok") != "ok"]
    if lost:
        r.evidence.append("GPUs NVML lists but cannot read (see their results): " + ", ".join(lost))
    if expected is not None and count < expected and pci:
        r.evidence.append("NVIDIA GPUs on the PCI bus: " + ", ".join(d["bus_id"] for d in pci))
    return _unreadable_on_the_node(r, gpus, node_reads(p, snap))


def _bus_ids_not_in_nvml(gpus: "list[JudgedGpu]", pci: "list[PciDevice]") -> tuple[list[str], int]:
    """The sysfs bus ids no NVML GPU has, and how many of them no GPU without a readable bus id
    (NVML lists it but cannot open it, or the read failed) can account for: those are theirs
    first."""
    nvml_bus = {g.get("pci_bus_id") for g in gpus if g.get("pci_bus_id")}
    unseen = [d["bus_id"] for d in pci if d.get("bus_id") not in nvml_bus]
    unreadable = [g.get("index") for g in gpus if not g.get("pci_bus_id")
                  and (g.get("state", "ok") != "ok" or "pci_bus_id" in unreadable_fields(g))]
    return unseen, max(len(unseen) - len(unreadable), 0)


def _unreadable_on_the_node(r: Result, gpus: "list[JudgedGpu]", reads: dict[str, Status]) -> Result:
    """The node result depends on every readable GPU's model and bus id: one that could not be
    read (or is invalid) leaves it unjudged (error) unless what was read already fails it."""
    whys = {f"GPU {g.get('index')}: {f}": f"GPU {g.get('index')}: {why}" for g in gpus if g.get("state", "ok") == "ok"
            for f, why in unreadable_fields(g).items() if f in reads}
    if not whys:
        return r
    r.evidence.extend(whys.values())
    r.unjudged.update({f: Status.ERROR for f in whys})
    if r.status != Status.FAIL:
        kept = f"; {r.summary}" if r.status in (Status.WARN, Status.ERROR) else ""
        settle(r)
        r.summary = "; ".join(whys.values()) + kept
    return r


def _gpu(g: "JudgedGpu", p: InventoryParams) -> Result:
    idx = g.get("index")
    ecc_cur, ecc_pend = get(g, "ecc_mode", "current"), get(g, "ecc_mode", "pending")
    mig_cur, mig_pend = get(g, "mig_mode", "current"), get(g, "mig_mode", "pending")
    metrics: dict[str, str | bool | None] = {
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
    sku = ecc_class(g.get("name"))
    ecc_off_by_default = ecc_cur is False and sku is not None and not sku.ships_with_ecc
    off = {"ecc_current": not p["require_ecc"] or ecc_off_by_default,
           "persistence_mode": not p["require_persistence_mode"], "mig_current": p["allow_mig"]}
    onoff = {f"{k}_{w}": "on" if v else "off"
             for k, w, v in (("ecc", "now", ecc_cur), ("ecc", "next", ecc_pend), ("mig", "now", mig_cur),
                             ("mig", "next", mig_pend))}
    r = evaluate(ID, [rule for rule in GPU_RULES if not off.get(rule.metric)], metrics, facts=onoff, gpu=idx,
                 ok_summary=f"GPU {idx} ({g.get('name') or 'unknown model'}, {g.get('pci_bus_id')}): modes ok")
    if ecc_off_by_default and sku is not None:  # a note, never a fault: that SKU ships with ECC off
        r.evidence.append(f"ECC disabled: the default of a {sku.name} ({g.get('name')}), not a fault")
        if r.status == Status.PASS:
            r.summary += f" (ECC disabled: the default of a {sku.name})"
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
    snap: SnapshotOrNone = ctx.snapshot or {}
    p = ctx.params(ID, DEFAULTS)
    if not get(snap, "nvml", "ok"):
        return _no_nvml(ctx, snap)
    partial = get(snap, "capture", "not_carried", "gpus")  # gpucheck judge: GPUs named by a partial capture
    if partial:
        return [Result(ID, Status.SKIP, str(partial))]
    gpus = snap.get("gpus") or []
    pci = snap.get("pci_nvidia_devices") or []
    expected = ctx.config.expected_gpus if ctx.config is not None else None
    if not gpus and not pci and not expected and not ctx.gpus:
        return [Result(ID, Status.SKIP, "no NVIDIA GPU on this machine (NVML reports none, none on the PCI bus)")]
    results = [_node(ctx, snap, p)]
    for g in sorted(ctx.selected_gpu_entries(), key=lambda g: g.get("index", 0)):
        g = judged_view(g)
        results.append(gpu_state_result(ID, g) or _gpu(g, p))
    return results


CHECKS = [inventory]
