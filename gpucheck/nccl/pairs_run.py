"""`gpucheck nccl pairs`: plan the rounds, run every pair of a round at once, turn each pair's
group outcome into a PairOutcome, judge, and build the `gpucheck.nccl.pairs` document.

Exit code (`exit_code`): 1 when a node is bad, suspect or unreachable; 3 when nothing could be
measured, when every pair failed the same way (the test or the setup is broken: no node is
blamed), when some pair's bandwidth had no reference and no node was found bad, or when a
signal stopped the run; 0 otherwise.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from ..platform.processes import Interrupted, stopping
from . import pairs as P
from .launch import Launcher, run_group
from .report import largest

if TYPE_CHECKING:  # pragma: no cover
    from .collective import Failure, SizeRow
    from .report import Outcome

EXIT_OK, EXIT_FAIL, EXIT_NO_JUDGEMENT = 0, 1, 3


def plan_rounds(strategy: str, nodes: list[str], *, rounds: int, seed: int | None, good: list[str],
                suspects: list[str]) -> list[list[P.Pair]]:
    """The rounds of pairs; ValueError(message, option) when the strategy cannot be planned."""
    if strategy == "ring":
        return P.ring_rounds(nodes)
    if strategy == "random":
        return P.random_rounds(nodes, rounds, seed)
    if not good:
        raise ValueError("--strategy suspects needs --good NODESET", "--good")
    unknown = [n for n in [*good, *suspects] if n not in nodes]
    if unknown:
        raise ValueError(f"{', '.join(unknown)} not in the node set", "--good/--suspects")
    plan = P.suspect_rounds(suspects or [n for n in nodes if n not in good], good, rounds)
    if not plan:
        raise ValueError("no suspect to pair with a good node", "--suspects")
    return plan


def _corrupt_map(corrupt: dict[str, Any] | None, pair: tuple[str, str], nproc_per_node: int) -> dict[str, str] | None:
    """--inject corrupt:host=H: the `nccl run --inject` text for H's rank in this pair."""
    if not corrupt or corrupt.get("host") not in pair:
        return None
    rank = list(pair).index(corrupt["host"]) * nproc_per_node
    spec = [f"rank={rank}"] + [f"{k}={corrupt[k]}" for k in ("op", "iter", "index") if k in corrupt]
    return {corrupt["host"]: "corrupt:" + ",".join(spec)}


def run_plan(plan: list[list[P.Pair]], lau: Launcher, args: list[str], *, deadline_s: float, fanout: int,
             ops: list[str], corrupt: dict[str, Any] | None, nproc_per_node: int = 1,
             progress: Callable[[str], None] | None = None) -> list[P.PairOutcome]:
    """Run every round's pairs (concurrently within a round) and build PairOutcomes.

    On a stop (SIGTERM/SIGINT) raises Interrupted with the outcomes of the pairs that finished
    before it as `partial`: the pairs it cut short are left out, and no further round starts."""
    outcomes: list[P.PairOutcome] = []
    index = 0
    for rnd, pairs in enumerate(plan, start=1):
        if why := stopping():
            raise Interrupted(why, partial=outcomes)
        if progress:
            progress(f"round {rnd}/{len(plan)}: " + ", ".join(f"{a}+{b}" for a, b in pairs))
        at_once = min(fanout, max(1, len(pairs)))
        jobs = []
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            for a, b in pairs:
                cmap = _corrupt_map(corrupt, (a, b), nproc_per_node)
                jobs.append(((a, b), cmap, pool.submit(run_group, [a, b], lau, args, deadline_s=deadline_s,
                                                       index=index, corrupt=cmap, nproc_per_node=nproc_per_node)))
                index += 1
            for pair, cmap, fut in jobs:
                try:
                    group = fut.result()
                except Interrupted:
                    continue  # the round ends below
                out = pair_outcome(rnd, pair, group, ops, injected=[corrupt["text"]] if cmap and corrupt else [])
                out.concurrency = at_once
                outcomes.append(out)
        if why := stopping():
            raise Interrupted(why, partial=outcomes)
    return outcomes


