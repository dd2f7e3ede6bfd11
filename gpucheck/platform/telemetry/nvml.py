"""The one place gpucheck talks to NVML (nvidia-ml-py, imported as `pynvml`).

Everything here returns plain data and never lets an NVML exception escape:

- `pynvml` is imported lazily, on the first session; a missing module is the outcome
  `library_not_found`, exactly like a missing libnvidia-ml.so.
- NVML is initialised once per process however many sessions are open, and shut down once, when
  the last session that was opened is closed (or at interpreter exit for sessions that never are).
- A session reads through a backend: the live pynvml module, or the replay of a recorded snapshot
  (gpucheck.platform.telemetry.replay), which answers the same pynvml calls from the recording. The readers
  (gpucheck.platform.telemetry.reader.read_gpu, `sample`, `read_gpu_processes`) cannot tell them apart.
- Every NVMLError maps to one `NvmlFailure` kind (codes from pynvml's NVML_ERROR_* constants):

  =================== =========================================================================
  kind                NVML return codes
  =================== =========================================================================
  not_supported       NOT_SUPPORTED, FUNCTION_NOT_FOUND (the installed driver lacks the call).
                      The value is None: never read as healthy, never read as zero.
  gpu_lost            GPU_IS_LOST (the GPU fell off the bus; Xid 79)
  reset_required      RESET_REQUIRED
  no_permission       NO_PERMISSION
  driver_not_loaded   DRIVER_NOT_LOADED
  library_not_found   LIBRARY_NOT_FOUND (libnvidia-ml: the driver's library is not installed)
  other               anything else (UNKNOWN, TIMEOUT, LIB_RM_VERSION_MISMATCH, ...); the
                      message keeps NVML's own text
  not_in_capture      (replays only) the recording does not hold what the call asks for: a
                      failed read, never "not supported"
  not_in_format       (converted captures only) the capture's format cannot carry the field
                      (nvidia-smi -q prints no NVLink state; a driver older than the line):
                      a plain skip naming what to add (formatgaps); a replay answers it as
                      not_in_capture
  timeout             no NVML code: the driver did not answer within the time the run could
                      give it, shorter than the hang limit (could not judge: a slow start of
                      the driver is no fault; a hung call; the thread that made it is a daemon thread, left
                      behind, and the library is not shut down at exit while it is stuck:
                      `Library.abandon`)
  hung                no NVML code: the driver did not answer within the full hang limit
                      (gpucheck.app.LIVE_TELEMETRY_TIMEOUT_S, 30 s, waited only when the run's
                      time limit leaves that much): a hung driver, judged by the inventory
                      check like any NVML failure (GPUs on the PCI bus: fail, reboot)
  internal_error      no NVML code: gpucheck's own reader raised, or the pynvml module
                      (nvidia-ml-py, gpucheck's dependency) cannot be imported (a bug in its code, not an
                      NVML failure): nothing was judged
  =================== =========================================================================

`NvmlSession.sample(index)` is the cheap per-second reading used by load samplers: device
handles are cached, four NVML calls are made, and it never raises.
"""

from __future__ import annotations

import atexit
import functools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .enums import constant, pynvml_module
from .model import NvmlError, Sample
from .throttle import reason_names

NOT_SUPPORTED = "not_supported"
GPU_LOST = "gpu_lost"
RESET_REQUIRED = "reset_required"
NO_PERMISSION = "no_permission"
DRIVER_NOT_LOADED = "driver_not_loaded"
LIBRARY_NOT_FOUND = "library_not_found"
OTHER = "other"
NOT_IN_CAPTURE = "not_in_capture"
NOT_IN_FORMAT = "not_in_format"  # gpucheck.platform.telemetry.formatgaps
TIMEOUT = "timeout"
HUNG = "hung"
INTERNAL_ERROR = "internal_error"

