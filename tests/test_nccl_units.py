"""Collective tests without namespaces: busbw formulas, patterns and verification, pairing,
scoring, report merging, topology and option parsing, judging, and the CPU (gloo) intra-node check
with real rank processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpucheck.nccl import bandwidth as bw
from gpucheck.nccl import expected, pairs as P, patterns
from gpucheck.nccl.collective import corruption_summary, timeout_summary
from gpucheck.nccl.intra import baselines_from_history, judge, rank_spread
from gpucheck.nccl.launch import DEFAULT_SSH, Launcher, parse_addrs
from gpucheck.nccl.report import merge, parse_events
from gpucheck.core.result import Action, Result, Status
from gpucheck.core.state import State

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpucheck.cli.main", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout, cwd=str(ROOT))


# -- bandwidth ---------------------------------------------------------------------------------
def test_busbw_factors_match_nccl_tests():
    assert bw.busbw_factor("all_reduce", 2) == 1.0
    assert bw.busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bw.busbw_factor("all_gather", 8) == pytest.approx(0.875)
    assert bw.busbw_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bw.busbw_factor("all_to_all", 2) == pytest.approx(0.5)
    assert bw.busbw_factor("broadcast", 8) == 1.0
    assert bw.busbw_factor("allreduce", 1) == 0.0  # alias; one rank moves nothing


def test_algbw_and_busbw_values():
    # 1 GiB in 10 ms: 107.37 GB/s algbw; 8-rank all-reduce busbw = 1.75 x that
    assert bw.algbw_gbs(1 << 30, 0.01) == pytest.approx(107.374, rel=1e-4)
    assert bw.busbw_gbs("all_reduce", 8, 1 << 30, 0.01) == pytest.approx(187.904, rel=1e-4)
    assert bw.algbw_gbs(100, 0) is None


def test_sizes_and_ops_parsing():
    assert bw.parse_size("64K") == 65536
    assert bw.parse_size("1MiB") == 1 << 20
    assert bw.parse_size("2g") == 2 << 30
    assert bw.parse_sizes("1M-8M") == [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    assert bw.parse_sizes("4M,1M,1M") == [1 << 20, 4 << 20]
    for bad in ("", "1X", "0", "-1M", "8M-1M"):
        with pytest.raises(ValueError):
            bw.parse_sizes(bad)
    assert bw.parse_ops("ar,all-gather,alltoall") == ["all_reduce", "all_gather", "all_to_all"]
    with pytest.raises(ValueError):
        bw.parse_ops("broadcast")
    with pytest.raises(ValueError):
        bw.parse_ops("nope")
    assert bw.align_size(1 << 20, 3) == 1048572 and bw.align_size(1, 4) == 16
    assert bw.median([3.0, 1.0, 2.0]) == 2.0 and bw.median([1.0, 2.0]) == 1.5 and bw.median([]) is None


# -- patterns ----------------------------------------------------------------------------------
def test_pattern_sums_are_exact_and_distinct():
    vals = {patterns.value(r, i, k) for r in range(8) for i in range(300) for k in range(3)}
    assert min(vals) >= -patterns.HALF and max(vals) <= patterns.HALF
    # 4096 ranks of the largest magnitude still sum far below 2**24 (exact in float32)
    assert 4096 * patterns.HALF < 2 ** 24
    # a rank's contribution, and the iteration, change most elements
    assert sum(patterns.value(0, i, 0) != patterns.value(1, i, 0) for i in range(251)) >= 250
    assert sum(patterns.value(0, i, 0) != patterns.value(0, i, 1) for i in range(251)) >= 250


def _simulate(op: str, world: int, size: int, k: int = 0):
    torch = pytest.importorskip("torch")
    pats = [patterns.Patterns(torch, op, size, r, world, torch.device("cpu")) for r in range(world)]
    for p in pats:
        p.prepare(k)
    c = pats[0].chunk
    total = sum(q.inp.clone() for q in pats)  # all_reduce is in place: sum before writing
    for r, p in enumerate(pats):  # what a correct collective delivers to rank r
        if op == "all_reduce":
            p.out.copy_(total)
        elif op == "all_gather":
            p.out.copy_(torch.cat([q.inp for q in pats]))
        else:
            p.out.copy_(torch.cat([q.inp[r * c:(r + 1) * c] for q in pats]))
    return pats


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "all_to_all"])
def test_verification_passes_correct_data_and_names_the_bad_element(op):
    pats = _simulate(op, 4, 4096, k=3)
    assert all(p.verify().bad == 0 for p in pats)
    i = pats[2].corrupt(700)
    chk = pats[2].verify()
    assert (chk.bad, chk.index) == (1, 700) and chk.got == chk.expected + 1
    assert chk.src_rank == (None if op == "all_reduce" else 700 // pats[2].chunk)
    assert i == 700 and pats[1].verify().bad == 0


def test_stale_or_missing_contribution_is_caught():
    torch = pytest.importorskip("torch")
    pats = _simulate("all_reduce", 3, 3 * 1024)
    rank1 = patterns.Patterns(torch, "all_reduce", 3 * 1024, 1, 3, torch.device("cpu"))
    rank1.prepare(0)
    pats[0].out.sub_(rank1.inp)  # rank 1's contribution missing from rank 0's result
    assert pats[0].verify().bad == int((rank1.inp != 0).sum()) > 700  # every element it touched
    stale = _simulate("all_gather", 2, 2048, k=0)
    stale[0].prepare(1)  # expected now for iteration 1, output still from iteration 0
    stale[0].out.copy_(torch.cat([stale[0].inp, stale[1].inp]))
    assert stale[0].verify().bad > 0


def test_messages():
    assert timeout_summary(1, "h2", "all_reduce 1M") == "timeout waiting for rank 1 on host h2 in all_reduce 1M"
    assert timeout_summary(None, None) == "timeout waiting for peers (no rank identified)"
    msg = corruption_summary("all_gather", 1, "h2", 1 << 20, 77, -3.0, -2.0, 0)
    assert msg == ("data corruption in all_gather on rank 1 (host h2): size 1M, first bad index 77, "
                   "data from rank 0 (expected -3, got -2)")


# -- pairing -----------------------------------------------------------------------------------
def _disjoint(rounds):
    for r in rounds:
        nodes = [n for p in r for n in p]
        assert len(nodes) == len(set(nodes))


def test_ring_rounds():
    four = P.ring_rounds(["a", "b", "c", "d"])
    _disjoint(four)
    assert sorted(p for r in four for p in r) == [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]
    five = P.ring_rounds(list("abcde"))
    _disjoint(five)
    assert len(five) == 3 and len([p for r in five for p in r]) == 5
    assert P.ring_rounds(["a", "b"]) == [[("a", "b")]] and P.ring_rounds(["a"]) == []


def test_random_rounds_meet_new_partners_and_are_reproducible():
    nodes = ["n1", "n2", "n3", "n4"]
    rounds = P.random_rounds(nodes, 3, seed=7)
    _disjoint(rounds)
    pairs = [frozenset(p) for r in rounds for p in r]
    assert len(pairs) == 6 and len(set(pairs)) == 6  # every node meets every other node once
    assert rounds == P.random_rounds(nodes, 3, seed=7)
    odd = P.random_rounds(list("abcde"), 5, seed=1)
    _disjoint(odd)
    sat_out = [next(n for n in "abcde" if all(n not in p for p in r)) for r in odd]
    assert sorted(sat_out) == list("abcde")  # the node that sits out rotates


def test_suspect_rounds_pair_each_suspect_with_good_nodes():
    rounds = P.suspect_rounds(["s1", "s2", "s3"], ["g1", "g2"], rounds=2)
    _disjoint(rounds)
    flat = [p for r in rounds for p in r]
    assert all(s.startswith("s") and g.startswith("g") for s, g in flat)
    for s in ("s1", "s2", "s3"):
        assert len({g for x, g in flat if x == s}) == 2  # confirmed with two different good nodes
    assert P.suspect_rounds(["g1"], ["g1"]) == []


# -- scoring -----------------------------------------------------------------------------------
def _ok(rnd, a, b, v):
    return P.PairOutcome(rnd, (a, b), "ok", busbw_gbs=v)


def test_slow_node_is_named_and_partners_stay_healthy():
    nodes = ["n1", "n2", "n3", "n4"]
    outs = [_ok(1, "n1", "n3", 1.0), _ok(1, "n2", "n4", 10.0),
            _ok(2, "n2", "n3", 1.1), _ok(2, "n1", "n4", 9.0),
            _ok(3, "n3", "n4", 0.9), _ok(3, "n1", "n2", 11.0)]
    j = P.judge_pairs(outs, nodes)
    assert j.bad == ["n3"] and j.suspects == []
    assert {n: s.verdict for n, s in j.nodes.items()} == {"n1": "ok", "n2": "ok", "n3": "bad", "n4": "ok"}
    assert j.nodes["n3"].bad == 3 and j.nodes["n3"].score < 0.7
    assert any("partners fine" in e for e in j.nodes["n3"].evidence)


def test_two_pairs_give_no_median_reference_and_are_not_judged():
    """Old: "only failures are judged" and exit 0: a pair whose bandwidth was not examined passed."""
    from gpucheck.nccl.pairs_run import exit_code

    j = P.judge_pairs([_ok(1, "a", "b", 1.0), _ok(1, "c", "d", 9.0)], list("abcd"))
    assert j.reference_gbs is None and "bandwidth not judged" in j.reference_kind
    assert {p.verdict for p in j.pairs} == {"unjudged"} and j.unjudged == 2
    assert exit_code(j, None) == 3


def _conc(rnd, a, b, v, conc, **ops):
    return P.PairOutcome(rnd, (a, b), "ok", busbw_gbs=v, concurrency=conc, op_busbw=ops or {"all_reduce": v})


def test_pairs_are_compared_only_with_pairs_measured_as_many_at_once():
    """Four pairs at once measure lower than one pair alone; old: a reference from every pair
    made the four-at-once round 'slow' next to the alone ones (and the alone ones set it)."""
    alone = [_conc(i, f"s{i}", f"t{i}", 10.0, 1) for i in range(1, 4)]
    crowd = [_conc(9, f"a{i}", f"b{i}", 4.0, 4) for i in range(4)] + [_conc(9, "x", "y", 4.2, 4)]
    j = P.judge_pairs(alone + crowd, sorted({n for o in alone + crowd for n in o.nodes}))
    assert {p.verdict for p in j.pairs} == {"ok"} and not j.bad
    assert sorted((r.concurrency, r.busbw_gbs) for r in j.references) == [(1, 10.0), (4, 4.0)]
    slow = crowd[:-1] + [_conc(9, "x", "y", 1.0, 4)]
    j = P.judge_pairs(alone + slow, sorted({n for o in alone + slow for n in o.nodes}))
    assert [p.outcome.nodes for p in j.pairs if p.verdict == "slow"] == [("x", "y")]


def test_every_collective_is_judged():
    outs = [_conc(1, f"a{i}", f"b{i}", 5.0, 4, all_gather=5.0, all_reduce=9.0) for i in range(3)]
    outs.append(_conc(1, "x", "y", 5.0, 4, all_gather=5.1, all_reduce=2.0))  # only all_reduce is slow
    j = P.judge_pairs(outs, sorted({n for o in outs for n in o.nodes}))
    (slow,) = [p for p in j.pairs if p.verdict == "slow"]
    assert slow.outcome.nodes == ("x", "y") and slow.slow_ops == ["all_reduce"]


def test_unreachable_host_is_named_and_its_partners_stay_healthy():
    from gpucheck.nccl.pairs_run import exit_code, pair_outcome

    group = {"status": "error", "summary": "no rank reported", "failure": None, "results": [],
             "launch_errors": {"d": "unreachable (launcher exit 255): ssh: connect to host d port 22: Connection refused"},
             "unreachable": ["d"], "stopped": ["c"]}
    out = pair_outcome(1, ("c", "d"), group, ["all_reduce"])
    assert out.status == "fail" and out.blamed == ["d"] and out.unreachable == ["d"]
    assert "Connection refused" in out.summary
    outs = [out, _ok(1, "a", "b", 5.0), _ok(2, "a", "c", 5.0), _ok(2, "b", "e", 5.0), _ok(3, "c", "e", 5.0)]
    j = P.judge_pairs(outs, list("abcde"))
    assert j.unreachable == ["d"] and j.bad == [] and j.nodes["c"].verdict == "ok"
    assert exit_code(j, None) == 1


def test_every_pair_failing_the_same_way_is_a_broken_test_not_bad_nodes():
    from gpucheck.nccl.pairs_run import exit_code

    outs = [P.PairOutcome(1, (a, b), "fail", summary=f"{b}: gpucheck not found (exit 127): sh: 1: gpucheck: not found",
                          blamed=[b]) for a, b in (("n1", "n2"), ("n3", "n4"))]
    outs += [P.PairOutcome(2, (a, b), "fail", summary=f"{a}: gpucheck not found (exit 127): sh: 1: gpucheck: not found",
                           blamed=[a]) for a, b in (("n2", "n3"), ("n4", "n1"))]
    j = P.judge_pairs(outs, ["n1", "n2", "n3", "n4"])
    assert j.broken and "every pair (4) failed the same way" in j.broken
    assert exit_code(j, None) == 3
    # a rendezvous that never formed on every pair (a setup error): not measured, broken
    rdv = [P.PairOutcome(1, (a, b), "error", summary=f"the rendezvous never formed (rank 1 on host {b}: "
                                                     "Connection refused)") for a, b in (("n1", "n2"), ("n3", "n4"))]
    j = P.judge_pairs(rdv, ["n1", "n2", "n3", "n4"])
    assert j.broken and j.measured == 0 and exit_code(j, None) == 3
    assert not any(s.verdict == "bad" for s in j.nodes.values())


def test_single_slow_pair_is_only_suspect_and_absolute_limit():
    j = P.judge_pairs([_ok(1, "a", "b", 1.0)], ["a", "b"], min_busbw=5.0)
    assert j.bad == [] and sorted(j.suspects) == ["a", "b"]
    j = P.judge_pairs([_ok(1, "a", "b", 6.0)], ["a", "b"], min_busbw=5.0)
    assert j.bad == [] and j.suspects == []


def test_failures_blame_the_named_node_and_errors_are_not_judged():
    outs = [P.PairOutcome(1, ("a", "b"), "fail", summary="timeout waiting for rank 1 on host b", blamed=["b"]),
            _ok(1, "c", "d", 5.0),
            P.PairOutcome(2, ("a", "c"), "error", summary="ssh: could not resolve"),
            _ok(2, "b", "d", 5.0)]
    j = P.judge_pairs(outs, ["a", "b", "c", "d"])
    assert j.nodes["a"].verdict == "ok" and j.nodes["a"].pairs == 1  # the error pair is not counted
    assert j.nodes["b"].bad == 1 and j.nodes["b"].verdict == "ok"  # 1 of 2 pairs: not most
    j2 = P.judge_pairs(outs[:1], ["a", "b"])
    assert j2.bad == ["b"] and j2.nodes["a"].verdict == "ok"
    none = P.judge_pairs([P.PairOutcome(1, ("a", "b"), "error")], ["a", "b"])
    assert none.measured == 0 and {s.verdict for s in none.nodes.values()} == {"unmeasured"}


def test_corruption_in_every_pair_of_one_node():
    outs = [P.PairOutcome(1, ("a", "b"), "fail", summary="data corruption in all_reduce on rank 1 (host b)"),
            _ok(1, "c", "d", 5.0),
            P.PairOutcome(2, ("b", "c"), "fail", summary="data corruption in all_reduce on rank 0 (host b)"),
            _ok(2, "d", "a", 5.0)]
    j = P.judge_pairs(outs, ["a", "b", "c", "d"])
    assert j.bad == ["b"]


# -- merging rank reports ----------------------------------------------------------------------
def _rep(rank, status="ok", failure=None, world=2, results=None, host=None):
    return {"event": "result", "rank": rank, "world": world, "host": host or f"h{rank}",
            "hosts": [f"h{i}" for i in range(world)], "status": status, "summary": status,
            "failure": failure, "results": results or [], "backend": "gloo", "injected": []}


def test_merge_prefers_corruption_then_the_culprit_survivors_name():
    corr = {"kind": "corruption", "rank": 1, "host": "h1", "summary": "data corruption in all_reduce on rank 1"}
    out = merge([_rep(0, "fail", corr), _rep(1, "fail", corr)])
    assert out["status"] == "fail" and out["failure"]["rank"] == 1
    t_named = {"kind": "timeout", "rank": 2, "host": "h2", "what": "all_reduce 1M"}
    t_self = {"kind": "timeout", "rank": 1, "host": "h1", "what": ""}  # killed as frozen by the supervisor
    out = merge([_rep(0, "fail", t_named, 3), _rep(1, "fail", t_named, 3), _rep(2, "fail", {**t_self, "rank": 2}, 3)])
    assert out["summary"] == "timeout waiting for rank 2 on host h2 in all_reduce 1M"
    out = merge([_rep(0, "fail", {"kind": "timeout", "rank": 1, "host": "h1", "what": "x"}),
                 _rep(1, "error", {"kind": "exit", "rank": 1})])
    assert out["failure"]["rank"] == 1 and out["status"] == "fail"
    out = merge([_rep(0)], world=2)  # rank 1 never reported
    assert out["status"] == "fail" and "rank 1 on host h1 exited" in out["summary"]
    assert merge([_rep(0), _rep(1)])["status"] == "ok"
    assert merge([_rep(0, "error", {"kind": "error"}), _rep(1, "error", {"kind": "error"})])["status"] == "error"


def test_cancelled_run_is_stopped_and_not_a_hardware_verdict():
    import threading

    from gpucheck.nccl.collective import RankSpec
    from gpucheck.nccl.procs import run_ranks

    cancel = threading.Event()
    cancel.set()  # a SIGTERM / whole-run timeout before the ranks could finish
    specs = [RankSpec(rank=r, world=2, ops=["all_reduce"], sizes=[4096], master_port=0 if r == 0 else None,
                      host="h", timeout_s=5) for r in range(2)]
    reports = run_ranks(specs, deadline_s=30, cancel=cancel)
    assert [r["failure"]["kind"] for r in reports] == ["cancelled", "cancelled"]
    out = merge(reports, 2)
    assert out["status"] == "error" and out["summary"].startswith("stopped before the end")
    rs = judge(out, ops=["all_reduce"], params=PARAMS, devices=[0, 1], gpu_name=None)
    assert [r.status for r in rs] == [Status.ERROR]


def test_parse_events_skips_noise():
    text = 'warning: x\n{"event":"listening","port":5}\nnot json {\n{"event":"result","rank":0}\n{"a":1}\n'
    assert [e["event"] for e in parse_events(text)] == ["listening", "result"]


# -- launcher, topology, options ---------------------------------------------------------------
def test_launcher_templates():
    cmd = ["gpucheck", "nccl", "run", "--host-label", "a b"]
    ssh = Launcher(DEFAULT_SSH).argv("node1", cmd)
    assert ssh[0] == "ssh" and "BatchMode=yes" in ssh and ssh[-2] == "node1"
    assert ssh[-1] == "gpucheck nccl run --host-label 'a b'"
    ns = Launcher("ip netns exec {host} {cmd}", addrs={"h1": "10.77.0.1"})
    assert ns.argv("h1", cmd) == ["ip", "netns", "exec", "h1", *cmd] and ns.addr("h1") == "10.77.0.1"
    assert ns.addr("h2") == "h2"
    assert Launcher("srun").is_srun
    with pytest.raises(ValueError):
        Launcher("ssh {host}").validate()
    assert parse_addrs(["a=1.2.3.4"]) == {"a": "1.2.3.4"}
    with pytest.raises(ValueError):
        parse_addrs(["a"])


def test_topology_from_options_torchrun_and_slurm():
    from gpucheck.cli.nccl import parse_corrupt
    from gpucheck.nccl.topology import TopologyError, resolve_topology

    t = resolve_topology({"rank": 1, "world_size": 2, "master_addr": "10.0.0.1", "master_port": "stdin"}, {})
    assert (t.ranks, t.world, t.master_addr, t.master_port) == ([1], 2, "10.0.0.1", "stdin")
    t = resolve_topology({"node_rank": 1, "nnodes": 2, "nproc_per_node": 4, "master_port": "29500"}, {})
    assert t.ranks == [4, 5, 6, 7] and t.local_ranks == [0, 1, 2, 3] and t.world == 8
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "n0", "MASTER_PORT": "29400",
           "TORCHELASTIC_USE_AGENT_STORE": "True"}
    t = resolve_topology({}, env)
    assert (t.ranks, t.local_ranks, t.master_addr, t.master_port, t.agent_store, t.source) == \
        ([3], [3], "n0", 29400, True, "torchrun")
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "1234",
           "SLURM_STEP_NODELIST": "gpu[007-008]"}
    t = resolve_topology({}, env)
    assert (t.ranks, t.world, t.master_addr, t.master_port, t.source) == ([1], 2, "gpu007", 21234, "slurm")
    for opts, env in (({}, {}), ({"rank": 0, "world_size": 1}, {}), ({"rank": 1}, {}),
                      ({"rank": 1, "world_size": 2}, {}), ({"rank": 2, "world_size": 2, "master_port": "1"}, {}),
                      ({"master_port": "99999", "rank": 0, "world_size": 2}, {})):
        with pytest.raises(TopologyError):
            resolve_topology(opts, env)
    c = parse_corrupt(["corrupt:rank=1,op=ag,iter=2"], keys=("rank",))
    assert c == {"text": "corrupt:rank=1,op=ag,iter=2", "rank": 1, "op": "all_gather", "iter": 2}
    for bad in (["bitflip:gpu=1"], ["corrupt:gpu=1"], ["corrupt:rank=x"], ["corrupt:rank=1", "corrupt:rank=0"]):
        with pytest.raises(click.BadParameter):
            parse_corrupt(bad, keys=("rank",))


@pytest.mark.parametrize("args", [
    ["nccl", "pairs", "node[1-"],
    ["nccl", "pairs", "node1"],
    ["nccl", "pairs", "n[1-4]", "--strategy", "suspects"],
    ["nccl", "pairs", "n[1-4]", "--sizes", "1Q"],
    ["nccl", "pairs", "n[1-4]", "--launcher", "ssh {host}"],
    ["nccl", "pairs", "n[1-4]", "--inject", "corrupt:host=n9"],
    ["nccl", "run"],
    ["nccl", "run", "--rank", "1", "--world-size", "2"],
    ["nccl", "run", "--rank", "0", "--world-size", "2", "--inject", "corrupt:rank=1,op=all_gather"],
    ["nccl", "run", "--rank", "0", "--world-size", "2", "--iters", "2", "--inject", "corrupt:rank=1,iter=2"],
])
def test_usage_errors_exit_2(args):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert "error" in r.stderr.lower()


def test_nccl_modules_do_not_import_torch():
    code = ("import sys, gpucheck.tests_suite.nccl_intra, gpucheck.nccl.launch, gpucheck.nccl.procs, gpucheck.cli.nccl\n"
            "from gpucheck.cli.main import cli\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


# -- expected table and judging ----------------------------------------------------------------
def test_expected_table():
    assert expected.expected_busbw("all_reduce", "NVIDIA H100 80GB HBM3", 8)[0] == 370.0
    assert expected.expected_busbw("all_reduce", "NVIDIA H100 80GB HBM3", 8, nvls=True)[0] == 480.0
    assert expected.expected_busbw("all_reduce", "NVIDIA A100-SXM4-80GB", 8)[0] == 230.0
    assert expected.expected_busbw("all_reduce", "NVIDIA H100 80GB HBM3", 4) == (None, "")
    assert expected.expected_busbw("all_gather", "NVIDIA H100 80GB HBM3", 8) == (None, "")
    v, src = expected.expected_busbw("all_gather", None, 2, overrides={"expected_all_gather_gbs": 5})
    assert v == 5.0 and "config" in src


PARAMS = {"warn_fraction": 0.85, "fail_fraction": 0.6, "baseline_warn_fraction": 0.85, "rank_spread_warn": 1.0,
          "nvls": False, "expected_all_reduce_gbs": 0.0, "expected_all_gather_gbs": 0.0,
          "expected_all_to_all_gbs": 0.0}


def _outcome(backend, busbw, ranks=8, status="ok", failure=None, rank_min=None):
    row = {"op": "all_reduce", "bytes": 1 << 30, "time_s": 0.01, "algbw_gbs": busbw / 1.75, "busbw_gbs": busbw,
           "rank_time_s": [0.01] * ranks, "rank_min_s": rank_min or [0.01] * ranks, "errors": []}
    return {"status": status, "summary": (failure or {}).get("summary", "ok"), "failure": failure, "world": ranks,
            "backend": backend, "results": [row]}


def test_judge_against_the_sku_table():
    name = "NVIDIA H100 80GB HBM3"
    ok = judge(_outcome("nccl", 372.0), ops=["all_reduce"], params=PARAMS, devices=list(range(8)), gpu_name=name)
    assert ok[0].status is Status.PASS and ok[0].subject == "node/all_reduce"
    assert ok[0].metrics["expected_busbw_gbs"] == 370.0
    warn = judge(_outcome("nccl", 300.0), ops=["all_reduce"], params=PARAMS, devices=list(range(8)), gpu_name=name)
    assert warn[0].status is Status.WARN and "below expected 370" in warn[0].summary
    bad = judge(_outcome("nccl", 150.0), ops=["all_reduce"], params=PARAMS, devices=list(range(8)), gpu_name=name)
    assert bad[0].status is Status.FAIL and bad[0].action is Action.INVESTIGATE
    cpu = judge(_outcome("gloo", 0.3, ranks=2), ops=["all_reduce"], params=PARAMS, devices=[0, 1], gpu_name=None)
    assert cpu[0].status is Status.PASS
    assert "no expected-bandwidth table for gloo/cpu; judged by data integrity and rank balance" in cpu[0].summary


def test_judge_names_the_gpu_of_a_corrupting_or_hung_rank_and_unbalanced_ranks():
    corr = {"kind": "corruption", "rank": 1, "op": "all_reduce", "bytes": 1024, "index": 5, "iter": 1, "nbad": 3,
            "bad_iters": 1, "expected": 3.0, "got": 4.0, "summary": "data corruption in all_reduce on rank 1 (host x)"}
    rs = judge(_outcome("nccl", 372.0, ranks=2, status="fail", failure=corr), ops=["all_reduce"], params=PARAMS,
               devices=[2, 5], gpu_name=None, injected=["corrupt:rank=1"])
    first = rs[0]
    assert (first.status, first.gpu, first.action) == (Status.FAIL, 5, Action.DRAIN)
    assert first.injected == ["corrupt:rank=1"] and first.metrics["corrupt_index"] == 5
    hung = {"kind": "timeout", "rank": 0, "host": "x",
            "summary": "timeout waiting for rank 0 on host x in all_reduce 1M"}
    rs = judge({**_outcome("nccl", 1.0, ranks=2), "status": "fail", "failure": hung, "summary": hung["summary"]},
               ops=["all_reduce"], params=PARAMS, devices=[2, 5], gpu_name=None)
    assert len(rs) == 1 and rs[0].gpu == 2 and rs[0].action is Action.RESET_GPU
    unb = judge(_outcome("gloo", 1.0, ranks=4, rank_min=[0.01, 0.01, 0.05, 0.01]), ops=["all_reduce"],
                params=PARAMS, devices=[0, 1, 2, 3], gpu_name=None)
    assert unb[0].status is Status.WARN and [r.gpu for r in unb[1:]] == [2]
    assert rank_spread([0.01, 0.01]) == (0.0, 0) and rank_spread([0.01]) == (None, None)


def test_intra_judge_is_its_rule_tables_and_keeps_its_wording():
    """nccl.intra on the rule engine (issue 18): the thresholds of a collective's result are
    OP_RULES with the limits of this run, an unbalanced rank's result lists the limit its time was
    compared with (RANK_RULES: the same spread rule said of one rank), a corruption is
    CORRUPTION_RULES, a rank that stopped or exited names its basis. Before: a threshold list and
    causes built by hand, and rank, corruption and hang results with no threshold at all."""
    import judge_consistency as jc
    from gpucheck.nccl import intra
    from gpucheck.core.result import Basis

    name = "NVIDIA H100 80GB HBM3"
    (warn,) = judge(_outcome("nccl", 300.0), ops=["all_reduce"], params=PARAMS, devices=list(range(8)),
                    gpu_name=name, baselines={"all_reduce": 400.0})
    assert [(t.metric, t.op, t.limit, t.status) for t in warn.thresholds] == [
        ("busbw_gbs", "<", 222.0, Status.FAIL), ("busbw_gbs", "<", 314.5, Status.WARN),
        ("baseline_ratio", "<", 0.85, Status.WARN), ("rank_spread", ">", 1.0, Status.WARN)]
    assert [r.metric for r in intra.OP_RULES] == [t.metric for t in warn.thresholds]
    assert warn.summary == ("all_reduce bus bandwidth below expected 370 GB/s for 8xH100 SXM over NVLink 4 "
                            "/ NVSwitch (busbw_gbs=300.0 GB/s < 314.5 GB/s); all_reduce bus bandwidth below this "
                            "node's recorded baseline 400 GB/s (baseline_ratio=0.75 < 0.85)")
    slow = judge(_outcome("gloo", 1.0, ranks=4, rank_min=[0.01, 0.01, 0.05, 0.01]), ops=["all_reduce"],
                 params=PARAMS, devices=[0, 1, 2, 3], gpu_name=None)[1]
    assert [(t.metric, t.op, t.limit) for t in slow.thresholds] == [("rank_time_s", ">", 0.01 + 1.0 * 0.01)]
    assert (slow.status, slow.action, slow.gpu) == (Status.WARN, Action.INVESTIGATE, 2)
    assert slow.summary == "rank 2 unbalanced in all_reduce: fastest iteration 50.000 ms vs median 10.000 ms of all ranks"
    fast = judge(_outcome("gloo", 1.0, ranks=4, rank_min=[0.001, 0.03, 0.031, 0.04]), ops=["all_reduce"],
                 params=PARAMS, devices=[4, 5, 6, 7], gpu_name=None)[1]
    assert [(t.metric, t.op, t.limit) for t in fast.thresholds] == [("rank_time_s", "<", 0.04 - 1.0 * 0.0305)]
    assert (fast.status, fast.gpu) == (Status.WARN, 4) and fast.summary.startswith("rank 0 unbalanced in all_reduce")
    hung = {"kind": "timeout", "rank": 0, "host": "x", "summary": "timeout waiting for rank 0 on host x"}
    (r,) = judge({**_outcome("nccl", 1.0, ranks=2), "status": "fail", "failure": hung, "summary": hung["summary"]},
                 ops=["all_reduce"], params=PARAMS, devices=[2, 5], gpu_name=None)
    assert (r.status, r.action, r.basis) == (Status.FAIL, Action.RESET_GPU, Basis.HANG)
    exited = {"kind": "exit", "rank": 1, "host": "x", "summary": "rank 1 on host x exited during the test (gone)"}
    (r,) = judge({**_outcome("nccl", 1.0, ranks=2), "status": "fail", "failure": exited, "summary": exited["summary"]},
                 ops=["all_reduce"], params=PARAMS, devices=[2, 5], gpu_name=None)
    assert (r.status, r.action, r.basis) == (Status.FAIL, Action.RESET_GPU, Basis.CRASH)
    for res in (warn, slow, fast, r):
        assert jc.disagreement(res) is None


def test_a_corruption_report_without_its_count_is_never_a_pass():
    """The ranks always send the count of wrong elements with a corruption (collective.py); a
    report without it cannot be judged by the rule (wrong elements > 0): an error naming it."""
    corr = {"kind": "corruption", "rank": 1, "op": "all_reduce", "index": 5, "summary": "data corruption in x"}
    first = judge(_outcome("nccl", 372.0, ranks=2, status="fail", failure=corr), ops=["all_reduce"], params=PARAMS,
                  devices=[2, 5], gpu_name=None)[0]
    assert (first.status, first.action, first.gpu) == (Status.ERROR, Action.NONE, 5)
    assert first.summary == ("could not judge a corruption report that gives no count of wrong elements: "
                             "data corruption in x")
    counted = judge(_outcome("nccl", 372.0, ranks=2, status="fail", failure={**corr, "nbad": 2}), ops=["all_reduce"],
                    params=PARAMS, devices=[2, 5], gpu_name=None)[0]
    assert (counted.status, counted.action, counted.summary) == (Status.FAIL, Action.DRAIN, "data corruption in x")
    assert [(t.metric, t.op, t.limit) for t in counted.thresholds] == [("corrupt_nbad", ">", 0)]


def test_baseline_from_history(tmp_path):
    st = State(tmp_path)

    def verdict(busbw, status="pass", injected=()):
        r = Result("nccl.intra", Status(status), "x", subject="node/all_reduce", injected=list(injected))
        r.metric("busbw_gbs", busbw).metric("ranks", 2).metric("backend", "gloo").metric("bytes", 1 << 20)
        return {"schema": "gpucheck.verdict", "results": [r.to_dict()]}

    for v in (1.0, 1.2, 1.1):
        st.append_history(verdict(v))
    st.append_history(verdict(0.1, "fail"))
    st.append_history(verdict(9.0, injected=["corrupt:rank=1"]))
    base = baselines_from_history(st, ranks=2, backend="gloo", sizes={"all_reduce": 1 << 20})
    assert base == {"all_reduce": pytest.approx(1.1)}
    assert baselines_from_history(st, ranks=4, backend="gloo", sizes={"all_reduce": 1 << 20}) == {}
    rs = judge(_outcome("gloo", 0.5, ranks=2), ops=["all_reduce"], params=PARAMS, devices=[0, 1], gpu_name=None,
               baselines=base)
    assert rs[0].status is Status.WARN and "recorded baseline" in rs[0].summary


# -- the CPU intra-node check, end to end ------------------------------------------------------
def _run_intra(*extra: str) -> tuple[int, dict]:
    r = cli("run", "--level", "2", "--check", "nccl.intra", "--device", "cpu", "--json", "--no-history", *extra)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {"stderr": r.stderr})


@pytest.mark.slow
def test_intra_check_on_cpu_workers_verifies_every_collective():
    code, doc = _run_intra("--workers", "2")
    assert code == 0, doc
    res = {r["subject"]: r for r in doc["results"]}
    for op in ("all_reduce", "all_gather", "all_to_all"):
        r = res[f"node/{op}"]
        assert r["status"] in ("pass", "warn")
        assert r["metrics"]["busbw_gbs"]["value"] > 0 and r["metrics"]["ranks"]["value"] == 2
        assert "judged by data integrity and rank balance" in r["summary"]


@pytest.mark.slow
def test_intra_check_catches_injected_corruption_on_the_named_rank():
    code, doc = _run_intra("--workers", "3", "--inject", "corrupt:rank=2,op=all_gather")
    assert code == 1, doc
    fails = [r for r in doc["results"] if r["status"] == "fail"]
    assert len(fails) == 1 and fails[0]["gpu"] == 2 and fails[0]["action"] == "drain"
    assert fails[0]["summary"].startswith("data corruption in all_gather on rank 2")
    assert fails[0]["injected"] == ["corrupt:rank=2,op=all_gather"]
    assert doc["injected"] == ["corrupt:rank=2,op=all_gather"]


def test_intra_check_skips_with_one_worker():
    code, doc = _run_intra("--workers", "1")
    assert code == 0
    (r,) = doc["results"]
    assert r["status"] == "skip" and "at least 2" in r["summary"]


def test_what_goes_wrong_without_deciding_the_result_is_a_warning_event():
    """Old: five `except Exception: pass` in the rank loop (heartbeat store, heartbeat writes,
    NCCL version, host labels, destroy_process_group) hid what failed."""
    import types

    from gpucheck.nccl import collective as C

    class Dist:
        def TCPStore(self, *a, **kw):
            raise RuntimeError("Connection refused\nsecond line")

        def barrier(self):
            pass

        def destroy_process_group(self):
            raise RuntimeError("process group already destroyed")

    events: list = []
    spec = C.RankSpec(rank=0, world=2, ops=["all_reduce"], sizes=[4096], host="h0")
    st = C._Rank(spec, events.append, lambda timeout: 0)
    st.port = 29500
    st.heartbeat(Dist())  # cannot reach the store: the heartbeat does not start
    env = C._Env(torch=None, dist=Dist(), backend="gloo", device=types.SimpleNamespace(type="cpu"))
    rep = C._teardown(st, env, types.SimpleNamespace(barrier=lambda: None), None)
    assert rep["status"] == "ok"
    warnings = [e for e in events if e["event"] == "warning"]
    assert [(w["rank"], w["step"]) for w in warnings] == [(0, "heartbeat"), (0, "teardown")]
    assert rep["warnings"] == [
        "heartbeat: cannot connect to the rendezvous store: RuntimeError: Connection refused",
        "teardown: destroy_process_group failed: RuntimeError: process group already destroyed"]
    peer = {**_rep(1), "warnings": []}
    assert merge([rep, peer])["warnings"] == [f"rank 0: {w}" for w in rep["warnings"]]


def test_a_rendezvous_that_never_formed_blames_no_rank():
    rdv = {"kind": "rendezvous", "rank": 1, "host": "h1", "detail": "the process group did not connect its ranks: "
                                                                   "Connection refused"}
    waited = {"kind": "timeout", "rank": 1, "host": "h1", "what": "rendezvous"}
    out = merge([_rep(0, "fail", waited), _rep(1, "error", rdv)])
    assert out["status"] == "error" and out["failure"]["kind"] == "rendezvous"
    assert out["summary"].startswith("the rendezvous never formed (rank 1 on host h1: ")
    from gpucheck.nccl.pairs_run import pair_outcome

    pair = pair_outcome(1, ("h0", "h1"), {**out, "launch_errors": {}}, ["all_reduce"])
    assert pair.status == "error" and pair.blamed == []


def test_the_interface_is_the_one_that_routes_to_the_other_hosts(monkeypatch):
    from gpucheck.nccl import topology as T

    routes = {"10.0.0.2": "10.0.0.1", "n2": "10.0.0.1", "n1-self": "127.0.0.1"}
    monkeypatch.setattr(T, "local_address_towards", lambda target: routes.get(target))
    monkeypatch.setattr(T, "interface_of", lambda addr: {"10.0.0.1": "eth7", "127.0.0.1": "lo"}.get(addr))
    # rank 0 hosts the store: the route to a peer; the others: the route to the rendezvous
    assert T.pick_interface("n1-self", ["n1-self", "n2"], 0) == ("eth7", "eth7 (10.0.0.1: the route to n2)")
    assert T.pick_interface("10.0.0.2", ["10.0.0.2", "n3"], 1)[0] == "eth7"
    # the name of the rendezvous host resolves to 127.0.0.1 here: loopback is never picked
    assert T.pick_interface("n1-self", [], 1)[0] is None
    assert T.pick_interface("n1-self", [], 0) == (None, "no peer address given")


def test_one_node_without_launcher_or_ranks_runs_a_rank_per_local_gpu():
    """nccl-tests' `-g N`: `gpucheck nccl run` alone refused to start ("no rank given"); on one
    node it now takes every local GPU, or --nproc-per-node ranks (issue 26)."""
    from gpucheck.nccl.topology import TopologyError, resolve_topology

    asked: list[int] = []

    def eight() -> tuple[int, str]:
        asked.append(1)
        return 8, "8 GPU(s) on this node"

    t = resolve_topology({"nproc_per_node": 1, "local_gpus": eight, "nproc_given": False}, {})
    assert (t.ranks, t.local_ranks, t.world, t.master_addr, t.source) == \
        (list(range(8)), list(range(8)), 8, "127.0.0.1", "one node")
    t = resolve_topology({"nproc_per_node": 3, "local_gpus": eight, "nproc_given": True}, {})
    assert (t.ranks, t.world) == ([0, 1, 2], 3) and len(asked) == 1  # given: no GPU count asked for
    # a launcher or rank options win, and the GPUs are not counted
    t = resolve_topology({"rank": 0, "world_size": 2, "local_gpus": eight}, {})
    assert t.source == "options"
    t = resolve_topology({"local_gpus": eight}, {"RANK": "0", "WORLD_SIZE": "2"})
    assert t.source == "torchrun" and len(asked) == 1
    for count in (0, 1):
        with pytest.raises(TopologyError, match=rf"^{count} GPU\(s\) on this node: a test on this node alone needs 2"):
            resolve_topology({"local_gpus": lambda: (count, f"{count} GPU(s) on this node")}, {})


@pytest.mark.slow
def test_nccl_run_on_one_node_with_only_nproc_per_node(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = str(root)
    r = subprocess.run([sys.executable, "-m", "gpucheck", "nccl", "run", "--backend", "gloo", "--nproc-per-node", "2",
                        "--sizes", "64K", "--iters", "1", "--warmup", "0"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=180)
    events = [__import__("json").loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    assert r.returncode == 0, r.stderr
    assert sorted(e["rank"] for e in events if e["event"] == "result") == [0, 1]
    r = subprocess.run([sys.executable, "-m", "gpucheck", "nccl", "run", "--backend", "gloo"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("gpucheck nccl run: error: --backend gloo runs on CPUs")
