"""The RDMA capture kinds `gpucheck judge` reads: `ibstat`, `ibstatus`, `ibv_devinfo`, `rdma link`
text, a sysfs tree folder (a copy of /sys, /sys/class or /sys/class/infiniband), and a sysfs
dump as JSON (path -> content, as gcm keeps node dumps). Each kind is (name, detect, read):
`detect(head, path) -> bool` looks at the file's first bytes (or the folder), `read(path) ->`
the snapshot fragment `{"net": ...}` the same readers as a live run produce.
`NET_CAPTURE_KINDS` lists them for the capture table of `gpucheck judge`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

from ..pci import normalize_bus_id
from .model import NetRecord
from .ports import IB_CLASS, read_ib_ports
from .record import from_text
from .tree import DirTree, MapTree

MAX_TEXT = 16 << 20


def _text(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_TEXT).decode("utf-8", "replace")


def _head_text(head: bytes) -> str:
    return head.decode("utf-8", "replace")


def detect_ibstat(head: bytes, path: Any = None) -> bool:
    t = _head_text(head)
    return bool(re.search(r"^\s*CA '[^']+'\s*$", t, re.M) and re.search(r"^\s*(CA type|Port \d+):", t, re.M))


def detect_ibstatus(head: bytes, path: Any = None) -> bool:
    return bool(re.search(r"^\s*Infiniband device '[^']+' port \d+ status:", _head_text(head), re.M))


def detect_ibv_devinfo(head: bytes, path: Any = None) -> bool:
    t = _head_text(head)
    return bool(re.search(r"^\s*hca_id:\s*\S+", t, re.M) and re.search(r"^\s*(transport|port):", t, re.M))


def detect_rdma_link(head: bytes, path: Any = None) -> bool:
    return bool(re.search(r"^\s*(link\s+|\d+/\d+:\s*)\S+/\d+:?\s+state\s+\S+", _head_text(head), re.M))


def _reader(kind: str) -> Callable[[str | os.PathLike[str]], dict[str, Any]]:
    def read(path: str | os.PathLike[str]) -> dict[str, Any]:
        return {"net": from_text(kind, _text(path))}

    read.__name__ = f"read_{kind.replace(' ', '_')}"
    return read


def sysfs_root_of(folder: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """(the folder that plays /sys, how the folder was laid out), or None when no IB class is in it."""
    p = Path(folder)
    for root, layout in ((p, "sys"), (p / "sys", "root"), (p.parent, "class")):
        if (root / IB_CLASS).is_dir() and (layout != "class" or p.name == "class"):
            return root, layout
    if any((d / "ports").is_dir() for d in p.iterdir() if d.is_dir()):
        return p, "class/infiniband"
    return None


def detect_sysfs_folder(head: bytes, path: Any = None) -> bool:
    return path is not None and Path(path).is_dir() and sysfs_root_of(path) is not None


def read_sysfs_folder(path: str | os.PathLike[str]) -> dict[str, Any]:
    found = sysfs_root_of(path)
    assert found is not None, "detect_sysfs_folder first"
    root, layout = found
    if layout == "class/infiniband":  # the folder holds the devices themselves
        ports = read_ib_ports(_Under(DirTree(root)), [])
    else:
        ports = read_ib_ports(DirTree(root), None)
    net: NetRecord = {**ports, "raw": None}
    return {"net": net}


class _Under:
    """A folder of IB devices read as /sys/class/infiniband."""

    def __init__(self, inner: DirTree) -> None:
        self.inner = inner

    def _rel(self, rel: str) -> str | None:
        return rel[len(IB_CLASS) + 1:] if rel.startswith(IB_CLASS + "/") else ("" if rel == IB_CLASS else None)

    def listdir(self, rel: str) -> list[str] | None:
        r = self._rel(rel)
        return None if r is None else self.inner.listdir(r)

    def read(self, rel: str) -> str | None:
        r = self._rel(rel)
        return None if r is None else self.inner.read(r)

    def pci_chain(self, rel: str) -> list[str] | None:
        return None


_PCI_IB = re.compile(r"^/?sys/bus/pci/devices/([^/]+)/infiniband/(.+)$")
_CLASS_IB = re.compile(r"^/?sys/class/infiniband/(.+)$")


def detect_sysfs_json(head: bytes, path: Any = None) -> bool:
    t = _head_text(head).lstrip()
    return t.startswith("{") and '"/sys/' in t and ("infiniband" in t or "/sys/bus/pci" in t)


def map_tree_of_dump(dump: dict[str, Any]) -> MapTree:
    """A sysfs dump {"/sys/...": content} as the tree the reader reads: IB devices found under
    their PCI device (/sys/bus/pci/devices/X/infiniband/D) are placed in class/infiniband/D."""
    files: dict[str, str | None] = {}
    chains: dict[str, list[str] | None] = {}
    for key, value in dump.items():
        if not isinstance(value, str):
            continue
        m = _PCI_IB.match(key)
        if m:
            dev = m.group(2).split("/", 1)[0]
            files[f"{IB_CLASS}/{m.group(2)}"] = value
            bus = normalize_bus_id(m.group(1))
            chains[f"{IB_CLASS}/{dev}/device"] = [bus] if bus else None
            continue
        m = _CLASS_IB.match(key)
        if m:
            files[f"{IB_CLASS}/{m.group(1)}"] = value
    return MapTree(files, None, chains)


def read_sysfs_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    dump = json.loads(_text(path))
    if not isinstance(dump, dict):
        raise ValueError("a sysfs dump is a JSON object of path -> content")
    ports = read_ib_ports(map_tree_of_dump(dump), [])
    net: NetRecord = {**ports, "raw": None}
    return {"net": net}


NET_CAPTURE_KINDS: list[tuple[str, Callable[..., bool], Callable[..., dict[str, Any]]]] = [
    ("ibstat", detect_ibstat, _reader("ibstat")),
    ("ibstatus", detect_ibstatus, _reader("ibstatus")),
    ("ibv_devinfo", detect_ibv_devinfo, _reader("ibv_devinfo")),
    ("rdma link", detect_rdma_link, _reader("rdma link")),
    ("sysfs folder", detect_sysfs_folder, read_sysfs_folder),
    ("sysfs json", detect_sysfs_json, read_sysfs_json),
]
