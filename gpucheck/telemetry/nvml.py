"""The one place gpucheck talks to NVML (nvidia-ml-py, imported as `pynvml`).

Everything here returns plain data and never lets an NVML exception escape:

- `pynvml` is imported lazily, on the first session; a missing module is the outcome
  `library_not_found`, exactly like a missing libnvidia-ml.so.
- NVML is initialised once per process however many sessions are open, and shut down once, when
  the last session that was opened is closed (or at interpreter exit for sessions that never are).
- Every NVMLError maps to one `NvmlFailure` kind:

  =================== =========================================================================
  kind                NVML return codes
  =================== =========================================================================
  not_supported       NOT_SUPPORTED, FUNCTION_NOT_FOUND (the installed driver lacks the call).
                      The value is None: never read as healthy, never read as zero.
  gpu_lost            GPU_IS_LOST (the GPU fell off the bus; Xid 79)
  reset_required      RESET_REQUIRED
  no_permission       NO_PERMISSION
  driver_not_loaded   DRIVER_NOT_LOADED
  library_not_found   LIBRARY_NOT_FOUND, or the pynvml module itself is missing
  other               anything else (UNKNOWN, TIMEOUT, LIB_RM_VERSION_MISMATCH, ...); the
                      message keeps NVML's own text
  =================== =========================================================================

`NvmlSession.sample(index)` is the cheap per-second reading used by load samplers: device
handles are cached, four NVML calls are made, and it never raises.
"""

from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from .throttle import reason_names

NOT_SUPPORTED = "not_supported"
GPU_LOST = "gpu_lost"
RESET_REQUIRED = "reset_required"
NO_PERMISSION = "no_permission"
DRIVER_NOT_LOADED = "driver_not_loaded"
LIBRARY_NOT_FOUND = "library_not_found"
OTHER = "other"

KINDS: tuple[str, ...] = (
    NOT_SUPPORTED,
    GPU_LOST,
    RESET_REQUIRED,
    NO_PERMISSION,
    DRIVER_NOT_LOADED,
    LIBRARY_NOT_FOUND,
    OTHER,
)

# NVML return codes (nvml.h, nvmlReturn_t). Stable ABI values; repeated here so that an error can
# be classified even when pynvml could not be imported.
_CODE_KIND = {
    3: NOT_SUPPORTED,  # NVML_ERROR_NOT_SUPPORTED
    13: NOT_SUPPORTED,  # NVML_ERROR_FUNCTION_NOT_FOUND: this driver predates the call
    15: GPU_LOST,  # NVML_ERROR_GPU_IS_LOST
    16: RESET_REQUIRED,  # NVML_ERROR_RESET_REQUIRED
    4: NO_PERMISSION,  # NVML_ERROR_NO_PERMISSION
    9: DRIVER_NOT_LOADED,  # NVML_ERROR_DRIVER_NOT_LOADED
    12: LIBRARY_NOT_FOUND,  # NVML_ERROR_LIBRARY_NOT_FOUND
}
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2


@dataclass(frozen=True)
class NvmlFailure:
    """Why an NVML call gave no value: one of KINDS and NVML's message."""

    kind: str
    message: str
    code: int | None = None  # the NVML return code, when there was one

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def kind_of_code(code: int) -> str:
    return _CODE_KIND.get(int(code), OTHER)


def classify(exc: BaseException) -> NvmlFailure:
    """Map any exception raised around an NVML call to an NvmlFailure."""
    if isinstance(exc, ImportError):
        return NvmlFailure(LIBRARY_NOT_FOUND, f"the pynvml module (nvidia-ml-py) is not importable: {exc}")
    code = getattr(exc, "value", None)
    if isinstance(code, int) and type(exc).__name__.startswith("NVMLError"):
        try:
            msg = str(exc)
        except Exception:  # noqa: BLE001 - a broken message never hides the code
            msg = ""
        return NvmlFailure(kind_of_code(code), f"{msg or 'NVML error'} (NVML return code {code})", code)
    return NvmlFailure(OTHER, f"{type(exc).__name__}: {exc}")


def failure_for_code(code: int, what: str = "") -> NvmlFailure:
    """An NvmlFailure for a per-item NVML return code (field values)."""
    where = f"{what}: " if what else ""
    return NvmlFailure(kind_of_code(code), f"{where}NVML return code {code}", int(code))


