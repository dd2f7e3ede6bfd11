"""Pairing strategies and per-node scoring for `gpucheck nccl pairs` (pure: no I/O, no torch).

Strategies (each returns rounds; a round is a list of disjoint pairs that run at the same time):

- ring: every node with its next neighbour (n pairs for n >= 3 nodes), in 2 rounds (3 for an odd
  count) so that no node is in two pairs at once.
- random: `rounds` random perfect matchings, each chosen among many shuffles to repeat as few
  earlier pairs as possible, so a node meets different partners (with an odd count the node that
  sits out rotates).
- suspects: each suspect with a known-good node, `rounds` different good partners when there are
  enough.

Scoring: a pair's value is its bus bandwidth (busbw at the largest size); the reference is the
median over all measured pairs (most pairs are assumed healthy; at least 3 are needed) or
`min_busbw` when given; without a reference only failures are judged. A pair
is `slow` below `slow_limit` x reference, `fail` when it timed out, saw corrupted data or a side
could not start. A node is judged **bad** when most of its pairs are bad and the evidence points
at it: a partner of one of its bad pairs is fine in its other pairs (so the partner is not the
cause), or a failure named it (the rank the others waited for). A node with most pairs bad but no
such evidence (say, the two nodes of a single pair) is a **suspect**: pair it with known-good
nodes (`--strategy suspects`) to confirm. Partners of a bad node stay healthy because their other
pairs are fine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .bandwidth import median

Pair = tuple[str, str]
MIN_PAIRS_FOR_MEDIAN = 3


# -- strategies ----------------------------------------------------------------------------------
def ring_rounds(nodes: Sequence[str]) -> list[list[Pair]]:
    nodes = list(nodes)
    n = len(nodes)
    if n < 2:
        return []
    if n == 2:
        return [[(nodes[0], nodes[1])]]
    pairs = [(nodes[i], nodes[(i + 1) % n]) for i in range(n)]
    rounds = [[p for i, p in enumerate(pairs) if i % 2 == 0 and not (n % 2 and i == n - 1)],
              [p for i, p in enumerate(pairs) if i % 2 == 1]]
    if n % 2:
        rounds.append([pairs[-1]])
    return [r for r in rounds if r]


def random_rounds(nodes: Sequence[str], rounds: int, seed: int | None = None, tries: int = 64) -> list[list[Pair]]:
    nodes = list(nodes)
    if len(nodes) < 2 or rounds < 1:
        return []
    rng = random.Random(seed)
    used: dict[frozenset[str], int] = {}
    sat_out: dict[str, int] = {n: 0 for n in nodes}
    out: list[list[Pair]] = []
    for _ in range(rounds):
        best: tuple[tuple[int, int], list[Pair], str | None] | None = None
        for _t in range(tries):
            order = nodes[:]
            rng.shuffle(order)
            rest = None
            if len(order) % 2:
                # the node that sits out: one that sat out least, picked at random among those
                fewest = min(sat_out.values())
                cands = [x for x in order if sat_out[x] == fewest]
                rest = rng.choice(cands)
                order.remove(rest)
            pairs = [(order[i], order[i + 1]) for i in range(0, len(order), 2)]
            cost = (sum(used.get(frozenset(p), 0) for p in pairs), 0)
            if best is None or cost < best[0]:
                best = (cost, pairs, rest)
            if cost[0] == 0:
                break
        assert best is not None
        _, pairs, rest = best
        for p in pairs:
            used[frozenset(p)] = used.get(frozenset(p), 0) + 1
        if rest is not None:
            sat_out[rest] += 1
        out.append(sorted(pairs))
    return out


def suspect_rounds(suspects: Sequence[str], good: Sequence[str], rounds: int = 1) -> list[list[Pair]]:
    """Each suspect with a different known-good node per round; a good node serves one suspect
    per round (extra rounds are added when there are more suspects than good nodes)."""
    suspects = [s for s in suspects if s not in set(good)]
    good = list(good)
    if not suspects or not good:
        return []
    out: list[list[Pair]] = []
    rounds = max(1, min(rounds, len(good)))
    for k in range(rounds):
        # suspect i meets good[(i + k) % len(good)]; split into rounds of disjoint pairs
        wanted = [(s, good[(i + k) % len(good)]) for i, s in enumerate(suspects)]
        while wanted:
            busy: set[str] = set()
            this, later = [], []
            for s, g in wanted:
                if g in busy:
                    later.append((s, g))
                else:
                    busy.add(g)
                    this.append((s, g))
            out.append(this)
            wanted = later
    return out


# -- scoring ------------------------------------------------------------------------------------
@dataclass
class PairOutcome:
    """What one pair's test gave (built by gpucheck.nccl.launch from the ranks' events)."""

    round: int
    nodes: Pair
    status: str  # ok | fail | error (error: gpucheck could not run it, no judgement)
    busbw_gbs: float | None = None
    algbw_gbs: float | None = None
    time_s: float | None = None
    bytes: int | None = None
    summary: str = ""
    blamed: list[str] = field(default_factory=list)  # nodes a failure names
    failure: dict[str, Any] | None = None
    injected: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "nodes": list(self.nodes), "status": self.status,
                "busbw_gbs": self.busbw_gbs, "algbw_gbs": self.algbw_gbs, "time_s": self.time_s,
                "bytes": self.bytes, "summary": self.summary, "blamed": list(self.blamed),
                "failure": self.failure, "injected": list(self.injected)}


@dataclass
class PairJudgement:
    outcome: PairOutcome
    verdict: str  # ok | slow | fail | error
    relative: float | None  # busbw / reference


@dataclass
class NodeScore:
    node: str
    pairs: int = 0
    bad: int = 0
    score: float | None = None  # median over its pairs of busbw / reference
    verdict: str = "ok"  # ok | bad | suspect | unmeasured
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "pairs": self.pairs, "bad_pairs": self.bad,
                "score": None if self.score is None else round(self.score, 3),
                "verdict": self.verdict, "evidence": list(self.evidence)}


@dataclass
class Judgement:
    reference_gbs: float | None
    reference_kind: str
    pairs: list[PairJudgement]
    nodes: dict[str, NodeScore]

    @property
    def bad(self) -> list[str]:
        return [n for n, s in self.nodes.items() if s.verdict == "bad"]

    @property
    def suspects(self) -> list[str]:
        return [n for n, s in self.nodes.items() if s.verdict == "suspect"]

    @property
    def measured(self) -> int:
        return sum(1 for p in self.pairs if p.verdict != "error")


def judge_pairs(outcomes: Iterable[PairOutcome], nodes: Sequence[str], *, slow_limit: float = 0.7,
                min_busbw: float | None = None) -> Judgement:
    outcomes = list(outcomes)
    values = [o.busbw_gbs for o in outcomes if o.status == "ok" and o.busbw_gbs]
    if min_busbw:
        ref, ref_kind = float(min_busbw) / slow_limit, f"--min-busbw {min_busbw:g} GB/s"
    elif len(values) >= MIN_PAIRS_FOR_MEDIAN:
        ref = median(values)
        ref_kind = f"median of {len(values)} measured pairs"
    else:  # with one or two values nothing says which one is typical
        ref = None
        ref_kind = (f"none: {len(values)} measured pair(s), {MIN_PAIRS_FOR_MEDIAN} needed for a median "
                    "(or give --min-busbw); only failures are judged")
    pjs: list[PairJudgement] = []
    for o in outcomes:
        if o.status == "error":
            pjs.append(PairJudgement(o, "error", None))
        elif o.status == "fail":
            pjs.append(PairJudgement(o, "fail", None))
        else:
            rel = (o.busbw_gbs / ref) if (ref and o.busbw_gbs is not None) else None
            slow = rel is not None and rel < slow_limit
            pjs.append(PairJudgement(o, "slow" if slow else "ok", rel))

    scores = {n: NodeScore(n) for n in nodes}
    mine: dict[str, list[PairJudgement]] = {n: [] for n in nodes}
    for pj in pjs:
        if pj.verdict == "error":
            continue
        for n in pj.outcome.nodes:
            mine.setdefault(n, []).append(pj)
            scores.setdefault(n, NodeScore(n))

    def is_bad_for(pj: PairJudgement, node: str) -> bool:
        """A pair counts against `node` unless a failure named only its partner."""
        if pj.verdict == "slow":
            return True
        if pj.verdict == "fail":
            return not pj.outcome.blamed or node in pj.outcome.blamed
        return False

    def bad_frac_without(node: str, exclude: str) -> float | None:
        others = [pj for pj in mine.get(node, []) if exclude not in pj.outcome.nodes]
        if not others:
            return None
        return sum(is_bad_for(pj, node) for pj in others) / len(others)

    for n, sc in scores.items():
        ps = mine.get(n, [])
        sc.pairs = len(ps)
        if not ps:
            sc.verdict = "unmeasured"
            sc.evidence.append("no pair of this node could be measured")
            continue
        rels = [pj.relative if pj.relative is not None else 0.0 for pj in ps]
        sc.score = median(rels)
        bad = [pj for pj in ps if is_bad_for(pj, n)]
        sc.bad = len(bad)
        for pj in bad:
            partner = pj.outcome.nodes[1] if pj.outcome.nodes[0] == n else pj.outcome.nodes[0]
            if pj.verdict == "slow":
                sc.evidence.append(f"round {pj.outcome.round} with {partner}: {pj.outcome.busbw_gbs:.4g} GB/s "
                                   f"busbw = {pj.relative:.2f} x reference")
            else:
                sc.evidence.append(f"round {pj.outcome.round} with {partner}: {pj.outcome.summary}")
        if sc.bad * 2 <= sc.pairs:
            continue
        exonerating = []
        for pj in bad:
            partner = pj.outcome.nodes[1] if pj.outcome.nodes[0] == n else pj.outcome.nodes[0]
            frac = bad_frac_without(partner, n)
            if frac is not None and frac * 2 <= 1:
                exonerating.append(partner)
        named = [pj for pj in bad if n in pj.outcome.blamed]
        if exonerating or named:
            sc.verdict = "bad"
            if exonerating:
                sc.evidence.append("partners fine in their other pairs: " + ", ".join(sorted(set(exonerating))))
            if named:
                sc.evidence.append(f"named by {len(named)} failed pair(s)")
        else:
            sc.verdict = "suspect"
            sc.evidence.append("most pairs bad but no partner to compare with: confirm with --strategy suspects")
    return Judgement(ref, ref_kind, pjs, scores)
