"""The RDMA ports of /sys/class/infiniband/*/ports/* (under a sysfs root, or a recorded tree):
state, phys_state, rate, link_layer, counters/* and hw_counters/*, the device's netdev, PCI
function, PCI path and NUMA node, and the PCI paths of the node's NVIDIA GPUs (which NICs are
nearest). A reader: plain data out, nothing judged."""

from __future__ import annotations

import os

from ..pci import normalize_bus_id
from .model import NetPort, NetPorts, empty_ports, new_port
from .tree import DirTree, Tree, Unreadable
from .values import counter_value, set_rate, set_states

IB_CLASS = "class/infiniband"
PCI_DEVICES = "bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")


def _text(tree: Tree, rel: str) -> str | None:
    v = tree.read(rel)
    return None if v is None else v.strip()


def _counters(tree: Tree, rel: str, p: NetPort) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for name in tree.listdir(rel) or []:
        text = tree.read(f"{rel}/{name}")
        if text is None:
            continue
        try:
            out[name] = counter_value(text)
        except ValueError:
            out[name] = None
            p["problems"].append(f"{rel.rsplit('/', 1)[-1]}/{name} {text.strip()[:40]!r}")
    return out


def _netdev(tree: Tree, dev: str, port: int) -> str | None:
    """The network interface of the port: device/net/<if> whose dev_port is port - 1."""
    names = tree.listdir(f"{IB_CLASS}/{dev}/device/net") or []
    for name in names:
        dev_port = _text(tree, f"{IB_CLASS}/{dev}/device/net/{name}/dev_port")
        if dev_port is None or dev_port.isdigit() and int(dev_port) == port - 1:
            return name
    return names[0] if len(names) == 1 else None


def read_port(tree: Tree, dev: str, port: int) -> NetPort:
    rel = f"{IB_CLASS}/{dev}/ports/{port}"
    p = new_port(dev, port)
    p["ca_type"] = _text(tree, f"{IB_CLASS}/{dev}/hca_type") or None
    set_states(p, _text(tree, f"{rel}/state"), _text(tree, f"{rel}/phys_state"))
    for field in ("state", "phys_state"):
        if p[field] is None:  # type: ignore[literal-required]
            p["missing"].append(field)
    rate = _text(tree, f"{rel}/rate")
    if rate is None:
        p["missing"].append("rate_gbps")
    else:
        set_rate(p, rate)
    p["link_layer"] = _text(tree, f"{rel}/link_layer")
    if p["link_layer"] is None:
        p["missing"].append("link_layer")
    p["counters"] = _counters(tree, f"{rel}/counters", p)
    p["hw_counters"] = _counters(tree, f"{rel}/hw_counters", p)
    p["netdev"] = _netdev(tree, dev, port)
    p["pci_chain"] = tree.pci_chain(f"{IB_CLASS}/{dev}/device")
    p["pci_bus_id"] = p["pci_chain"][-1] if p["pci_chain"] else None
    numa = _text(tree, f"{IB_CLASS}/{dev}/device/numa_node")
    p["numa_node"] = int(numa) if numa is not None and numa.lstrip("-").isdigit() and int(numa) >= 0 else None
    return p


def gpu_pci_chains(tree: Tree, gpu_bus_ids: list[str] | None) -> dict[str, list[str]]:
    """The PCI path of each NVIDIA GPU (`gpu_bus_ids`: the snapshot's pci_nvidia_devices; None:
    every vendor 0x10de VGA / 3D device of bus/pci/devices)."""
    if gpu_bus_ids is None:
        gpu_bus_ids = [name for name in tree.listdir(PCI_DEVICES) or []
                       if _text(tree, f"{PCI_DEVICES}/{name}/vendor") == NVIDIA_VENDOR
                       and (_text(tree, f"{PCI_DEVICES}/{name}/class") or "").startswith(GPU_CLASSES)]
    out: dict[str, list[str]] = {}
    for name in gpu_bus_ids:
        bus = normalize_bus_id(name)
        chain = tree.pci_chain(f"{PCI_DEVICES}/{name}")
        if bus and chain:
            out[bus] = chain
    return out


def read_ib_ports(tree: Tree, gpu_bus_ids: list[str] | None = None) -> NetPorts:
    """Every port of every device of class/infiniband. No class/infiniband folder: no RDMA
    device (an empty list, no error); a folder that cannot be read: `error`."""
    out = empty_ports("sysfs")
    try:
        for dev in tree.listdir(IB_CLASS) or []:
            ports = tree.listdir(f"{IB_CLASS}/{dev}/ports")
            if ports is None:
                out["notes"].append(f"{dev}: no ports folder")
                continue
            for name in ports:
                if name.isdigit():
                    out["ports"].append(read_port(tree, dev, int(name)))
        if out["ports"]:
            out["gpu_pci_chains"] = gpu_pci_chains(tree, gpu_bus_ids)
    except Unreadable as e:
        out["error"] = f"cannot read {IB_CLASS}: {e}"
    return out


def read_sysfs(sysfs_root: str | os.PathLike[str] = "/sys", gpu_bus_ids: list[str] | None = None) -> NetPorts:
    """read_ib_ports of a live (or copied) sysfs root."""
    return read_ib_ports(DirTree(sysfs_root), gpu_bus_ids)
