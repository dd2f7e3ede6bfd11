"""The RDMA ports of a command's output, pasted or captured: `ibstat`, `ibstatus`,
`ibv_devinfo [-v]` and `rdma link [show]`, to the same model as the sysfs reader. Fields a format
does not print are None and listed in the port's `missing`; a line no reader knows is skipped
(prompts, shell output); a device named as not read (ibstat's "ibpanic") is a note."""

from __future__ import annotations

import re

from .model import NetPort, NetPorts, empty_ports, new_port
from .values import set_rate, set_states, set_width_speed

_KV = re.compile(r"^\s*([A-Za-z_][A-Za-z_ ]*?)\s*:\s*(.*?)\s*$")
_NOT_READ = re.compile(r"IB device '([^']+)' failed")
# What each format never prints (beside the counters and the PCI topology, which only sysfs has).
_NEVER = {"ibstat": ["netdev"], "ibstatus": ["ca_type", "netdev"], "ibv_devinfo": ["netdev"],
          "rdma link": ["ca_type", "rate_gbps", "link_layer"]}
_ALWAYS = ["counters", "pci_chain"]


def _finish(out: NetPorts, fields: dict[str, list[str]]) -> NetPorts:
    """Fields a port of this capture should have shown but did not (a cut paste) go to `missing`."""
    for p in out["ports"]:
        p["missing"] = sorted(set(p["missing"]) | set(_NEVER[out["source"]]) | set(_ALWAYS) |
                              {f for f in fields.get(p["key"], []) if p.get(f) is None})
    return out


def _fill(out: NetPorts, fields: dict[str, dict[str, str]], phys_key: str, layer_key: str) -> NetPorts:
    """Each port's state, physical state, rate and link layer from the lines read under it
    (ibstat and ibstatus spell the keys differently)."""
    for p in out["ports"]:
        f = fields[p["key"]]
        set_states(p, f.get("state"), f.get(phys_key))
        if "rate" in f:
            set_rate(p, f["rate"])
        p["link_layer"] = f.get(layer_key) or None
    return _finish(out, {k: ["state", "phys_state", "rate_gbps", "link_layer"] for k in fields})


def _clean(text: str) -> list[str]:
    return [ln.replace("\r", "").rstrip() for ln in text.replace("```", "").splitlines()]


def parse_ibstat(text: str) -> NetPorts:
    """`ibstat` (indented or flattened): CA 'mlx5_0' / CA type / Port N: / State / Physical
    state / Rate / Link layer."""
    out = empty_ports("ibstat")
    dev, ca_type, port = None, None, None
    raw: dict[str, dict[str, str]] = {}
    for line in _clean(text):
        m = re.match(r"^\s*CA '([^']+)'\s*$", line)
        if m:
            dev, ca_type, port = m.group(1), None, None
            continue
        m = _NOT_READ.search(line)
        if m:
            out["notes"].append(f"{m.group(1)}: not read by ibstat ({line.strip()})")
            continue
        m = re.match(r"^\s*Port (\d+):\s*$", line)
        if m and dev is not None:
            port = new_port(dev, int(m.group(1)))
            port["ca_type"] = ca_type
            out["ports"].append(port)
            raw[port["key"]] = {}
            continue
        kv = _KV.match(line)
        if kv is None or dev is None:
            continue
        key, value = kv.group(1).lower(), kv.group(2)
        if key == "ca type":
            ca_type = value or None
        elif port is not None:
            raw[port["key"]][key] = value
    return _portless_cas(_fill(out, raw, "physical state", "link layer"), re.findall(r"(?m)^\s*CA '([^']+)'", text))


def _portless_cas(out: NetPorts, cas: list[str]) -> NetPorts:
    """A CA the capture names without a port was cut short: never "no RDMA hardware". With no
    port at all the capture cannot be judged (its error); else each such CA is a note."""
    shown = {q["device"] for q in out["ports"]}
    portless = [c for c in dict.fromkeys(cas) if c not in shown]
    if portless and not out["ports"]:
        out["error"] = f"the capture names {', '.join(portless)} but no port of it (cut short?)"
    out["notes"] += [f"{c}: no port in this capture (cut short?)" for c in portless if out["ports"]]
    return out


def parse_ibstatus(text: str) -> NetPorts:
    """`ibstatus`: Infiniband device 'mlx5_0' port 1 status: / state / phys state / rate / link_layer."""
    out = empty_ports("ibstatus")
    fields: dict[str, dict[str, str]] = {}
    port: NetPort | None = None
    for line in _clean(text):
        m = re.match(r"^\s*Infiniband device '([^']+)' port (\d+) status:\s*$", line)
        if m:
            port = new_port(m.group(1), int(m.group(2)))
            out["ports"].append(port)
            fields[port["key"]] = {}
            continue
        kv = _KV.match(line)
        if kv and port is not None:
            fields[port["key"]][kv.group(1).lower()] = kv.group(2)
    return _fill(out, fields, "phys state", "link_layer")


def parse_ibv_devinfo(text: str) -> NetPorts:
    """`ibv_devinfo` (with or without -v, old "Device ports:" form): hca_id / vendor_part_id /
    port: N / state / phys_state / active_width / active_speed / link_layer. Without -v it
    prints no physical state and no rate: they are `missing`."""
    out = empty_ports("ibv_devinfo")
    dev, part = None, None
    fields: dict[str, dict[str, str]] = {}
    port: NetPort | None = None
    for line in _clean(text):
        kv = _KV.match(line)
        if kv is None:
            continue
        key, value = kv.group(1).lower(), kv.group(2)
        if key == "hca_id":
            dev, part, port = value, None, None
        elif key == "vendor_part_id" and port is None:
            part = f"MT{value}" if value.isdigit() else value
        elif key == "port" and dev is not None and value.isdigit():
            port = new_port(dev, int(value))
            port["ca_type"] = part
            out["ports"].append(port)
            fields[port["key"]] = {}
        elif port is not None:
            fields[port["key"]][key] = value
    for p in out["ports"]:
        f = fields[p["key"]]
        set_states(p, f.get("state"), f.get("phys_state"))
        set_width_speed(p, f.get("active_width"), f.get("active_speed"))
        p["link_layer"] = f.get("link_layer") or None
        if "active_speed" in f and p["rate_gbps"] is None:
            p["missing"].append("rate_gbps")
    return _finish(out, {k: ["state", "phys_state", "rate_gbps", "link_layer"] for k in fields})


_RDMA_LINK = re.compile(r"^\s*(?:link\s+|\d+/\d+:\s*)(\S+?)/(\d+):?\s+(.*)$")


def parse_rdma_link(text: str) -> NetPorts:
    """`rdma link [show]`: "link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev p1p1"
    (older iproute2: "0/1: i40iw0/1: state DOWN physical_state NOP"). No rate, no link layer."""
    out = empty_ports("rdma link")
    for line in _clean(text):
        m = _RDMA_LINK.match(line)
        if m is None:
            continue
        p = new_port(m.group(1), int(m.group(2)))
        words = m.group(3).split()
        kv = dict(zip(words[0::2], words[1::2]))
        set_states(p, kv.get("state"), kv.get("physical_state"))
        p["netdev"] = kv.get("netdev")
        out["ports"].append(p)
    return _finish(out, {p["key"]: ["state", "phys_state"] for p in out["ports"]})
