"""Snapshots: everything the level-1 checks judge, read once, as plain JSON data.

`collect_snapshot()` reads NVML (through gpucheck.telemetry.nvml, the only NVML caller) and sysfs;
`load_snapshot(path)` reads a recorded one back (a capture from `gpucheck telemetry dump`, or a
synthetic test fixture) and validates it; `dump_snapshot(snap)` is its JSON text. Reading is
separate from judging: checks never call NVML, they look at `ctx.snapshot`.

The format is documented field by field in docs/snapshot.md. Rules that hold everywhere:
- a value NVML does not support on this GPU/driver is None (never 0, never "healthy");
- a read that failed for another reason is None too, and the GPU's "errors" map names the field
  and the failure kind (no_permission, other, ...);
- a GPU that NVML reports lost / reset-required stops being read: its "state" says so and its
  "error" holds NVML's message.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import __version__
from ..pci import normalize_bus_id
from . import nvml as N
from .sysfs import nvidia_pci_devices
from .throttle import reason_names

KIND = "gpucheck.snapshot"
VERSION = 1
GPU_STATES = ("ok", "lost", "reset_required", "error")

# nvmlDeviceArchitecture_t
ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}
ARCH_AMPERE = 7

# nvmlDeviceGpuRecoveryAction_t, the value of field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230)
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}

FI_NVLINK_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
FI_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS (probe limit when the link count is not reported)

NVLINK_STATES = {0: "inactive", 1: "active", 2: "sleep", 3: "active_traffic_disabled"}
# nvmlNvLinkErrorCounter_t
NVLINK_COUNTERS = {
    "replay_errors": 0,  # NVML_NVLINK_ERROR_DL_REPLAY
    "recovery_errors": 1,  # NVML_NVLINK_ERROR_DL_RECOVERY
    "crc_flit_errors": 2,  # NVML_NVLINK_ERROR_DL_CRC_FLIT
    "crc_data_errors": 3,  # NVML_NVLINK_ERROR_DL_CRC_DATA
}

# NVML enum values used below (nvml.h)
_UNCORRECTED, _CORRECTED = 1, 0  # nvmlMemoryErrorType_t
_VOLATILE, _AGGREGATE = 0, 1  # nvmlEccCounterType_t
_LOCATION_SRAM = 7  # nvmlMemoryLocation_t, Turing+
_TEMP_GPU = 0  # NVML_TEMPERATURE_GPU
_THRESHOLD_SHUTDOWN, _THRESHOLD_SLOWDOWN, _THRESHOLD_GPU_MAX = 0, 1, 3
_CLOCK_SM = 1
_RETIRE_SBE, _RETIRE_DBE = 0, 1  # nvmlPageRetirementCause_t

_REQUIRED_TOP = {
    "kind": str,
    "version": int,
    "synthetic": bool,
    "source": str,
    "host": str,
    "captured_at": str,
    "nvml": dict,
    "driver_version": (str, type(None)),
    "cuda_driver_version": (str, type(None)),
    "nvml_version": (str, type(None)),
    "pci_nvidia_devices": list,
    "gpus": list,
}


class SnapshotError(Exception):
    """A file that is not a usable snapshot. The message is one line."""


# -- collecting -----------------------------------------------------------------------------------
def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def collect_snapshot(sysfs_root: str | os.PathLike[str] = Path("/sys"), *, timeout_s: float | None = None) -> dict[str, Any]:
    """Read NVML and sysfs into a snapshot. Never raises for NVML trouble: a broken driver gives a
    valid snapshot with nvml.ok false. With `timeout_s`, NVML is read in a helper thread and a
    driver that does not answer in time gives nvml.ok false, kind "other" (a stuck driver call
    cannot be interrupted; the thread is left behind as a daemon)."""
    snap = _base(sysfs_root)
    if timeout_s is None:
        _fill_nvml(snap)
        return snap
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            part = dict(snap)
            _fill_nvml(part)
            box["snap"] = part
        except BaseException as e:  # noqa: BLE001 - reported below, never lost
            box["exc"] = e

    th = threading.Thread(target=work, name="gpucheck-nvml-read", daemon=True)
    th.start()
    th.join(timeout_s)
    if "snap" in box:
        return box["snap"]
    if "exc" in box:
        raise box["exc"]
    snap["nvml"] = {
        "ok": False,
        "error": {"kind": N.OTHER, "message": f"NVML did not answer within {timeout_s:g} s (stuck driver call?)"},
    }
    return snap


def unreadable_snapshot(kind: str, message: str, sysfs_root: str | os.PathLike[str] = Path("/sys")) -> dict[str, Any]:
    """A valid snapshot for a node whose NVML could not be read at all (a hung driver, a reader
    crash): nvml.ok false with this failure, and the PCI bus from sysfs so that the inventory
    check can still tell a broken GPU node from a machine without GPUs."""
    if kind not in N.KINDS:
        kind, message = N.OTHER, f"{kind}: {message}"
    snap = _base(sysfs_root)
    snap["nvml"] = {"ok": False, "error": {"kind": kind, "message": message}}
    return snap


def _base(sysfs_root: str | os.PathLike[str]) -> dict[str, Any]:
    return {
        "kind": KIND,
        "version": VERSION,
        "synthetic": False,
        "source": f"live: gpucheck {__version__} collect_snapshot (NVML via nvidia-ml-py, sysfs {os.fspath(sysfs_root)})",
        "host": socket.gethostname(),
        "captured_at": utc_now_iso(),
        "gpucheck_version": __version__,
        "nvml": {"ok": False, "error": None},
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "pci_nvidia_devices": nvidia_pci_devices(sysfs_root),
        "gpus": [],
    }


def _fill_nvml(snap: dict[str, Any]) -> None:
    with N.NvmlSession() as s:
        if not s.ok:
            snap["nvml"] = {"ok": False, "error": s.error.to_dict() if s.error else None}
            return
        count, err = s.read("nvmlDeviceGetCount")
        if err is not None:
            snap["nvml"] = {"ok": False, "error": err.to_dict()}
            return
        snap["nvml"] = {"ok": True, "error": None}
        snap["driver_version"] = s.driver_version()
        snap["cuda_driver_version"] = s.cuda_driver_version()
        snap["nvml_version"] = s.nvml_version()
        snap["gpus"] = [read_gpu(s, i) for i in range(int(count))]


class _Gone(Exception):
    def __init__(self, failure: N.NvmlFailure):
        super().__init__(str(failure))
        self.failure = failure


_STATE_OF_KIND = {N.GPU_LOST: "lost", N.RESET_REQUIRED: "reset_required"}


def empty_gpu(index: int) -> dict[str, Any]:
    """A GPU entry with every field present and unread (None)."""
    return {
        "index": index,
        "state": "ok",
        "error": None,
        "uuid": None,
        "name": None,
        "serial": None,
        "pci_bus_id": None,
        "pci_device_id": None,
        "architecture": None,
        "architecture_id": None,
        "persistence_mode": None,
        "ecc_mode": {"current": None, "pending": None},
        "mig_mode": {"current": None, "pending": None},
        "ecc_errors": {
            "volatile_corrected": None,
            "volatile_uncorrected": None,
            "aggregate_corrected": None,
            "aggregate_uncorrected": None,
            "sram_volatile_uncorrected": None,
            "sram_aggregate_uncorrected": None,
            "sram_threshold_exceeded": None,
        },
        "remapped_rows": {"correctable": None, "uncorrectable": None, "pending": None, "failure": None},
        "retired_pages": {"single_bit": None, "double_bit": None, "pending": None},
        "temperature": {"gpu_c": None, "slowdown_c": None, "shutdown_c": None, "gpu_max_c": None},
        "clocks": {"sm_mhz": None, "sm_max_mhz": None, "throttle_reasons": None, "throttle_reason_names": None},
        "power": {"usage_w": None, "limit_w": None},
        "pcie": {
            "link_gen": None,
            "link_gen_max": None,
            "link_gen_gpu_max": None,
            "link_width": None,
            "link_width_max": None,
            "replay_counter": None,
        },
        "nvlink": {"supported": None, "links": []},
        "recovery_action": None,
        "recovery_action_name": None,
        "errors": {},
    }


def read_gpu(s: N.NvmlSession, index: int) -> dict[str, Any]:
    g = empty_gpu(index)
    errors: dict[str, str] = g["errors"]
    try:
        h = s.handle(index)
    except N.NvmlCallError as e:
        g["state"] = _STATE_OF_KIND.get(e.failure.kind, "error")
        g["error"] = e.failure.to_dict()
        return g

    def rd(field: str, name: str, *args: Any, newer_enum: bool = False) -> Any:
        """One read. `newer_enum`: the call passes an enum value older drivers may not know
        (they answer INVALID_ARGUMENT), which means not supported by this driver."""
        v, err = s.read(name, *args)
        if err is None:
            return v
        if err.kind in _STATE_OF_KIND:
            raise _Gone(err)
        if newer_enum and err.code == N.NVML_ERROR_INVALID_ARGUMENT:
            return None
        if err.kind != N.NOT_SUPPORTED:
            errors[field] = err.kind
        return None

    sections = (
        (lambda: _read_identity(g, rd, h), ("uuid", "name", "serial", "pci_bus_id", "architecture")),
        (lambda: _read_modes(g, rd, h), ("persistence_mode", "ecc_mode", "mig_mode")),
        (lambda: _read_memory(g, rd, h, s), ("ecc_errors", "remapped_rows", "retired_pages")),
        (lambda: _read_thermal_clocks(g, rd, h, s, errors), ("temperature", "clocks", "power")),
        (lambda: _read_pcie(g, rd, h), ("pcie",)),
        (lambda: _read_fields_and_nvlink(g, rd, h, s, errors), ("recovery_action", "nvlink")),
    )
    try:
        for read_section, fields in sections:
            try:
                read_section()
            except (_Gone, KeyboardInterrupt):
                raise
            except Exception:  # noqa: BLE001 - an answer the reader did not expect is a failed read
                _unread_after_crash(g, fields)
    except _Gone as e:
        g["state"] = _STATE_OF_KIND[e.failure.kind]
        g["error"] = e.failure.to_dict()
    return g


_READ_WHOLE = ("ecc_mode", "mig_mode", "remapped_rows")  # groups read by one NVML call: one field in `errors`


def _unread_after_crash(g: dict[str, Any], fields: tuple[str, ...]) -> None:
    """A section of the reader raised (an NVML binding that answered something unexpected):
    every field of it still unread is a failed read (kind other), never "not supported"."""
    errors: dict[str, str] = g["errors"]
    for name in fields:
        value = g.get(name)
        if name in _READ_WHOLE:
            if all(v is None for v in value.values()):
                errors.setdefault(name, N.OTHER)
        elif isinstance(value, dict) and name != "nvlink":
            for key, v in value.items():
                if v is None and not key.endswith("_names"):
                    errors.setdefault(f"{name}.{key}", N.OTHER)
        elif name == "nvlink" and not g["nvlink"].get("links"):
            errors.setdefault("nvlink", N.OTHER)
        elif value is None:
            errors.setdefault(name, N.OTHER)


def _read_identity(g: dict[str, Any], rd: Any, h: Any) -> None:
    v = rd("uuid", "nvmlDeviceGetUUID", h)
    g["uuid"] = None if v is None else N.text(v)
    v = rd("name", "nvmlDeviceGetName", h)
    g["name"] = None if v is None else N.text(v)
    v = rd("serial", "nvmlDeviceGetSerial", h)
    g["serial"] = None if v is None else N.text(v)
    pci = rd("pci_bus_id", "nvmlDeviceGetPciInfo", h)
    if pci is not None:
        bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
        g["pci_bus_id"] = normalize_bus_id(N.text(bus)) if bus is not None else None
        if g["pci_bus_id"] is None:  # NVML answered, but with no PCI address we can read
            g["errors"]["pci_bus_id"] = N.OTHER
        dev_id = getattr(pci, "pciDeviceId", None)
        if isinstance(dev_id, int):
            g["pci_device_id"] = f"{(dev_id >> 16) & 0xFFFF:#06x}"
    arch = rd("architecture", "nvmlDeviceGetArchitecture", h)
    if arch is not None:
        g["architecture_id"] = int(arch)
        g["architecture"] = ARCHITECTURES.get(int(arch), "unknown")


def _read_modes(g: dict[str, Any], rd: Any, h: Any) -> None:
    v = rd("persistence_mode", "nvmlDeviceGetPersistenceMode", h)
    g["persistence_mode"] = None if v is None else bool(v)
    v = rd("ecc_mode", "nvmlDeviceGetEccMode", h)
    if v is not None:
        g["ecc_mode"] = {"current": bool(v[0]), "pending": bool(v[1])}
    v = rd("mig_mode", "nvmlDeviceGetMigMode", h)
    if v is not None:
        g["mig_mode"] = {"current": bool(v[0]), "pending": bool(v[1])}


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _read_memory(g: dict[str, Any], rd: Any, h: Any, s: N.NvmlSession) -> None:
    e = g["ecc_errors"]
    e["volatile_uncorrected"] = _int(rd("ecc_errors.volatile_uncorrected", "nvmlDeviceGetTotalEccErrors", h, _UNCORRECTED, _VOLATILE))
    e["volatile_corrected"] = _int(rd("ecc_errors.volatile_corrected", "nvmlDeviceGetTotalEccErrors", h, _CORRECTED, _VOLATILE))
    e["aggregate_uncorrected"] = _int(rd("ecc_errors.aggregate_uncorrected", "nvmlDeviceGetTotalEccErrors", h, _UNCORRECTED, _AGGREGATE))
    e["aggregate_corrected"] = _int(rd("ecc_errors.aggregate_corrected", "nvmlDeviceGetTotalEccErrors", h, _CORRECTED, _AGGREGATE))
    e["sram_volatile_uncorrected"] = _int(rd("ecc_errors.sram_volatile_uncorrected", "nvmlDeviceGetMemoryErrorCounter",
                                             h, _UNCORRECTED, _VOLATILE, _LOCATION_SRAM, newer_enum=True))
    e["sram_aggregate_uncorrected"] = _int(rd("ecc_errors.sram_aggregate_uncorrected", "nvmlDeviceGetMemoryErrorCounter",
                                              h, _UNCORRECTED, _AGGREGATE, _LOCATION_SRAM, newer_enum=True))
    # SRAM status (R550+, needs root): the field-diag RMA threshold flag, and the SRAM counters
    # where the location-based counter is not supported.
    status_cls = s.constant("c_nvmlEccSramErrorStatus_v1_t", None)
    if status_cls is not None:
        st = status_cls()
        if rd("ecc_errors.sram_threshold_exceeded", "nvmlDeviceGetSramEccErrorStatus", h, ctypes.byref(st)) is not None:
            e["sram_threshold_exceeded"] = bool(st.bThresholdExceeded)
            # Where the location-based counter gave nothing, the status has it: read after all.
            if e["sram_volatile_uncorrected"] is None:
                e["sram_volatile_uncorrected"] = int(st.volatileUncParity) + int(st.volatileUncSecDed)
                g["errors"].pop("ecc_errors.sram_volatile_uncorrected", None)
            if e["sram_aggregate_uncorrected"] is None:
                e["sram_aggregate_uncorrected"] = int(st.aggregateUncParity) + int(st.aggregateUncSecDed)
                g["errors"].pop("ecc_errors.sram_aggregate_uncorrected", None)

    v = rd("remapped_rows", "nvmlDeviceGetRemappedRows", h)
    if v is not None:
        corr, unc, pending, failure = v
        g["remapped_rows"] = {"correctable": int(corr), "uncorrectable": int(unc), "pending": bool(pending), "failure": bool(failure)}

    sbe = rd("retired_pages.single_bit", "nvmlDeviceGetRetiredPages", h, _RETIRE_SBE)
    dbe = rd("retired_pages.double_bit", "nvmlDeviceGetRetiredPages", h, _RETIRE_DBE)
    pend = rd("retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
    g["retired_pages"] = {
        "single_bit": None if sbe is None else len(sbe),
        "double_bit": None if dbe is None else len(dbe),
        "pending": None if pend is None else bool(pend),
    }


def _read_thermal_clocks(g: dict[str, Any], rd: Any, h: Any, s: N.NvmlSession, errors: dict[str, str]) -> None:
    t = g["temperature"]
    t["gpu_c"] = _int(rd("temperature.gpu_c", "nvmlDeviceGetTemperature", h, _TEMP_GPU))
    t["slowdown_c"] = _int(rd("temperature.slowdown_c", "nvmlDeviceGetTemperatureThreshold", h, _THRESHOLD_SLOWDOWN))
    t["shutdown_c"] = _int(rd("temperature.shutdown_c", "nvmlDeviceGetTemperatureThreshold", h, _THRESHOLD_SHUTDOWN))
    t["gpu_max_c"] = _int(rd("temperature.gpu_max_c", "nvmlDeviceGetTemperatureThreshold", h, _THRESHOLD_GPU_MAX,
                             newer_enum=True))
    c = g["clocks"]
    c["sm_mhz"] = _int(rd("clocks.sm_mhz", "nvmlDeviceGetClockInfo", h, _CLOCK_SM))
    c["sm_max_mhz"] = _int(rd("clocks.sm_max_mhz", "nvmlDeviceGetMaxClockInfo", h, _CLOCK_SM))
    mask = rd("clocks.throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None and "clocks.throttle_reasons" not in errors:  # not supported: pre-R535 name
        mask = rd("clocks.throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", h)
    c["throttle_reasons"] = _int(mask)
    c["throttle_reason_names"] = None if mask is None else reason_names(int(mask))
    p = g["power"]
    mw = rd("power.usage_w", "nvmlDeviceGetPowerUsage", h)
    p["usage_w"] = None if mw is None else round(int(mw) / 1000.0, 3)
    mw = rd("power.limit_w", "nvmlDeviceGetEnforcedPowerLimit", h)
    p["limit_w"] = None if mw is None else round(int(mw) / 1000.0, 3)


def _read_pcie(g: dict[str, Any], rd: Any, h: Any) -> None:
    p = g["pcie"]
    p["link_gen"] = _int(rd("pcie.link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h))
    p["link_gen_max"] = _int(rd("pcie.link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h))
    p["link_gen_gpu_max"] = _int(rd("pcie.link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration", h))
    p["link_width"] = _int(rd("pcie.link_width", "nvmlDeviceGetCurrPcieLinkWidth", h))
    p["link_width_max"] = _int(rd("pcie.link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", h))
    p["replay_counter"] = _int(rd("pcie.replay_counter", "nvmlDeviceGetPcieReplayCounter", h))


def _read_fields_and_nvlink(g: dict[str, Any], rd: Any, h: Any, s: N.NvmlSession, errors: dict[str, str]) -> None:
    link_count: int | None = None
    try:
        vals = s.field_values(h, [FI_NVLINK_LINK_COUNT, FI_GPU_RECOVERY_ACTION])
    except N.NvmlCallError as e:
        if e.failure.kind in _STATE_OF_KIND:
            raise _Gone(e.failure) from None
        if e.failure.kind != N.NOT_SUPPORTED:
            errors["recovery_action"] = e.failure.kind
            errors["nvlink.link_count"] = e.failure.kind
        vals = [(None, None), (None, None)]
    (lc, lc_err), (ra, ra_err) = vals
    for field, err in (("nvlink.link_count", lc_err), ("recovery_action", ra_err)):
        if err is not None and err.kind in _STATE_OF_KIND:
            raise _Gone(err)
        if err is not None and err.kind != N.NOT_SUPPORTED:
            errors[field] = err.kind
    if ra is not None:
        g["recovery_action"] = int(ra)
        g["recovery_action_name"] = RECOVERY_ACTIONS.get(int(ra), "unknown")
    if lc is not None:
        link_count = int(lc)
    _read_nvlink(g, h, s, errors, link_count)


def _read_nvlink(g: dict[str, Any], h: Any, s: N.NvmlSession, errors: dict[str, str], link_count: int | None) -> None:
    links: list[dict[str, Any]] = []
    failed = False
    probe = link_count is None
    for link in range(link_count if link_count is not None else NVLINK_MAX_LINKS):
        state, err = s.read("nvmlDeviceGetNvLinkState", h, link)
        if err is not None:
            if err.kind in _STATE_OF_KIND:
                raise _Gone(err)
            if probe and err.code == N.NVML_ERROR_INVALID_ARGUMENT:
                break  # past this GPU's last link
            if err.kind == N.NOT_SUPPORTED:
                if probe:
                    continue
                links.append({"link": link, "state": None, **{k: None for k in NVLINK_COUNTERS}})
                continue
            errors[f"nvlink.links[{link}].state"] = err.kind
            failed = True
            continue
        entry: dict[str, Any] = {"link": link, "state": NVLINK_STATES.get(int(state), f"unknown_{int(state)}")}
        for key, counter in NVLINK_COUNTERS.items():
            v, cerr = s.read("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
            if cerr is not None:
                if cerr.kind in _STATE_OF_KIND:
                    raise _Gone(cerr)
                if cerr.kind != N.NOT_SUPPORTED:
                    errors[f"nvlink.links[{link}].{key}"] = cerr.kind
            entry[key] = _int(v)
        links.append(entry)
    judged = [lk for lk in links if lk["state"] is not None]
    if judged:
        supported: bool | None = True
    elif failed:
        supported = None
    else:
        supported = False
    g["nvlink"] = {"supported": supported, "links": links if supported else []}


# -- loading and writing --------------------------------------------------------------------------
def dump_snapshot(snap: dict[str, Any]) -> str:
    return json.dumps(snap, indent=2) + "\n"


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a snapshot file ("-": standard input); an `nvidia-smi -q` or `-q -x`
    capture is converted (gpucheck.telemetry.nvsmi). SnapshotError (one line) when it is neither."""
    from .. import safeio
    from . import nvsmi

    p = "standard input" if str(path) == "-" else str(Path(path))
    try:  # a regular file of at most safeio.LIMITS["snapshot"] bytes (or "-", standard input)
        raw = nvsmi.read_text(path)
    except FileNotFoundError:
        raise SnapshotError(f"{p}: no such file") from None
    except OSError as e:
        raise SnapshotError(f"{p}: cannot read: {safeio.describe_error(e, p)}") from None
    except UnicodeDecodeError as e:
        raise SnapshotError(f"{p}: cannot read: {e}") from None
    if nvsmi.detect(raw) is not None:  # nvidia-smi -q or -q -x: converted (docs/snapshot.md)
        try:
            doc = nvsmi.convert(raw, p)
        except nvsmi.CaptureError as e:
            raise SnapshotError(str(e) if str(e).startswith(p) else f"{p}: {e}") from None
    else:
        try:
            doc = safeio.loads_json(raw)
        except ValueError as e:
            raise SnapshotError(f"{p}: neither a gpucheck snapshot nor an nvidia-smi -q capture (not JSON: {e})") from None
    validate_snapshot(doc, p)
    return doc


