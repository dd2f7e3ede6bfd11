"""The snapshot's `net` key: read live (sysfs + /proc/modules), recorded with what the reader read
(`raw`), and replayed through the same reader (a recorded sysfs tree through read_ib_ports, a
command's text through its parser). docs/snapshot.md describes the key."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable, Mapping, cast

from .model import NetPorts, NetRecord
from .modules import read_modules
from .ports import read_ib_ports
from .text import parse_ibstat, parse_ibstatus, parse_ibv_devinfo, parse_rdma_link
from .tree import DirTree, MapTree, RecordingTree

TEXT_PARSERS: dict[str, Callable[[str], NetPorts]] = {
    "ibstat": parse_ibstat, "ibstatus": parse_ibstatus, "ibv_devinfo": parse_ibv_devinfo, "rdma link": parse_rdma_link,
}


def proc_root_for(sysfs_root: str | os.PathLike[str]) -> Path:
    """/sys -> /proc; a copied tree DIR/sys -> DIR/proc."""
    return Path(sysfs_root).parent / "proc"


def collect_net(sysfs_root: str | os.PathLike[str] = "/sys", gpu_bus_ids: list[str] | None = None) -> NetRecord:
    """This node's RDMA ports and modules, with the files read (`raw`) for a replay. Never raises."""
    tree = RecordingTree(DirTree(sysfs_root))
    try:
        ports = read_ib_ports(tree, gpu_bus_ids)
    except Exception as e:  # noqa: BLE001 - a snapshot records the failure instead of crashing
        ports = {"source": "sysfs", "error": f"{type(e).__name__}: {e}", "ports": [], "notes": [],
                 "gpu_pci_chains": {}}
    return {**ports, "modules": read_modules(proc_root_for(sysfs_root)), "raw": tree.recording()}


def from_text(kind: str, text: str) -> NetRecord:
    """A command's output (kind: a key of TEXT_PARSERS) as the `net` key, modules not in it."""
    ports = TEXT_PARSERS[kind](text)
    return {**ports, "raw": {"kind": kind, "text": text}}


def read_raw(raw: Mapping[str, Any]) -> NetPorts | None:
    """The ports of a recording's `raw`, read again through the reader; None for a kind this
    gpucheck does not know (the recorded ports are then used as they are)."""
    kind = raw.get("kind")
    if kind == "sysfs":
        tree = MapTree(dict(raw.get("files") or {}), dict(raw.get("dirs") or {}), dict(raw.get("chains") or {}))
        gpus = list((raw.get("chains") or {}).keys())
        return read_ib_ports(tree, [g.rsplit("/", 1)[-1] for g in gpus if g.startswith("bus/pci/devices/")])
    if kind in TEXT_PARSERS and isinstance(raw.get("text"), str):
        return TEXT_PARSERS[str(kind)](str(raw["text"]))
    return None


def replay_net(recorded: Mapping[str, Any]) -> NetRecord:
    """The `net` key a replay judges: the ports read again from `raw` where it is there (the
    recorded error stands: a source that could not be read stays unread), the rest as recorded."""
    out: Any = copy.deepcopy(dict(recorded))
    raw = recorded.get("raw")
    if isinstance(raw, Mapping) and not recorded.get("error"):
        again = read_raw(raw)
        if again is not None:
            out.update(again)
    replayed: NetRecord = out
    return replayed


def validate_net(net: Any, where: str) -> str | None:
    """Why a snapshot's `net` key is not usable, or None."""
    if not isinstance(net, dict):
        return f"{where}: net must be an object"
    if not isinstance(net.get("ports", []), list) or not all(isinstance(p, dict) for p in net.get("ports", [])):
        return f"{where}: net.ports must be a list of objects"
    if not isinstance(net.get("error"), (str, type(None))):
        return f"{where}: net.error must be a string or null"
    mods = net.get("modules")
    if mods is not None and (not isinstance(mods, dict) or not isinstance(mods.get("loaded"), (list, type(None)))):
        return f"{where}: net.modules must be {{loaded: [names] | null, error}}"
    return None


def net_in(snapshot: Mapping[str, Any] | None) -> NetRecord | None:
    """A snapshot's `net` key, or None when it does not hold one (a recording from before issue 24,
    a converted nvidia-smi capture)."""
    net: Any = (snapshot or {}).get("net")
    return cast(NetRecord, net) if isinstance(net, dict) else None
