"""Status and action follow from the thresholds a result lists (tests/judge_consistency.py).

Here: the re-evaluation catches every way a result can disagree with its thresholds (hostile,
hand-made results, among them the shape nvlink had when it recomputed its status apart from its
thresholds); every snapshot fixture judged at level 1 (with and without the node's expected
config, with a counter history), every DCGM and kernel-log fixture, follow from their thresholds or
name their basis; and the wrapper that checks every other test's results is in place."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

import judge_consistency as jc
from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.eud.dcgm_parse import DcgmParseError, map_results, parse_diag
from gpucheck.tests_suite.registry import all_checks
from gpucheck.core.result import Action, Basis, Result, Status, Threshold
from gpucheck.core.runner import run_checks
from gpucheck.core.state import State
from gpucheck.platform.telemetry.snapshot import load_snapshot

FIX = Path(__file__).parent / "fixtures"
SNAPSHOTS = sorted(p.name for p in (FIX / "snapshots").glob("*.json"))
EIGHT = Config(node={"expected_gpus": 8, "expected_model": "NVIDIA H100 80GB HBM3"})
F, W, P, S, E = Status.FAIL, Status.WARN, Status.PASS, Status.SKIP, Status.ERROR


def _r(status, action=Action.NONE, thresholds=(), metrics=None, **kw) -> Result:
    return Result("ecc", status, "summary", gpu=0, action=action, thresholds=list(thresholds),
                  metrics=dict(metrics or {}), **kw)


def _t(metric, op, limit, status, action=Action.INVESTIGATE) -> Threshold:
    return Threshold(metric, op, limit, status, action=action)


# -- the re-evaluation itself -------------------------------------------------------------------------
LIES = {
    "a fail no threshold gives": _r(F, Action.RESET_GPU, [_t("dbe", ">", 0, F, Action.RESET_GPU)], {"dbe": 0}),
    "a pass under a violated fail": _r(P, Action.NONE, [_t("dbe", ">", 0, F, Action.RESET_GPU)], {"dbe": 2}),
    "an action the violation does not give": _r(F, Action.RMA, [_t("dbe", ">", 0, F, Action.RESET_GPU)], {"dbe": 2}),
    "a warn from nowhere": _r(W, Action.INVESTIGATE),
    "a fail from nowhere (a lost GPU that does not say so)": _r(F, Action.REBOOT),
    # nvlink before: status computed per link (status_of), thresholds on aggregates that said otherwise
    "nvlink's old shape": _r(F, Action.REBOOT, [_t("links_down", ">", 0, F, Action.REBOOT),
                                                _t("crc_rate_per_s_max_link", ">", 100.0, F)],
                             {"links_down": 0, "crc_rate_per_s_max_link": 5.0}),
    "a warn that an unread ERROR field makes an error": _r(W, Action.INVESTIGATE, [_t("x", ">", 0, W)], {"x": 1},
                                                           unjudged={"ecc_errors": E}),
    "a skip with a violated threshold": _r(S, Action.NONE, [_t("x", ">", 0, W)], {"x": 1}),
    "a pass with a NaN": _r(P, Action.NONE, [_t("x", ">", 0, F)], {"x": math.nan}),
    "a basis result whose thresholds claim worse": _r(W, Action.INVESTIGATE, [_t("x", ">", 0, F)], {"x": 1},
                                                      basis=Basis.HANG),
    "an error with a drain and nothing compared": _r(E, Action.DRAIN),
}
TRUTHS = {
    "a fail and its action": _r(F, Action.RESET_GPU, [_t("dbe", ">", 0, F, Action.RESET_GPU),
                                                      _t("sbe", ">", 9, W)], {"dbe": 2, "sbe": 10}),
    "the strongest action at the worst status": _r(W, Action.RESET_GPU, [_t("a", ">", 0, W, Action.INVESTIGATE),
                                                                        _t("b", ">", 0, W, Action.RESET_GPU)],
                                                   {"a": 1, "b": 1}),
    "not supported is no violation": _r(P, Action.NONE, [_t("x", ">", 0, F)], {"x": None}),
    "a NaN is an error": _r(E, Action.NONE, [_t("x", ">", 0, F)], {"x": math.nan}),
    "a fail stands over a NaN": _r(F, Action.DRAIN, [_t("x", ">", 0, F, Action.DRAIN), _t("y", ">", 0, W)],
                                   {"x": 1, "y": math.nan}),
    "an unread WARN field makes a pass a warn": _r(W, Action.INVESTIGATE, [_t("x", ">", 0, F)], {"x": 0},
                                                   unjudged={"uuid": W}),
    "an unread ERROR field leaves a fail standing": _r(F, Action.RMA, [_t("x", ">", 0, F, Action.RMA)], {"x": 1},
                                                       unjudged={"nvlink": E}),
    "a skip of what is not supported": _r(S, Action.NONE, [_t("x", ">", 0, F)], {"x": None}),
    "a lost GPU says so": _r(F, Action.REBOOT, basis=Basis.GPU_STATE),
    "could not judge, compared nothing": _r(E, Action.NONE),
}


@pytest.mark.parametrize("name", LIES)
def test_a_status_or_action_the_thresholds_do_not_give_is_caught(name):
    assert jc.disagreement(LIES[name]) is not None


@pytest.mark.parametrize("name", TRUTHS)
def test_a_status_and_action_the_thresholds_give_are_accepted(name):
    assert jc.disagreement(TRUTHS[name]) is None


def test_the_check_records_a_disagreement_and_the_fixture_would_fail_the_test():
    jc.check_all([LIES["nvlink's old shape"], TRUTHS["a fail and its action"]])
    found = list(jc.FOUND)
    jc.FOUND.clear()  # this test made the lie on purpose
    assert len(found) == 1 and "make it pass/none" in found[0]


# -- every fixture ---------------------------------------------------------------------------------------
LEVEL1 = [c for c in all_checks(max_level=1) if c.spec.level == Level.QUICK]


def _judged(results: list[Result]) -> list[Result]:
    for r in results:
        assert jc.disagreement(r) is None, jc.disagreement(r)
        if r.status in (F, W) and not r.thresholds:
            assert r.basis is not None, f"{r.check} {r.subject}: a {r.status.value} with no threshold and no basis"
    return results


@pytest.mark.parametrize("config", [None, EIGHT], ids=["no-config", "eight-h100"])
@pytest.mark.parametrize("name", SNAPSHOTS)
def test_every_snapshot_fixture_at_level_1_follows_from_its_thresholds(name, config):
    path = FIX / "snapshots" / name
    ctx = Context(level=Level.QUICK, snapshot=load_snapshot(path), config=config,
                  options={"snapshot_path": str(path)})
    out = run_checks(LEVEL1, ctx, install_signal_handlers=False)
    assert {r.check for r in out.results} >= {"inventory", "xid"}
    _judged(out.results)


def test_counter_deltas_from_a_history_follow_from_their_thresholds(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    shutil.copy(FIX / "snapshots" / "h100-nvlink-replay-growth.history.jsonl", state_dir / "history.jsonl")
    checks = [c for c in LEVEL1 if c.id in ("nvlink", "pcie")]
    ctx = Context(level=Level.QUICK, snapshot=load_snapshot(FIX / "snapshots" / "h100-nvlink-replay-growth.json"),
                  config=EIGHT, state=State(state_dir))
    results = _judged(run_checks(checks, ctx, install_signal_handlers=False).results)
    grew = [r for r in results if r.check == "nvlink" and r.status == F]
    assert grew and all(r.metrics["window_s"] for r in grew)


@pytest.mark.parametrize("path", sorted((FIX / "dcgm").glob("*.json")), ids=lambda p: p.name)
def test_every_dcgm_fixture_follows_from_its_thresholds(path):
    try:
        doc = parse_diag(path.read_text())
    except DcgmParseError:
        return  # a document gpucheck refuses produces no result to judge (tests/test_eud_dcgm_parse.py)
    _judged(map_results(doc))


@pytest.mark.parametrize("path", sorted((FIX / "kernlog").iterdir()), ids=lambda p: p.name)
def test_every_kernel_log_fixture_follows_from_its_thresholds(path):
    xid = [c for c in LEVEL1 if c.id == "xid"]
    ctx = Context(level=Level.QUICK, config=Config(checks={"xid": {"files": [str(path)], "since": "all"}}),
                  snapshot={"nvml": {"ok": True}, "gpus": []})
    results = _judged(run_checks(xid, ctx, install_signal_handlers=False).results)
    assert any(r.status != S for r in results)


# -- the wrapper that checks every other test's results ---------------------------------------------------
def test_every_entry_point_and_check_of_the_rule_engine_is_checked_in_every_test():
    import importlib

    for mod, name, also in jc.ENTRY_POINTS:
        for m in (mod, *also):
            assert getattr(getattr(importlib.import_module(m), name), "__judge_checked__", False), f"{m}.{name}"
    checks = {c.id: c for c in all_checks()}
    assert jc.CHECKS <= set(checks)
    for cid in jc.CHECKS:
        assert getattr(checks[cid].run, "__judge_checked__", False), cid


# -- results whose thresholds said something else before --------------------------------------------------
def test_a_dcgm_fail_judged_a_warning_or_an_error_lists_that_status():
    by_subject = {r.subject: r for r in map_results(parse_diag((FIX / "dcgm" / "v4_r3_mixed.json").read_text()))}
    fail_rules = {s: [t for t in r.thresholds if t.limit != "Warn"] for s, r in by_subject.items()}
    softened = [s for s, r in by_subject.items() if r.status in (W, E) and r.metrics["dcgm_status"].lower() == "fail"]
    assert softened  # the fixture has a Fail DCGM's catalog makes a warn and one it makes an error
    for s in softened:
        (t,) = fail_rules[s]
        assert (t.status, t.limit, t.action) == (by_subject[s].status, "Fail", by_subject[s].action)


def test_an_sxid_of_unknown_fatality_warns_by_a_threshold_it_lists():
    from gpucheck.xid.judge import judge
    from gpucheck.platform.kernlog.mapping import GpuMap
    from gpucheck.platform.kernlog.parse import SXidEvent

    sx = SXidEvent(sxid=12028, pci_bus_id="0000:07:00.0", time=None, raw=["nvidia-nvswitch0: SXid ..."])
    (node, switch) = judge(check="xid", events=[], sxid_events=[sx], unrecognised=[], gpu_map=GpuMap(),
                           params={}, read_summary="a file", window_label="since boot")
    assert (switch.status, switch.action) == (W, Action.INVESTIGATE) and "unknown fatality" in switch.summary
    assert switch.metrics["unknown_fatality_sxids"] == 1
    assert any(t.metric == "unknown_fatality_sxids" and t.status == W for t in switch.thresholds)


def test_nvml_refusing_access_lists_no_threshold_it_did_not_compare():
    snap = {"nvml": {"ok": False, "error": {"kind": "no_permission", "message": "Insufficient Permissions"}},
            "gpus": [], "pci_nvidia_devices": [{"bus_id": "0000:18:00.0", "class": "0x030200", "device": "0x2330"}]}
    (r,) = [c for c in LEVEL1 if c.id == "inventory"][0].run(Context(level=Level.QUICK, snapshot=snap))
    assert (r.status, r.action, r.thresholds) == (E, Action.NONE, [])  # before: "pci_gpu_count > 0 -> fail"
    assert r.metrics["pci_gpu_count"] == 1


def test_memory_errors_found_while_an_injection_could_not_be_made_still_fail():
    from gpucheck.tests_suite import eud_memtest as mt
    from gpucheck.eud.memtest_worker import MemtestConfig, NumpyBackend, run_memtest
    from gpucheck.workers.pool import LocalChannel

    def data(**inject):
        cfg = MemtestConfig(cpu_bytes=64 << 10, cpu_chunk_bytes=32 << 10, copy_bytes=8 << 10, copy_repeats=2,
                            patterns=["zeros", "random"], inject=inject or None)
        return run_memtest(NumpyBackend(cfg), cfg, LocalChannel())

    p = mt._params(Context())
    clean = data(offset=1 << 30, bit=3)  # outside the tested region: nothing injected, nothing found
    r = mt.judge_data(0, clean, p, "cpu", ["bitflip:gpu=0"])
    assert (r.status, r.action) == (E, Action.NONE) and r.summary.startswith("could not inject: bitflip offset")
    faulty = data(offset=4096, bit=7)  # a miscompare, as a real fault would be
    faulty["inject_problem"] = clean["inject_problem"]
    r = mt.judge_data(0, faulty, p, "cpu", [])
    assert (r.status, r.action) == (F, Action.DRAIN) and r.summary.startswith("memory errors: 1")  # before: error
    assert any(e.startswith("could not inject: bitflip offset") for e in r.evidence)


# -- the example in docs/checks.md ------------------------------------------------------------------------
def _example_check(tmp_path):
    import importlib.util

    text = (Path(__file__).parents[1] / "docs" / "checks.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example_temperature.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("example_temperature", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (check,) = mod.CHECKS
    return check


def test_the_example_check_of_docs_checks_md_runs_and_follows_from_its_rules(tmp_path):
    check = _example_check(tmp_path)
    assert check.id == "example.temperature" and check.spec.level == Level.QUICK
    snap = load_snapshot(FIX / "snapshots" / "h100-healthy.json")
    snap["gpus"][1]["temperature"]["gpu_c"] = 90  # warm
    snap["gpus"][2]["temperature"]["gpu_c"] = None  # not supported
    snap["gpus"][3]["temperature"]["gpu_c"] = None  # could not be read
    snap["gpus"][3]["errors"] = {"temperature.gpu_c": "other"}
    snap["gpus"][4]["state"] = "lost"
    snap["gpus"][5]["temperature"]["gpu_c"] = 99  # hot
    results = {r.gpu: r for r in _judged(check.run(Context(level=Level.QUICK, snapshot=snap)))}
    t0 = snap["gpus"][0]["temperature"]["gpu_c"]
    assert (results[0].status, results[0].summary) == (P, f"GPU 0: {t0} C")
    assert (results[1].status, results[1].action) == (W, Action.INVESTIGATE)
    assert results[1].summary == "GPU 1 runs hot (90 C)"
    assert results[2].status == S and results[3].status == E and "temperature.gpu_c" in results[3].summary
    assert (results[4].status, results[4].basis) == (F, Basis.GPU_STATE)
    assert results[5].status == F and results[5].summary == "GPU 5 runs hot (99 C)"
    assert [(t.metric, t.op, t.limit) for t in results[0].thresholds] == [("temperature_c", ">", 95),
                                                                          ("temperature_c", ">", 85)]