"""Replay: a recorded snapshot answers the pynvml calls the live reader makes.

`ReplayNvml(doc)` stands in for the pynvml module: nvmlInit, nvmlDeviceGetHandleByIndex,
nvmlDeviceGetUUID, nvmlDeviceGetTotalEccErrors(handle, type, counter), nvmlDeviceGetFieldValues,
nvmlDeviceGetNvLinkState(handle, link), ... are answered from the recording in the shapes pynvml
returns (ints, mW, ctypes structs, field-value structs), and NVML's constants and error classes are
pynvml's own. A session over it (`replay_session(doc)`) is read by exactly the code that reads live
NVML (gpucheck.platform.telemetry.reader.read_gpu, NvmlSession.sample, read_gpu_processes), so every
recorded snapshot exercises the reader's parsing, error mapping and lost-GPU handling.

How a recording answers a call:
- a value: the value, as pynvml returns it (a count as an int, watts as milliwatts, ...);
- None with the field in the entry's `errors` map: that failure, raised as pynvml's NVMLError of
  the kind's return code (no_permission -> NO_PERMISSION, other -> UNKNOWN, ...);
- None without an `errors` entry: NOT_SUPPORTED;
- a field (or group) the recording does not hold at all: NotInCapture, kind "not_in_capture": a
  failed read of a distinct kind, judged as unreadable (never a pass);
- a value no NVML call returns (text for a count, NaN, a negative page count, a group that is not
  an object): a failure of kind "other" (the reader never sees a value it would misread);
- a GPU recorded lost or reset-required: the recorded fields, then its failure at the first field
  the recording does not hold (at the handle when it holds them all); a GPU recorded in state
  "error": its failure at the handle;
- NVML itself not working (nvml.ok false): its failure at nvmlInit. A recorded message that names
  NVML's return code ("... (NVML return code 9)") is raised with that code; one that names none is
  raised as recorded (ReplayedFailure), as is a failure of a kind that has no return code
  (timeout, internal_error: gpucheck.platform.telemetry.nvml).
- any other NVML call (process lists, event sets): NotInCapture.

`replay_snapshot(doc)` is the snapshot the checks judge: the recording's own facts (host, time,
source, sysfs's PCI list, the kernel log, and any key the reader does not read) with the NVML part
read back through the reader.
"""

from __future__ import annotations

import copy
import functools
import math
import re
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, Callable

from ..fabric import nvmlfabric
from ..net.record import replay_net
from . import enums
from . import nvml as N
from .model import Snapshot
from .reader import empty_gpu
from .snapshot import read_nvml

# failure kind -> the pynvml constant of the return code a replay raises for it
KIND_CODES: dict[str, str] = {
    N.NOT_SUPPORTED: "NVML_ERROR_NOT_SUPPORTED",
    N.GPU_LOST: "NVML_ERROR_GPU_IS_LOST",
    N.RESET_REQUIRED: "NVML_ERROR_RESET_REQUIRED",
    N.NO_PERMISSION: "NVML_ERROR_NO_PERMISSION",
    N.DRIVER_NOT_LOADED: "NVML_ERROR_DRIVER_NOT_LOADED",
    N.LIBRARY_NOT_FOUND: "NVML_ERROR_LIBRARY_NOT_FOUND",
    N.OTHER: "NVML_ERROR_UNKNOWN",
}
_CODE_SUFFIX = re.compile(r"^(.*?)\s*\(NVML return code (\d+)\)$", re.S)
_MISSING = object()  # a field the recording does not hold
_LINK_KEY = re.compile(r"^nvlink\.links\[(\d+)\]")
_GPU_STATES = {"lost": N.GPU_LOST, "reset_required": N.RESET_REQUIRED}

