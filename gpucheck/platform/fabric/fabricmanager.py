"""NVIDIA Fabric Manager: its systemd service state and its log, as plain data.

`read_fabric_manager(...)` records what the check judges, live: the output of `systemctl show -p
ActiveState,SubState,Result,LoadState nvidia-fabricmanager`, the newest lines of
/var/log/fabricmanager.log, and the NVSwitches on the PCI bus (NVIDIA class 0x0680). A snapshot
keeps the texts (`fabric_manager`); `parse_service_state` and `parse_fm_log` read them, live and
replayed alike, and read a pasted Fabric Manager log or `journalctl -u nvidia-fabricmanager`
excerpt (`gpucheck judge`).

Log forms: FM's own ``[Dec 19 2024 19:17:49] [ERROR] [tid 1374] message`` and the journal's
``Jan 05 14:45:28 host nv-fabricmanager[1120]: message``. A line whose time cannot be read (a
localized month) has time None: unknown, never old.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..kernlog.timeparse import parse_prefix
from .aer import role_of

SERVICE = "nvidia-fabricmanager"
LOG_PATH = "/var/log/fabricmanager.log"
SERVICE_PROPERTIES = ("ActiveState", "SubState", "Result", "LoadState")
MAX_LOG_BYTES = 4 << 20  # the newest 4 MiB of the log
MAX_LOG_LINES = 20000


class ServiceRecord(TypedDict):
    """`systemctl show` output as recorded (text), or why it could not be read."""

    text: str | None
    error: str | None


class LogRecord(TypedDict):
    """The newest lines of the Fabric Manager log, or why they could not be read (`missing`:
    no file at the path)."""

    path: str
    lines: list[str]
    error: str | None
    missing: bool


class FabricManagerRecord(TypedDict):
    """The snapshot's `fabric_manager`: service, log, and the NVSwitches on the PCI bus (None:
    not known, as in a pasted log)."""

    service: ServiceRecord | None
    log: LogRecord | None
    nvswitch_devices: list[str] | None


class ServiceState(TypedDict):
    active_state: str | None
    sub_state: str | None
    result: str | None
    load_state: str | None


# -- reading ----------------------------------------------------------------------------------------


def read_service(timeout_s: float = 5.0) -> ServiceRecord:
    """`systemctl show -p ... nvidia-fabricmanager`; never raises."""
    argv = ["systemctl", "show", "-p", ",".join(SERVICE_PROPERTIES), SERVICE]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return {"text": None, "error": "systemctl not found (no systemd here?)"}
    except subprocess.TimeoutExpired:
        return {"text": None, "error": f"systemctl show did not answer within {timeout_s:g} s"}
    except OSError as e:
        return {"text": None, "error": f"cannot run systemctl: {e}"}
    if proc.returncode != 0 or not proc.stdout.strip():
        why = (proc.stderr or proc.stdout).strip().splitlines()
        return {"text": None, "error": f"systemctl show exited {proc.returncode}: {why[0] if why else 'no output'}"}
    return {"text": proc.stdout, "error": None}


def read_log(path: str = LOG_PATH, max_bytes: int = MAX_LOG_BYTES, max_lines: int = MAX_LOG_LINES) -> LogRecord:
    """The newest lines of the log (its last `max_bytes`, whole lines); never raises."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except FileNotFoundError:
        return {"path": path, "lines": [], "error": None, "missing": True}
    except OSError as e:
        return {"path": path, "lines": [], "error": f"cannot read {path}: {e.strerror or e}", "missing": False}
    if size > max_bytes:
        data = data[data.find(b"\n") + 1:]
    lines = data.decode("utf-8", "replace").splitlines()
    return {"path": path, "lines": lines[-max_lines:], "error": None, "missing": False}


