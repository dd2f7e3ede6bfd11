"""Host lists in Slurm/ClusterShell node-set syntax, parsed and folded with ClusterShell.

`parse_nodeset("gpu[001-003],login1")` -> ["gpu001", "gpu002", "gpu003", "login1"];
`fold(["gpu001", "gpu002", "gpu003"])` -> "gpu[001-003]". A malformed or empty node set raises
NodeSetError, which the CLI reports as a usage error (exit 2).

Every node name is checked here, once, where a node set is parsed: 1 to 255 characters from
the ASCII letters, digits, `-`, `_` and `.`, not starting with `-` (NODE_NAME_RE). A name can
then never carry shell syntax or pass for an option of ssh or srun.

Group references (`@rack1`, `@slurm:gpu`, `@rack[1-4]`, `@*`, `@source:*`, `@@source`) are
checked before ClusterShell sees the text (GROUP_REF_RE): source and group names are made of the
same characters as node names (plus `[`, `]`, `/` of a range), so nothing ClusterShell
substitutes into a groups.conf upcall (`map: sinfo -h -o %N -p $GROUP`, run through /bin/sh) can
carry shell syntax, a space or an option. `fold` never resolves groups at all. A node set may hold at
most MAX_NODES nodes; the bracket ranges of the text are counted before ClusterShell expands
them (ClusterShell builds a one-dimensional range element by element: `n[1-100000000]` would
take minutes and gigabytes), and the node set's size is checked before it is listed.
"""

from __future__ import annotations

import re
from typing import Iterable

MAX_NODES = 1_000_000
NODE_NAME_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,254}", re.ASCII)
_BRACKET_RE = re.compile(r"\[([^\[\]]*)\]")
_OPERATORS = ",!&^"  # ClusterShell's set operators (union, difference, and, xor), outside brackets
# A source or group name: node-name characters, and ranges (`rack[1-4,7]`, `[1-9/2]`).
_GROUP_NAME = r"(?:[A-Za-z0-9_.]|\[[0-9,/-]+\])(?:[A-Za-z0-9_.-]|\[[0-9,/-]+\]){0,254}"
GROUP_REF_RE = re.compile(rf"@(?:{_GROUP_NAME}:)?(?:\*|{_GROUP_NAME})|@@(?:{_GROUP_NAME})?", re.ASCII)
_RANGE_RE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*(?:/\s*(\d+)\s*)?)?")


class NodeSetError(ValueError):
    """A node set that cannot be parsed, that names no node, too many nodes, or a bad name."""


def node_name_problem(name: str) -> str | None:
    """Why `name` is not an acceptable node name, or None."""
    if NODE_NAME_RE.fullmatch(name):
        return None
    if not name:
        return "empty node name"
    if len(name) > 255:
        return f"node name longer than 255 characters ({name[:40]!r}...)"
    if name.startswith("-"):
        return f"node name {name!r} starts with '-'"
    return (f"node name {name!r} has a character other than letters, digits, '-', '_' and '.'")


def check_node_name(name: str, *, what: str = "node set") -> str:
    """`name` itself when acceptable; NodeSetError naming `what` otherwise."""
    why = node_name_problem(name)
    if why:
        raise NodeSetError(f"{what}: {why}")
    return name


def group_reference_problem(text: str) -> str | None:
    """Why a group reference of node-set `text` may not reach ClusterShell, or None.

    Every operand (the text between set operators outside brackets, as ClusterShell splits it)
    that holds an `@` must be one whole reference (GROUP_REF_RE): `@GROUP`, `@SOURCE:GROUP`,
    `@*`, `@SOURCE:*` or `@@SOURCE`, names of letters, digits, `_`, `.`, `-` (not first) and
    [ranges]."""
    for operand in _operands(text):
        operand = operand.lstrip()
        if "@" in operand and not GROUP_REF_RE.fullmatch(operand):
            shown = operand if len(operand) <= 60 else operand[:60] + "..."
            return (f"bad group {shown!r}: a group is @GROUP or @SOURCE:GROUP, names of letters, digits, "
                    "'_', '.', '-' (not first) and [ranges]")
    return None


def _operands(text: str) -> list[str]:
    """`text` split at the set operators that stand outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and ch in _OPERATORS:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def ranges_size(text: str) -> int:
    """An upper bound of the names the bracket ranges of `text` spell out, without expanding
    them: the sum, over every `[...]` range, of its element counts (a range we cannot read
    counts 0: ClusterShell then reports the syntax error itself)."""
    total = 0
    for inner in _BRACKET_RE.findall(text):
        for item in inner.split(","):
            m = _RANGE_RE.fullmatch(item)
            if not m:
                continue
            lo, hi, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
            if hi >= lo and step > 0:
                total += (hi - lo) // step + 1
    return total


def parse_nodeset(text: str, *, what: str = "node set") -> list[str]:
    """Expand a node set into its node names (ClusterShell's order), without duplicates."""
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    s = (text or "").strip()
    if not s:
        raise NodeSetError(f"empty {what}")
    why = group_reference_problem(s)
    if why:
        raise NodeSetError(f"{what} {_short(text)}: {why}")
    if ranges_size(s) > MAX_NODES:
        raise NodeSetError(f"{what} {_short(text)} spans more than {MAX_NODES:,} nodes")
    try:
        ns = NodeSet(s)
    except NodeSetException as e:
        raise NodeSetError(f"malformed {what} {_short(text)}: {e}") from None
    except Exception as e:  # group resolution problems (groups.conf) surface as other errors
        raise NodeSetError(f"cannot resolve {what} {_short(text)}: {e}") from None
    count = len(ns)
    if count > MAX_NODES:
        raise NodeSetError(f"{what} {_short(text)} has {count:,} nodes (at most {MAX_NODES:,})")
    nodes = list(ns)
    if not nodes:
        raise NodeSetError(f"{what} {_short(text)} names no node")
    for n in nodes:
        why = node_name_problem(n)
        if why:
            raise NodeSetError(f"{what} {_short(text)}: {why}")
    return nodes


def _short(text: str, limit: int = 120) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def fold(nodes: Iterable[str]) -> str:
    """Fold node names into the shortest node-set text (`n[1-3,7]`); "" for none."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    nodes = [n for n in nodes if n]
    if not nodes:
        return ""
    return str(NodeSet.fromlist(nodes, resolver=RESOLVER_NOGROUP))  # a name is never looked up as a group


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
