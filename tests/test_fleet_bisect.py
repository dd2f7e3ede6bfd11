"""Bisection against simulated group tests (a function of the set), then the command group test
through the CLI.

Bounds checked: binary splitting finds k bad nodes among N in at most k*log2(N/k) + 4k + 1 search
tests (one a round); told at most K (--max-bad), every placement of k <= K within the whole set
plus Hwang's ceil(log2 C(N, K)) + K - 1, and more than K still all found; the grid finds one bad
node among m x n in exactly two rounds of m + n tests; flaky tests with repeats still name the
right nodes."""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.fleet.bisect import STRATEGIES, GroupOutcome, bisect, grid_layout, posterior_bad


def nodes_of(n: int) -> list[str]:
    return [f"gpu{i:04d}" for i in range(n)]


def simulated(bad: set[str], *, flake: float = 0.0, seed: int = 0, calls: list | None = None):
    rng = random.Random(seed)
    bad = frozenset(bad)

    def test(group: list[str]) -> GroupOutcome:
        if calls is not None:
            calls.append(list(group))
        healthy = bad.isdisjoint(group)
        if flake and rng.random() < flake:
            healthy = not healthy
        return GroupOutcome(healthy, "exit 0" if healthy else "exit 1")

    return test


def placements(n: int, k: int, seeds: int, neighbours: bool = True):
    """Random placements of k bad nodes, then neighbours (a rack) at the front and elsewhere."""
    nodes = nodes_of(n)
    for seed in range(seeds):
        yield nodes, set(random.Random(seed).sample(nodes, k)), False
    if neighbours:
        for start in (0, random.Random(99).randrange(n - k + 1)):
            yield nodes, set(nodes[start:start + k]), True


@pytest.mark.slow
@pytest.mark.parametrize("n,k", [(16, 1), (64, 1), (1024, 1), (4096, 1), (256, 3), (1024, 4), (1024, 8),
                                 (4096, 8), (4096, 16)])
def test_sequential_binary_finds_k_bad_nodes_within_the_bound(n, k):
    """--parallel 1: generalized binary splitting, one test a round. One bad node costs
    log2(N) + 1 search tests (the issue's goal k*log2(N/k) + k; the remainder test that ends the
    search is the verification); k bad nodes placed at random stay within k*log2(N/k) + 3.5k
    (the unknown k costs about 2k over the goal; for k >= 8 the goal is below log2(C(N, k)),
    the fewest any test sequence can need, see benchmarks/RESULTS.md), neighbours within
    k*log2(N/k) + 5k (each costs a full halving, plus the probes of a test that never passed)."""
    for nodes, bad, neighbours in placements(n, k, 3):
        calls: list = []
        r = bisect(nodes, simulated(bad, calls=calls), strategy="binary", parallel=1)
        assert set(r.bad_nodes) == bad and r.exit_code == 1
        assert r.verified and not r.cleared
        bound = math.log2(n) + 1 if k == 1 else k * math.log2(n / k) + (5 if neighbours else 3.5) * k
        assert r.search_tests <= bound, (r.search_tests, bound)
        assert r.search_rounds == r.search_tests  # one test a round
        # confirm: one re-test per suspect and one control group, in one round (the verify test,
        # the remainder that ended the search, is not repeated)
        assert r.tests == len(calls) == r.search_tests + 1 + k + 1
        assert all(s.failures == s.runs == 1 for s in r.bad)


@pytest.mark.slow
@pytest.mark.parametrize("n,k", [(16, 1), (64, 3), (1024, 1), (1024, 8), (1024, 16), (4096, 16), (64, 16)])
def test_parallel_binary_rounds_do_not_grow_with_k(n, k):
    """--parallel 0 (every disjoint group at once): the whole set, then every failing group in
    four parts at once: 1 + ceil(log4 N) search rounds for any number of bad nodes, and with
    the verification and the re-tests within log2(N) + 3 rounds in all."""
    depth = math.ceil(math.log(n, 4))
    for nodes, bad, _ in placements(n, k, 3):
        calls: list = []
        r = bisect(nodes, simulated(bad, calls=calls), strategy="binary")
        assert set(r.bad_nodes) == bad and r.verified and r.exit_code == 1
        assert r.search_rounds == 1 + depth, (r.search_rounds, depth)
        assert r.rounds <= math.ceil(math.log2(n)) + 3
        assert r.search_tests <= 1 + 4 * sum(min(4 ** level, k) for level in range(depth))
        for rnd in {t.round for t in r.records}:  # no node in two tests at once
            members = [x for t in r.records if t.round == rnd for x in t.nodes]
            assert len(members) == len(set(members))


