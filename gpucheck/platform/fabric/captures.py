"""The capture kinds of the fabric readers, for `gpucheck judge` (its capture-kind table takes the
rows of FABRIC_CAPTURE_KINDS): each is (name, detect(head_bytes, path) -> bool, read(path) ->
a snapshot fragment). The fragments hold the same keys a `gpucheck telemetry dump` records, so
that pcie.aer and fabric.nvswitch judge a pasted capture with the parsers they judge a node with:

    lspci -vvv (or plain lspci)            {"pcie_aer": {"source": "lspci", "lspci": [lines], ...}}
    Fabric Manager log / its journal       {"fabric_manager": {"log": {...}, "service": None, "nvswitch_devices": None}}
    systemctl show nvidia-fabricmanager    {"fabric_manager": {"service": {"text": ...}, "log": None, ...}}
    nvidia-smi -q Fabric sections alone    {"gpus": [{"index": i, "fabric": {...}}]} (a grep or a paste of
                                           the sections; a whole nvidia-smi -q capture is the nvsmi kind)

Fragments of several files add up key by key (`fabric_manager` of a log and of a service state
merge: the judge's assembly). The kernel-log AER lines need no kind of their own: a kernel log's
`kernel_log` holds them (the line filter keeps kernlog.aer.AER_NEEDLES).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from .nvmlfabric import parse_nvsmi_fabric

_LSPCI_HEAD_RE = re.compile(rb"(?m)^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] [A-Za-z][^:\n]{2,60}: ")
_FM_LOG_RE = re.compile(rb"(?m)^\[[A-Z][a-z]{2} +\d{1,2} \d{4} \d\d:\d\d:\d\d\] \[(?:INFO|ERROR|WARNING|FATAL|DEBUG)\] "
                        rb"\[tid \d+\] |nv-fabricmanager\[\d+\]: |nvidia-fabricmanager(?:-start\.sh\[\d+\]|\.service)")
_SYSTEMCTL_RE = re.compile(rb"(?m)^ActiveState=\w")
_NVSMI_FABRIC_RE = re.compile(rb"(?m)^\s*Fabric\s*\n\s+State\s+: ")
_NVSMI_BANNER = (b"==============NVSMI LOG==============", b"<nvidia_smi_log")
MAX_CAPTURE_BYTES = 64 << 20


def _text(path: str | Path) -> str:
    with open(path, "rb") as f:
        data = f.read(MAX_CAPTURE_BYTES + 1)
    if len(data) > MAX_CAPTURE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_CAPTURE_BYTES >> 20} MiB")
    return data.decode("utf-8", "replace").replace("\r\n", "\n")


def detect_lspci(head: bytes, path: str | Path) -> bool:
    """lspci output: at least two `bb:dd.f Class: Vendor ...` device lines."""
    return len(_LSPCI_HEAD_RE.findall(head)) >= 2


def read_lspci(path: str | Path) -> dict[str, Any]:
    return {"pcie_aer": {"source": "lspci", "error": None, "devices": [], "lspci": _text(path).splitlines()}}


def detect_fm_log(head: bytes, path: str | Path) -> bool:
    """Fabric Manager's own log lines, or its journal / systemctl lines."""
    return _FM_LOG_RE.search(head) is not None


def read_fm_log(path: str | Path) -> dict[str, Any]:
    return {"fabric_manager": {"service": None, "nvswitch_devices": None,
                               "log": {"path": str(path), "lines": _text(path).splitlines(), "error": None,
                                       "missing": False}}}


def detect_fm_service(head: bytes, path: str | Path) -> bool:
    """`systemctl show -p ActiveState,... nvidia-fabricmanager` output (Key=Value lines)."""
    return _SYSTEMCTL_RE.search(head) is not None and b"\n\n" not in head.strip()


def read_fm_service(path: str | Path) -> dict[str, Any]:
    return {"fabric_manager": {"service": {"text": _text(path), "error": None}, "log": None, "nvswitch_devices": None}}


def detect_nvsmi_fabric(head: bytes, path: str | Path) -> bool:
    """nvidia-smi -q Fabric sections without the rest of the capture (a grep, a paste)."""
    return _NVSMI_FABRIC_RE.search(head) is not None and not any(b in head for b in _NVSMI_BANNER)


def read_nvsmi_fabric(path: str | Path) -> dict[str, Any]:
    return {"gpus": [{"index": i, "fabric": f} for i, f in enumerate(parse_nvsmi_fabric(_text(path)))]}


FABRIC_CAPTURE_KINDS: list[tuple[str, Callable[[bytes, str | Path], bool], Callable[[str | Path], dict[str, Any]]]] = [
    ("lspci", detect_lspci, read_lspci),
    ("fabric manager log", detect_fm_log, read_fm_log),
    ("systemctl show nvidia-fabricmanager", detect_fm_service, read_fm_service),
    ("nvidia-smi fabric", detect_nvsmi_fabric, read_nvsmi_fabric),
]