KINDS: tuple[str, ...] = (
    NOT_SUPPORTED,
    GPU_LOST,
    RESET_REQUIRED,
    NO_PERMISSION,
    DRIVER_NOT_LOADED,
    LIBRARY_NOT_FOUND,
    OTHER,
    NOT_IN_CAPTURE,
    NOT_IN_FORMAT,
    TIMEOUT,
    HUNG,
    INTERNAL_ERROR,
)
# The kinds that say nothing about the GPUs: gpucheck could not read them (no verdict, exit 3).
UNJUDGED_KINDS: tuple[str, ...] = (TIMEOUT, INTERNAL_ERROR)
# The kinds that no NVML return code stands for (gpucheck's own: how long it waited, its own failure).
NO_CODE_KINDS: tuple[str, ...] = (TIMEOUT, HUNG, INTERNAL_ERROR)

# NVML return code (pynvml constant) -> failure kind; every other code is OTHER.
ERROR_KINDS: tuple[tuple[str, str], ...] = (
    ("NVML_ERROR_NOT_SUPPORTED", NOT_SUPPORTED),
    ("NVML_ERROR_FUNCTION_NOT_FOUND", NOT_SUPPORTED),  # this driver predates the call
    ("NVML_ERROR_GPU_IS_LOST", GPU_LOST),
    ("NVML_ERROR_RESET_REQUIRED", RESET_REQUIRED),
    ("NVML_ERROR_NO_PERMISSION", NO_PERMISSION),
    ("NVML_ERROR_DRIVER_NOT_LOADED", DRIVER_NOT_LOADED),
    ("NVML_ERROR_LIBRARY_NOT_FOUND", LIBRARY_NOT_FOUND),
)


# A field value's nvmlReturn for a field a replayed recording does not hold: no NVML return code
# is negative, so it can never be mistaken for one.
NOT_IN_CAPTURE_RETURN = -1


def code(name: str) -> int | None:
    """The value of pynvml constant `name` (an NVML_ERROR_*, NVML_SUCCESS...), None without it."""
    return constant(pynvml_module(), name)


@functools.cache
def _code_kinds() -> dict[int, str]:
    out: dict[int, str] = {}
    for name, kind in ERROR_KINDS:
        value = code(name)
        if value is not None:
            out[value] = kind
    return out


@dataclass(frozen=True)
class NvmlFailure:
    """Why an NVML call gave no value: one of KINDS and NVML's message."""

    kind: str
    message: str
    code: int | None = None  # the NVML return code, when there was one

    def to_dict(self) -> NvmlError:
        return {"kind": self.kind, "message": self.message}

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class NotInCapture(Exception):
    """Raised by a replay backend for a call whose answer the recording does not hold."""


class ReplayedFailure(Exception):
    """Raised by a replay backend for a failure the recording holds without an NVML return code
    (a driver that did not answer in time): its kind and message, as recorded."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def kind_of_code(value: int) -> str:
    if int(value) == NOT_IN_CAPTURE_RETURN:
        return NOT_IN_CAPTURE
    return _code_kinds().get(int(value), OTHER)


def _with_code(message: str, value: int) -> str:
    suffix = f"(NVML return code {value})"
    return message if message.endswith(suffix) else f"{message or 'NVML error'} {suffix}"


def classify(exc: BaseException) -> NvmlFailure:
    """Map any exception raised around an NVML call to an NvmlFailure."""
    if isinstance(exc, ImportError):  # gpucheck's own dependency, not the node's driver library
        return NvmlFailure(INTERNAL_ERROR, f"the pynvml module (nvidia-ml-py, a dependency of gpucheck) is not "
                                           f"importable: {exc}; an installation problem of gpucheck, not a fault "
                                           "of the node")
    if isinstance(exc, NotInCapture):
        return NvmlFailure(NOT_IN_CAPTURE, str(exc))
    if isinstance(exc, ReplayedFailure):
        return NvmlFailure(exc.kind if exc.kind in KINDS else OTHER, exc.message)
    value = getattr(exc, "value", None)
    if isinstance(value, int) and type(exc).__name__.startswith("NVMLError"):
        try:
            msg = str(exc)
        except Exception:  # noqa: BLE001 - a broken message never hides the code
            msg = ""
        return NvmlFailure(kind_of_code(value), _with_code(msg, value), value)
    return NvmlFailure(OTHER, f"{type(exc).__name__}: {exc}")


def is_nvml_failure(exc: BaseException) -> bool:
    """Whether `exc` is NVML's own failure (pynvml's NVMLError and its subclasses, a missing
    library or pynvml module, a replayed or classified failure), as opposed to an exception
    raised by gpucheck's own code around NVML (a KeyError, a TypeError: a bug)."""
    if isinstance(exc, (ImportError, NotInCapture, ReplayedFailure, NvmlCallError)):
        return True
    return any(c.__name__.startswith("NVMLError") for c in type(exc).__mro__)


