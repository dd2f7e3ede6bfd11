"""Clock-event ("throttle") reason bits of nvmlDeviceGetCurrentClocksEventReasons.

The bits are pynvml's own constants (nvmlClocksEventReason*, or the older
nvmlClocksThrottleReason* names: gpucheck.platform.telemetry.enums), identical in DCGM's
DCGM_CLOCKS_EVENT_REASON_* masks. Names are gpucheck's, stable, and used in snapshots and verdicts:
gpu_idle, applications_clocks_setting, sw_power_cap, hw_slowdown (clocks cut by 2x or more:
temperature, external power brake, power fast-trigger), sync_boost, sw_thermal_slowdown,
hw_thermal_slowdown, hw_power_brake_slowdown (external power brake asserted, e.g. by the system
power supply), display_clock_setting, board_limit, reliability.
"""

from __future__ import annotations

from .enums import throttle_bits


def reasons() -> dict[int, str]:
    """Bit -> name."""
    return {bit_: name for name, bit_ in throttle_bits().items()}


def reason_names(mask: int) -> list[str]:
    """Names of the set bits, lowest bit first; unknown bits as "unknown_0x...". """
    known = reasons()
    names = []
    bit_ = 1
    m = int(mask)
    while m:
        if m & 1:
            names.append(known.get(bit_, f"unknown_{bit_:#x}"))
        m >>= 1
        bit_ <<= 1
    return names


def bit(name: str) -> int:
    """The bit of reason `name` (KeyError for a name pynvml does not define)."""
    return throttle_bits()[name]


def is_set(mask: int | None, name: str) -> bool | None:
    """Whether reason `name` is set in `mask`; None when the mask was not read."""
    if mask is None:
        return None
    return bool(int(mask) & bit(name))
