"""Which ports are the node's rails (the NICs a job's GPUs talk through): from the config, else
the NICs that share a PCIe switch with a GPU (sysfs PCI paths), else the largest class of
alike ports (same adapter type and link layer; InfiniBand first on a tie). A management or
frontend NIC is then not a rail, and its port being down does not drain the node. Classifies
only: the checks judge."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .model import NetPort, NetPorts


@dataclass(frozen=True)
class Rails:
    keys: tuple[str, ...]  # the rail ports ("mlx5_0/1")
    how: str  # how they were chosen, in words
    absent: tuple[str, ...] = ()  # configured rails the source does not show


def hardware_ports(net: NetPorts) -> list[NetPort]:
    """The ports of RDMA hardware (not rxe/siw software devices)."""
    return [p for p in net["ports"] if not p["soft"]]


def _configured(ports: list[NetPort], names: list[str]) -> Rails:
    def named(p: NetPort, n: str) -> bool:
        return n in (p["key"], p["device"], p["netdev"])

    keys = tuple(p["key"] for p in ports if any(named(p, n) for n in names))
    absent = tuple(n for n in names if not any(named(p, n) for p in ports))
    return Rails(keys, f"configured rails ({', '.join(names)})", absent)


def _shares_switch(a: list[str], b: list[str]) -> bool:
    """Two PCI paths below one PCIe switch: the same root port and the same switch port under it."""
    return len(a) >= 2 and len(b) >= 2 and a[:2] == b[:2]


def _by_topology(ports: list[NetPort], gpus: dict[str, list[str]]) -> Rails | None:
    if not gpus:
        return None
    near = tuple(p["key"] for p in ports if p["pci_chain"] and any(_shares_switch(p["pci_chain"], g)
                                                                    for g in gpus.values()))
    return Rails(near, "the NICs under the GPUs' PCIe switches") if near else None


def _by_class(ports: list[NetPort]) -> Rails:
    def cls(p: NetPort) -> tuple[str, str]:
        return (p["ca_type"] or "?", p["link_layer"] or "?")

    counts = Counter(cls(p) for p in ports)
    if not counts:
        return Rails((), "no RDMA port")
    most = max(counts.values())
    tied = [c for c, n in counts.items() if n == most]
    ib = [c for c in tied if c[1] == "InfiniBand"]
    chosen = set(ib if ib and len(ib) < len(tied) else tied)
    words = ", ".join(f"{t} {ll}" if t != "?" else ll for t, ll in sorted(chosen))
    return Rails(tuple(p["key"] for p in ports if cls(p) in chosen),
                 f"the node's largest class of alike ports ({most} x {words}; no configured rails, no PCI topology)")


def select_rails(net: NetPorts, configured: list[str] | None = None) -> Rails:
    ports = hardware_ports(net)
    if configured:
        return _configured(ports, configured)
    return _by_topology(ports, net["gpu_pci_chains"]) or _by_class(ports)