def pair_outcome(rnd: int, nodes: tuple[str, str], group: "Outcome", ops: list[str] | str,
                 injected: list[str] | None = None) -> P.PairOutcome:
    """One pair's group outcome (gpucheck.nccl.launch.run_group) as a PairOutcome."""
    ops = [ops] if isinstance(ops, str) else list(ops)
    status = group.get("status")
    failure: Failure = group.get("failure") or {}
    launch_errors = group.get("launch_errors") or {}
    unreachable = [h for h in group.get("unreachable") or [] if h in nodes]
    injected = injected or []
    if launch_errors and len(launch_errors) < len(nodes):
        # the hosts that could not take part (unreachable, no gpucheck) are the problem
        summary = "; ".join(f"{h}: {w}" for h, w in launch_errors.items())
        return P.PairOutcome(rnd, nodes, "fail", summary=summary, blamed=sorted(launch_errors), failure=failure,
                             injected=injected, unreachable=unreachable)
    if status == "ok":
        return _measured(rnd, nodes, group, ops, injected)
    if status == "fail":
        host = failure.get("host")
        blamed = [host] if failure.get("kind") in ("timeout", "exit") and host is not None and host in nodes else []
        summary = group.get("summary", "")
        if launch_errors:
            summary += "; " + "; ".join(f"{h}: {w}" for h, w in launch_errors.items())
        return P.PairOutcome(rnd, nodes, "fail", summary=summary, blamed=blamed, failure=failure, injected=injected)
    # error: no rank ran the test (busy GPU, a rendezvous that never formed, no host could start)
    summary = group.get("summary", "") or "no result"
    if launch_errors:
        summary = "; ".join(f"{h}: {w}" for h, w in launch_errors.items())
    return P.PairOutcome(rnd, nodes, "error", summary=summary, failure=failure, injected=injected,
                         unreachable=unreachable)


def _measured(rnd: int, nodes: tuple[str, str], group: "Outcome", ops: list[str],
              injected: list[str]) -> P.PairOutcome:
    found = {op: largest(group.get("results", []), op) for op in ops}
    missing = [op for op, row in found.items() if row is None]
    if missing:
        return P.PairOutcome(rnd, nodes, "error", summary=f"no {', '.join(missing)} measurement", injected=injected)
    rows: dict[str, SizeRow] = {op: row for op, row in found.items() if row is not None}  # every op here
    impossible = [f"{op} busbw {row.get('busbw_gbs')!r}" for op, row in rows.items()
                  if not real_bandwidth(row.get("busbw_gbs"))]
    if impossible:  # not a measurement (a broken timer, a corrupt or hostile rank): not examined
        return P.PairOutcome(rnd, nodes, "error", summary=f"no usable measurement: {', '.join(impossible)} is not "
                             "a finite, non-negative bandwidth", injected=injected)
    first = rows[ops[0]]
    return P.PairOutcome(rnd, nodes, "ok", busbw_gbs=first["busbw_gbs"], algbw_gbs=first["algbw_gbs"],
                         time_s=first["time_s"], bytes=first["bytes"], summary=group.get("summary", ""),
                         injected=injected, op_busbw={op: busbw for op, row in rows.items()
                                                      if (busbw := row["busbw_gbs"]) is not None})  # all: real


def real_bandwidth(value: Any) -> bool:
    """A bandwidth a rank could have measured: a finite number, not negative (json.loads lets NaN,
    Infinity and negatives through)."""
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def exit_code(j: P.Judgement, interrupted: str | None) -> int:
    if interrupted or j.measured == 0 or j.broken:
        return EXIT_NO_JUDGEMENT
    if j.bad or j.suspects or j.unreachable:
        return EXIT_FAIL
    return EXIT_NO_JUDGEMENT if (j.unjudged or j.unmeasured) else EXIT_OK


def pairs_document(j: P.Judgement, *, nodes: list[str], strategy: str, plan: list[list[P.Pair]], ops: list[str],
                   code: int, injected: list[str], command: str = "", interrupted: str | None = None) -> dict[str, Any]:
    """The `gpucheck.nccl.pairs` document. `interrupted`: the signal that stopped the run; the
    pairs and the judgement then cover only the pairs measured before it (exit 3)."""
    return {
        "schema": "gpucheck.nccl.pairs",
        "version": 2,
        "nodes": list(nodes),
        "strategy": strategy,
        "op": ops[0],
        "ops": list(ops),
        "rounds": [[list(p) for p in r] for r in plan],
        "reference_busbw_gbs": j.reference_gbs,
        "reference": j.reference_kind,
        "references": [r.to_dict() for r in j.references],
        "pairs": [{**pj.outcome.to_dict(), "verdict": pj.verdict, "slow_ops": list(pj.slow_ops),
                   "relative": None if pj.relative is None else round(pj.relative, 3)} for pj in j.pairs],
        "node_scores": [s.to_dict() for s in j.nodes.values()],
        "bad": j.bad,
        "suspects": j.suspects,
        "unreachable": j.unreachable,
        "unmeasured": j.unmeasured,
        "unjudged_pairs": j.unjudged,
        "broken": j.broken,
        "command": command,
        "injected": list(injected),
        "interrupted": interrupted,
        "pairs_planned": sum(len(r) for r in plan),
        "exit_code": code,
    }