# reader call -> the entry's field (no enum arguments)
_PLAIN: dict[str, str] = {
    "nvmlDeviceGetUUID": "uuid",
    "nvmlDeviceGetName": "name",
    "nvmlDeviceGetSerial": "serial",
    "nvmlDeviceGetArchitecture": "architecture_id",
    "nvmlDeviceGetPersistenceMode": "persistence_mode",
    "nvmlDeviceGetRetiredPagesPendingStatus": "retired_pages.pending",
    "nvmlDeviceGetCurrentClocksEventReasons": "clocks.throttle_reasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons": "clocks.throttle_reasons",
    "nvmlDeviceGetPowerUsage": "power.usage_w",
    "nvmlDeviceGetEnforcedPowerLimit": "power.limit_w",
    "nvmlDeviceGetCurrPcieLinkGeneration": "pcie.link_gen",
    "nvmlDeviceGetMaxPcieLinkGeneration": "pcie.link_gen_max",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": "pcie.link_gen_gpu_max",
    "nvmlDeviceGetCurrPcieLinkWidth": "pcie.link_width",
    "nvmlDeviceGetMaxPcieLinkWidth": "pcie.link_width_max",
    "nvmlDeviceGetPcieReplayCounter": "pcie.replay_counter",
}
_TEXT = ("uuid", "name", "serial")
_FLAGS = ("persistence_mode", "retired_pages.pending")
_MILLIWATTS = ("power.usage_w", "power.limit_w")


class Invalid(Exception):
    """A recorded value that no NVML call returns."""


class NVMLError_Replayed(Exception):  # noqa: N801 - classified like pynvml's NVMLError_* classes
    """A recorded NVML failure: its return code (`value`) and NVML's text, as pynvml raises it."""

    def __init__(self, value: int, text: str | None = None):
        super().__init__(value)
        self.value = value
        self.text = text

    def __str__(self) -> str:
        if self.text:
            return self.text
        mod = enums.pynvml_module()
        known = getattr(getattr(mod, "NVMLError", None), "_errcode_to_string", {})
        return str(known.get(self.value, f"NVML Error with code {self.value}"))


def recorded_failure(kind: str, message: str | None, what: str) -> Exception:
    """The exception a replay raises for a recorded failure (see the module)."""
    if kind in (N.NOT_IN_CAPTURE, N.NOT_IN_FORMAT):
        return N.NotInCapture(message or f"{what}: not in this capture")
    if kind in N.NO_CODE_KINDS and not message:  # no NVML return code: the kind itself
        return N.ReplayedFailure(kind, f"{what}: {kind}")
    if message:
        m = _CODE_SUFFIX.match(message)
        if m and N.kind_of_code(int(m.group(2))) == kind:
            return NVMLError_Replayed(int(m.group(2)), m.group(1))
        return N.ReplayedFailure(kind, message)
    value = N.code(KIND_CODES.get(kind, KIND_CODES[N.OTHER]))
    return NVMLError_Replayed(value if value is not None else -1)


