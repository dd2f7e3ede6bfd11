"""recovery-action: the driver's own verdict on what a GPU needs after an error.

NVML field 230, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvmlDeviceGpuRecoveryAction_t), set by the
driver after uncorrectable errors (NVIDIA GPU memory error management, "Recovery action flag"):

  0 NONE             no action: the GPU can be used by starting a new process      -> pass
  1 GPU_RESET        reset the GPU (nvidia-smi -r) before new work                 -> fail, reset-gpu
  2 NODE_REBOOT      the OS may be inconsistent: reboot the node                   -> fail, reboot
  3 DRAIN_P2P        stop peer-to-peer traffic to this GPU                         -> fail, drain
  4 DRAIN_AND_RESET  drain peer-to-peer traffic, then reset the GPU                -> fail, drain
  5 RECOVER_IMEX_DOMAIN  recover the IMEX (multi-node NVLink) domain               -> fail, drain
  6 BUS_RESET        reset the GPU's PCIe bus                                      -> fail, reset-gpu
  7 SYSTEM_REBOOT    reboot the system                                             -> fail, reboot

Drivers that predate the field report it as not supported: that is
a pass saying so, with the value recorded as None (never read as "none needed").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..sdk import Action, Context, Key, Level, Need, Result, Rule, Status, apply_unreadable, define, each_gpu, evaluate

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import JudgedGpu

ID = "recovery-action"

READS = {"recovery_action": Status.ERROR}  # the one field the rule needs

# value -> (name, gpucheck action, what to tell the operator)
ACTIONS: dict[int, tuple[str, Action, str]] = {
    1: ("gpu_reset", Action.RESET_GPU, "the driver asks for a GPU reset"),
    2: ("node_reboot", Action.REBOOT, "the driver asks for a node reboot"),
    3: ("drain_p2p", Action.DRAIN, "the driver asks to drain peer-to-peer traffic"),
    4: ("drain_and_reset", Action.DRAIN, "the driver asks to drain peer-to-peer traffic, then reset the GPU"),
    5: ("recover_imex_domain", Action.DRAIN, "the driver asks to recover the IMEX domain"),
    6: ("bus_reset", Action.RESET_GPU, "the driver asks for a PCIe bus reset of the GPU"),
    7: ("system_reboot", Action.REBOOT, "the driver asks for a system reboot"),
}


RULE = Rule("recovery_action", "!=", 0, Status.FAIL, Key("driver_action"),
            "{driver_asks} (NVML recovery action {recovery_action_name})")


def _gpu(g: "JudgedGpu", p: dict[str, object]) -> Result:  # (no parameters)
    idx = g.get("index")
    value = g.get("recovery_action")
    if value is None:
        name, action, text = None, Action.NONE, ""
    elif int(value) == 0:
        name, action, text = "none", Action.NONE, ""
    else:
        name, action, text = ACTIONS.get(int(value), (f"unknown_{value}", Action.INVESTIGATE,
                                                      f"the driver reports recovery action {value}, unknown to gpucheck"))
    metrics = {"uuid": g.get("uuid"), "recovery_action": value, "recovery_action_name": name}
    ok = (f"GPU {idx}: recovery action not supported by this driver" if value is None
          else f"GPU {idx}: no recovery action pending")
    r = evaluate(ID, [RULE], metrics, limits={"driver_action": action}, facts={"driver_asks": text},
                 ok_summary=ok, prefix=f"GPU {idx}: ", gpu=idx)
    return apply_unreadable(r, g, READS)


@define(
    ID,
    title="Driver-reported GPU recovery action (NVML field 230)",
    level=Level.QUICK,
    needs=(Need.NVML,),
    budget_s=5.0,
    detects="GPUs the driver itself wants reset, drained or the node rebooted after an error",
    defaults={},
)
def recovery_action(ctx: Context) -> list[Result]:
    return each_gpu(ID, ctx, {}, _gpu)


CHECKS = [recovery_action]