def nvswitch_devices(sysfs_root: str | os.PathLike[str] = "/sys") -> list[str] | None:
    """Bus ids of the NVSwitches on the PCI bus (None: the bus cannot be listed)."""
    base = Path(sysfs_root) / "bus" / "pci" / "devices"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return None
    out = []
    for name in names:
        try:
            vendor = int((base / name / "vendor").read_text().strip(), 16)
            cls = int((base / name / "class").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if role_of(vendor, cls) == "nvswitch":
            out.append(name)
    return out


def read_fabric_manager(sysfs_root: str | os.PathLike[str] = "/sys", log_path: str = LOG_PATH,
                        timeout_s: float = 5.0) -> FabricManagerRecord:
    """The service, the log and the NVSwitches of this node."""
    return {"service": read_service(timeout_s), "log": read_log(log_path),
            "nvswitch_devices": nvswitch_devices(sysfs_root)}


# -- parsing ----------------------------------------------------------------------------------------


def parse_service_state(text: str) -> ServiceState:
    """`Key=Value` lines of `systemctl show` -> the four properties (None where absent). Raises
    ValueError for text that holds none of them."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    found: ServiceState = {"active_state": values.get("ActiveState"), "sub_state": values.get("SubState"),
                           "result": values.get("Result"), "load_state": values.get("LoadState")}
    if all(v is None for v in found.values()):
        raise ValueError(f"not systemctl show output: {text.strip()[:80]!r}")
    return found


@dataclass(frozen=True)
class FmEvent:
    """One Fabric Manager log line that matters: its kind, time (None: unknown), the NVSwitch
    (bus id) and port it names, the error number, the line."""

    kind: str
    time: float | None
    switch: str | None
    port: int | None
    code: int | None
    line: str


# kind -> pattern; the first that matches names the line. Order matters (fatal before error).
FM_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("nothing_to_do", re.compile(r"NV_WARN_NOTHING_TO_DO")),
    ("nvswitch_fatal", re.compile(r"detected NVSwitch fatal error (?P<code>\d+)", re.I)),
    ("nvswitch_nonfatal", re.compile(r"detected NVSwitch non-fatal error (?P<code>\d+)", re.I)),
    ("start_failed", re.compile(r'fabricmanager.*" failed! Exit code|nvidia-fabricmanager\.service: (?:Control process '
                                r'exited, code=exited, status=[1-9]|Failed with result)|Job for nvidia-fabricmanager'
                                r'\.service failed')),
    ("configured", re.compile(r"Successfully configured all the available NVSwitches")),
    ("started", re.compile(r'Started "Nvidia Fabric Manager"|Fabric Manager version \S+ is running')),
    ("stopped", re.compile(r'Stopped "Nvidia Fabric Manager"')),
    ("error", re.compile(r"\[ERROR\]|\[FATAL\]")),
)
_FM_STAMP_RE = re.compile(r"^\[(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<year>\d{4}) (?P<hms>\d\d:\d\d:\d\d)\] ")
_SWITCH_RE = re.compile(r"pci bus id (?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?:.*? port (?P<port>\d+))?")


def _fm_time(line: str) -> float | None:
    m = _FM_STAMP_RE.match(line)
    if m is None:
        return parse_prefix(line).epoch  # the journal's forms (a BSD stamp: year inferred)
    try:
        return time.mktime(time.strptime(f"{m['mon']} {m['day']} {m['year']} {m['hms']}", "%b %d %Y %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def parse_fm_log(lines: list[str]) -> list[FmEvent]:
    """The lines of a Fabric Manager log (or its journal) that matter, in order."""
    out: list[FmEvent] = []
    for line in lines:
        for kind, pattern in FM_PATTERNS:
            m = pattern.search(line)
            if m is None:
                continue
            sw = _SWITCH_RE.search(line)
            bus = sw.group("bus").lower()[-12:] if sw else None
            code = m.groupdict().get("code")
            out.append(FmEvent(kind, _fm_time(line), bus, int(sw.group("port")) if sw and sw.group("port") else None,
                               int(code) if code else None, line.strip()))
            break
    return out
