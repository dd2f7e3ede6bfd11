"""Host lists in Slurm/ClusterShell node-set syntax, parsed and folded with ClusterShell.

`parse_nodeset("gpu[001-003],login1")` -> ["gpu001", "gpu002", "gpu003", "login1"];
`fold(["gpu001", "gpu002", "gpu003"])` -> "gpu[001-003]". A malformed or empty node set raises
NodeSetError, which the CLI reports as a usage error (exit 2).
"""

from __future__ import annotations

from typing import Iterable


class NodeSetError(ValueError):
    """A node set that cannot be parsed, or that names no node."""


def parse_nodeset(text: str, *, what: str = "node set") -> list[str]:
    """Expand a node set into its node names (ClusterShell's order), without duplicates."""
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    s = (text or "").strip()
    if not s:
        raise NodeSetError(f"empty {what}")
    try:
        ns = NodeSet(s)
    except NodeSetException as e:
        raise NodeSetError(f"malformed {what} {text!r}: {e}") from None
    except Exception as e:  # group resolution problems (groups.conf) surface as other errors
        raise NodeSetError(f"cannot resolve {what} {text!r}: {e}") from None
    nodes = list(ns)
    if not nodes:
        raise NodeSetError(f"{what} {text!r} names no node")
    for n in nodes:
        if not n or any(c.isspace() for c in n):
            raise NodeSetError(f"malformed {what} {text!r}: bad node name {n!r}")
    return nodes


def fold(nodes: Iterable[str]) -> str:
    """Fold node names into the shortest node-set text (`n[1-3,7]`); "" for none."""
    from ClusterShell.NodeSet import NodeSet

    nodes = [n for n in nodes if n]
    if not nodes:
        return ""
    return str(NodeSet.fromlist(nodes))


def parse_node_map(specs: Iterable[str], nodes: Iterable[str], *, what: str) -> dict[str, str]:
    """`["n[2-3]=--snapshot /x.json", ...]` -> {node: value} for the nodes of the sweep.

    Each spec is NODESET=VALUE; a node named by several specs gets their values joined with a
    space, in order. A spec naming a node outside `nodes` is a usage error (a typo would
    otherwise silently test nothing).
    """
    known = set(nodes)
    out: dict[str, str] = {}
    for spec in specs:
        key, eq, value = spec.partition("=")
        if not eq or not key.strip():
            raise NodeSetError(f"{what}: want NODESET=VALUE, got {spec!r}")
        for n in parse_nodeset(key, what=f"{what} node set"):
            if n not in known:
                raise NodeSetError(f"{what}: node {n} is not in the node set")
            out[n] = f"{out[n]} {value}".strip() if n in out else value.strip()
    return out
