"""Inputs for `gpucheck report` built with gpucheck's own code: verdicts (the level-1 fixture
verdicts, with burn.gemm results judged by gpucheck.core.result.judge against the H100 SKU floor and
the node median as the burn check does), a history, a sweep report (classify, the fleet
comparison, build_report and report_chunks of gpucheck.fleet.sweep, fed NodeRuns instead of
ssh), an `nccl pairs` document (gpucheck.nccl.pairs.judge_pairs) and a bisect result
(gpucheck.fleet.bisect.bisect with a group test that fails whenever the group holds a bad node).
Used by tests/test_report_*.py, scripts/screenshots.py and benchmarks/bench_report.py."""

from __future__ import annotations

import copy
import json
import random
import statistics
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HEALTHY = FIXTURES / "verdicts" / "h100-healthy.level1.json"
ECC_DBE = FIXTURES / "verdicts" / "h100-ecc-dbe.level1.json"
BF16_PEAK = 989.4  # H100 SXM dense bf16 (gpucheck.data.sku)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def with_burn(verdict: dict[str, Any], tflops: list[float], *, host: str | None = None,
              time: str | None = None) -> dict[str, Any]:
    """`verdict` plus one burn.gemm result per GPU measuring `tflops` (bf16), judged against
    the burn's default floors: 0.5 / 0.3 of the SKU's dense rate, 8 % / 25 % below the median."""
    from gpucheck.core.levels import Level
    from gpucheck.core.result import Action, Result, ResultEntry, Status, Threshold, judge
    from gpucheck.core.verdict import CheckEntry, RunFacts, Verdict, VerdictSource, build_verdict

    base = Verdict.from_json(verdict)
    results: list[Result | ResultEntry] = list(base.results)
    med = statistics.median(tflops)
    for gpu, tf in enumerate(tflops):
        deficit = round(max(0.0, (med - tf) / med * 100), 1)
        thresholds = [Threshold("tflops_bf16", "<", round(BF16_PEAK * 0.5, 1), Status.WARN, "TFLOP/s"),
                      Threshold("tflops_bf16", "<", round(BF16_PEAK * 0.3, 1), Status.FAIL, "TFLOP/s"),
                      Threshold("peer_deficit_bf16", ">", 8.0, Status.WARN, "%"),
                      Threshold("peer_deficit_bf16", ">", 25.0, Status.FAIL, "%")]
        results.append(judge("burn.gemm", thresholds, {"tflops_bf16": round(tf, 2), "peer_deficit_bf16": deficit},
                             gpu=gpu, units={"tflops_bf16": "TFLOP/s", "peer_deficit_bf16": "%"},
                             ok_summary=f"bf16 {tf:.1f} TFLOP/s ({tf / BF16_PEAK:.2f} of the H100 SXM dense peak)",
                             causes={"peer_deficit_bf16": f"slow GPU: bf16 {deficit:.0f}% below the node median "
                                                          f"of {med:.1f} TFLOP/s",
                                     "tflops_bf16": "slow GPU: bf16 below the H100 SXM floor"},
                             actions={"peer_deficit_bf16": Action.DRAIN, "tflops_bf16": Action.DRAIN}))
    checks: dict[str, list[Status]] = {}
    for r in results:
        checks.setdefault(r.check, []).append(r.status)
    from gpucheck.core.result import worst_status

    built = build_verdict(results, RunFacts(
        level=Level(2), started_at=0.0, duration_s=31.5,
        checks=tuple(CheckEntry.of(c, 2 if c == "burn.gemm" else 1, worst_status(s), 0.0) for c, s in checks.items()),
        software=base.software, host=host or base.host, gpus=base.gpus, source=VerdictSource("live", None, True)))
    doc = built.to_json()
    doc["time"] = time or "2025-06-02T10:15:00Z"
    return doc


def slow_gpu_verdict(host: str = "gpu-h100-017") -> dict[str, Any]:
    """GPU 6 of 8 at 60 % of its peers' rate: a fail (peer deficit > 25 %)."""
    return with_burn(load(HEALTHY), [702.0, 698.5, 705.1, 699.8, 701.2, 703.3, 420.4, 700.6], host=host)


