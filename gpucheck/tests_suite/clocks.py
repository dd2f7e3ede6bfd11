"""clocks: clock-event (throttle) reasons and thermal headroom at the time of the snapshot.

HW slowdown, HW thermal slowdown and HW power brake cut the clocks by half or more: a GPU under
them is not fit for a job (bad cooling, an asserted external power brake, power fast-trigger). SW
thermal slowdown means the GPU is already hot enough for the driver to pull clocks back: warn. A
GPU whose temperature is within `thermal_margin_c` of its slowdown threshold before a job has
even started is heading for the same: warn. One snapshot is one instant (NVML documents that HW
slowdown may also be reported briefly around P-state changes); the burn-in checks sample under
load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from ..platform.telemetry.throttle import is_set, reason_names
from ..sdk import (Context, Key, Level, Limit, Need, Result, Rule, Status, apply_unreadable, define, each_gpu, evaluate,
                   get)

ID = "clocks"

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import JudgedGpu


class ClocksParams(TypedDict):
    """clocks' parameters (DEFAULTS, merged with the config's [checks.clocks])."""

    thermal_margin_c: float


DEFAULTS: ClocksParams = {
    "thermal_margin_c": 10,  # warn when the GPU is less than this far below its slowdown temperature
}
LIMITS = {"thermal_margin_c": Limit("real", 0)}  # degrees: a fraction of one is a valid margin

# The snapshot fields a GPU's result depends on: the clock-event reasons feed the fail rules
# (error when unreadable); temperatures feed the advisory headroom rule, and clocks and power are
# reported (warn).
READS = {"clocks.throttle_reasons": Status.ERROR, "clocks": Status.WARN, "temperature": Status.WARN,
         "power": Status.WARN}


def _flag(mask: int | None, name: str) -> int | None:
    v = is_set(mask, name)
    return None if v is None else int(v)


RULES = (
    Rule("hw_slowdown", ">", 0, Status.FAIL, cause="HW slowdown active (clocks cut by half or more) ({detail})"),
    Rule("hw_thermal_slowdown", ">", 0, Status.FAIL, cause="HW thermal slowdown active ({detail})"),
    Rule("hw_power_brake_slowdown", ">", 0, Status.FAIL,
         cause="HW power brake active (external power brake asserted) ({detail})"),
    Rule("sw_thermal_slowdown", ">", 0, Status.WARN, cause="SW thermal slowdown active ({detail})"),
    Rule("thermal_headroom_c", "<", Key("thermal_margin_c"), Status.WARN, unit="C",
         cause="temperature close to the slowdown threshold ({temperature_c} C, slowdown at "
               "{slowdown_temperature_c} C) ({detail})"),
)  # every action: investigate (cooling, an external power brake)


def _gpu(g: "JudgedGpu", p: ClocksParams) -> Result:
    idx = g.get("index")
    mask = get(g, "clocks", "throttle_reasons")
    temp = get(g, "temperature", "gpu_c")
    slowdown = get(g, "temperature", "slowdown_c")
    headroom = None if temp is None or slowdown is None else slowdown - temp
    metrics: dict[str, float | str | None] = {
        "uuid": g.get("uuid"),
        "throttle_reasons": mask,
        "throttle_reason_names": None if mask is None else ",".join(reason_names(mask)) or "none",
        "hw_slowdown": _flag(mask, "hw_slowdown"),
        "hw_thermal_slowdown": _flag(mask, "hw_thermal_slowdown"),
        "hw_power_brake_slowdown": _flag(mask, "hw_power_brake_slowdown"),
        "sw_thermal_slowdown": _flag(mask, "sw_thermal_slowdown"),
        "temperature_c": temp,
        "slowdown_temperature_c": slowdown,
        "thermal_headroom_c": headroom,
        "sm_clock_mhz": get(g, "clocks", "sm_mhz"),
        "sm_max_clock_mhz": get(g, "clocks", "sm_max_mhz"),
        "power_w": get(g, "power", "usage_w"),
    }
    r = evaluate(ID, RULES, metrics, limits=p, gpu=idx,
                 units={"temperature_c": "C", "slowdown_temperature_c": "C", "thermal_headroom_c": "C",
                        "sm_clock_mhz": "MHz", "sm_max_clock_mhz": "MHz", "power_w": "W"},
                 ok_summary=(f"GPU {idx}: no HW slowdown; {temp} C, {headroom} C below slowdown" if headroom is not None
                             else f"GPU {idx}: no HW slowdown (temperature thresholds not reported)"),
                 skip=(f"GPU {idx}: neither clock-event reasons nor temperature thresholds are supported on this "
                       "GPU/driver"))
    if mask is None and r.status != Status.SKIP:
        r.evidence.append("clock-event reasons not supported on this GPU/driver: throttling not judged")
    return apply_unreadable(r, g, READS)


@define(
    ID,
    title="Clock-event reasons (HW slowdown, thermal, power brake) and thermal headroom",
    level=Level.QUICK,
    needs=(Need.NVML,),
    budget_s=5.0,
    detects="GPUs held in HW slowdown / power brake, overheating before a job starts",
    defaults=DEFAULTS,
    limits=LIMITS,
)
def clocks(ctx: Context) -> list[Result]:
    return each_gpu(ID, ctx, DEFAULTS, _gpu)


CHECKS = [clocks]