class NvmlCallError(Exception):
    """Raised by NvmlSession.call; carries the classified failure."""

    def __init__(self, failure: NvmlFailure):
        super().__init__(str(failure))
        self.failure = failure


def text(value: Any) -> str:
    """NVML strings arrive as str or bytes depending on the pynvml version."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def import_pynvml() -> ModuleType:
    import pynvml  # noqa: PLC0415 - lazy on purpose: gpucheck starts without touching NVML

    return pynvml


# -- process-wide library state -------------------------------------------------------------------
class _Library:
    """NVML init/shutdown bookkeeping shared by every session of the process."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.module: ModuleType | None = None
        self.users = 0
        self.initialised = False
        self.handles: dict[int, Any] = {}
        self._atexit = False

    def acquire(self) -> tuple[ModuleType | None, NvmlFailure | None]:
        with self.lock:
            if self.initialised:
                self.users += 1
                return self.module, None
            try:
                mod = self.module or import_pynvml()
                self.module = mod
                mod.nvmlInit()
            except Exception as e:  # noqa: BLE001 - NVMLError, ImportError, OSError: all classified
                return None, classify(e)
            self.initialised = True
            self.users = 1
            self.handles = {}
            if not self._atexit:
                atexit.register(self._shutdown_at_exit)
                self._atexit = True
            return self.module, None

    def release(self) -> None:
        with self.lock:
            if not self.initialised:
                return
            self.users -= 1
            if self.users <= 0:
                self._shutdown()

    def _shutdown(self) -> None:
        self.users = 0
        self.initialised = False
        self.handles = {}
        try:
            if self.module is not None:
                self.module.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a broken driver is best effort
            pass

    def _shutdown_at_exit(self) -> None:
        with self.lock:
            if self.initialised:
                self._shutdown()


_LIB = _Library()