def history_lines(runs: int = 6) -> str:
    """A node's history (JSON lines): healthy burns, GPU 6 slowing down, then the ECC fault."""
    out = []
    for i in range(runs):
        tf = [700.0 + (g % 3) for g in range(8)]
        tf[6] = 700.0 - i * 60.0
        base = load(ECC_DBE) if i == runs - 1 else load(HEALTHY)
        out.append(json.dumps(with_burn(base, tf, time=f"2025-06-{i + 1:02d}T10:15:00Z")))
    return "\n".join(out) + "\n"


def sweep_report(n: int = 12, *, seed: int = 7, slow: str | None = None, ecc: str | None = None,
                 dead: str | None = None) -> str:
    """A sweep report of n nodes (gpu0001 ...): every node's verdict with a burn, one node with a
    slow GPU (a fleet outlier), one with the ECC fault, one unreachable over ssh."""
    from gpucheck.fleet import compare
    from gpucheck.platform.fanout import NodeRun
    from gpucheck.fleet.sweep import SweepPlan, VerdictSpool, apply_fleet, build_report, classify, keep_summary
    from gpucheck.fleet.sweep import report_chunks

    rnd = random.Random(seed)
    names = [f"gpu{i:04d}" for i in range(1, n + 1)]
    slow, ecc, dead = slow or names[n // 3], ecc or names[n // 2], dead or names[-1]
    healthy, faulty = load(HEALTHY), load(ECC_DBE)
    plan = SweepPlan(nodes=names, run_args=["run", "--json", "--level", "2"])
    with VerdictSpool() as spool:
        outcomes = []
        for name in names:
            if name == dead:
                run = NodeRun(name, 255, "", f"ssh: connect to host {name} port 22: Connection refused")
            else:
                tf = [rnd.gauss(700.0, 4.0) for _ in range(8)]
                if name == slow:
                    tf[3] = 600.0
                v = with_burn(copy.deepcopy(faulty if name == ecc else healthy), tf, host=name)
                run = NodeRun(name, int(v["exit_code"]), json.dumps(v))
            outcomes.append(keep_summary(classify(run), spool))
        comparison = compare.compare_inputs({o.node: o.inputs for o in outcomes if o.inputs is not None})
        apply_fleet(outcomes, compare.findings_by_node(comparison))
        report = build_report(outcomes, comparison, plan=plan, started_at=1748859300.0, duration_s=42.0)
        return "".join(report_chunks(report, spool))


def pairs_document(n: int = 8, bad: str | None = None, seed: int = 3) -> dict[str, Any]:
    """`nccl pairs` over n nodes (random rounds): every pair with the bad node at 30 % of the
    others' bus bandwidth, and one of its pairs corrupting data."""
    from gpucheck.nccl.pairs_run import pairs_document as document
    from gpucheck.nccl.pairs import PairOutcome, judge_pairs, random_rounds

    names = [f"node{i:02d}" for i in range(1, n + 1)]
    bad = bad or names[n // 2]
    rnd = random.Random(seed)
    plan = random_rounds(names, 3, seed)
    outcomes = []
    for r, pairs in enumerate(plan, start=1):
        for a, b in pairs:
            if bad in (a, b) and r == 1:
                outcomes.append(PairOutcome(r, (a, b), "fail", summary=f"data corruption in all_reduce on rank "
                                            f"{[a, b].index(bad)} (host {bad})", blamed=[bad]))
                continue
            bw = rnd.gauss(180.0, 3.0) * (0.3 if bad in (a, b) else 1.0)
            outcomes.append(PairOutcome(r, (a, b), "ok", busbw_gbs=bw, algbw_gbs=bw, time_s=0.01, bytes=1 << 26))
    j = judge_pairs(outcomes, names)
    code = 1 if (j.bad or j.suspects) else 0
    return document(j, nodes=names, strategy="random", plan=plan, ops=["all_reduce"], code=code, injected=[])


def bisect_result(n: int = 64, bad: tuple[str, ...] = ("n037",)) -> dict[str, Any]:
    """gpucheck.fleet.bisect over n nodes with a group test failing when it holds a bad node."""
    from gpucheck.fleet.bisect import GroupOutcome, bisect

    names = [f"n{i:03d}" for i in range(1, n + 1)]

    def test(group: list[str]) -> GroupOutcome:
        hit = [x for x in group if x in bad]
        return GroupOutcome(not hit, f"all_reduce corrupt on {hit[0]}" if hit else "busbw 180 GB/s")

    return bisect(names, test, strategy="binary").to_dict()
