"""What `gpucheck bisect` would do (`--dry-run`), without running a test."""

from __future__ import annotations

import math

from ...platform.nodeset import fold
from .search import splitting_bound
from .strategies import grid_layout


def plan_text(nodes: list[str], *, strategy: str, group_size: int | None, min_group: int,
              repeats: int, max_bad: int | None, parallel: int = 0, pairs_first: bool = False) -> list[str]:
    n = len(nodes)
    lines = [f"{n} node(s): {fold(nodes)}; strategy {strategy}"]
    if pairs_first:
        lines.append(f"round 1: {n // 2} disjoint pair(s) at once, the bandwidth reference (median of the "
                     "round's pairs); a second round re-pairs the nodes of slow or failed pairs with "
                     "known-good partners (and control pairs)")
    if strategy == "grid":
        g = group_size or max(min_group, int(round(math.sqrt(n))) or 1)
        rows = grid_layout(nodes, g)
        lines.append(f"round 1: {len(rows)} row group(s) of about {g} node(s), all at once:")
        lines += [f"  row {i + 1}: {fold(r)}" for i, r in enumerate(rows)]
        lines.append(f"round 2: up to {max(len(r) for r in rows)} column group(s) of {len(rows)} node(s), all at "
                     "once: the j-th node of every row (only columns that cross a failing row)")
        lines.append(f"one bad node: {len(rows)} + {max(len(r) for r in rows)} tests in 2 rounds")
    elif parallel == 1:
        lines.append("test the whole set, then split (Hwang's generalized binary splitting), one test a round")
        lines += _splitting_cost(n, max_bad)
    else:
        depth = math.ceil(math.log(max(n, 2), 4))
        lines.append("round 1: the whole set; then every failing group split in 4, all parts at once"
                     + (f" (at most {parallel} tests at once)" if parallel else ""))
        lines.append(f"any number of bad nodes: {depth + 1} search round(s) (1 + ceil(log4 N)), "
                     "4 tests per failing group and round")
    lines.append(f"confirm: the other nodes together, and each suspect {repeats} time(s) with known-good nodes "
                 "next to a control group of known-good nodes")
    return lines


def _splitting_cost(n: int, max_bad: int | None) -> list[str]:
    if max_bad is None:
        est = math.log2(max(n, 1)) + 3
        return [f"about {est:.0f} tests for 1 bad node(s) (k*log2(N/k) + 2k + 1), as many rounds"]
    return [f"at most {max_bad} bad node(s): the whole set, then at most {splitting_bound(n, max_bad)} tests "
            "(ceil(log2 C(N, K)) + K - 1), as many rounds; then the nodes not found bad together (the "
            "verification): if they still fail, more than K are bad and the search goes on without the bound"]