def failure_for_code(value: int, what: str = "") -> NvmlFailure:
    """An NvmlFailure for a per-item NVML return code (field values)."""
    where = f"{what}: " if what else ""
    if int(value) == NOT_IN_CAPTURE_RETURN:
        return NvmlFailure(NOT_IN_CAPTURE, f"{where}not in this capture")
    return NvmlFailure(kind_of_code(value), f"{where}NVML return code {value}", int(value))


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


def import_pynvml() -> Any:
    import pynvml  # noqa: PLC0415 - lazy on purpose: gpucheck starts without touching NVML

    return pynvml


# -- library state ------------------------------------------------------------------------------------
class Library:
    """NVML init/shutdown bookkeeping shared by every session of one backend: the process-wide
    live library (`_LIB`, the real pynvml), or one replay. `load()` gives the backend module."""

    def __init__(self, load: Callable[[], Any] | None = None) -> None:
        self.lock = threading.RLock()
        self._load = load
        self.module: Any = None
        self.users = 0
        self.initialised = False
        self.handles: dict[int, Any] = {}
        self._atexit = False
        self._left_behind: list[threading.Thread] = []  # threads stuck in a call that did not answer

    def abandon(self, thread: threading.Thread) -> None:
        """A call through this library made by (daemon) `thread` did not answer in time and the
        thread was left behind: while it is still stuck, nvmlShutdown at interpreter exit would
        wait for the same hung driver (or for the lock that thread holds) and block the process's
        exit, so it is not called."""
        # Never under self.lock: the thread left behind may hold it.
        self._left_behind = [t for t in self._left_behind if t.is_alive()] + [thread]

    @property
    def abandoned(self) -> bool:
        """Whether a call left behind in the driver is still stuck there."""
        return any(t.is_alive() for t in self._left_behind)

    def acquire(self) -> tuple[Any, NvmlFailure | None]:
        with self.lock:
            if self.initialised:
                self.users += 1
                return self.module, None
            try:
                mod = self.module or (self._load() if self._load is not None else import_pynvml())
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
        if self.abandoned or not self.lock.acquire(timeout=1.0):  # a hung call holds it: leave it
            return
        try:
            if self.initialised and not self.abandoned:
                self._shutdown()
        finally:
            self.lock.release()


_LIB = Library()


def live_library() -> Library:
    """The process-wide library of live NVML (the real pynvml)."""
    return _LIB


