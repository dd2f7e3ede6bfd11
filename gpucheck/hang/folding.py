"""Node sets folded fast enough for a 16k-rank job's analysis."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable

_NODE_NUMBER = re.compile(r"(.*?)(\d+)(\D*)")


def fold(nodes: Iterable[str]) -> str:
    """gpucheck.platform.nodeset.fold's node set text, for thousands of names at once: the numbers
    are folded into ranges here and ClusterShell parses only the few folded pieces (it parses
    every name of a plain list: about 50 ms for 2,048 names, many times per analysis)."""
    from ClusterShell.NodeSet import NodeSet

    runs: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    plain = []
    for name in set(nodes):
        m = _NODE_NUMBER.fullmatch(name)
        if m is None:
            plain.append(name)
            continue
        digits = m.group(2)
        pad = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        runs[(m.group(1), m.group(3), pad)].append(int(digits))
    parts = list(plain)
    for (prefix, suffix, pad), numbers in runs.items():
        numbers.sort()
        spans, start = [], numbers[0]
        for a, b in zip(numbers, [*numbers[1:], None]):
            if b != a + 1:
                spans.append(f"{start:0{pad}d}" + (f"-{a:0{pad}d}" if a != start else ""))
                if b is not None:
                    start = b
        parts.append(f"{prefix}[{','.join(spans)}]{suffix}")
    return str(NodeSet(",".join(sorted(parts)))) if parts else ""
