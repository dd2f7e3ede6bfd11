"""Bisection against simulated group tests (a function of the set), then the command group test
through the CLI.

Bounds checked: binary splitting finds k bad nodes among N in at most k*log2(N/k) + 4k + 1 search
tests (one a round); the grid finds one bad node among m x n in exactly two rounds of m + n
tests; flaky tests with repeats still name the right nodes."""

from __future__ import annotations

import json
import math
import random
import sys
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


@pytest.mark.parametrize("n,k,seeds", [(16, 1, 4), (256, 1, 4), (256, 3, 4), (1024, 4, 3), (4096, 1, 2),
                                       (4096, 8, 2), (4096, 32, 1)])
def test_binary_finds_k_bad_nodes_within_the_bound(n, k, seeds):
    for seed in range(seeds):
        nodes = nodes_of(n)
        bad = set(random.Random(seed).sample(nodes, k))
        calls: list = []
        r = bisect(nodes, simulated(bad, calls=calls), strategy="binary")
        assert set(r.bad_nodes) == bad
        assert r.verified and not r.cleared
        bound = k * math.log2(n / k) + 4 * k + 1
        assert r.search_tests <= bound, (r.search_tests, bound)
        assert r.search_rounds == r.search_tests  # one test a round
        assert r.tests == len(calls) == r.search_tests + 1 + k  # verify the rest + one re-test each
        assert all(s.failures == s.runs == 1 for s in r.bad)


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


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flaky_tests_with_repeats_still_name_the_right_nodes(strategy):
    for seed in range(8):
        nodes = nodes_of(256)
        bad = set(random.Random(100 + seed).sample(nodes, 2))
        r = bisect(nodes, simulated(bad, flake=0.02, seed=seed), strategy=strategy, repeats=3, group_size=16)
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
    assert r.bad_nodes == [] and not r.verified and r.notes


def test_a_broken_group_test_counts_as_failing():
    def raising(group):
        raise RuntimeError("launcher exploded")

    r = bisect(nodes_of(4), raising, strategy="binary")
    assert "group test raised RuntimeError: launcher exploded" in r.records[0].detail


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