class NvmlSession:
    """A use of NVML. Construction never raises: check `.ok`, and `.error` (an NvmlFailure) when
    it is False. Use as a context manager, or call close(); a long sampling loop should hold one
    session rather than make one per sample (both work; the library is initialised only once).
    `library`: the backend (default: live NVML through pynvml)."""

    def __init__(self, library: Library | None = None) -> None:
        self._closed = False
        self._lib = library if library is not None else _LIB
        mod, err = self._lib.acquire()
        self.nvml: Any = mod
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
            self._lib.release()

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

    def const(self, name: str) -> int | None:
        """The value of NVML constant `name` (pynvml's), or None when this pynvml has none."""
        return constant(self.nvml if self.nvml is not None else pynvml_module(), name)

    def enum(self, name: str) -> int:
        """const(name), or NvmlCallError (not supported by this pynvml) when it has none: a call
        that needs an enum value this pynvml does not define reads as not supported."""
        value = self.const(name)
        if value is None:
            raise NvmlCallError(NvmlFailure(NOT_SUPPORTED, f"{name} is not in this pynvml version"))
        return value

    def constant(self, name: str, default: Any) -> Any:
        """Any attribute of the backend module (a ctypes struct class), or `default`."""
        return getattr(self.nvml, name, default) if self.nvml is not None else default

    def handle(self, index: int) -> Any:
        """The device handle of GPU `index` (cached); raises NvmlCallError."""
        with self._lib.lock:
            h = self._lib.handles.get(index)
        if h is None:
            h = self.call("nvmlDeviceGetHandleByIndex", index)
            with self._lib.lock:
                self._lib.handles[index] = h
        return h

    def forget(self, index: int) -> None:
        """Drop the cached handle of a GPU that was lost or needs a reset."""
        with self._lib.lock:
            self._lib.handles.pop(index, None)

    def field_values(self, handle: Any, field_ids: list[int]) -> list[tuple[Any, NvmlFailure | None]]:
        """nvmlDeviceGetFieldValues for several ids: one (value, failure) per id. A field id the
        driver does not know (INVALID_ARGUMENT, older drivers) reads as not_supported."""
        values = self.call("nvmlDeviceGetFieldValues", handle, list(field_ids))
        success, invalid = self.const("NVML_SUCCESS"), self.const("NVML_ERROR_INVALID_ARGUMENT")
        out: list[tuple[Any, NvmlFailure | None]] = []
        for fid, v in zip(field_ids, values):
            ret = int(getattr(v, "nvmlReturn", success) or 0)
            if ret == invalid:
                out.append((None, NvmlFailure(NOT_SUPPORTED, f"field {fid}: unknown to this driver", ret)))
            elif ret != success:
                out.append((None, failure_for_code(ret, f"field {fid}")))
            else:
                out.append((field_value(self, v), None))
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
    def sample(self, index: int) -> Sample:
        """SM clock, temperature, power and clock-event reasons of one GPU. Never raises; a value
        that could not be read is None and `error` names the first failure that was not a plain
        not_supported (gpu_lost, ...)."""
        out: Sample = {"index": index, "sm_clock_mhz": None, "temperature_c": None, "power_w": None,
                       "throttle_reasons": None, "throttle_reason_names": None, "error": None, "time": time.time()}
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
            try:
                return self.call(name, *args)
            except NvmlCallError as e:
                if e.failure.kind != NOT_SUPPORTED:
                    errors.append(e.failure.kind)
                return None

        clock = get("nvmlDeviceGetClockInfo", h, self.const("NVML_CLOCK_SM"))
        temp = get("nvmlDeviceGetTemperature", h, self.const("NVML_TEMPERATURE_GPU"))
        power_mw = get("nvmlDeviceGetPowerUsage", h)
        mask = self.throttle_mask(h, errors)
        out["sm_clock_mhz"] = None if clock is None else int(clock)
        out["temperature_c"] = None if temp is None else int(temp)
        out["power_w"] = None if power_mw is None else round(int(power_mw) / 1000.0, 3)
        out["throttle_reasons"] = mask
        out["throttle_reason_names"] = None if mask is None else reason_names(mask)
        out["error"] = errors[0] if errors else None
        if GPU_LOST in errors or RESET_REQUIRED in errors:
            self.forget(index)
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


