"""The hang analysis (gpucheck/hang/analysis.py, topology.py) on recorded and synthetic stacks."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hang_synth import ALL_REDUCE, FIXTURES, LOAD_BATCH, synthetic_job  # noqa: E402

from gpucheck.hang import analysis as A  # noqa: E402
from gpucheck.hang import flight as F  # noqa: E402
from gpucheck.hang import topology as T  # noqa: E402


def _rank(rank, node, threads, **kw):
    return {"rank": rank, "node": node, "pid": 100 + rank, "status": "dumped", "error": None, "world_size": kw.pop(
        "world", None), "threads": copy.deepcopy(threads), "flight": kw.pop("flight", None), **kw}


def _stack(*names, file="/job/train.py"):
    return [{"name": "MainThread", "tid": 1, "main": True, "active": False,
             "frames": [{"function": n, "file": f, "line": 10 + i} for i, (n, f) in
                        enumerate((n if isinstance(n, tuple) else (n, file)) for n in names)]}]


C10D = "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py"
WAITING = _stack(("all_reduce", C10D), "train_step", "main", "<module>")
LOADING = _stack("load_batch", "main", "<module>")


def test_recorded_dumps_of_1024_ranks_with_two_outliers():
    ranks = synthetic_job(1024, outliers={37: "load_batch", 900: "lock"})
    rep = A.analyze(ranks, [{"node": f"n{i:04d}", "status": "ok", "reason": ""} for i in range(1, 129)])
    assert rep["status"] == "suspects" and rep["exit_code"] == 1
    assert [s["rank"] for s in rep["suspects"]] == [37, 900]
    assert [(s["node"], s["source"]) for s in rep["suspects"]] == [("n0005", "stacks"), ("n0113", "stacks")]
    assert rep["suspect_nodes"] == "n[0005,0113]" and rep["evict_nodes"] == "n[0005,0113]"
    # install paths, line numbers and background threads differ per rank: still one healthy group
    groups = rep["groups"]
    assert [g["size"] for g in groups] == [1022, 1, 1] and groups[0]["dominant"] and groups[0]["in_collective"]
    assert groups[0]["main_frames"][:2] == ["all_reduce (torch/distributed/distributed_c10d.py)",
                                            "_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py)"]
    by_rank = {s["rank"]: s for s in rep["suspects"]}
    assert by_rank[37]["why"] == ("not in the collective the other 1022 rank(s) wait in: load_batch (hang_train.py)")
    assert by_rank[37]["frames"][0] == "load_batch (hang_train.py:35)"  # its own line: recorded 33, + 37 % 5
    assert by_rank[900]["why"].endswith("Condition.wait (threading.py) <- save_checkpoint "
                                        "(megatron/training/checkpointing.py)")
    g37 = next(g for g in groups if 37 in g["ranks"])
    assert g37["distinct_frames"] == ["load_batch (hang_train.py)"] and g37["splits_from"] == "main (hang_train.py)"
    assert rep["summary"].startswith("2 suspect rank(s): rank 37 on n0005 and 1 more")


def test_every_rank_in_the_same_collective_agrees_and_points_to_bisect():
    rep = A.analyze(synthetic_job(64), [{"node": "n0001", "status": "ok", "reason": ""}])
    assert rep["status"] == "agree" and rep["exit_code"] == 0 and rep["suspects"] == []
    assert "cannot localize this hang" in rep["summary"] and "gpucheck bisect" in rep["summary"]
    assert "every one in all_reduce (torch/distributed/distributed_c10d.py)" in rep["summary"]


def test_normalization():
    assert A.short_file("/opt/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py") == \
        "torch/distributed/distributed_c10d.py"
    assert A.short_file("/usr/lib/python3/dist-packages/torch/x.py") == "torch/x.py"
    assert A.short_file("/usr/lib/python3.12/threading.py") == "threading.py"
    assert A.short_file("/home/a/job/train.py") == "train.py" and A.short_file("<string>") == "<string>"
    assert A.frame_label("0x7f3a12 (libc.so.6)", "libc.so.6") == "0x? (libc.so.6) (libc.so.6)"


def test_a_communication_thread_counts_when_the_main_thread_is_not_in_a_collective():
    comm = {"name": "comm", "tid": 2, "main": False, "active": False,
            "frames": [{"function": "all_gather", "file": C10D, "line": 1},
                       {"function": "comm_loop", "file": "/job/train.py", "line": 5}]}
    idle = {"name": "comm", "tid": 2, "main": False, "active": False,
            "frames": [{"function": "get", "file": "/usr/lib/python3.11/queue.py", "line": 1},
                       {"function": "comm_loop", "file": "/job/train.py", "line": 9}]}
    main = _stack("join", "main")
    ranks = [_rank(r, f"n{r}", main + [comm]) for r in range(4)] + [_rank(4, "n4", main + [idle])]
    rep = A.analyze(ranks, scope="local")
    assert [s["rank"] for s in rep["suspects"]] == [4]
    g = next(g for g in rep["groups"] if g["ranks"] == [4])
    assert g["distinct_frames"] == [] and rep["groups"][0]["collective_frames"][0].startswith("all_gather")


def test_ranks_waiting_for_a_stalled_majority_are_not_suspects():
    """Most ranks stuck reading data (a shared filesystem hangs), one made it to the all_reduce: that
    one is waiting for the others, not the culprit; stacks cannot localize a job-wide stall."""
    ranks = [_rank(r, f"n{r // 2}", LOADING, world=8) for r in range(7)] + [_rank(7, "n3", WAITING, world=8)]
    rep = A.analyze(ranks)
    assert rep["exit_code"] == 3 and rep["suspects"] == [] and rep["dominant_group"] == 1
    assert ("the majority (7 ranks) is outside any collective, in load_batch (train.py), and 1 rank(s) wait in a "
            "collective for them: a stall of the whole job, not of one rank") in rep["summary"]
    # a rank elsewhere still stands out from such a majority
    ranks.append(_rank(8, "n4", _stack("save_checkpoint", "main", "<module>"), world=9))
    for r in ranks:
        r["world_size"] = 9
    rep = A.analyze(ranks)
    assert rep["exit_code"] == 1 and [s["rank"] for s in rep["suspects"]] == [8]


def test_no_majority_is_could_not_judge():
    stacks = [WAITING, LOADING, _stack("a"), _stack("b")]
    ranks = [_rank(r, "n1", stacks[r % 4]) for r in range(8)]
    rep = A.analyze(ranks, scope="local")
    assert rep["exit_code"] == 3 and rep["suspects"] == [] and rep["dominant_group"] is None
    assert "no majority: the largest of 4 stack groups holds 2 of 8 ranks" in rep["summary"]


def test_two_halves_the_half_in_a_collective_is_healthy():
    rep = A.analyze([_rank(0, "a", WAITING), _rank(1, "b", LOADING)], scope="local")
    assert rep["exit_code"] == 1 and [s["rank"] for s in rep["suspects"]] == [1]
    assert "waiting in a collective" in rep["dominant_why"]
    rep = A.analyze([_rank(0, "a", _stack("x")), _rank(1, "b", LOADING)], scope="local")
    assert rep["exit_code"] == 3 and rep["suspects"] == []


def test_missing_ranks_are_not_a_clean_bill():
    ranks = [_rank(r, "n1", WAITING, world=4) for r in range(3)]  # rank 3 is gone
    rep = A.analyze(ranks, [{"node": "n1", "status": "ok", "reason": ""}])
    assert rep["exit_code"] == 3 and rep["missing_ranks"] == [3]
    assert "1 rank(s) of the world were not found on any node: 3" in rep["summary"]
    assert A.analyze(ranks, scope="local")["exit_code"] == 0  # one node's view: the others are elsewhere


def test_duplicate_ranks_or_two_worlds_cannot_be_judged():
    ranks = [_rank(r, "n1", WAITING, world=2) for r in range(2)] + [_rank(1, "n2", LOADING, world=2)]
    rep = A.analyze(ranks)
    assert rep["exit_code"] == 3 and rep["duplicate_ranks"] == [{"rank": 1, "where": ["n1:101", "n2:101"]}]
    assert "rank 1 is claimed by 2 processes" in rep["summary"]
    rep = A.analyze([_rank(0, "n1", WAITING, world=2), _rank(1, "n1", WAITING, world=3)])
    assert rep["exit_code"] == 3 and "disagree on the world size (2, 3)" in rep["summary"]


def test_undumped_ranks_and_uncollected_nodes():
    ranks = [_rank(r, "n1", WAITING, world=3) for r in range(2)]
    ranks.append({**_rank(2, "n2", [], world=3), "status": "error", "error": "py-spy did not finish within 10 s"})
    nodes = [{"node": "n1", "status": "ok", "reason": ""}, {"node": "n2", "status": "error", "reason": "x"}]
    rep = A.analyze(ranks, nodes)
    assert rep["exit_code"] == 3 and rep["undumped"][0]["rank"] == 2 and rep["uncollected_nodes"] == "n2"
    assert "1 node(s) not fully collected: n2 (n2: error: x)" in rep["summary"]
    # the same with a suspect among the dumped ranks: the suspect is a judged fault (exit 1)
    ranks += [_rank(3, "n1", LOADING, world=4)]
    for r in ranks:
        r["world_size"] = 4
    rep = A.analyze(ranks, nodes)
    assert rep["exit_code"] == 1 and [s["rank"] for s in rep["suspects"]] == [3]
    assert rep["summary"].endswith("also: 1 node(s) not fully collected: n2 (n2: error: x)")


def test_unreachable_node_of_the_hung_rank_is_named_not_passed():
    ranks = [_rank(r, f"n{r}", WAITING, world=4) for r in range(3)]
    nodes = [{"node": f"n{r}", "status": "ok", "reason": ""} for r in range(3)]
    nodes.append({"node": "n3", "status": "unreachable", "reason": "Connection refused"})
    rep = A.analyze(ranks, nodes)
    assert rep["exit_code"] == 3 and rep["uncollected_nodes"] == "n3" and rep["missing_ranks"] == [3]
    assert "n3: unreachable: Connection refused" in rep["summary"]


def _fr(rank: int, last: int, ops=None, ranks=(0, 1, 2, 3), pg="0"):
    ops = ops or {s: "nccl:all_reduce" for s in range(1, last + 1)}
    return {"version": "2.10", "entries": last, "pgs": {pg: {
        "desc": "default_pg", "ranks": list(ranks), "last_seq": last, "last_op": ops[last], "last_state": "started",
        "ops": [[s, o] for s, o in sorted(ops.items())]}}}


def test_flight_recorder_from_recorded_dumps_names_the_rank_that_never_entered():
    sums = {r: F.summarize(F.parse_dump_bytes((FIXTURES / f"fr-rank{r}.pickle").read_bytes())) for r in (0, 2)}
    ranks = [_rank(0, "a", WAITING, flight=sums[0]), _rank(2, "b", WAITING, flight=sums[2])]
    rep = A.analyze(ranks, scope="local")  # the stacks agree: only the flight recorder tells
    (pg,) = rep["flight_recorder"]["groups"]
    assert (pg["pg"], pg["desc"], pg["divergence_seq"], pg["op"]) == ("0", "default_pg", 4, "gloo:all_reduce")
    assert pg["entered"] == [0] and pg["not_entered"] == [2] and pg["no_data"] == [1, 3]
    assert rep["exit_code"] == 1 and rep["suspects"] == [
        {"rank": 2, "node": "b", "pid": 102, "group": None, "source": "flight-recorder",
         "why": "never entered collective #4 (gloo:all_reduce) of process group 0 (default_pg), which 1 rank(s) "
                "entered", "frames": ["all_reduce (torch/distributed/distributed_c10d.py:10)",
                                      "train_step (train.py:11)", "main (train.py:12)", "<module> (train.py:13)"]}]


def test_flight_recorder_op_mismatch():
    ops = {1: "nccl:all_reduce", 2: "nccl:all_gather"}
    ranks = [_rank(r, "a", WAITING, flight=_fr(r, 2)) for r in range(3)]
    ranks.append(_rank(3, "a", WAITING, flight=_fr(3, 2, ops)))
    rep = A.analyze(ranks, scope="local")
    (pg,) = rep["flight_recorder"]["groups"]
    assert pg["status"] == "diverged" and pg["mismatched"] == [{"seq": 2, "op": "nccl:all_reduce",
                                                                "ranks": {"3": "nccl:all_gather"}}]
    assert [s["rank"] for s in rep["suspects"]] == [3] and "is nccl:all_gather here" in rep["suspects"][0]["why"]


def test_flight_recorder_agreeing_adds_nothing():
    ranks = [_rank(r, "a", WAITING, flight=_fr(r, 7)) for r in range(4)]
    rep = A.analyze(ranks, scope="local")
    assert rep["exit_code"] == 0 and rep["flight_recorder"]["groups"][0]["status"] == "agree"


def test_megatron_rank_order():
    topo = T.megatron(T.parse_spec("tp=2,pp=2"), 8)  # dp = 2
    assert topo.dims == {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                         "pp": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    topo = T.megatron(T.parse_spec("tp=2,pp=2,order=tp-pp-dp"), 8)
    assert topo.dims["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]] and topo.dims["dp"][0] == [0, 4]
    with pytest.raises(T.TopologyError, match="not a multiple of tp\\*cp\\*pp = 32"):
        T.megatron(T.parse_spec("tp=8,pp=4"), 48)
    with pytest.raises(T.TopologyError, match="tp\\*cp\\*dp\\*pp = 16"):
        T.megatron(T.parse_spec("tp=8,dp=2"), 32)


@pytest.mark.parametrize("text,why", [("tp=8,pp", "KEY=VALUE"), ("tp=0", "not a positive size"), ("ep=2", "unknown"),
                                      ("tp=2,tp=4", "given twice"), ("order=tp-pp-tp", "distinct"), ("order=tp-ep", "distinct"), ("", "KEY=VALUE")])
def test_topology_spec_errors(text, why):
    with pytest.raises(T.TopologyError, match=why):
        T.parse_spec(text)


def test_one_suspect_evicts_its_tp_group_two_in_one_pipeline_evict_the_pipeline():
    # 64 ranks, tp=8 (one node each), pp=4, dp=2: node k holds ranks 8k..8k+7
    ranks = synthetic_job(64, per_node=8, outliers={19: "load_batch"})
    topo = T.megatron(T.parse_spec("tp=8,pp=4"), 64)
    rep = A.analyze(ranks, topology=topo)
    t = rep["topology"]
    assert t["evict_dim"] == "tp" and t["evict_ranks"] == list(range(16, 24)) and rep["evict_nodes"] == "n0003"
    assert t["dims"]["pp"] == [{"index": 3, "ranks": [3, 19, 35, 51], "suspects": [19],
                                "nodes": "n[0001,0003,0005,0007]"}]
    # ranks 19 and 35: the same pipeline (tp rank 3, dp 0), stages 1 and 2
    rep = A.analyze(synthetic_job(64, outliers={19: "load_batch", 35: "lock"}), topology=topo)
    t = rep["topology"]
    assert t["evict_dim"] == "pp" and t["evict_ranks"] == [3, 19, 35, 51]
    assert rep["suspect_nodes"] == "n[0003,0005]" and rep["evict_nodes"] == "n[0001,0003,0005,0007]"


def test_groups_file(tmp_path):
    path = tmp_path / "groups.json"
    path.write_text(json.dumps({"tp": [[0, 1], [2, 3]], "stage": [[0, 2], [1, 3]]}))
    topo = T.load_groups(str(path))
    plan = T.evict_plan(topo, [2], {0: "a", 1: "a", 2: "b", 3: "b"})
    assert plan["evict_dim"] == "tp" and plan["evict_nodes"] == "b"
    plan = T.evict_plan(topo, [1, 3], {0: "a", 1: "a", 2: "b", 3: "b"})
    assert plan["evict_dim"] == "stage" and plan["evict_nodes"] == "a,b"
    for bad, why in (({"tp": [[0, "x"]]}, "tp: 'x' is not a rank"), ({"tp": [[0], [0]]}, "rank 0 is in two groups"),
                     ({"tp": [[]]}, "non-empty rank lists"), ([], "want an object")):
        path.write_text(json.dumps(bad))
        with pytest.raises(T.TopologyError, match=why):
            T.load_groups(str(path))


def test_interrupted_collection_is_never_a_judgement():
    rep = A.analyze([_rank(0, "a", WAITING), _rank(1, "a", LOADING), _rank(2, "a", WAITING)], scope="local")
    assert rep["exit_code"] == 1
    doc = A.document(rep, source={}, started=0.0, interrupted="SIGTERM", now=1.0)
    assert doc["exit_code"] == 3 and doc["status"] == "could-not-judge" and doc["suspects"]
    assert doc["summary"].startswith("could not judge: interrupted (SIGTERM) before every node answered")
    assert doc["schema"] == "gpucheck.hang" and doc["schema_version"] == "1.0"


def test_recorded_fixtures_are_real_py_spy_dumps():
    main = [next(t for t in stacks if t["main"]) for stacks in (ALL_REDUCE, LOAD_BATCH)]
    assert [m["frames"][0]["function"] for m in main] == ["all_reduce", "load_batch"]
    assert {t["name"] for t in ALL_REDUCE} == {"MainThread", "fr-dump"}


def test_fast_fold_is_the_fleets_fold():
    import random

    from gpucheck.platform.nodeset import fold as fleet_fold
    from gpucheck.hang.folding import fold

    rng = random.Random(16)
    for _ in range(200):
        names = {rng.choice(["gpu", "n", "r1n", "r2n", "rack-a-", "login"]) + rng.choice(["", "0", "00"])
                 + str(rng.randrange(0, 120)) + rng.choice(["", "-ib", "x"]) for _ in range(rng.randrange(1, 40))}
        assert fold(names) == fleet_fold(names), names
    assert fold(f"n{i:04d}" for i in range(1, 2049)) == "n[0001-2048]" and fold([]) == ""