class ReplayHandle(int):
    """The device handle of recorded GPU `index` (an int: the index itself)."""

    @property
    def index(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"ReplayHandle({int(self)})"


class ReplayNvml:
    """A pynvml stand-in that answers from recorded snapshot `doc` (see the module). Every call
    goes through `answer(name, *args)`."""

    def __init__(self, doc: Snapshot | Mapping[str, Any]):
        self.doc: Mapping[str, Any] = doc
        self.gpus: dict[int, Mapping[str, Any]] = {int(g["index"]): g for g in doc.get("gpus") or []}
        self._pynvml = enums.pynvml_module()
        self._reads: dict[int, int] = {}  # calls answered per GPU (a lost GPU's failure comes after its last value)
        self._loss_at: dict[int, int] = {}
        self._link_cache: dict[int, Any] = {}
        self._counter_keys = {v: k for k, v in enums.resolve(self._pynvml, enums.NVLINK_COUNTERS).items()}
        self._state_codes = enums.resolve(self._pynvml, enums.NVLINK_STATES)
        self._answers: dict[str, Callable[..., Any]] = {
            "nvmlInit": self._init, "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlSystemGetDriverVersion": lambda: self._system("driver_version"),
            "nvmlSystemGetNVMLVersion": lambda: self._system("nvml_version"),
            "nvmlSystemGetCudaDriverVersion": self._cuda_version,
            "nvmlDeviceGetHandleByIndex": self._handle,
            "nvmlDeviceGetPciInfo": self._pci, "nvmlDeviceGetEccMode": lambda h: self._pair(h, "ecc_mode"),
            "nvmlDeviceGetMigMode": lambda h: self._pair(h, "mig_mode"),
            "nvmlDeviceGetTotalEccErrors": self._ecc, "nvmlDeviceGetMemoryErrorCounter": self._ecc_location,
            "nvmlDeviceGetSramEccErrorStatus": self._sram_status, "nvmlDeviceGetRemappedRows": self._remapped,
            "nvmlDeviceGetRetiredPages": self._retired, "nvmlDeviceGetTemperature": self._temperature,
            "nvmlDeviceGetTemperatureThreshold": self._threshold, "nvmlDeviceGetClockInfo": self._clock,
            "nvmlDeviceGetMaxClockInfo": self._max_clock, "nvmlDeviceGetFieldValues": self._field_values,
            "nvmlDeviceGetNvLinkState": self._link_state, "nvmlDeviceGetNvLinkErrorCounter": self._link_counter,
            "nvmlDeviceGetGpuFabricInfoV": self._fabric, "nvmlDeviceGetGpuFabricInfo": self._fabric,
        }

    # -- the module surface ---------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        real = getattr(self._pynvml, name, None)
        if real is not None and (not callable(real) or isinstance(real, type)):
            return real  # constants, ctypes structs, error classes: pynvml's own
        if name.startswith("nvml"):
            return functools.partial(self.answer, name)
        raise AttributeError(name)

    def answer(self, name: str, *args: Any) -> Any:
        """The recording's answer to pynvml.<name>(*args), or the failure it raises."""
        if args and isinstance(args[0], int) and name.startswith("nvmlDevice") and name != "nvmlDeviceGetHandleByIndex":
            self._step(int(args[0]))
        if name in _PLAIN:
            return self._plain(args[0], _PLAIN[name])
        fn = self._answers.get(name)
        if fn is None:
            raise N.NotInCapture(f"{name}: not in this capture")
        return fn(*args)

    # -- NVML and the system ----------------------------------------------------------------------
    def _init(self) -> None:
        nv = self.doc.get("nvml")
        if not isinstance(nv, Mapping):
            raise N.NotInCapture("nvml: not in this capture")
        if not nv.get("ok"):
            err = nv.get("error") or {}
            raise recorded_failure(str(err.get("kind", N.OTHER)), err.get("message"), "NVML")

    def _system(self, key: str) -> str:
        value = self.doc.get(key, _MISSING)
        if value is _MISSING:
            raise N.NotInCapture(f"{key}: not in this capture")
        if value is None:
            raise recorded_failure(N.NOT_SUPPORTED, None, key)
        if not isinstance(value, str):
            raise recorded_failure(N.OTHER, None, key)
        return value

    def _cuda_version(self) -> int:
        m = re.fullmatch(r"(\d+)\.(\d{1,2})", self._system("cuda_driver_version"))
        if m is None:
            raise recorded_failure(N.OTHER, None, "cuda_driver_version")
        return int(m.group(1)) * 1000 + int(m.group(2)) * 10

    # -- a GPU ----------------------------------------------------------------------------------------
    def _handle(self, index: int) -> ReplayHandle:
        g = self.gpus.get(int(index))
        if g is None:
            raise _invalid_argument()
        state = g.get("state", "ok")
        if state == "error" or (state in _GPU_STATES and self._loss_point(int(index)) is None):
            raise self._gpu_failure(int(index))
        self._reads[int(index)] = 0
        return ReplayHandle(int(index))

    def _gpu_failure(self, index: int) -> Exception:
        g = self.gpus[index]
        recorded = g.get("error")
        err: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
        kind = err.get("kind", _GPU_STATES.get(g.get("state", "ok"), N.OTHER))
        message = err.get("message")
        return recorded_failure(str(kind), message if isinstance(message, str) else None, f"GPU {index}")

    def _loss_point(self, index: int) -> int | None:
        """For a GPU recorded lost or reset-required: how many of the reader's calls on it are
        answered before its failure (the reader read it up to its last recorded value), or None
        when the recording holds an answer to every call (then it fails at the handle). Found by
        reading the entry as if the GPU were fine, with the reader itself."""
        if index not in self._loss_at:
            probe = _Probe(self.doc, index)
            from .reader import read_gpu  # noqa: PLC0415 - the reader is what decides the order

            with N.NvmlSession(N.Library(lambda: probe)) as s:
                read_gpu(s, index)
            answered = [i for i, ok in enumerate(probe.answered, 1) if ok]
            last = answered[-1] if answered else 0
            self._loss_at[index] = -1 if last == len(probe.answered) else last
        at = self._loss_at[index]
        return None if at < 0 else at

    def _step(self, index: int) -> None:
        """Count a call on GPU `index`; past a lost GPU's loss point, raise its failure."""
        g = self.gpus.get(index)
        if g is None or g.get("state", "ok") not in _GPU_STATES:
            return
        self._reads[index] = self._reads.get(index, 0) + 1
        at = self._loss_point(index)
        if at is not None and self._reads[index] > at:
            raise self._gpu_failure(index)

    def _value(self, h: ReplayHandle, field: str) -> Any:
        """The recorded value of `field` (a path like "ecc_errors.volatile_uncorrected"), or the
        failure the recording holds for it."""
        g = self.gpus[int(h)]
        errors = _errors(g)
        value = _lookup(g, field)
        if value is _MISSING:
            value = self._derived(g, field)
        kind = _recorded_error(errors, field)
        if kind is not None:
            raise recorded_failure(kind, None, field)
        if value is _MISSING:
            raise N.NotInCapture(f"{field}: not in this capture")
        if value is None:
            raise recorded_failure(N.NOT_SUPPORTED, None, field)
        return value

    def _derived(self, g: Mapping[str, Any], field: str) -> Any:
        """A value the recording holds only by its name (a converted `nvidia-smi -q` may name the
        architecture, the recovery action or the clock-event reasons without NVML's number): the
        number NVML would have answered, or _MISSING."""
        if field == "clocks.throttle_reasons":
            names = _lookup(g, "clocks.throttle_reason_names")
            bits = enums.throttle_bits()
            if not isinstance(names, list) or not all(isinstance(n, str) and n in bits for n in names):
                return _MISSING
            mask = 0
            for n in names:
                mask |= bits[n]
            return mask
        named = {"architecture_id": ("architecture", enums.ARCHITECTURES),
                 "recovery_action": ("recovery_action_name", enums.RECOVERY_ACTIONS)}.get(field)
        if named is None:
            return _MISSING
        name = _lookup(g, named[0])
        return enums.resolve(self._pynvml, named[1]).get(name, _MISSING) if isinstance(name, str) else _MISSING

    def _plain(self, h: ReplayHandle, field: str) -> Any:
        value = self._value(h, field)
        try:
            if field in _TEXT:
                return _text(value)
            if field in _FLAGS:
                return int(_flag(value))
            if field in _MILLIWATTS:
                return _milliwatts(value)
            return _count(value)
        except Invalid:
            raise recorded_failure(N.OTHER, None, field) from None

    def _checked(self, field: str, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except Invalid:
            raise recorded_failure(N.OTHER, None, field) from None

    def _pci(self, h: ReplayHandle) -> Any:
        bus = self._checked("pci_bus_id", lambda: _text(self._value(h, "pci_bus_id")))
        dev = _lookup(self.gpus[int(h)], "pci_device_id")
        info = SimpleNamespace(busId=bus.encode())
        if isinstance(dev, str) and re.fullmatch(r"0x[0-9a-fA-F]{1,4}", dev):
            info.pciDeviceId = (int(dev, 16) << 16) | 0x10DE  # PCI vendor id of NVIDIA in the low half
        return info

    def _pair(self, h: ReplayHandle, group: str) -> list[int]:
        current, pending = _lookup(self.gpus[int(h)], f"{group}.current"), _lookup(self.gpus[int(h)], f"{group}.pending")
        if current is None and pending is None:
            self._value(h, group + ".current")  # the group's failure, or not supported
        self._value(h, group)  # a recorded failure of the whole group, or not in this capture
        return self._checked(group, lambda: [int(_flag(self._value(h, f"{group}.current"))),
                                             int(_flag(self._value(h, f"{group}.pending")))])

    def _ecc(self, h: ReplayHandle, etype: int, counter: int) -> int:
        kind = "uncorrected" if etype == self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED") else "corrected"
        where = "volatile" if counter == self._const("NVML_VOLATILE_ECC") else "aggregate"
        field = f"ecc_errors.{where}_{kind}"
        return self._checked(field, lambda: _count(self._value(h, field)))

    def _ecc_location(self, h: ReplayHandle, etype: int, counter: int, location: int) -> int:
        if location != self._const("NVML_MEMORY_LOCATION_SRAM") or etype != self._const(
                "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"):
            raise N.NotInCapture(f"memory error counter {etype}/{counter}/{location}: not in this capture")
        where = "volatile" if counter == self._const("NVML_VOLATILE_ECC") else "aggregate"
        field = f"ecc_errors.sram_{where}_uncorrected"
        return self._checked(field, lambda: _count(self._value(h, field)))

    def _sram_status(self, h: ReplayHandle, ref: Any) -> int:
        """The SRAM status struct: the threshold flag and the counters it carries. A recording
        that holds the flag but not both counters cannot fill the struct: not in this capture."""
        field = "ecc_errors.sram_threshold_exceeded"
        exceeded = self._checked(field, lambda: _flag(self._value(h, field)))
        g = self.gpus[int(h)]
        counts = [_lookup(g, f"ecc_errors.sram_{w}_uncorrected") for w in ("volatile", "aggregate")]
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise N.NotInCapture(f"{field}: the capture holds the flag without both SRAM counters")
        st = ref._obj
        st.bThresholdExceeded = int(exceeded)
        st.volatileUncParity, st.volatileUncSecDed = 0, counts[0]
        st.aggregateUncParity, st.aggregateUncSecDed = 0, counts[1]
        return self._const("NVML_SUCCESS") or 0

    def _fabric(self, h: ReplayHandle, ref: Any) -> int:
        """The fabric-info struct from the recorded `fabric` group (platform.fabric.nvmlfabric)."""
        fabric = self._value(h, "fabric")
        if not isinstance(fabric, dict):
            raise recorded_failure(N.OTHER, None, "fabric")
        try:
            nvmlfabric.encode(self._pynvml, fabric, ref._obj)  # type: ignore[arg-type]
        except (ValueError, TypeError, AttributeError):  # names no NVML value has: unreadable, never a value
            raise recorded_failure(N.OTHER, None, "fabric") from None
        return self._const("NVML_SUCCESS") or 0

    def _remapped(self, h: ReplayHandle) -> tuple[int, int, int, int]:
        g = self.gpus[int(h)]
        keys = ("correctable", "uncorrectable", "pending", "failure")
        if all(_lookup(g, f"remapped_rows.{k}") is None for k in keys):
            self._value(h, "remapped_rows.correctable")
        self._value(h, "remapped_rows")
        return self._checked("remapped_rows", lambda: (
            _count(self._value(h, "remapped_rows.correctable")), _count(self._value(h, "remapped_rows.uncorrectable")),
            int(_flag(self._value(h, "remapped_rows.pending"))), int(_flag(self._value(h, "remapped_rows.failure")))))

    def _retired(self, h: ReplayHandle, cause: int) -> range:
        double = cause == self._const("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")
        field = "retired_pages.double_bit" if double else "retired_pages.single_bit"
        n = self._checked(field, lambda: _count(self._value(h, field)))
        return range(n)  # the page addresses; the reader counts them (a range never holds them all)

    def _temperature(self, h: ReplayHandle, sensor: int) -> int:
        if sensor != self._const("NVML_TEMPERATURE_GPU"):
            raise N.NotInCapture(f"temperature sensor {sensor}: not in this capture")
        return self._checked("temperature.gpu_c", lambda: _count(self._value(h, "temperature.gpu_c")))

    def _threshold(self, h: ReplayHandle, which: int) -> int:
        names = {self._const("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"): "shutdown_c",
                 self._const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"): "slowdown_c",
                 self._const("NVML_TEMPERATURE_THRESHOLD_GPU_MAX"): "gpu_max_c"}
        if which not in names:
            raise N.NotInCapture(f"temperature threshold {which}: not in this capture")
        field = f"temperature.{names[which]}"
        return self._checked(field, lambda: _count(self._value(h, field)))

    def _clock(self, h: ReplayHandle, clock: int) -> int:
        return self._sm_clock(h, clock, "clocks.sm_mhz")

    def _max_clock(self, h: ReplayHandle, clock: int) -> int:
        return self._sm_clock(h, clock, "clocks.sm_max_mhz")

    def _sm_clock(self, h: ReplayHandle, clock: int, field: str) -> int:
        if clock != self._const("NVML_CLOCK_SM"):
            raise N.NotInCapture(f"clock {clock}: not in this capture")
        return self._checked(field, lambda: _count(self._value(h, field)))

    # -- field values and NvLink ------------------------------------------------------------------------
    def _field_values(self, h: ReplayHandle, field_ids: list[int]) -> list[Any]:
        by_id = {self._const("NVML_FI_DEV_NVLINK_LINK_COUNT"): self._link_count,
                 self._const("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"): self._recovery_action}
        out = []
        for fid in field_ids:
            ret, value = N.NOT_IN_CAPTURE_RETURN, 0
            read = by_id.get(fid)
            if read is not None:
                try:
                    ret, value = self._const("NVML_SUCCESS") or 0, read(h)
                except N.NotInCapture:
                    ret = N.NOT_IN_CAPTURE_RETURN
                except (NVMLError_Replayed, N.ReplayedFailure) as e:
                    ret = _return_code(e)
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=ret, valueType=self._const("NVML_VALUE_TYPE_UNSIGNED_INT"),
                                       value=SimpleNamespace(uiVal=value)))
        return out

    def _recovery_action(self, h: ReplayHandle) -> int:
        return self._checked("recovery_action", lambda: _count(self._value(h, "recovery_action")))

    def _links(self, h: ReplayHandle) -> tuple[dict[int, Mapping[str, Any]], set[int]]:
        """The recorded links by number, and the link numbers whose reads the recording says
        failed (worked out once per GPU: the reader asks for every link and counter)."""
        index = int(h)
        if index not in self._link_cache:
            try:
                self._link_cache[index] = self._read_links(index)
            except Exception as e:  # noqa: BLE001 - the same failure for every later question
                self._link_cache[index] = e
        found = self._link_cache[index]
        if isinstance(found, Exception):
            raise found
        return found

    def _read_links(self, index: int) -> tuple[dict[int, Mapping[str, Any]], set[int]]:
        g = self.gpus[index]
        nv = _lookup(g, "nvlink")
        if nv is _MISSING or nv is None:
            raise N.NotInCapture("nvlink: not in this capture")
        links = nv.get("links") if isinstance(nv, Mapping) else None
        if not isinstance(links, list) or not all(isinstance(lk, Mapping) and isinstance(lk.get("link"), int)
                                                  and not isinstance(lk.get("link"), bool) for lk in links):
            raise recorded_failure(N.OTHER, None, "nvlink.links")
        failed = {int(m.group(1)) for k in _errors(g) for m in [_LINK_KEY.match(str(k))] if m}
        return {int(lk["link"]): lk for lk in links}, failed

    def _link_count(self, h: ReplayHandle) -> int:
        kind = _recorded_error(_errors(self.gpus[int(h)]), "nvlink.link_count")
        if kind is not None:
            raise recorded_failure(kind, None, "nvlink.link_count")
        links, failed = self._links(h)
        numbers = set(links) | failed
        gaps = numbers and set(range(max(numbers) + 1)) - numbers
        if not numbers or gaps:  # no count recorded: the reader probed the links
            raise recorded_failure(N.NOT_SUPPORTED, None, "nvlink.link_count")
        return max(numbers) + 1

    def _link_state(self, h: ReplayHandle, link: int) -> int:
        """A link's state. A failure recorded for the whole NvLink group answers link 0 (and the
        probe ends at link 1): the group failed once, not once per possible link."""
        field = f"nvlink.links[{link}].state"
        errors = _errors(self.gpus[int(h)])
        try:
            links, failed = self._links(h)
        except (N.NotInCapture, NVMLError_Replayed, N.ReplayedFailure):
            if link == 0:
                raise
            raise _invalid_argument() from None
        kind = _recorded_error(errors, field)
        if kind is not None and (link == 0 or _recorded_error(errors, f"nvlink.links[{link}]", own=True)):
            raise recorded_failure(kind, None, field)
        entry = links.get(int(link))
        if entry is None:
            if int(link) > max(set(links) | failed, default=-1):
                raise _invalid_argument()
            raise recorded_failure(N.NOT_SUPPORTED, None, field)
        state = entry.get("state", _MISSING)
        if state is _MISSING:
            raise N.NotInCapture(f"{field}: not in this capture")
        if state is None:
            raise recorded_failure(N.NOT_SUPPORTED, None, field)
        return self._checked(field, lambda: self._state_code(state))

    def _state_code(self, state: Any) -> int:
        codes = self._state_codes
        if isinstance(state, str) and state in codes:
            return codes[state]
        m = re.fullmatch(r"unknown_(\d+)", state) if isinstance(state, str) else None
        if m is None:
            raise Invalid(state)
        return int(m.group(1))

    def _link_counter(self, h: ReplayHandle, link: int, counter: int) -> int:
        links, _ = self._links(h)
        key = self._counter_keys.get(counter)
        field = f"nvlink.links[{link}].{key}"
        if key is None or int(link) not in links:
            raise N.NotInCapture(f"{field}: not in this capture")
        kind = _recorded_error(_errors(self.gpus[int(h)]), field)
        if kind is not None:
            raise recorded_failure(kind, None, field)
        value = links[int(link)].get(key, _MISSING)
        if value is _MISSING:
            raise N.NotInCapture(f"{field}: not in this capture")
        if value is None:
            raise recorded_failure(N.NOT_SUPPORTED, None, field)
        return self._checked(field, lambda: _count(value))

    def _const(self, name: str) -> int | None:
        return enums.constant(self._pynvml, name)


