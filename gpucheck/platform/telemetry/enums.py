"""NVML's enums and codes, read from pynvml's own constants: no NVML number is copied by hand.

Each table pairs gpucheck's stable name (used in snapshots and verdicts) with the name of the
pynvml constant that holds NVML's value. `resolve(module, table)` reads the values from a pynvml
module (the real one, or the replay backend, which forwards its constants to the real one). A
constant the installed pynvml does not have (an older nvidia-ml-py) is left out: the call that
needs it reads as not supported by this pynvml, a value it would name reads as "unknown".

`pynvml_module()` imports pynvml on first use (it loads no NVML library: that happens at
nvmlInit), so importing gpucheck.platform.telemetry stays free of it.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

# nvmlDeviceArchitecture_t
ARCHITECTURES: tuple[tuple[str, str], ...] = (
    ("kepler", "NVML_DEVICE_ARCH_KEPLER"),
    ("maxwell", "NVML_DEVICE_ARCH_MAXWELL"),
    ("pascal", "NVML_DEVICE_ARCH_PASCAL"),
    ("volta", "NVML_DEVICE_ARCH_VOLTA"),
    ("turing", "NVML_DEVICE_ARCH_TURING"),
    ("ampere", "NVML_DEVICE_ARCH_AMPERE"),
    ("ada", "NVML_DEVICE_ARCH_ADA"),
    ("hopper", "NVML_DEVICE_ARCH_HOPPER"),
    ("blackwell", "NVML_DEVICE_ARCH_BLACKWELL"),
    ("rubin", "NVML_DEVICE_ARCH_RUBIN"),
)

# nvmlDeviceGpuRecoveryAction_t: the value of field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
RECOVERY_ACTIONS: tuple[tuple[str, str], ...] = (
    ("none", "NVML_GPU_RECOVERY_ACTION_NONE"),
    ("gpu_reset", "NVML_GPU_RECOVERY_ACTION_GPU_RESET"),
    ("node_reboot", "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT"),
    ("drain_p2p", "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P"),
    ("drain_and_reset", "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET"),
    ("recover_imex_domain", "NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN"),
    ("bus_reset", "NVML_GPU_RECOVERY_ACTION_BUS_RESET"),
    ("system_reboot", "NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT"),
)

# nvmlNvLinkState values (nvmlDeviceGetNvLinkState)
NVLINK_STATES: tuple[tuple[str, str], ...] = (
    ("inactive", "NVML_NVLINK_STATE_INACTIVE"),
    ("active", "NVML_NVLINK_STATE_ACTIVE"),
    ("sleep", "NVML_NVLINK_STATE_SLEEP"),
    ("active_traffic_disabled", "NVML_NVLINK_STATE_ACTIVE_TRAFFIC_DISABLED"),
)
NVLINK_STATE_NAMES: tuple[str, ...] = tuple(name for name, _ in NVLINK_STATES)

# nvmlNvLinkErrorCounter_t, by the key of a link entry in a snapshot
NVLINK_COUNTERS: tuple[tuple[str, str], ...] = (
    ("replay_errors", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery_errors", "NVML_NVLINK_ERROR_DL_RECOVERY"),
    ("crc_flit_errors", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("crc_data_errors", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
)
NVLINK_COUNTER_KEYS: tuple[str, ...] = tuple(key for key, _ in NVLINK_COUNTERS)

# Clock-event ("throttle") reason bits: the R535+ nvmlClocksEventReason* name first, then the
# older nvmlClocksThrottleReason* one (the bits are the same, and DCGM's masks use them too).
THROTTLE_REASONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpu_idle", ("nvmlClocksEventReasonGpuIdle", "nvmlClocksThrottleReasonGpuIdle")),
    ("applications_clocks_setting", ("nvmlClocksEventReasonApplicationsClocksSetting",
                                     "nvmlClocksThrottleReasonApplicationsClocksSetting")),
    ("sw_power_cap", ("nvmlClocksEventReasonSwPowerCap", "nvmlClocksThrottleReasonSwPowerCap")),
    ("hw_slowdown", ("nvmlClocksEventReasonHwSlowdown", "nvmlClocksThrottleReasonHwSlowdown")),
    ("sync_boost", ("nvmlClocksEventReasonSyncBoost", "nvmlClocksThrottleReasonSyncBoost")),
    ("sw_thermal_slowdown", ("nvmlClocksEventReasonSwThermalSlowdown", "nvmlClocksThrottleReasonSwThermalSlowdown")),
    ("hw_thermal_slowdown", ("nvmlClocksEventReasonHwThermalSlowdown", "nvmlClocksThrottleReasonHwThermalSlowdown")),
    ("hw_power_brake_slowdown", ("nvmlClocksEventReasonHwPowerBrakeSlowdown",
                                 "nvmlClocksThrottleReasonHwPowerBrakeSlowdown")),
    ("display_clock_setting", ("nvmlClocksEventReasonDisplayClockSetting",
                               "nvmlClocksThrottleReasonDisplayClockSetting")),
    ("board_limit", ("nvmlClocksEventReasonBoardLimit", "nvmlClocksThrottleReasonBoardLimit")),
    ("reliability", ("nvmlClocksEventReasonReliability", "nvmlClocksThrottleReasonReliability")),
)


def pynvml_module() -> ModuleType | None:
    """The pynvml module, or None when it cannot be imported."""
    try:
        import pynvml  # noqa: PLC0415 - lazy: gpucheck starts without it
    except ImportError:
        return None
    return pynvml


def constant(module: Any, name: str) -> int | None:
    """The integer value of pynvml constant `name` in `module`, or None when it has none."""
    value = getattr(module, name, None) if module is not None else None
    value = getattr(value, "value", value)  # NVML_VALUE_NOT_AVAILABLE_* are ctypes values
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def resolve(module: Any, table: tuple[tuple[str, str], ...]) -> dict[str, int]:
    """gpucheck name -> NVML value for every constant of `table` that `module` has."""
    out: dict[str, int] = {}
    for name, const in table:
        value = constant(module, const)
        if value is not None:
            out[name] = value
    return out


def names_by_value(module: Any, table: tuple[tuple[str, str], ...]) -> dict[int, str]:
    """NVML value -> gpucheck name (the first name of a value wins)."""
    out: dict[int, str] = {}
    for name, value in resolve(module, table).items():
        out.setdefault(value, name)
    return out


@functools.cache
def throttle_bits() -> dict[str, int]:
    """gpucheck reason name -> its bit, from pynvml's constants (empty without pynvml)."""
    mod = pynvml_module()
    out: dict[str, int] = {}
    for name, consts in THROTTLE_REASONS:
        for const in consts:
            value = constant(mod, const)
            if value:
                out[name] = value
                break
    return out
