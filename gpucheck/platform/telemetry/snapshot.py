"""Snapshots: everything the level-1 checks judge, read once, as plain JSON data.

`collect_snapshot()` reads NVML (through gpucheck.platform.telemetry.nvml, the only NVML caller, and the
GPU reader gpucheck.platform.telemetry.reader) and sysfs; `load_snapshot(path)` reads a recorded one back
(a capture from `gpucheck telemetry dump`, or a synthetic test fixture) and validates it; a
recorded snapshot is judged after it is replayed through the same reader
(gpucheck.platform.telemetry.replay); `dump_snapshot(snap)` is its JSON text. Reading is separate from
judging: checks never call NVML, they look at `ctx.snapshot`.

The format is documented field by field in docs/snapshot.md, and typed in
gpucheck.platform.telemetry.model. Rules that hold everywhere:
- a value NVML does not support on this GPU/driver is None (never 0, never "healthy");
- a read that failed for another reason is None too, and the GPU's "errors" map names the field
  and the failure kind (no_permission, other, not_in_capture, ...);
- a GPU that NVML reports lost / reset-required stops being read: its "state" says so and its
  "error" holds NVML's message.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ... import __version__
from ..net.record import collect_net, validate_net
from . import nvml as N
from .model import GPU_STATES, KIND, VERSION, Snapshot
from .reader import read_gpu
from .sysfs import nvidia_pci_devices

__all__ = ["SnapshotError", "collect_snapshot", "unreadable_snapshot", "read_nvml", "dump_snapshot", "load_snapshot",
           "validate_snapshot", "snapshot_epoch", "parse_time"]

_REQUIRED_TOP: dict[str, type | tuple[type, ...]] = {
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


def collect_snapshot(sysfs_root: str | os.PathLike[str] = Path("/sys"), *, timeout_s: float | None = None) -> Snapshot:
    """Read NVML and sysfs into a snapshot. Never raises for NVML trouble: a broken driver gives a
    valid snapshot with nvml.ok false. With `timeout_s`, NVML is read in a helper thread and a
    driver that does not answer in time gives nvml.ok false, kind "timeout" (a stuck driver call
    cannot be interrupted: the thread is left behind as a daemon, which cannot hold the process's
    exit, and NVML is not shut down at exit while it is stuck: nvml.Library.abandon)."""
    snap = _base(sysfs_root)
    if timeout_s is None:
        _fill_nvml(snap)
        return snap
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            part: Snapshot = {**snap}
            _fill_nvml(part)
            box["snap"] = part
        except BaseException as e:  # noqa: BLE001 - reported below, never lost
            box["exc"] = e

    th = threading.Thread(target=work, name="gpucheck-nvml-read", daemon=True)
    th.start()
    th.join(timeout_s)
    if "snap" in box:
        done: Snapshot = box["snap"]
        return done
    if "exc" in box:
        raise box["exc"]
    N.live_library().abandon(th)
    snap["nvml"] = {
        "ok": False,
        "error": {"kind": N.TIMEOUT, "message": f"NVML did not answer within {timeout_s:g} s (stuck driver call?)"},
    }
    return snap


def unreadable_snapshot(kind: str, message: str, sysfs_root: str | os.PathLike[str] = Path("/sys")) -> Snapshot:
    """A valid snapshot for a node whose NVML could not be read at all (a hung driver, a reader
    crash): nvml.ok false with this failure, and the PCI bus from sysfs so that the inventory
    check can still tell a broken GPU node from a machine without GPUs."""
    return unread(_base(sysfs_root), kind, message)


def unread(snap: Snapshot, kind: str, message: str) -> Snapshot:
    """`snap` with NVML marked unreadable (kind, message) and no GPU entries."""
    if kind not in N.KINDS:
        kind, message = N.OTHER, f"{kind}: {message}"
    snap["nvml"] = {"ok": False, "error": {"kind": kind, "message": message}}
    snap["gpus"] = []
    return snap


def _base(sysfs_root: str | os.PathLike[str]) -> Snapshot:
    pci = nvidia_pci_devices(sysfs_root)
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
        "pci_nvidia_devices": pci,
        "gpus": [],
        "net": collect_net(sysfs_root, [d["bus_id"] for d in pci]),
    }


def _fill_nvml(snap: Snapshot) -> None:
    with N.NvmlSession() as s:
        read_nvml(snap, s)


def read_nvml(snap: Snapshot, s: N.NvmlSession, indices: Iterable[int] | None = None) -> None:
    """Fill `snap`'s NVML part from session `s`: the system versions and every GPU (`indices`:
    which GPUs a replay recorded; live, 0..nvmlDeviceGetCount-1)."""
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
    snap["gpus"] = [read_gpu(s, i) for i in (range(int(count)) if indices is None else indices)]


# -- loading and writing --------------------------------------------------------------------------
def dump_snapshot(snap: Snapshot | dict[str, Any]) -> str:
    return json.dumps(snap, indent=2) + "\n"


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read and validate a snapshot file ("-": standard input); an `nvidia-smi -q` or `-q -x`
    capture is converted (gpucheck.platform.telemetry.nvsmi). SnapshotError (one line) when it is neither."""
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
    return snapshot_from_text(raw, p)


def snapshot_from_text(raw: str, p: str) -> Snapshot:
    """The snapshot a file's text (named `p` in messages) holds: snapshot JSON, validated, or an
    nvidia-smi capture, converted. SnapshotError (one line) when it is neither."""
    from .. import safeio
    from . import nvsmi

    doc: Any
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
    loaded: Snapshot = doc
    return loaded


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
    _validate_fabric_keys(doc, where)
    if "net" in doc and (why := validate_net(doc["net"], where)):
        raise SnapshotError(why)
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


def _list_of(value: Any, typ: type) -> bool:
    return isinstance(value, list) and all(isinstance(x, typ) for x in value)


def _validate_fabric_keys(doc: dict[str, Any], where: str) -> None:
    """The optional `pcie_aer` and `fabric_manager` keys (platform.fabric): their types when present."""
    aer = doc.get("pcie_aer")
    if aer is not None:
        if not isinstance(aer, dict) or not isinstance(aer.get("devices"), list) \
                or not all(isinstance(d, dict) and isinstance(d.get("bus_id"), str) and isinstance(d.get("aer"), dict)
                           for d in aer["devices"]) \
                or not (aer.get("lspci") is None or _list_of(aer.get("lspci"), str)):
            raise SnapshotError(f"{where}: pcie_aer must be null or {{source, error, devices: [{{bus_id, aer, ...}}], "
                                "lspci: [lines] | null}")
    fm = doc.get("fabric_manager")
    if fm is not None:
        svc, log, switches = (fm.get(k) if isinstance(fm, dict) else None for k in ("service", "log", "nvswitch_devices"))
        if not isinstance(fm, dict) or not (svc is None or isinstance(svc, dict)) \
                or not (log is None or (isinstance(log, dict) and _list_of(log.get("lines"), str))) \
                or not (switches is None or _list_of(switches, str)):
            raise SnapshotError(f"{where}: fabric_manager must be null or {{service: {{text, error}} | null, "
                                "log: {path, lines: [str], error, missing} | null, nvswitch_devices: [str] | null}")


def snapshot_epoch(snap: Snapshot | dict[str, Any]) -> float | None:
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
