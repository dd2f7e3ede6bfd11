"""Majority votes within a node and across a fleet: agreement, outliers, ties, no majority,
single voters, single-node fingerprints, fingerprints that are never compared."""

from __future__ import annotations

import pytest

from gpucheck.repro.majority import AGREE, MAJORITY, NO_MAJORITY, SINGLE, TIE, fleet_outliers, vote

A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize(
    "votes,status,majority,agree,outliers",
    [
        ({0: A, 1: A, 2: A}, AGREE, A, 3, []),
        ({0: A, 1: B, 2: A}, MAJORITY, A, 2, [1]),
        ({0: A, 1: B, 2: B, 3: B, 4: C}, MAJORITY, B, 3, [0, 4]),
        ({0: A, 1: B}, TIE, None, 0, []),
        ({0: A, 1: A, 2: B, 3: B}, TIE, None, 0, []),
        ({0: A, 1: B, 2: C}, TIE, None, 0, []),
        ({0: A, 1: A, 2: B, 3: C}, NO_MAJORITY, None, 0, []),  # 2 of 4 is not more than half
        ({0: A}, SINGLE, A, 1, []),
        ({}, NO_MAJORITY, None, 0, []),
    ],
)
def test_vote(votes, status, majority, agree, outliers):
    v = vote(votes)
    assert (v["status"], v["majority"], v["agree"], v["of"], v["outliers"]) == (status, majority, agree,
                                                                                 len(votes), outliers)
    assert sorted(x for g in v["groups"].values() for x in g) == sorted(votes)


def test_vote_groups_largest_first():
    v = vote({"n3": B, "n1": A, "n2": B})
    assert list(v["groups"].items()) == [(B, ["n2", "n3"]), (A, ["n1"])]


def test_fleet_outliers_per_fingerprint():
    h100, a100, b200 = "k-h100", "k-a100", "k-b200"
    nodes = {
        "gpu001": {h100: {"gemm.bf16": A, "transformer.step": B}},
        "gpu002": {h100: {"gemm.bf16": A, "transformer.step": B}},
        "gpu003": {h100: {"gemm.bf16": C, "transformer.step": B}},  # the odd one out
        "gpu004": {h100: {"gemm.bf16": A}},  # ran the level-1 subset only
        # Other hardware: other bits, never compared with the H100s.
        "gpu101": {a100: {"gemm.bf16": C}},
        "gpu102": {a100: {"gemm.bf16": B}},
        # One node of its kind: nobody to compare with.
        "gpu201": {b200: {"gemm.bf16": B}},
    }
    rep = fleet_outliers(nodes)
    assert set(rep) == {h100, a100, b200}
    h = rep[h100]
    assert h["status"] == "outliers" and h["nodes"] == ["gpu001", "gpu002", "gpu003", "gpu004"]
    assert h["outliers"] == {"gpu003": ["gemm.bf16"]} and h["ties"] == []
    w = h["workloads"]["gemm.bf16"]
    assert (w["status"], w["majority"], w["agree"], w["of"]) == (MAJORITY, A, 3, 4)
    t = h["workloads"]["transformer.step"]
    assert t["status"] == AGREE and t["missing"] == ["gpu004"] and t["of"] == 3
    a = rep[a100]
    assert a["status"] == "tie" and a["ties"] == ["gemm.bf16"] and a["outliers"] == {}
    b = rep[b200]
    assert b["status"] == "single-node" and b["outliers"] == {} and b["workloads"]["gemm.bf16"]["status"] == SINGLE


def test_fleet_node_with_two_kinds_of_gpu():
    nodes = {
        "mixed1": {"k1": {"w": A}, "k2": {"w": B}},
        "mixed2": {"k1": {"w": A}, "k2": {"w": B}},
        "mixed3": {"k1": {"w": A}, "k2": {"w": C}},
    }
    rep = fleet_outliers(nodes)
    assert rep["k1"]["status"] == "ok" and rep["k1"]["outliers"] == {}
    assert rep["k2"]["outliers"] == {"mixed3": ["w"]}
    assert fleet_outliers({}) == {}
