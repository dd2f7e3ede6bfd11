"""Pairing strategies and per-node scoring for `gpucheck nccl pairs` (pure: no I/O, no torch).

Strategies (each returns rounds; a round is a list of disjoint pairs that run at the same time):

- ring: every node with its next neighbour (n pairs for n >= 3 nodes), in 2 rounds (3 for an odd
  count) so that no node is in two pairs at once.
- random: `rounds` random perfect matchings, each chosen among many shuffles to repeat as few
  earlier pairs as possible, so a node meets different partners (with an odd count the node that
  sits out rotates).
- suspects: each suspect with a known-good node, `rounds` different good partners when there are
  enough.

Scoring: a pair's values are its bus bandwidths (busbw at the largest size, per collective); the
reference of a collective is the median over the pairs measured with the same number of pairs
at once (most pairs are assumed healthy; at least 3 are needed; a pair run alone is never
compared with pairs run four at a time), or `min_busbw` when given; a pair without a reference
is `unjudged` (its bandwidth was not examined). A pair is `slow` below `slow_limit` x the
reference in any collective, `fail` when it timed out, saw corrupted data or a side could not
start. A host the launcher could not reach (ssh's exit 255) is `unreachable`. When every pair
failed the same way and none passed, the test or the setup is broken, not every node. A node is judged **bad** when most of its pairs are bad and the evidence points
at it: a partner of one of its bad pairs is fine in its other pairs (so the partner is not the
cause), or a failure named it (the rank the others waited for). A node with most pairs bad but no
such evidence (say, the two nodes of a single pair) is a **suspect**: pair it with known-good
nodes (`--strategy suspects`) to confirm. Partners of a bad node stay healthy because their other
pairs are fine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .bandwidth import median

if TYPE_CHECKING:  # pragma: no cover
    from .collective import Failure

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
    """What one pair's test gave (built by gpucheck.nccl.pairs_run from the ranks' events)."""

    round: int
    nodes: Pair
    status: str  # ok | fail | error (error: gpucheck could not run it, no judgement)
    busbw_gbs: float | None = None  # of the first collective (the table's column)
    algbw_gbs: float | None = None
    time_s: float | None = None
    bytes: int | None = None
    summary: str = ""
    blamed: list[str] = field(default_factory=list)  # nodes a failure names
    failure: "Failure | None" = None
    injected: list[str] = field(default_factory=list)
    op_busbw: dict[str, float] = field(default_factory=dict)  # every collective's busbw (largest size)
    concurrency: int = 0  # pairs measured at once in its round (0: not known, one class)
    unreachable: list[str] = field(default_factory=list)  # hosts the launcher could not reach

    def values(self) -> dict[str, float]:
        """busbw per collective ('busbw' alone when only the first one is known)."""
        if self.op_busbw:
            return dict(self.op_busbw)
        return {"busbw": self.busbw_gbs} if self.busbw_gbs else {}

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "nodes": list(self.nodes), "status": self.status,
                "busbw_gbs": self.busbw_gbs, "algbw_gbs": self.algbw_gbs, "time_s": self.time_s,
                "bytes": self.bytes, "summary": self.summary, "blamed": list(self.blamed),
                "failure": self.failure, "injected": list(self.injected), "op_busbw_gbs": dict(self.op_busbw),
                "concurrency": self.concurrency, "unreachable": list(self.unreachable)}


@dataclass
class PairJudgement:
    outcome: PairOutcome
    verdict: str  # ok | slow | fail | error | unjudged (bandwidth with no reference)
    relative: float | None  # busbw / reference (the lowest over the collectives)
    slow_ops: list[str] = field(default_factory=list)


@dataclass
class NodeScore:
    node: str
    pairs: int = 0
    bad: int = 0
    score: float | None = None  # median over its pairs of busbw / reference
    verdict: str = "ok"  # ok | bad | suspect | unreachable | unmeasured
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "pairs": self.pairs, "bad_pairs": self.bad,
                "score": None if self.score is None else round(self.score, 3),
                "verdict": self.verdict, "evidence": list(self.evidence)}


@dataclass
class Reference:
    op: str
    concurrency: int
    busbw_gbs: float | None
    how: str

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "concurrency": self.concurrency, "busbw_gbs": self.busbw_gbs, "how": self.how}


@dataclass
class Judgement:
    reference_gbs: float | None
    reference_kind: str
    pairs: list[PairJudgement]
    nodes: dict[str, NodeScore]
    references: list[Reference] = field(default_factory=list)
    broken: str | None = None  # every pair failed the same way: the test or the setup, not the nodes

    def _with(self, verdict: str) -> list[str]:
        """The nodes scored `verdict`; none when the test is broken (no node is blamed then)."""
        return [] if self.broken else [n for n, s in self.nodes.items() if s.verdict == verdict]

    @property
    def bad(self) -> list[str]:
        return self._with("bad")

    @property
    def suspects(self) -> list[str]:
        return self._with("suspect")

    @property
    def unreachable(self) -> list[str]:
        return self._with("unreachable")

    @property
    def unmeasured(self) -> list[str]:
        """Nodes none of whose pairs could be measured (a busy GPU, a rank that could not start):
        never examined, so never healthy."""
        return [n for n, s in self.nodes.items() if s.verdict == "unmeasured"]

    @property
    def measured(self) -> int:
        return sum(1 for p in self.pairs if p.verdict != "error")

    @property
    def unjudged(self) -> int:
        return sum(1 for p in self.pairs if p.verdict == "unjudged")


def references(outcomes: list[PairOutcome], slow_limit: float, min_busbw: float | None) -> list[Reference]:
    """The reference busbw per collective and concurrency: pairs measured with a different number
    of pairs at once are never compared (shared links and cores make them slower or faster)."""
    if min_busbw:
        ops = sorted({op for o in outcomes for op in o.values()}) or ["busbw"]
        return [Reference(op, 0, float(min_busbw) / slow_limit, f"--min-busbw {min_busbw:g} GB/s") for op in ops]
    classes: dict[tuple[str, int], list[float]] = {}
    for o in outcomes:
        if o.status == "ok":
            for op, v in o.values().items():
                classes.setdefault((op, o.concurrency), []).append(v)
    out = []
    for (op, conc), vals in sorted(classes.items()):
        at = f"{conc} at a time" if conc else "in this run"
        if len(vals) >= MIN_PAIRS_FOR_MEDIAN:
            out.append(Reference(op, conc, median(vals), f"median of {len(vals)} pairs measured {at}"))
        else:
            out.append(Reference(op, conc, None, f"none: {len(vals)} pair(s) measured {at}, {MIN_PAIRS_FOR_MEDIAN} "
                                              "needed for a median (or give --min-busbw): bandwidth not judged"))
    return out


def _judge_pair(o: PairOutcome, refs: dict[tuple[str, int], Reference], slow_limit: float) -> PairJudgement:
    if o.status in ("error", "fail"):
        return PairJudgement(o, o.status, None)
    rels: dict[str, float] = {}
    for op, v in o.values().items():
        ref = refs.get((op, o.concurrency)) or refs.get((op, 0))
        if ref is None or not ref.busbw_gbs:
            return PairJudgement(o, "unjudged", None)
        rels[op] = v / ref.busbw_gbs
    if not rels:
        return PairJudgement(o, "unjudged", None)
    slow = sorted(op for op, r in rels.items() if r < slow_limit)
    return PairJudgement(o, "slow" if slow else "ok", min(rels.values()), slow)


def judge_pairs(outcomes: Iterable[PairOutcome], nodes: Sequence[str], *, slow_limit: float = 0.7,
                min_busbw: float | None = None) -> Judgement:
    outcomes = list(outcomes)
    refs = references(outcomes, slow_limit, min_busbw)
    by_key = {(r.op, r.concurrency): r for r in refs}
    pjs = [_judge_pair(o, by_key, slow_limit) for o in outcomes]
    first = refs[0] if refs else None
    kind = "; ".join(f"{r.op}: {r.how}" for r in refs) if len(refs) > 1 else (first.how if first else
                                                                               "none: no pair was measured")
    scores = _score_nodes(pjs, nodes)
    return Judgement(first.busbw_gbs if first else None, kind, pjs, scores, refs, _broken(outcomes))


def _partner(pj: PairJudgement, node: str) -> str:
    a, b = pj.outcome.nodes
    return b if a == node else a


def _is_bad_for(pj: PairJudgement, node: str) -> bool:
    """A pair counts against `node` unless a failure named only its partner."""
    if pj.verdict == "slow":
        return True
    if pj.verdict == "fail":
        return not pj.outcome.blamed or node in pj.outcome.blamed
    return False


def _score_nodes(pjs: list[PairJudgement], nodes: Sequence[str]) -> dict[str, NodeScore]:
    scores = {n: NodeScore(n) for n in nodes}
    mine: dict[str, list[PairJudgement]] = {n: [] for n in nodes}
    for pj in pjs:
        if pj.verdict == "error":
            continue
        for n in pj.outcome.nodes:
            mine.setdefault(n, []).append(pj)
            scores.setdefault(n, NodeScore(n))
    for n, sc in scores.items():
        _score_one(n, sc, mine)
    return scores


def _score_one(n: str, sc: NodeScore, mine: dict[str, list[PairJudgement]]) -> None:
    ps = mine.get(n, [])
    sc.pairs = len(ps)
    if not ps:
        sc.verdict = "unmeasured"
        sc.evidence.append("no pair of this node could be measured")
        return
    sc.score = median([pj.relative if pj.relative is not None else 0.0 for pj in ps])
    bad = [pj for pj in ps if _is_bad_for(pj, n)]
    sc.bad = len(bad)
    for pj in bad:
        partner = _partner(pj, n)
        if pj.verdict == "slow":
            ops = f" ({', '.join(pj.slow_ops)})" if pj.slow_ops and pj.slow_ops != ["busbw"] else ""
            sc.evidence.append(f"round {pj.outcome.round} with {partner}: {pj.outcome.busbw_gbs:.4g} GB/s "
                               f"busbw = {pj.relative:.2f} x reference{ops}")
        else:
            sc.evidence.append(f"round {pj.outcome.round} with {partner}: {pj.outcome.summary}")
    if any(n in pj.outcome.unreachable for pj in bad):
        sc.verdict = "unreachable"
        return
    if sc.bad * 2 <= sc.pairs:
        return
    exonerating = []
    for pj in bad:
        partner = _partner(pj, n)
        others = [x for x in mine.get(partner, []) if n not in x.outcome.nodes]
        # Fine means seen working: most of its other pairs passed (bandwidth judged ok, or data
        # verified where no reference judged the bandwidth); a failure that named only the other
        # node of a pair says nothing good about the partner.
        if others and sum(x.verdict in ("ok", "unjudged") for x in others) * 2 > len(others):
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


def same_reason(summary: str, nodes: Sequence[str]) -> str:
    """A failure's summary with the pair's host names and every number taken out, so that the
    same failure on different pairs compares equal."""
    import re

    text = summary
    for n in sorted(nodes, key=len, reverse=True):
        text = text.replace(n, "HOST")
    return re.sub(r"\d+(\.\d+)?", "N", text)


def _broken(outcomes: list[PairOutcome]) -> str | None:
    """No pair passed (of two or more): that is the test or the setup (a wrong launcher, ssh
    refused everywhere, gpucheck missing everywhere, no route), not every node; and without one
    pair that passed, no node can be told apart from its partners (which rank of a failing pair
    exits first is a race, so their summaries need not even match)."""
    if any(o.status == "ok" for o in outcomes) or len(outcomes) < 2:
        return None
    reasons = {same_reason(o.summary, o.nodes) for o in outcomes}
    if len(reasons) == 1:
        return f"every pair ({len(outcomes)}) failed the same way: {outcomes[0].summary}"
    unreachable = sorted({h for o in outcomes for h in o.unreachable})
    hosts = sorted({h for o in outcomes for h in o.nodes})
    if unreachable and unreachable == hosts:
        return (f"no pair passed: the launcher reached none of the {len(hosts)} hosts (check the launcher, ssh "
                f"keys and user); first failure: {outcomes[0].summary}")
    return (f"no pair passed ({len(outcomes)} failed or could not run): with no pair to compare with, no node "
            f"can be told apart from the setup; first failure: {outcomes[0].summary}")
