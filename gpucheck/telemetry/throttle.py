"""Clock-event ("throttle") reason bits of nvmlDeviceGetCurrentClocksEventReasons.

Bit values are those of nvml.h (nvmlClocksEventReason* / the older nvmlClocksThrottleReason*),
identical in DCGM's DCGM_CLOCKS_EVENT_REASON_* masks. Names are gpucheck's, stable, and used in
snapshots and verdicts.
"""

from __future__ import annotations

GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8  # clocks cut by 2x or more: temperature, external power brake, power fast-trigger
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80  # external power brake asserted (e.g. by the system power supply)
DISPLAY_CLOCK_SETTING = 0x100
BOARD_LIMIT = 0x200
RELIABILITY = 0x400

REASONS: dict[int, str] = {
    GPU_IDLE: "gpu_idle",
    APPLICATIONS_CLOCKS_SETTING: "applications_clocks_setting",
    SW_POWER_CAP: "sw_power_cap",
    HW_SLOWDOWN: "hw_slowdown",
    SYNC_BOOST: "sync_boost",
    SW_THERMAL_SLOWDOWN: "sw_thermal_slowdown",
    HW_THERMAL_SLOWDOWN: "hw_thermal_slowdown",
    HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake_slowdown",
    DISPLAY_CLOCK_SETTING: "display_clock_setting",
    BOARD_LIMIT: "board_limit",
    RELIABILITY: "reliability",
}
_BY_NAME = {v: k for k, v in REASONS.items()}


def reason_names(mask: int) -> list[str]:
    """Names of the set bits, lowest bit first; unknown bits as "unknown_0x...". """
    names = []
    bit = 1
    m = int(mask)
    while m:
        if m & 1:
            names.append(REASONS.get(bit, f"unknown_{bit:#x}"))
        m >>= 1
        bit <<= 1
    return names


def bit(name: str) -> int:
    return _BY_NAME[name]


def is_set(mask: int | None, name: str) -> bool | None:
    """Whether reason `name` is set in `mask`; None when the mask was not read."""
    if mask is None:
        return None
    return bool(int(mask) & _BY_NAME[name])