class _Probe(ReplayNvml):
    """Reads GPU `index` of a recording as if it were fine, noting for each call on it whether the
    recording answered it with a value (for a lost GPU's loss point)."""

    def __init__(self, doc: Mapping[str, Any], index: int):
        fine = {**dict(doc["gpus"][0]), "state": "ok", "error": None}
        for g in doc.get("gpus") or []:
            if int(g["index"]) == index:
                fine = {**dict(g), "state": "ok", "error": None}
        super().__init__({**dict(doc), "nvml": {"ok": True, "error": None}, "gpus": [fine]})
        self.answered: list[bool] = []

    def answer(self, name: str, *args: Any) -> Any:
        counted = bool(args) and isinstance(args[0], int) and name.startswith("nvmlDevice") \
            and name != "nvmlDeviceGetHandleByIndex"
        try:
            out = super().answer(name, *args)
        except Exception:
            if counted:
                self.answered.append(False)
            raise
        if counted:
            success = self._const("NVML_SUCCESS")
            self.answered.append(name != "nvmlDeviceGetFieldValues" or any(v.nvmlReturn == success for v in out))
        return out


# -- recorded values -------------------------------------------------------------------------------------
def _lookup(g: Mapping[str, Any], path: str) -> Any:
    """The value at `path` of entry `g`; _MISSING where the recording does not hold it; a
    group that is not an object is returned as it is (an invalid value)."""
    cur: Any = g
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return cur
        if part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _errors(g: Mapping[str, Any]) -> Mapping[str, Any]:
    """The entry's `errors` map (field path -> failure kind); a map that is not one holds none."""
    errors = g.get("errors")
    return errors if isinstance(errors, Mapping) else {}