def test_max_bad_lets_the_parallel_search_infer_the_last_part():
    nodes = nodes_of(256)
    bad = {nodes[17], nodes[200]}
    free = bisect(nodes, simulated(bad), strategy="binary")
    known = bisect(nodes, simulated(bad), strategy="binary", max_bad=2)
    assert set(known.bad_nodes) == bad and known.verified
    assert known.search_rounds == free.search_rounds and known.search_tests < free.search_tests


def hwang_bound(n: int, k: int) -> int:
    """Tests generalized binary splitting may need for at most k bad nodes among n once the n
    failed together: ceil(log2 C(n, k)) + k - 1 (Hwang's bound)."""
    return math.ceil(math.log2(math.comb(n, k))) + k - 1


@pytest.mark.slow
@pytest.mark.parametrize("max_bad", [1, 2, 3])
def test_max_bad_sequential_names_every_placement_within_hwangs_bound(max_bad):
    """--parallel 1 --max-bad K: Hwang's generalized binary splitting for at most K bad nodes.
    Every placement of k <= K bad nodes among 16 (neighbours at the front included): exactly
    the bad nodes, the whole set then at most ceil(log2 C(16, K)) + K - 1 tests, no probe (old:
    the estimate from the share found, 9 search tests for K = 2; and one bad node at the front
    with K = 1 never saw a group pass: "the test is broken", exit 3)."""
    nodes = nodes_of(16)
    bound = 1 + hwang_bound(16, max_bad)
    for k in range(max_bad + 1):
        for bad in itertools.combinations(nodes, k):
            r = bisect(nodes, simulated(set(bad)), strategy="binary", parallel=1, max_bad=max_bad)
            assert set(r.bad_nodes) == set(bad) and r.verified and not r.broken, (bad, r.bad_nodes, r.broken)
            assert r.exit_code == (1 if bad else 0) and not r.notes
            assert r.search_tests <= bound, (bad, r.search_tests, bound)
            assert r.search_rounds == r.search_tests  # one test a round
            assert not any(t.phase == "probe" for t in r.records)


