"""gdr.peermem: GPUDirect RDMA's kernel module on a node with GPUs and RDMA NICs.

Without `nvidia_peermem` (or the older `nv_peer_mem`) loaded, NCCL and UCX cannot register GPU
memory with the NIC through peer memory and fall back to staging through host memory (or fail).
- The module not loaded on a node that has GPUs and RDMA hardware: fail.
- Load errors of the module in the kernel log ("Unknown symbol", "disagrees about version of
  symbol", modprobe could not insert it: a driver / MOFED mismatch): fail when the module is not
  loaded or its state is not in the capture, warn when it is loaded now.
- Other errors of the loaded module (e.g. "invalid context") are reported, not judged.
Set `require_peermem = false` on nodes that use DMA-BUF instead. No RDMA hardware, no GPU: skip.
"""

from __future__ import annotations

from typing import Any, TypedDict

from ..platform.kernlog.netscan import NetScan, scan_for
from ..platform.net.model import NetRecord
from ..platform.net.record import net_in
from ..platform.net.modules import PEERMEM_MODULES
from ..platform.net.rails import hardware_ports
from ..sdk import (nvml_unjudged, Action, Context, Key, Level, Limit, Result, Rule, Status, define, evaluate, settle,
                   snapshot_time)

ID = "gdr.peermem"


class PeermemParams(TypedDict):
    require_peermem: bool
    max_evidence_lines: int


DEFAULTS: PeermemParams = {"require_peermem": True, "max_evidence_lines": 5}
LIMITS = {"max_evidence_lines": Limit("int", 1)}
RULES = (
    Rule("peermem_loaded", "<", Key("peermem_required"), Status.FAIL, Action.INVESTIGATE,
         "GPUDirect RDMA module not loaded (neither nvidia_peermem nor nv_peer_mem in /proc/modules)"),
    Rule("load_errors", ">", Key("load_errors_fail"), Status.FAIL, Action.INVESTIGATE,
         "{value} load error(s) of {module} in the kernel log{unloaded}"),
    Rule("load_errors", ">", 0, Status.WARN, Action.INVESTIGATE,
         "{value} earlier load error(s) of {module} in the kernel log (loaded now)"),
)


def _has_gpus(snap: Any) -> bool | None:
    """True / False, or None when the snapshot says nothing about GPUs (a network capture alone)."""
    if snap.get("gpus") or snap.get("pci_nvidia_devices"):
        return True
    nv = snap.get("nvml") or {}
    return False if nv.get("ok") or "pci_nvidia_devices" in snap and snap.get("host") != "unknown" else None


def judge_peermem(net: NetRecord | None, has_gpus: bool | None, scan: NetScan, p: PeermemParams) -> Result:
    errors = [e for e in scan.events.peermem if e.load_error]
    runtime = [e for e in scan.events.peermem if not e.load_error]
    if net is None and not scan.events.peermem:
        return Result(ID, Status.SKIP, "kernel modules not in this capture (add /proc/modules)")
    if net is not None and not hardware_ports({"source": "", "error": None, "ports": net.get("ports") or [],
                                               "notes": [], "gpu_pci_chains": {}}) and not net.get("error"):
        return Result(ID, Status.SKIP, "no RDMA hardware on this node: GPUDirect RDMA does not apply")
    if has_gpus is False:
        return Result(ID, Status.SKIP, "no NVIDIA GPU on this node: GPUDirect RDMA does not apply")
    mods = (net or {}).get("modules") or {"loaded": None, "error": None}
    if mods.get("error"):
        return Result(ID, Status.ERROR, f"could not judge: {mods['error']}")
    loaded_list = mods.get("loaded")
    loaded = None if loaded_list is None else [m for m in PEERMEM_MODULES if m in loaded_list]
    if loaded is None and not errors:  # nothing says whether it is loaded or failed to load
        return Result(ID, Status.SKIP, "kernel modules not in this capture (add /proc/modules)",
                      evidence=[f"{len(runtime)} {runtime[0].module} error line(s) (reported, not judged)"] if runtime else [])
    module = errors[0].module if errors else "the GPUDirect RDMA module"
    metrics: dict[str, Any] = {"peermem_loaded": None if loaded is None else int(bool(loaded)), "load_errors": len(errors),
               "runtime_errors": len(runtime), "loaded_module": loaded[0] if loaded else None}
    limits = {"peermem_required": 1 if p["require_peermem"] else None, "load_errors_fail": None if loaded else 0}
    facts = {"module": module, "unloaded": " (module state not in this capture)" if loaded is None else ""}
    r = evaluate_peermem(metrics, limits, facts, loaded)
    r.evidence += [e.line for e in errors[: p["max_evidence_lines"]]]
    if runtime:
        r.evidence.append(f"{len(runtime)} other {runtime[0].module} error line(s), e.g. {runtime[0].line}")
        if r.status == Status.PASS:
            r.summary += f"; {len(runtime)} other {runtime[0].module} error line(s) (reported, not judged)"
    if scan.error:
        r.evidence.append(f"kernel log not read: {scan.error}")
    return r


def evaluate_peermem(metrics: dict[str, Any], limits: dict[str, Any], facts: dict[str, Any],
                     loaded: list[str] | None) -> Result:
    ok = f"{loaded[0]} loaded" if loaded else "no load error of the GPUDirect RDMA module in the kernel log"
    return evaluate(ID, RULES, metrics, limits=limits, facts=facts, ok_summary=ok,
                    units={"load_errors": "count", "runtime_errors": "count"})


@define(ID, title="GPUDirect RDMA: nvidia_peermem loaded, no load errors", level=Level.QUICK, needs=(),
        budget_s=10.0, detects="GPUDirect RDMA unavailable: peer-memory module missing or failing to load",
        defaults=DEFAULTS, limits=LIMITS)
def gdr_peermem(ctx: Context) -> list[Result]:
    unjudged = nvml_unjudged(ID, ctx.snapshot or {})  # the snapshot itself could not be read
    if unjudged is not None:
        return [unjudged]
    snap: Any = ctx.snapshot or {}
    scan = scan_for(snap, replayed=bool(ctx.options.snapshot_path), since=None, captured_at=snapshot_time(ctx))
    r = judge_peermem(net_in(snap), _has_gpus(snap), scan, ctx.params(ID, DEFAULTS))
    if scan.error and r.status != Status.SKIP and not ctx.options.snapshot_path:
        # Live, on a node with the hardware: the load errors could not be looked for.
        r.unjudged["kernel log"] = Status.ERROR
        before = r.status
        settle(r)
        if r.status != before:
            r.summary = f"could not read the kernel log ({scan.error}); {r.summary}"
    return [r]


CHECKS = [gdr_peermem]