def _recorded_error(errors: Mapping[str, Any], field: str, own: bool = False) -> str | None:
    """The failure kind the recording holds for `field`, or (unless `own`) for a group or link
    holding it ("nvlink", "nvlink.links[3]" for "nvlink.links[3].replay_errors")."""
    keys = [field] if own else [field] + [field[:i] for i in range(len(field) - 1, 0, -1) if field[i] in ".["]
    for key in keys:
        kind = errors.get(key)
        if kind is not None:
            return str(kind) if str(kind) in N.KINDS else N.OTHER
    for key in (k for k in errors if own and str(k).startswith(field + ".")):
        return str(errors[key]) if str(errors[key]) in N.KINDS else N.OTHER
    return None


def _invalid_argument() -> Exception:
    """What NVML answers for a GPU index or link number it does not have."""
    return NVMLError_Replayed(N.code("NVML_ERROR_INVALID_ARGUMENT") or -1)


def _return_code(e: Exception) -> int:
    """The NVML return code of a replayed failure (a field value's nvmlReturn)."""
    value = getattr(e, "value", None)
    if isinstance(value, int):
        return value
    kind = getattr(e, "kind", N.OTHER)
    return N.code(KIND_CODES.get(kind, KIND_CODES[N.OTHER])) or -1


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise Invalid(v)
    return v


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise Invalid(v)
    return v