@pytest.mark.slow
@pytest.mark.parametrize("n,k", [(1024, 8), (4096, 16)])
def test_max_bad_sequential_stays_within_hwangs_bound_at_scale(n, k):
    """Random placements and a rack at the front, the middle, the end: within Hwang's bound,
    which is within k - 1 of the floor ceil(log2 C(N, k))."""
    nodes = nodes_of(n)
    racks = [set(nodes[s:s + k]) for s in (0, (n - k) // 2, n - k)]
    for bad in [set(random.Random(seed).sample(nodes, k)) for seed in range(2)] + racks:
        r = bisect(nodes, simulated(bad), strategy="binary", parallel=1, max_bad=k)
        assert set(r.bad_nodes) == bad and r.verified and r.exit_code == 1 and not r.notes
        assert r.search_tests <= 1 + hwang_bound(n, k), (r.search_tests, hwang_bound(n, k))


@pytest.mark.parametrize("n,max_bad", [(16, 1), (16, 2), (16, 3), (64, 2)])
def test_more_bad_nodes_than_max_bad_are_still_all_found(n, max_bad):
    """K is a promise the search does not rely on: with K + 1 to K + 3 bad nodes (at random, at
    the front, at the end), the nodes left still fail once K are found, and the search goes on
    without the bound; every bad node is named, and a note says K was exceeded."""
    nodes = nodes_of(n)
    for k in (max_bad + 1, max_bad + 3):
        for bad in [set(random.Random(seed).sample(nodes, k)) for seed in range(8)] + [set(nodes[:k]),
                                                                                     set(nodes[-k:])]:
            r = bisect(nodes, simulated(bad), strategy="binary", parallel=1, max_bad=max_bad)
            assert set(r.bad_nodes) == bad and r.verified and r.exit_code == 1, (bad, r.bad_nodes, r.notes)
            assert any(note.startswith(f"more than --max-bad {max_bad} bad node(s)") for note in r.notes), r.notes


def test_max_bad_does_not_hide_a_test_that_never_passes():
    """A test that fails on every group with --max-bad: the bounded search finds K "bad" nodes,
    the rest still fails, the probes fail too: broken, exit 3, nobody blamed."""
    r = bisect(nodes_of(1024), lambda group: GroupOutcome(False, "exit 1"), strategy="binary", parallel=1,
               max_bad=4)
    assert r.bad == [] and r.exit_code == 3 and r.broken and "no group passed" in r.broken
    assert r.tests <= 1 + hwang_bound(1024, 4) + 1 + 3
    assert [t.phase for t in r.records[-3:]] == ["probe"] * 3


@pytest.mark.parametrize("rows,cols", [(4, 4), (16, 16), (64, 64), (8, 32)])
def test_grid_finds_one_bad_node_in_two_rounds(rows, cols):
    nodes = nodes_of(rows * cols)
    for victim in (nodes[0], nodes[len(nodes) // 2 + 3], nodes[-1]):
        r = bisect(nodes, simulated({victim}), strategy="grid", group_size=cols)
        assert r.bad_nodes == [victim]
        assert r.search_rounds == 2 and r.search_tests == rows + cols
        row_tests = [t for t in r.records if t.phase == "rows"]
        col_tests = [t for t in r.records if t.phase == "columns"]
        assert len(row_tests) == rows and {len(t.nodes) for t in row_tests} == {cols}
        assert len(col_tests) == cols and {len(t.nodes) for t in col_tests} == {rows}  # classic columns
        for rnd in {t.round for t in r.records}:  # no node in two tests at once
            members = [n for t in r.records if t.round == rnd for n in t.nodes]
            assert len(members) == len(set(members))


def test_grid_with_several_bad_nodes_and_a_short_last_row():
    nodes = nodes_of(1000)
    bad = {nodes[5], nodes[37], nodes[38], nodes[600], nodes[999]}
    r = bisect(nodes, simulated(bad), strategy="grid", group_size=32)
    assert set(r.bad_nodes) == bad and r.verified
    assert [len(x) for x in grid_layout(nodes, 32)][-1] == 40  # 8 left over joined the last row


@pytest.mark.parametrize("strategy,parallel", [("binary", 0), ("binary", 1), ("grid", 0)])
def test_flaky_tests_with_repeats_still_name_the_right_nodes(strategy, parallel):
    for seed in range(8):
        nodes = nodes_of(256)
        bad = set(random.Random(100 + seed).sample(nodes, 2))
        r = bisect(nodes, simulated(bad, flake=0.02, seed=seed), strategy=strategy, repeats=3, group_size=16,
                   parallel=parallel)
        assert set(r.bad_nodes) == bad, (seed, r.bad_nodes, [c.node for c in r.cleared], r.notes)
        for s in r.bad:
            assert s.runs >= 3 and s.failures * 2 > s.runs and s.confidence > 0.99


def test_confidence_figure():
    assert posterior_bad(3, 3, 0.05) == pytest.approx(0.95 ** 3 / (0.95 ** 3 + 0.05 ** 3))
    assert posterior_bad(1, 1, 0.05) == pytest.approx(0.95)
    assert posterior_bad(0, 3, 0.05) < 0.001


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_healthy_set_and_a_fault_that_needs_two_nodes(strategy):
    nodes = nodes_of(64)
    r = bisect(nodes, simulated(set()), strategy=strategy, group_size=8)
    assert r.bad_nodes == [] and r.verified

    def pair_fault(group):  # fails only when both of two nodes are in it: no single bad node
        return GroupOutcome(not {"gpu0003", "gpu0040"} <= set(group))

    r = bisect(nodes, pair_fault, strategy=strategy, group_size=8)
    assert r.bad_nodes == [] and not r.verified and r.notes and r.exit_code == 3


def test_a_bad_node_that_does_not_explain_the_failure_is_exit_3():
    """gpu0003 fails every group it is in, and gpu0040 with gpu0050 fail together: the rest
    never passes, "no single bad node explains the failure" (old: exit 1 naming gpu0003)."""
    def test(group):
        g = set(group)
        return GroupOutcome("gpu0003" not in g and not {"gpu0040", "gpu0050"} <= g)

    r = bisect(nodes_of(64), test, strategy="binary")
    assert not r.verified and r.exit_code == 3
    assert "gpu0003" in r.bad_nodes and any("no single bad node" in n or "still fail" in n for n in r.notes)


def test_a_group_test_that_raises_is_broken_not_a_bad_node():
    """gpucheck's own failure inside the test is no evidence (old: every group failed, nodes BAD)."""
    def raising(group):
        raise RuntimeError("launcher exploded")

    r = bisect(nodes_of(4), raising, strategy="binary")
    assert "group test raised RuntimeError: launcher exploded" in r.records[0].detail
    assert r.broken == "the group test raised RuntimeError: launcher exploded"
    assert r.bad == [] and r.exit_code == 3 and r.tests == 1


@pytest.mark.parametrize("parallel", [0, 1])
@pytest.mark.parametrize("timed_out", [False, True])
def test_a_test_that_never_passes_is_broken(parallel, timed_out):
    """A test that fails on every group (a script that always exits 1, or that always runs past
    its limit) blames nobody (old: every node BAD, confidence 0.95, exit 1), and gives up once
    no group passed in max(8, 2 log2 N + 2) tests instead of testing every node."""
    def failing(group):
        return GroupOutcome(False, "timed out after 30 s (killed)" if timed_out else "exit 1", timed_out=timed_out)

    nodes = nodes_of(1024)
    r = bisect(nodes, failing, strategy="binary", parallel=parallel)
    assert r.bad == [] and r.exit_code == 3 and r.broken
    assert ("every group test timed out" in r.broken) if timed_out else ("no group passed" in r.broken)
    # the limit (22 tests for 1024 nodes) and three probes; in parallel, the round that crossed it
    assert (r.rounds <= 5) if parallel == 0 else (r.tests <= 22 + 3)
    assert [t.phase for t in r.records[-3:]] == ["probe"] * 3


def test_a_test_that_fails_on_known_good_nodes_is_broken():
    """The replay needs more than two nodes: every small group fails. The confirm round's
    control group (known-good nodes alone) fails too: the test is broken, nobody is blamed."""
    nodes = nodes_of(64)

    def needs_three(group):
        return GroupOutcome(len(group) > 2 and "gpu0040" not in group, "exit 1")

    r = bisect(nodes, needs_three, strategy="binary", parallel=1)
    assert r.bad == [] and r.exit_code == 3
    assert r.broken.startswith("the test fails on known-good nodes")
    assert any(t.phase == "control" and not t.healthy for t in r.records)


def test_the_control_group_backs_the_confirmation():
    nodes = nodes_of(64)
    r = bisect(nodes, simulated({"gpu0040"}), strategy="binary")
    (control,) = [t for t in r.records if t.phase == "control"]
    (confirm,) = [t for t in r.records if t.phase == "confirm"]
    assert control.healthy and control.round == confirm.round and not set(control.nodes) & set(confirm.nodes)
    assert any("control" in e and "passed" in e for e in r.bad[0].evidence)


# -- the command group test through the CLI ----------------------------------------------------

def _script(tmp_path: Path, bad: list[str], *, hang: bool = False) -> str:
    (tmp_path / "bad.txt").write_text("".join(f"{b}\n" for b in bad))
    script = tmp_path / "replay.py"
    script.write_text(
        "import sys, time\n"
        f"open({str(tmp_path / 'calls.log')!r}, 'a').write(sys.argv[1] + '\\n')\n"
        f"bad = set(open({str(tmp_path / 'bad.txt')!r}).read().split())\n"
        "hit = bad & set(sys.argv[1].split(','))\n"
        + ("if hit: time.sleep(60)\n" if hang else "")
        + "sys.exit(1 if hit else 0)\n")
    return f"{sys.executable} {script} {{nodes_comma}}"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_command_test_end_to_end_json(tmp_path, capsys, strategy):
    rc = main(["bisect", "gpu[001-032]", "--test", _script(tmp_path, ["gpu007", "gpu020"]), "--strategy", strategy,
               "--group-size", "8", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert rc == 1 and doc["exit_code"] == 1
    assert doc["bad"] == "gpu[007,020]" and [b["node"] for b in doc["bad_nodes"]] == ["gpu007", "gpu020"]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert doc["tests"] == len(calls) == len(doc["records"])
    assert doc["search_tests"] + doc["confirm_tests"] == doc["tests"]
    assert all(b["evidence"] for b in doc["bad_nodes"])
    assert "round 1 (" in err  # rounds are printed live (on stderr with --json)


@pytest.mark.slow
def test_command_test_table_hang_and_dry_run(tmp_path, capsys):
    rc = main(["bisect", "n[1-8]", "--test", _script(tmp_path, ["n6"], hang=True), "--test-timeout", "2s",
               "--max-bad", "1"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "timed out after 2 s (killed)" in out and out.rstrip().endswith("bad nodes: n6")
    assert "BAD n6: 1/1 re-tests failed, confidence 0.950" in out

    (tmp_path / "calls.log").unlink()
    rc = main(["bisect", "n[1-64]", "--test", _script(tmp_path, ["n6"]), "--strategy", "grid", "--group-size", "8",
               "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "round 1: 8 row group(s)" in out and "row 8: n[57-64]" in out
    assert not (tmp_path / "calls.log").exists()  # nothing ran


@pytest.mark.slow
def test_command_test_max_bad_exceeded_names_every_bad_node(tmp_path, capsys):
    """--parallel 1 --max-bad 1 with two bad nodes: both named (exit 1), the note says so."""
    rc = main(["bisect", "n[1-16]", "--test", _script(tmp_path, ["n3", "n12"]), "--parallel", "1",
               "--max-bad", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and out.rstrip().endswith("bad nodes: n[3,12]")
    assert "note: more than --max-bad 1 bad node(s): the nodes left still failed together after 1 were found" in out


def test_fault_of_two_nodes_together_is_exit_3(tmp_path, capsys):
    script = tmp_path / "pair.sh"
    script.write_text('case ",$1," in *,n3,*n5,*) exit 1;; esac\nexit 0\n')
    rc = main(["bisect", "n[1-8]", "--test", f"sh {script} {{nodes_comma}}"])
    out = capsys.readouterr().out
    assert rc == 3 and "could not localize the fault" in out and "bad nodes" not in out


def test_bisect_usage_errors(capsys):
    assert main(["bisect", "n[1-4]", "--test", "true"]) == 2
    assert "no {nodes}" in capsys.readouterr().err
    assert main(["bisect", "n[1-4]"]) == 2
    assert main(["bisect", "n[1-4]", "--test", "true {nodes}", "--builtin", "allreduce"]) == 2
    assert "exactly one" in capsys.readouterr().err


@pytest.mark.parametrize("template,why", [
    ("/nonexistent/replay {nodes}", "command not found (exit 127)"),
    ("kill -KILL $$; true {nodes}", "the command was killed by SIGKILL, which gpucheck did not send"),
])
def test_a_test_that_cannot_run_is_broken_exit_3_with_the_command(tmp_path, capsys, template, why):
    """Old: `--test '/nonexistent/replay {nodes}'` declared every node BAD (confidence 0.95, exit 1)."""
    rc = main(["bisect", "n[1-8]", "--test", template])
    out = capsys.readouterr().out
    assert rc == 3, out
    assert f"the group test is broken: {why}" in out and f"command: {template}" in out
    assert "BAD" not in out and "bad nodes" not in out and "1 test(s) in 1 round(s)" in out
    rc = main(["bisect", "n[1-8]", "--test", template, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == doc["exit_code"] == 3 and doc["bad_nodes"] == [] and why in doc["broken"]
    assert doc["command"] == template


@pytest.mark.slow
def test_a_test_that_always_times_out_is_broken(tmp_path, capsys):
    rc = main(["bisect", "n[1-4]", "--test", "sleep 30; true {nodes}", "--test-timeout", "0.3s", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 and doc["bad_nodes"] == [] and "every group test timed out" in doc["broken"]


def test_a_bad_node_that_does_not_explain_the_failure_prints_no_bad_nodes(tmp_path, capsys):
    script = tmp_path / "t.sh"
    script.write_text('case ",$1," in *,n3,*) exit 1;; esac\ncase ",$1," in *,n5,*n7,*) exit 1;; esac\nexit 0\n')
    rc = main(["bisect", "n[1-8]", "--test", f"sh {script} {{nodes_comma}}"])
    out = capsys.readouterr().out
    assert rc == 3 and "no single bad node explains the failure" in out and "found failing: n3" in out
    assert "bad nodes:" not in out


# -- the built-in test's bandwidth: reference pairs, same concurrency ----------------------------

class FakeCollective:
    """A group's busbw is 8 GB/s divided by the number of groups running at once (shared links),
    a tenth of that with the slow node in the group; data always verified."""

    def __init__(self, slow: str | None = None):
        self.slow = slow
        self.active = 0
        self.lock = threading.Lock()

    def __call__(self, nodes):
        assert len(nodes) >= 2, nodes  # a collective needs two nodes (raising: the run is broken)
        with self.lock:
            self.active += 1
        time.sleep(0.1)
        with self.lock:
            at_once = self.active
        time.sleep(0.1)
        with self.lock:
            self.active -= 1
        bw = 8.0 / at_once * (0.1 if self.slow in nodes else 1.0)
        return GroupOutcome(True, "verified", metrics={"all_gather": bw, "all_reduce": bw})


def _screen(**kw):
    from gpucheck.fleet.bisect.pairscreen import PairScreen

    return PairScreen(("all_gather", "all_reduce"), slow_limit=0.5, min_busbw=kw.get("min_busbw"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_reference_pairs_name_the_slow_node_and_compare_like_with_like(strategy):
    """Rounds run 4, then 3, then 1 group at once, so bandwidth differs fourfold with no fault:
    only measurements of the same round are compared (old: the best group so far, whatever
    its round, so a round of four pairs blamed healthy nodes; and the first group alone had no
    reference at all)."""
    nodes = [f"n{i}" for i in range(1, 9)]
    r = bisect(nodes, FakeCollective(slow="n6"), strategy=strategy, min_group=2, screen=_screen())
    assert r.bad_nodes == ["n6"] and r.exit_code == 1 and r.verified
    pairs = [t for t in r.records if t.phase == "pairs"]
    assert [t.concurrency for t in pairs] == [4] * 4 and [t.healthy for t in pairs] == [True, True, False, True]
    assert "slow: all_gather busbw 0.2 GB/s < 0.5 x 2 GB/s (median of 4 pairs measured 4 at a time)" in pairs[2].detail
    # n5 and n6 with known-good partners, next to two control pairs: four at once, as round 1
    repair = [t for t in r.records if t.phase in ("re-pair", "control")]
    assert {t.round for t in repair} == {2} and [t.concurrency for t in repair] == [4] * 4
    assert [(t.label, t.healthy) for t in repair if t.phase == "re-pair"] == [("n[1,5]", True), ("n[2,6]", False)]
    assert all(t.healthy for t in r.records if t.phase not in ("pairs", "re-pair"))
    assert r.bandwidth["references"][0]["how"] == "median of 8 pairs measured 4 at a time"
    assert any("partners fine in their other pairs" in e for e in r.bad[0].evidence)
    assert "below 0.5 x the slowest control pair of the same round" in r.bad[0].evidence[-1]
    # the groups of the search ran three and one at a time: never compared with the pairs
    assert {t.concurrency for t in r.records if t.phase not in ("pairs", "re-pair", "control")} <= {1, 2, 3}
    healthy = bisect(nodes, FakeCollective(), strategy=strategy, min_group=2, screen=_screen())
    # pairs, then the whole set (grid: the rows, then all of them together)
    assert healthy.bad == [] and healthy.exit_code == 0 and healthy.rounds == (2 if strategy == "binary" else 3)


def test_control_pairs_keep_noise_from_blaming_a_healthy_node():
    """Shared links or cores: a known-good control pair measures at 3 of 8 GB/s in round 2, and
    the healthy n5 with its known-good partner at 2.5: as good as the controls, so not bad
    (the median alone, 5.5, would have made it slow in both its pairs and blamed it). n6 is
    below half the slowest control: bad."""
    values = {("n1", "n2"): 8, ("n3", "n4"): 8, ("n5", "n6"): 0.5, ("n7", "n8"): 8,
              ("n1", "n5"): 2.5, ("n5", "n1"): 2.5, ("n2", "n6"): 0.5, ("n6", "n2"): 0.5}
    calls: dict = {}

    def test(group):
        key = tuple(group)
        calls[key] = calls.get(key, 0) + 1
        bw = 3.0 if key == ("n7", "n8") and calls[key] > 1 else values.get(key, 8.0)
        return GroupOutcome(True, "verified", metrics={"all_gather": bw, "all_reduce": bw})

    r = bisect([f"n{i}" for i in range(1, 9)], test, min_group=2, screen=_screen())
    assert r.bad_nodes == ["n6"] and r.exit_code == 1, [(t.label, t.detail) for t in r.records]
    assert r.bandwidth["control_floors"] == {"2": {"all_gather": 1.5, "all_reduce": 1.5}}
    assert r.unjudged == []


def test_an_unreachable_host_among_four_is_bad_and_no_group_is_a_single_node():
    def test(group):
        assert len(group) >= 2, group
        if "h2" in group:
            return GroupOutcome(False, "h2: unreachable (launcher exit 255)", blamed=["h2"], unreachable=["h2"])
        return GroupOutcome(True, "verified", metrics={"all_gather": 1.0, "all_reduce": 1.0})

    for strategy in STRATEGIES:
        r = bisect(["h1", "h2", "h3", "h4"], test, strategy=strategy, min_group=2, screen=_screen())
        assert r.bad_nodes == ["h2"] and r.exit_code == 1 and r.broken is None
        assert "unreachable" in r.bad[0].evidence[0]
        # one pair at a time is all three hosts allow: their bandwidth has no reference, and says so
        assert r.unjudged == ["h1", "h3", "h4"]


def test_bandwidth_without_a_reference_is_not_judged():
    """Two nodes make one pair: nothing to compare it with; never a pass (exit 3) unless
    --min-busbw gives an absolute floor."""
    r = bisect(["a", "b"], FakeCollective(), min_group=2, screen=_screen())
    assert r.exit_code == 3 and r.unjudged == ["a", "b"] and "none" in r.bandwidth["references"][0]["how"]
    assert all(len(t.nodes) >= 2 for t in r.records)
    r = bisect(["a", "b"], FakeCollective(), min_group=2, screen=_screen(min_busbw=1.0))
    assert r.exit_code == 0 and r.unjudged == []


@pytest.mark.parametrize("failure,why", [
    ({"kind": "busy", "rank": 1, "host": "n2"}, "--force loads GPUs that a job is using"),
    ({"kind": "rendezvous", "rank": 1, "host": "n2"}, "setup error"),
])
def test_a_busy_gpu_or_a_rendezvous_that_never_formed_blames_no_node(monkeypatch, failure, why):
    from gpucheck.fleet.bisect.builtin import CollectiveTest
    from gpucheck.nccl import launch

    def run_group(hosts, *a, **kw):
        return {"status": "error", "summary": f"rank 1 on host {hosts[1]} did not start", "failure": failure,
                "results": [], "launch_errors": {}, "unreachable": [], "stopped": []}

    monkeypatch.setattr(launch, "run_group", run_group)
    test = CollectiveTest(launch.Launcher("ip netns exec {host} {cmd}"), [], deadline_s=10)
    r = bisect([f"n{i}" for i in range(1, 5)], test, min_group=2, screen=_screen())
    assert r.exit_code == 3 and r.bad == [] and why in r.broken and r.tests == 2  # the first round of pairs


def test_force_reaches_the_hosts():
    from gpucheck.fleet.bisect.builtin import make_builtin
    from gpucheck.nccl.launch import Launcher

    test, _ = make_builtin(Launcher("ip netns exec {host} {cmd}"), ops=["all_gather", "all_reduce"], sizes=[1 << 20],
                           iters=2, warmup=1, timeout_s=5, backend="gloo", ifname=None, deadline_s=60, slow_limit=0.5,
                           min_busbw=None, bitwise=True, bitwise_args=[], force=True, repeats=1, flake_rate=0.05)
    assert "--force" in test.args and "--force" in test.bitwise.extra_args
    assert "--ops all_gather,all_reduce" in test.command(["n1", "n2"])


def test_the_bitwise_probe_starts_at_most_its_fan_out_at_once(monkeypatch):
    """A whole-set test of a large node list probes every node: never one launcher process per
    node at once (4,096 ssh clients), at most PROBE_FANOUT."""
    import threading
    import time as _time

    from gpucheck.fleet.bisect import builtin as B
    from gpucheck.nccl.launch import Launcher

    running, peak, lock = [0], [0], threading.Lock()

    def probe(self, node):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        _time.sleep(0.01)
        with lock:
            running[0] -= 1
            self.verdicts[node] = None
            self.errors[node] = "not run"

    monkeypatch.setattr(B.BitwiseProbe, "_probe", probe)
    p = B.BitwiseProbe(Launcher("ip netns exec {host} {cmd}"))
    p.check([f"n{i:04d}" for i in range(300)])
    assert len(p.verdicts) == 300 and peak[0] <= B.PROBE_FANOUT


@pytest.mark.parametrize("busbw", [float("nan"), float("inf"), -1.0])
def test_a_group_whose_rank_reports_an_impossible_busbw_is_broken_never_judged(monkeypatch, busbw):
    """bisect --builtin: a busbw no measurement gives (json.loads lets NaN, Infinity and
    negatives through) is not a measurement: the group test is broken (no node blamed), never
    a pass (NaN < --min-busbw is false) or a slow group."""
    from gpucheck.fleet.bisect.builtin import CollectiveTest
    from gpucheck.nccl import launch as L

    def run_group(hosts, launcher, args, *, deadline_s, index=0, **kw):
        return {"status": "ok", "summary": "ok", "launch_errors": {}, "failure": None,
                "results": [{"op": "all_reduce", "bytes": 1 << 24, "busbw_gbs": busbw, "algbw_gbs": 5.0}]}

    monkeypatch.setattr(L, "run_group", run_group)
    out = CollectiveTest(L.Launcher(), [], deadline_s=10.0, ops=("all_reduce",), min_busbw=5.0)(["n1", "n2"])
    assert not out.healthy and out.broken and "not a finite, non-negative bandwidth" in out.broken


@pytest.mark.parametrize("strategy, parallel, max_bad", [("binary", 0, None), ("binary", 1, 1), ("grid", 0, None)])
def test_a_failure_no_node_explains_is_never_a_healthy_node_set(strategy, parallel, max_bad):
    """The group test fails once (its first run: a flaky test, an intermittent node) and then
    passes on every group: the failure that started the bisection is not explained, so the nodes
    are not declared healthy: exit 3 with the reason, no node blamed (never 0 'no bad node')."""
    from gpucheck.fleet.bisect import GroupOutcome, bisect

    calls = [0]

    def test(group):
        calls[0] += 1
        return GroupOutcome(calls[0] > 1, "failed once" if calls[0] == 1 else "ok")

    r = bisect([f"n{i}" for i in range(1, 17)], test, strategy=strategy, parallel=parallel, max_bad=max_bad)
    assert r.bad_nodes == [] and r.exit_code == 3, (r.notes, r.exit_code)
    assert r.unexplained and "no node explains the failure" in r.unexplained
    assert r.to_dict()["unexplained"] == r.unexplained


def test_a_search_without_failures_still_passes():
    from gpucheck.fleet.bisect import GroupOutcome, bisect

    r = bisect([f"n{i}" for i in range(1, 17)], lambda group: GroupOutcome(True, "ok"))
    assert r.exit_code == 0 and r.unexplained is None
