"""The typed model of the node's RDMA ports: one `NetPort` per port, whatever format it was read
from (sysfs, ibstat, ibstatus, ibv_devinfo, rdma link). A field the format does not carry is
None and named in the port's `missing`; a value that did not parse is None and named in
`problems` (never read as healthy)."""

from __future__ import annotations

from typing import TypedDict

# The logical port states (IB spec; sysfs "4: ACTIVE", ibstat "Active", ibv_devinfo "PORT_ACTIVE (4)").
PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
# The physical port states (sysfs "5: LinkUp", ibv_devinfo "LINK_UP (5)").
PHYS_STATES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
               6: "LinkErrorRecovery", 7: "PhyTest"}
UNKNOWN = "unknown"  # a state that did not parse, or whose number and word disagree


class NetPort(TypedDict):
    """One RDMA port."""

    device: str  # mlx5_0
    port: int  # 1
    key: str  # "mlx5_0/1": the key of history deltas
    ca_type: str | None  # "MT4129" (ibstat), hca_type (sysfs), vendor_part_id (ibv_devinfo)
    state: str | None  # one of PORT_STATES' values, or UNKNOWN
    state_text: str | None  # as printed
    phys_state: str | None  # one of PHYS_STATES' values, or UNKNOWN
    phys_state_text: str | None
    rate_gbps: float | None  # the port's data rate
    width: str | None  # "4X"
    speed: str | None  # "NDR"
    rate_text: str | None
    link_layer: str | None  # "InfiniBand" | "Ethernet"
    counters: dict[str, int | None]  # counters/*: None where not available ("N/A (no PMA)")
    hw_counters: dict[str, int | None]  # hw_counters/*
    netdev: str | None  # the port's network interface (sysfs, rdma link)
    pci_bus_id: str | None  # the device's PCI function (sysfs)
    pci_chain: list[str] | None  # PCI path from the root port down to the device (sysfs)
    numa_node: int | None
    soft: bool  # a software RDMA device (rxe, siw): not a NIC, never a rail
    missing: list[str]  # fields the source does not carry
    problems: list[str]  # values that did not parse


class NetPorts(TypedDict):
    """Every port a source shows, and what the source could not show."""

    source: str  # "sysfs" | "ibstat" | "ibstatus" | "ibv_devinfo" | "rdma link"
    error: str | None  # the source could not be read at all
    ports: list[NetPort]
    notes: list[str]  # what the capture lacks (a device named but not read, lines that did not parse)
    gpu_pci_chains: dict[str, list[str]]  # GPU bus id -> its PCI path (sysfs only): which NICs are nearest


class Modules(TypedDict):
    """The loaded kernel modules (/proc/modules)."""

    loaded: list[str] | None  # None: not read
    error: str | None


class NetRecord(TypedDict, total=False):
    """The snapshot's `net` key (docs/snapshot.md): the ports, the modules, and what they were read
    from (`raw`), which a replay reads back through the same reader."""

    source: str
    error: str | None
    ports: list[NetPort]
    notes: list[str]
    gpu_pci_chains: dict[str, list[str]]
    modules: Modules
    raw: dict[str, object] | None


def new_port(device: str, port: int, missing: list[str] | None = None) -> NetPort:
    """A port with nothing read yet."""
    return {"device": device, "port": port, "key": f"{device}/{port}", "ca_type": None, "state": None,
            "state_text": None, "phys_state": None, "phys_state_text": None, "rate_gbps": None, "width": None,
            "speed": None, "rate_text": None, "link_layer": None, "counters": {}, "hw_counters": {},
            "netdev": None, "pci_bus_id": None, "pci_chain": None, "numa_node": None,
            "soft": device.startswith(("rxe", "siw")), "missing": list(missing or []), "problems": []}


def empty_ports(source: str, error: str | None = None) -> NetPorts:
    return {"source": source, "error": error, "ports": [], "notes": [], "gpu_pci_chains": {}}