def _count(v: Any) -> int:
    """An unsigned integer, as every NVML call the reader makes returns (the reader's range checks
    judge its size). A whole float (345.0: JSON keeps no int/float distinction that another tool,
    or a converted nvidia-smi capture, must honour) is that integer; any other value is invalid."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise Invalid(v)
    return v


def _milliwatts(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise Invalid(v)
    return round(v * 1000)


# -- sessions and snapshots ------------------------------------------------------------------------------
def replay_library(doc: Snapshot | Mapping[str, Any]) -> N.Library:
    """A library (NvmlSession backend) that answers from recording `doc`."""
    return N.Library(lambda: ReplayNvml(doc))


def replay_session(doc: Snapshot | Mapping[str, Any]) -> N.NvmlSession:
    """An NvmlSession over recording `doc` (close it, or use it as a context manager)."""
    return N.NvmlSession(replay_library(doc))


_READ_KEYS = ("nvml", "driver_version", "cuda_driver_version", "nvml_version", "gpus")


def recorded_facts(doc: Snapshot | Mapping[str, Any]) -> Snapshot:
    """What recording `doc` says that is not read through NVML (host, time, source, the PCI
    list, the kernel log, ...), with its NVML part not read yet."""
    snap: Any = {k: copy.deepcopy(v) for k, v in doc.items() if k not in _READ_KEYS}
    snap.update(nvml={"ok": False, "error": None}, driver_version=None, cuda_driver_version=None,
                nvml_version=None, gpus=[])
    facts: Snapshot = snap
    return facts


def replay_snapshot(doc: Snapshot | Mapping[str, Any], library: N.Library | None = None) -> Snapshot:
    """The snapshot the checks judge for recording `doc` (validated): its own facts, and its NVML
    part read back through the reader (see the module)."""
    snap = recorded_facts(doc)
    if isinstance(doc.get("net"), Mapping):  # the RDMA ports: read again through their reader
        snap["net"] = replay_net(doc["net"])  # type: ignore[arg-type]
    recorded = sorted((int(g["index"]), g) for g in doc.get("gpus") or [])
    with N.NvmlSession(library or replay_library(doc)) as s:
        read_nvml(snap, s, [i for i, _ in recorded])
    by_index = dict(recorded)
    known = set(empty_gpu(0))
    for entry in snap["gpus"]:  # keys the reader does not read (a converter's extras): as recorded
        extra = {k: copy.deepcopy(v) for k, v in by_index[entry["index"]].items() if k not in known}
        entry.update(extra)  # type: ignore[typeddict-item]
    return snap


__all__ = ["ReplayNvml", "ReplayHandle", "NVMLError_Replayed", "recorded_failure", "replay_library",
           "replay_session", "replay_snapshot", "recorded_facts"]