def validate_snapshot(doc: Any, where: str = "snapshot") -> None:
    if not isinstance(doc, dict):
        raise SnapshotError(f"{where}: not a gpucheck snapshot (a JSON object is expected, got {type(doc).__name__})")
    if doc.get("kind") != KIND:
        raise SnapshotError(f"{where}: not a gpucheck snapshot (kind is {doc.get('kind')!r}, expected {KIND!r})")
    if doc.get("version") != VERSION:
        raise SnapshotError(f"{where}: unsupported snapshot version {doc.get('version')!r} (this gpucheck reads version {VERSION})")
    missing = [k for k in _REQUIRED_TOP if k not in doc]
    if missing:
        raise SnapshotError(f"{where}: snapshot is missing {', '.join(missing)}")
    for key, typ in _REQUIRED_TOP.items():
        if not isinstance(doc[key], typ) or (typ is int and isinstance(doc[key], bool)):
            raise SnapshotError(f"{where}: snapshot field {key!r} has the wrong type ({type(doc[key]).__name__})")
    nv = doc["nvml"]
    if not isinstance(nv.get("ok"), bool):
        raise SnapshotError(f"{where}: nvml.ok must be true or false")
    err = nv.get("error")
    if err is not None:
        if not isinstance(err, dict) or err.get("kind") not in N.KINDS or not isinstance(err.get("message"), str):
            raise SnapshotError(f"{where}: nvml.error must be null or {{kind: one of {', '.join(N.KINDS)}, message}}")
    if not nv["ok"] and err is None:
        raise SnapshotError(f"{where}: nvml.ok is false but nvml.error says nothing")
    if "kernel_log" in doc and not isinstance(doc["kernel_log"], (dict, type(None))):
        raise SnapshotError(f"{where}: kernel_log must be an object or null")
    for i, d in enumerate(doc["pci_nvidia_devices"]):
        if not isinstance(d, dict) or not isinstance(d.get("bus_id"), str):
            raise SnapshotError(f"{where}: pci_nvidia_devices[{i}] needs a bus_id")
    seen: set[int] = set()
    for i, g in enumerate(doc["gpus"]):
        if not isinstance(g, dict):
            raise SnapshotError(f"{where}: gpus[{i}] is not an object")
        idx = g.get("index")
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            raise SnapshotError(f"{where}: gpus[{i}] needs a non-negative integer index")
        if idx in seen:
            raise SnapshotError(f"{where}: gpus[{i}]: index {idx} appears twice")
        seen.add(idx)
        if g.get("state", "ok") not in GPU_STATES:
            raise SnapshotError(f"{where}: gpus[{i}].state must be one of {', '.join(GPU_STATES)}")
        if not isinstance(g.get("errors", {}), dict):
            raise SnapshotError(f"{where}: gpus[{i}].errors must be an object")


def snapshot_epoch(snap: dict[str, Any]) -> float | None:
    """captured_at as seconds since the epoch (None when it does not parse)."""
    return parse_time(snap.get("captured_at"))


def parse_time(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
