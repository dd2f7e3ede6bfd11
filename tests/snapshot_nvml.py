"""An NvmlSession stand-in that answers the snapshot reader's NVML calls from a recorded GPU entry.

`read_gpu(SnapshotNvml(entry), index)` gives the entry back (the tests check that first), so
that making one call fail (`fail=`) shows exactly what the reader records for that failed read,
through the reader's own code. A value the entry has as None is answered NOT_SUPPORTED; a link
past the last is answered INVALID_ARGUMENT (how NVML ends the link probe).
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

from gpucheck.telemetry import nvml as N
from gpucheck.telemetry.snapshot import NVLINK_COUNTERS, NVLINK_STATES

Call = tuple[Any, ...]  # (NVML function name, its arguments after the handle); fields: ("field", id)

_ECC = {(1, 0): "volatile_uncorrected", (0, 0): "volatile_corrected", (1, 1): "aggregate_uncorrected",
        (0, 1): "aggregate_corrected"}
_SRAM = {0: "sram_volatile_uncorrected", 1: "sram_aggregate_uncorrected"}
_THRESHOLDS = {0: "shutdown_c", 1: "slowdown_c", 3: "gpu_max_c"}
_STATE_CODE = {v: k for k, v in NVLINK_STATES.items()}
_COUNTER_NAME = {v: k for k, v in NVLINK_COUNTERS.items()}
_PCIE = {
    "nvmlDeviceGetCurrPcieLinkGeneration": "link_gen",
    "nvmlDeviceGetMaxPcieLinkGeneration": "link_gen_max",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": "link_gen_gpu_max",
    "nvmlDeviceGetCurrPcieLinkWidth": "link_width",
    "nvmlDeviceGetMaxPcieLinkWidth": "link_width_max",
    "nvmlDeviceGetPcieReplayCounter": "replay_counter",
}


class SramStatus(ctypes.Structure):
    _fields_ = [("bThresholdExceeded", ctypes.c_uint), ("volatileUncParity", ctypes.c_ulonglong),
                ("volatileUncSecDed", ctypes.c_ulonglong), ("aggregateUncParity", ctypes.c_ulonglong),
                ("aggregateUncSecDed", ctypes.c_ulonglong)]


NOT_SUPPORTED = N.NvmlFailure(N.NOT_SUPPORTED, "not supported", 3)
INVALID_ARGUMENT = N.NvmlFailure(N.OTHER, "invalid argument", N.NVML_ERROR_INVALID_ARGUMENT)
INJECTED = N.NvmlFailure(N.OTHER, "injected failure (NVML_ERROR_UNKNOWN)", 999)


class SnapshotNvml:
    def __init__(self, gpu: dict[str, Any], fail: Call | None = None):
        self.g = gpu
        self.fail = fail
        self.calls: list[Call] = []

    # -- the NvmlSession surface the reader uses -------------------------------------------------
    def handle(self, index: int) -> int:
        return index

    def constant(self, name: str, default: Any) -> Any:
        return SramStatus if name == "c_nvmlEccSramErrorStatus_v1_t" else default

    def read(self, name: str, *args: Any) -> tuple[Any, N.NvmlFailure | None]:
        rest = tuple(a for a in args[1:] if isinstance(a, int))
        call = (name, *rest)
        self.calls.append(call)
        if call == self.fail:
            return None, INJECTED
        try:
            value = self._answer(name, rest, args[1:])
        except IndexError:
            return None, INVALID_ARGUMENT
        return (None, NOT_SUPPORTED) if value is None else (value, None)

    def field_values(self, handle: Any, field_ids: list[int]) -> list[tuple[Any, N.NvmlFailure | None]]:
        out = []
        for fid in field_ids:
            call = ("field", fid)
            self.calls.append(call)
            value = (len(self.g["nvlink"]["links"]) or None) if fid == 91 else self.g.get("recovery_action")
            if call == self.fail:
                out.append((None, INJECTED))
            else:
                out.append((None, NOT_SUPPORTED) if value is None else (value, None))
        return out

    # -- answers ---------------------------------------------------------------------------------
    def _answer(self, name: str, rest: tuple[int, ...], raw: tuple[Any, ...]) -> Any:
        g = self.g
        simple = {
            "nvmlDeviceGetUUID": g["uuid"], "nvmlDeviceGetName": g["name"], "nvmlDeviceGetSerial": g["serial"],
            "nvmlDeviceGetArchitecture": g["architecture_id"],
            "nvmlDeviceGetPersistenceMode": _int(g["persistence_mode"]),
            "nvmlDeviceGetEccMode": _pair(g["ecc_mode"]), "nvmlDeviceGetMigMode": _pair(g["mig_mode"]),
            "nvmlDeviceGetRemappedRows": _remapped(g["remapped_rows"]),
            "nvmlDeviceGetRetiredPagesPendingStatus": _int(g["retired_pages"]["pending"]),
            "nvmlDeviceGetClockInfo": g["clocks"]["sm_mhz"], "nvmlDeviceGetMaxClockInfo": g["clocks"]["sm_max_mhz"],
            "nvmlDeviceGetCurrentClocksEventReasons": g["clocks"]["throttle_reasons"],
            "nvmlDeviceGetCurrentClocksThrottleReasons": g["clocks"]["throttle_reasons"],
            "nvmlDeviceGetPowerUsage": _milli(g["power"]["usage_w"]),
            "nvmlDeviceGetEnforcedPowerLimit": _milli(g["power"]["limit_w"]),
        }
        if name in simple:
            return simple[name]
        if name in _PCIE:
            return g["pcie"][_PCIE[name]]
        if name == "nvmlDeviceGetPciInfo":
            return None if g["pci_bus_id"] is None else SimpleNamespace(
                busId=g["pci_bus_id"].encode(), pciDeviceId=(int(g["pci_device_id"], 16) << 16) | 0x10DE)
        if name == "nvmlDeviceGetTotalEccErrors":
            return g["ecc_errors"][_ECC[rest]]
        if name == "nvmlDeviceGetMemoryErrorCounter":
            return g["ecc_errors"][_SRAM[rest[1]]]
        if name == "nvmlDeviceGetSramEccErrorStatus":
            return self._sram_status(raw[0])
        if name == "nvmlDeviceGetRetiredPages":
            n = g["retired_pages"]["single_bit" if rest[0] == 0 else "double_bit"]
            return None if n is None else [0x1000 * (i + 1) for i in range(n)]
        if name == "nvmlDeviceGetTemperature":
            return g["temperature"]["gpu_c"]
        if name == "nvmlDeviceGetTemperatureThreshold":
            return g["temperature"][_THRESHOLDS[rest[0]]]
        if name == "nvmlDeviceGetNvLinkState":
            state = g["nvlink"]["links"][rest[0]]["state"]
            return None if state is None else _STATE_CODE[state]
        if name == "nvmlDeviceGetNvLinkErrorCounter":
            return g["nvlink"]["links"][rest[0]][_COUNTER_NAME[rest[1]]]
        raise AssertionError(f"the reader called {name}{rest}, unknown to SnapshotNvml: teach it")

    def _sram_status(self, ref: Any) -> Any:
        e = self.g["ecc_errors"]
        if e["sram_threshold_exceeded"] is None:
            return None
        st = ref._obj
        st.bThresholdExceeded = int(e["sram_threshold_exceeded"])
        st.volatileUncSecDed = e["sram_volatile_uncorrected"] or 0
        st.aggregateUncSecDed = e["sram_aggregate_uncorrected"] or 0
        return 0


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _pair(mode: dict[str, Any]) -> tuple[int, int] | None:
    return None if mode["current"] is None else (int(mode["current"]), int(mode["pending"]))


def _remapped(rr: dict[str, Any]) -> tuple[int, int, int, int] | None:
    if rr["correctable"] is None:
        return None
    return rr["correctable"], rr["uncorrectable"], int(rr["pending"]), int(rr["failure"])


def _milli(w: float | None) -> int | None:
    return None if w is None else round(w * 1000)