# nvmlValueType_t (pynvml constant) -> the member of the nvmlValue_t union that holds the value.
VALUE_MEMBERS: tuple[tuple[str, str], ...] = (
    ("NVML_VALUE_TYPE_DOUBLE", "dVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_INT", "uiVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG", "ulVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "ullVal"),
    ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", "sllVal"),
    ("NVML_VALUE_TYPE_SIGNED_INT", "siVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_SHORT", "usVal"),
)


def field_value(session: NvmlSession, v: Any) -> int | float:
    """The value of one nvmlFieldValue_t, by its valueType (unsigned int when it has none)."""
    members = {session.const(t): m for t, m in VALUE_MEMBERS}
    vtype = getattr(v, "valueType", session.const("NVML_VALUE_TYPE_UNSIGNED_INT"))
    member = members.get(vtype, "uiVal")
    val = getattr(v.value, member)
    return float(val) if member == "dVal" else int(val)


# -- Xid events while a load runs -----------------------------------------------------------------------
class XidWatch:
    """Xid critical-error events through an NVML event set (best effort: some drivers and
    containers refuse event registration; then `note` says so and Xids come from the xid check)."""

    def __init__(self, session: NvmlSession, gpus: list[int]):
        self.session = session
        self.note: str | None = None
        self.ok = False
        self._set: Any = None
        try:
            self._set = session.call("nvmlEventSetCreate")
            etype = session.enum("nvmlEventTypeXidCriticalError")
            for g in gpus:
                session.call("nvmlDeviceRegisterEvents", session.handle(g), etype, self._set)
            self.ok = True
        except NvmlCallError as e:
            self.note = f"Xid events not watched during the load: {e.failure}"
            self.close()

    def poll(self) -> list[tuple[int, int]]:
        """(GPU index, Xid) of the events pending now (-1: a GPU NVML could not name)."""
        if not self.ok or self._set is None:
            return []
        name = "nvmlEventSetWait_v2" if getattr(self.session.nvml, "nvmlEventSetWait_v2", None) else "nvmlEventSetWait"
        timeout = self.session.const("NVML_ERROR_TIMEOUT")
        out: list[tuple[int, int]] = []
        for _ in range(64):  # drain what is pending, bounded
            try:
                data = self.session.call(name, self._set, 0)
            except NvmlCallError as e:
                if e.failure.code != timeout:  # TIMEOUT: nothing pending
                    self.note = f"Xid event watch stopped: {e.failure}"
                    self.ok = False
                return out
            index, err = self.session.read("nvmlDeviceGetIndex", data.device)
            out.append((-1 if err is not None else int(index), int(data.eventData)))
        return out

    def close(self) -> None:
        if self._set is not None:
            self.session.read("nvmlEventSetFree", self._set)
            self._set = None


# -- running processes: what the load-test guard (gpucheck.workers.busy) reads ------------------------------
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
        missing_call = (failure.code is not None and failure.code == session.const("NVML_ERROR_FUNCTION_NOT_FOUND")) \
            or (failure.code is None and failure.kind == NOT_SUPPORTED)
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
    # NVML_VALUE_NOT_AVAILABLE: older pynvml versions pass it through as the memory used
    not_available = session.const("NVML_VALUE_NOT_AVAILABLE_ulonglong")
    for kind, names, required in PROCESS_LISTS:
        entries, failure = _read_process_list(session, handle, names)
        if failure is not None:
            if required or failure.kind != NOT_SUPPORTED:
                return GpuProcesses(index, None, NvmlFailure(failure.kind, f"{kind} processes: {failure.message}",
                                                             failure.code))
            notes.append(f"{kind} process list not supported here ({failure.message})")
            continue
        for entry in entries or []:
            pid = int(getattr(entry, "pid"))
            mem = getattr(entry, "usedGpuMemory", None)
            slot = found.setdefault(pid, {"kinds": [], "memory": None})
            if kind not in slot["kinds"]:
                slot["kinds"].append(kind)
            known = isinstance(mem, int) and 0 <= mem and mem != not_available
            if known and (slot["memory"] is None or mem > slot["memory"]):
                slot["memory"] = mem
    procs = tuple(GpuProcess(pid, s["memory"], tuple(s["kinds"]), process_name(pid, proc_root))
                  for pid, s in sorted(found.items()))
    return GpuProcesses(index, procs, None, tuple(notes))
