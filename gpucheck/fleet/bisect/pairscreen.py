"""The built-in test's bandwidth reference: pairs, before the search (gpucheck.fleet.bisect.builtin).

Round 1: the nodes in disjoint pairs, all at once. Then `repeats` rounds for the nodes not yet
cleared (suspects, nodes of failed or unjudged pairs, the odd one): each with a new partner,
known-good where there is one, next to control pairs of known-good nodes up to round 1's number
of pairs, so that the rounds' pairs are measured alike and compared.

Judged as `gpucheck nccl pairs` judges (gpucheck.nccl.pairs.judge_pairs): the reference of a
collective is the median busbw of the pairs measured as many at once (at least 3, over the
rounds); a pair below `slow_limit` times it is slow; a node is bad when most of its pairs are
slow or fail and a partner of those is fine elsewhere, or a failure names it, or it is
unreachable. The control pairs also calibrate: a known-good pair can measure slow when the
hosts share links or cores, so a node whose pair with a known-good partner is not below
`slow_limit` times the slowest control pair of that round is as good as the controls (cleared),
and one is bad on bandwidth only when that pair is below it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...platform.nodeset import fold
from .result import posterior_bad
from .session import GroupOutcome, Session, TestBroken


@dataclass
class Screened:
    """What the pairs found: bad nodes with their evidence, nodes cleared (in a good pair), and
    the document for the result (references, nodes whose bandwidth could not be judged)."""

    bad: dict[str, dict[str, Any]] = field(default_factory=dict)
    good: list[str] = field(default_factory=list)
    doc: dict[str, Any] = field(default_factory=dict)


class PairScreen:
    """See the module's docstring. Called with the session and the nodes; returns Screened."""

    def __init__(self, ops: tuple[str, ...], *, slow_limit: float, min_busbw: float | None, repeats: int = 1,
                 flake_rate: float = 0.05):
        self.ops = tuple(ops)
        self.slow_limit = slow_limit
        self.min_busbw = min_busbw
        self.repeats = repeats
        self.flake_rate = flake_rate
        self.outcomes: list[Any] = []  # gpucheck.nccl.pairs.PairOutcome, one per pair measured
        self.kinds: dict[int, str] = {}  # id(outcome) -> pairs | re-pair | control
        self.subjects: dict[int, str] = {}  # id(re-pair outcome) -> the node re-paired (its partner is good)
        self.floors: dict[int, dict[str, float]] = {}  # round -> op -> slow_limit x the slowest control
        self._controls: list[list[str]] = []
        self._with_good: set[tuple[str, str]] = set()  # this round's pairs (node, known-good partner)

    def __call__(self, session: Session, nodes: list[str]) -> Screened:
        pairs = [nodes[i:i + 2] for i in range(0, len(nodes) - 1, 2)]
        self._round(session, pairs, [])
        for _ in range(self.repeats):
            judgement = self._judgement(nodes)
            todo = [n for n in nodes if not self._cleared(n, judgement) and not self._is_bad(n, judgement)]
            if not todo:
                break
            self._repair(session, nodes, todo, judgement, width=len(pairs))
        judgement = self._judgement(nodes)
        if judgement.broken:  # no pair passed: the launcher, the setup or the test, not the nodes
            raise TestBroken(judgement.broken)
        return self._screened(nodes, judgement)

    # -- rounds ---------------------------------------------------------------------------------
    def _round(self, session: Session, pairs: list[list[str]], controls: list[list[str]]) -> list[bool]:
        self._controls = controls
        phase = "re-pair" if controls or self.outcomes else "pairs"
        groups = pairs + controls
        return session.run(groups, phase, cache=False, judge=self._judge_round,
                           phases=[phase] * len(pairs) + ["control"] * len(controls))

    def _judge_round(self, groups: list[list[str]], outs: list[GroupOutcome]) -> None:
        """Each pair of the round against the pairs measured as many at once so far (this round
        included); the record shows it live. The final verdicts come from all rounds."""
        from ...nccl import pairs as P

        rnd = 1 + max((o.round for o in self.outcomes), default=0)
        fresh = [self._outcome(rnd, g, o, len(groups)) for g, o in zip(groups, outs)]
        first = not self.outcomes
        for g, po in zip(groups, fresh):
            self.kinds[id(po)] = "control" if g in self._controls else "pairs" if first else "re-pair"
            if self.kinds[id(po)] == "re-pair" and tuple(g) in self._with_good:
                self.subjects[id(po)] = g[0]
        self._floor(rnd, [po for po in fresh if self.kinds[id(po)] == "control"])
        self.outcomes += fresh
        j = P.judge_pairs(self.outcomes, sorted({n for g in groups for n in g}), slow_limit=self.slow_limit,
                          min_busbw=self.min_busbw)
        verdicts = {id(pj.outcome): pj for pj in j.pairs}
        refs = {(r.op, r.concurrency): r for r in j.references}
        for o, po in zip(outs, fresh):
            self._annotate(o, verdicts[id(po)], refs, self.floors.get(rnd, {}))

    def _floor(self, rnd: int, controls: list[Any]) -> None:
        measured = [c for c in controls if c.status == "ok"]
        if measured:
            self.floors[rnd] = {op: self.slow_limit * min(c.op_busbw[op] for c in measured)
                                for op in self.ops if all(op in c.op_busbw for c in measured)}

    def _outcome(self, rnd: int, group: list[str], o: GroupOutcome, at_once: int) -> Any:
        from ...nccl import pairs as P

        pair = (group[0], group[1])
        ops = {op: float(v) for op in self.ops if (v := o.metrics.get(op)) is not None}
        if o.healthy:
            return P.PairOutcome(rnd, pair, "ok", busbw_gbs=next(iter(ops.values()), None), summary=o.detail,
                                 op_busbw=ops, concurrency=at_once)
        return P.PairOutcome(rnd, pair, "fail", summary=o.detail, blamed=list(o.blamed), concurrency=at_once,
                             unreachable=list(o.unreachable))

    def _annotate(self, o: GroupOutcome, pj: Any, refs: dict, floors: dict[str, float]) -> None:
        for op in self.ops:
            ref = refs.get((op, pj.outcome.concurrency)) or refs.get((op, 0))
            if ref is not None and op in o.metrics:
                o.metrics[f"{op}_reference_gbs"] = None if ref.busbw_gbs is None else round(ref.busbw_gbs, 6)
            if op in floors and op in o.metrics:
                o.metrics[f"{op}_control_floor_gbs"] = round(floors[op], 6)
        if pj.verdict == "slow":
            o.healthy = False
            o.detail = "slow: " + "; ".join(
                f"{op} busbw {pj.outcome.op_busbw[op]:.3g} GB/s < {self.slow_limit:g} x "
                f"{o.metrics[f'{op}_reference_gbs']:.3g} GB/s ({self._how(refs, op, pj.outcome.concurrency)})"
                for op in pj.slow_ops)
        elif pj.verdict == "unjudged":
            o.detail += " (bandwidth not judged yet: no reference at this concurrency)"

    @staticmethod
    def _how(refs: dict, op: str, conc: int) -> str:
        ref = refs.get((op, conc)) or refs.get((op, 0))
        return ref.how if ref else "no reference"

    def _repair(self, session: Session, nodes: list[str], todo: list[str], judgement: Any, width: int) -> None:
        """New partners for `todo`: known-good nodes, else each other in a new order; control
        pairs of good nodes up to `width` pairs in the round."""
        good = [n for n in nodes if self._cleared(n, judgement) and n not in todo]
        met = {frozenset(o.nodes) for o in self.outcomes}
        pairs, used = [], set()
        for n in todo:
            if n in used:
                continue
            partner = next((g for g in good if g not in used and frozenset((n, g)) not in met), None)
            partner = partner or next((m for m in todo if m != n and m not in used
                                       and frozenset((n, m)) not in met), None)
            if partner is not None:
                pairs.append([n, partner])
                used |= {n, partner}
        self._with_good = {(a, b) for a, b in pairs if b in good}
        spare = [g for g in good if g not in used]
        controls = [spare[2 * i:2 * i + 2] for i in range(min(max(0, width - len(pairs)), len(spare) // 2))]
        if not pairs:
            return
        ok = self._round(session, pairs, controls)
        for c, healthy in zip(controls, ok[len(pairs):]):
            rec = next(r for r in reversed(session.records) if r.nodes == c)
            if not healthy and not rec.detail.startswith("slow"):
                raise TestBroken(f"the test fails on known-good nodes: control pair {fold(c)}, whose nodes "
                                 f"passed in pairs before, failed: {rec.detail}")

    # -- verdicts -------------------------------------------------------------------------------
    def _judgement(self, nodes: list[str]) -> Any:
        from ...nccl import pairs as P

        return P.judge_pairs(self.outcomes, nodes, slow_limit=self.slow_limit, min_busbw=self.min_busbw)

    def _against_controls(self, node: str) -> str | None:
        """slow | ok: the node's pairs with known-good partners in rounds with control pairs,
        against slow_limit x the slowest control; None without such a pair."""
        verdicts = []
        for o in self.outcomes:
            floors = self.floors.get(o.round)
            if not floors or self.subjects.get(id(o)) != node:
                continue
            if o.status != "ok":
                verdicts.append("slow")  # a data failure with a known-good partner
            else:
                verdicts.append("slow" if any(o.op_busbw.get(op, floor) < floor for op, floor in floors.items())
                                else "ok")
        if not verdicts:
            return None
        return "slow" if verdicts.count("slow") * 2 > len(verdicts) else "ok"

    def _cleared(self, node: str, j: Any) -> bool:
        """In a pair whose bandwidth was judged good (or as good as the control pairs), and not
        judged bad."""
        score = j.nodes.get(node)
        if score is None or score.verdict == "unreachable":
            return False
        controls = self._against_controls(node)
        if controls is not None:
            return controls == "ok"
        if score.verdict in ("bad", "suspect"):
            return False
        return any(pj.verdict == "ok" and node in pj.outcome.nodes for pj in j.pairs)

    def _is_bad(self, node: str, j: Any) -> bool:
        score = j.nodes.get(node)
        if score is None or score.verdict not in ("bad", "unreachable"):
            return False
        return score.verdict == "unreachable" or self._against_controls(node) != "ok"

    def _screened(self, nodes: list[str], j: Any) -> Screened:
        out = Screened()
        for n in nodes:
            if self._is_bad(n, j):
                out.bad[n] = self._evidence(n, j)
            elif self._cleared(n, j):
                out.good.append(n)
        unjudged = [n for n in nodes if n not in out.bad and n not in out.good]
        out.doc = {"ops": list(self.ops), "slow_limit": self.slow_limit, "min_busbw": self.min_busbw,
                   "references": [r.to_dict() for r in j.references], "bad": sorted(out.bad), "unjudged": unjudged,
                   "suspects": [n for n in unjudged if j.nodes[n].verdict == "suspect"],
                   "control_floors": {str(r): {op: round(v, 6) for op, v in f.items()} for r, f in self.floors.items()},
                   "rule": "busbw of each pair against the median of the pairs measured as many at once"
                           if self.min_busbw is None else "busbw of every measurement against --min-busbw"}
        return out

    def _evidence(self, node: str, j: Any) -> dict[str, Any]:
        score = j.nodes[node]
        mine = [pj for pj in j.pairs if node in pj.outcome.nodes and pj.verdict != "error"]
        failures = sum(1 for pj in mine if pj.verdict in ("slow", "fail"))
        evidence = [f"pairs: {e}" for e in score.evidence]
        if score.verdict == "unreachable":
            evidence.insert(0, "unreachable: the launcher could not reach it")
        elif self._against_controls(node) == "slow":
            evidence.append(f"pairs: its pair with a known-good node was below {self.slow_limit:g} x the slowest "
                            "control pair of the same round")
        return {"failures": failures, "runs": len(mine), "evidence": evidence,
                "confidence": posterior_bad(failures, len(mine), self.flake_rate)}