class NvmlSession:
    """A use of NVML. Construction never raises: check `.ok`, and `.error` (an NvmlFailure) when
    it is False. Use as a context manager, or call close(); a long sampling loop should hold one
    session rather than make one per sample (both work; the library is initialised only once)."""

    def __init__(self) -> None:
        self._closed = False
        mod, err = _LIB.acquire()
        self.nvml: ModuleType | None = mod
        self.error: NvmlFailure | None = err
        if err is not None:
            self._closed = True  # nothing to release

    @property
    def ok(self) -> bool:
        return self.error is None

    def __enter__(self) -> "NvmlSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _LIB.release()

    # -- calls ------------------------------------------------------------------------------------
    def call(self, name: str, *args: Any) -> Any:
        """Call pynvml.<name>(*args); raise NvmlCallError with the classified failure."""
        if self.nvml is None:
            raise NvmlCallError(self.error or NvmlFailure(LIBRARY_NOT_FOUND, "NVML is not initialised"))
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            raise NvmlCallError(NvmlFailure(NOT_SUPPORTED, f"{name} is not in this pynvml version"))
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - every NVML failure becomes data
            raise NvmlCallError(classify(e)) from None

    def read(self, name: str, *args: Any) -> tuple[Any, NvmlFailure | None]:
        """(value, None) or (None, failure)."""
        try:
            return self.call(name, *args), None
        except NvmlCallError as e:
            return None, e.failure

    def constant(self, name: str, default: Any) -> Any:
        return getattr(self.nvml, name, default) if self.nvml is not None else default

    def handle(self, index: int) -> Any:
        """The device handle of GPU `index` (cached); raises NvmlCallError."""
        with _LIB.lock:
            h = _LIB.handles.get(index)
        if h is None:
            h = self.call("nvmlDeviceGetHandleByIndex", index)
            with _LIB.lock:
                _LIB.handles[index] = h
        return h

    def field_values(self, handle: Any, field_ids: list[int]) -> list[tuple[Any, NvmlFailure | None]]:
        """nvmlDeviceGetFieldValues for several ids: one (value, failure) per id. A field id the
        driver does not know (INVALID_ARGUMENT, older drivers) reads as not_supported."""
        values = self.call("nvmlDeviceGetFieldValues", handle, list(field_ids))
        out: list[tuple[Any, NvmlFailure | None]] = []
        for fid, v in zip(field_ids, values):
            ret = int(getattr(v, "nvmlReturn", NVML_SUCCESS))
            if ret == NVML_ERROR_INVALID_ARGUMENT:
                out.append((None, NvmlFailure(NOT_SUPPORTED, f"field {fid}: unknown to this driver", ret)))
            elif ret != NVML_SUCCESS:
                out.append((None, failure_for_code(ret, f"field {fid}")))
            else:
                out.append((field_value(v), None))
        return out

    # -- system-wide ------------------------------------------------------------------------------
    def device_count(self) -> int | None:
        v, err = self.read("nvmlDeviceGetCount")
        return None if err else int(v)

    def driver_version(self) -> str | None:
        v, err = self.read("nvmlSystemGetDriverVersion")
        return None if err else text(v)

    def nvml_version(self) -> str | None:
        v, err = self.read("nvmlSystemGetNVMLVersion")
        return None if err else text(v)

    def cuda_driver_version(self) -> str | None:
        """The CUDA version the driver supports, like "12.4" (nvmlSystemGetCudaDriverVersion
        returns 1000*major + 10*minor)."""
        v, err = self.read("nvmlSystemGetCudaDriverVersion")
        if err or v is None:
            return None
        return cuda_version_text(int(v))

    # -- the cheap per-second reading ---------------------------------------------------------
    def sample(self, index: int) -> dict[str, Any]:
        """SM clock, temperature, power and clock-event reasons of one GPU. Never raises; a value
        that could not be read is None and `error` names the first failure that was not a plain
        not_supported (gpu_lost, ...)."""
        out: dict[str, Any] = {
            "index": index,
            "sm_clock_mhz": None,
            "temperature_c": None,
            "power_w": None,
            "throttle_reasons": None,
            "throttle_reason_names": None,
            "error": None,
            "time": time.time(),
        }
        if not self.ok:
            out["error"] = self.error.kind if self.error else LIBRARY_NOT_FOUND
            return out
        try:
            h = self.handle(index)
        except NvmlCallError as e:
            out["error"] = e.failure.kind
            return out
        errors: list[str] = []

        def get(name: str, *args: Any) -> Any:
            v, err = self.read(name, *args)
            if err is not None and err.kind != NOT_SUPPORTED:
                errors.append(err.kind)
            return v

        clock = get("nvmlDeviceGetClockInfo", h, self.constant("NVML_CLOCK_SM", 1))
        temp = get("nvmlDeviceGetTemperature", h, self.constant("NVML_TEMPERATURE_GPU", 0))
        power_mw = get("nvmlDeviceGetPowerUsage", h)
        mask = self.throttle_mask(h, errors)
        out.update(
            sm_clock_mhz=None if clock is None else int(clock),
            temperature_c=None if temp is None else int(temp),
            power_w=None if power_mw is None else round(int(power_mw) / 1000.0, 3),
            throttle_reasons=mask,
            throttle_reason_names=None if mask is None else reason_names(mask),
            error=errors[0] if errors else None,
        )
        if GPU_LOST in errors or RESET_REQUIRED in errors:
            with _LIB.lock:
                _LIB.handles.pop(index, None)
        return out

    def throttle_mask(self, handle: Any, errors: list[str] | None = None) -> int | None:
        """Current clocks-event (throttle) reasons; the pre-R535 name is the fallback."""
        v, err = self.read("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if err is not None and err.kind == NOT_SUPPORTED:
            v, err = self.read("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if err is not None:
            if errors is not None and err.kind != NOT_SUPPORTED:
                errors.append(err.kind)
            return None
        return int(v)


def cuda_version_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value.
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def field_value(v: Any) -> Any:
    member = _VALUE_MEMBER.get(int(getattr(v, "valueType", 1)), "uiVal")
    val = getattr(v.value, member)
    return float(val) if member == "dVal" else int(val)


# -- running processes: what the load-test guard (gpucheck.busy) reads ------------------------------
# Each list is read with the newest call this pynvml and driver have: the _v3 struct first, then
# _v2, then the unversioned name (older pynvml maps it to v1). A call missing from pynvml or from
# the driver (FUNCTION_NOT_FOUND) falls through to the next; any other failure is the answer.
PROCESS_LISTS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    # (kind, pynvml names, required: a failure of a required list means "could not read")
    ("compute", ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
                 "nvmlDeviceGetComputeRunningProcesses"), True),
    ("graphics", ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2",
                  "nvmlDeviceGetGraphicsRunningProcesses"), False),
    ("mps", ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
             "nvmlDeviceGetMPSComputeRunningProcesses"), False),
)
_FUNCTION_NOT_FOUND = 13
_NOT_AVAILABLE_ULL = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE: older pynvml versions pass it through


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU, as NVML lists it."""

    pid: int
    used_memory_bytes: int | None  # None: NVML did not report it (MIG without privileges, WDDM)
    kinds: tuple[str, ...]  # "compute", "graphics", "mps" (an MPS client)
    name: str | None = None  # /proc/<pid>/comm; None when not readable (another PID namespace)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "used_memory_bytes": self.used_memory_bytes, "kinds": list(self.kinds),
                "name": self.name}


@dataclass(frozen=True)
class GpuProcesses:
    """What runs on GPU `index`: `processes`, or None when the list could not be read, with
    `failure` saying why. An unreadable list is never "no processes"."""

    index: int
    processes: tuple[GpuProcess, ...] | None
    failure: NvmlFailure | None = None
    notes: tuple[str, ...] = ()  # lists this GPU or driver does not support (graphics, MPS)

    @property
    def readable(self) -> bool:
        return self.processes is not None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index,
                "processes": None if self.processes is None else [p.to_dict() for p in self.processes],
                "failure": None if self.failure is None else self.failure.to_dict(), "notes": list(self.notes)}


def process_name(pid: int, proc_root: str = "/proc") -> str | None:
    """The command name of `pid` (/proc/<pid>/comm), or None when it cannot be read."""
    try:
        with open(f"{proc_root}/{int(pid)}/comm", encoding="utf-8", errors="replace") as f:
            return f.read(64).strip() or None
    except (OSError, ValueError):
        return None


def _read_process_list(session: NvmlSession, handle: Any, names: tuple[str, ...]
                       ) -> tuple[list[Any] | None, NvmlFailure | None]:
    failure: NvmlFailure | None = None
    for name in names:
        value, failure = session.read(name, handle)
        if failure is None:
            return list(value or []), None
        missing_call = failure.code == _FUNCTION_NOT_FOUND or (failure.code is None and failure.kind == NOT_SUPPORTED)
        if not missing_call:
            break
    return None, failure


def read_gpu_processes(session: NvmlSession, index: int, proc_root: str = "/proc") -> GpuProcesses:
    """The compute, graphics and MPS-client processes on GPU `index`, merged by PID, with their
    used memory and names. Never raises. The compute list must be read (any failure, a plain
    not_supported included, makes the GPU unreadable); graphics and MPS lists the GPU or driver
    does not support are noted; any other failure of theirs makes the GPU unreadable too."""
    if not session.ok:
        return GpuProcesses(index, None, session.error or NvmlFailure(LIBRARY_NOT_FOUND, "NVML is not initialised"))
    try:
        handle = session.handle(index)
    except NvmlCallError as e:
        return GpuProcesses(index, None, e.failure)
    found: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    for kind, names, required in PROCESS_LISTS:
        entries, failure = _read_process_list(session, handle, names)
        if failure is not None:
            if required or failure.kind != NOT_SUPPORTED:
                return GpuProcesses(index, None, NvmlFailure(failure.kind, f"{kind} processes: {failure.message}",
                                                             failure.code))
            notes.append(f"{kind} process list not supported here ({failure.message})")
            continue
        for e in entries or []:
            pid = int(getattr(e, "pid"))
            mem = getattr(e, "usedGpuMemory", None)
            slot = found.setdefault(pid, {"kinds": [], "memory": None})
            if kind not in slot["kinds"]:
                slot["kinds"].append(kind)
            known = isinstance(mem, int) and 0 <= mem < _NOT_AVAILABLE_ULL
            if known and (slot["memory"] is None or mem > slot["memory"]):
                slot["memory"] = mem
    procs = tuple(GpuProcess(pid, s["memory"], tuple(s["kinds"]), process_name(pid, proc_root))
                  for pid, s in sorted(found.items()))
    return GpuProcesses(index, procs, None, tuple(notes))
