"""The typed verdict (gpucheck.core.verdict): one builder, the same JSON, and a parser that trusts
nothing of a document's shape: what it refuses (every field the Verdict holds, after the checks
the sweep made before), what it keeps (a later 1.x's fields, passed on as the node sent them),
and where it is used (the Slurm hook's could-not-judge verdict, the sweep, `gpucheck report`)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from gpucheck.core.levels import Level
from gpucheck.core.result import Action, Result, Status, Threshold, judge
from gpucheck.core.verdict import (SCHEMA, CheckEntry, InventoryEntry, RunFacts, Verdict, VerdictError,
                                   VerdictSource, build_verdict, unjudged_verdict, verdict_problem)
from gpucheck.fleet.sweep import VerdictSpool, build_report, classify, keep_summary, report_chunks, SweepPlan
from gpucheck.fleet.compare import compare_inputs
from gpucheck.platform.fanout import NodeRun

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import report_inputs as ri  # noqa: E402

SOFTWARE = {k: None for k in SCHEMA["properties"]["software"]["required"]}  # type: ignore[index]


def built() -> Verdict:
    """A verdict of the builder: an ECC fail on GPU 1 with its threshold, a skip, two GPUs."""
    ecc = judge("ecc", [Threshold("dbe", ">", 0, Status.FAIL, "count")], {"dbe": 2, "temp": float("nan")}, gpu=1,
                units={"dbe": "count"}, actions={"dbe": Action.RESET_GPU})
    ecc.evidence.append("Xid 48")
    skip = Result("xid", Status.SKIP, "snapshot has no kernel log")
    gpus = tuple(InventoryEntry(i, f"GPU-{i}", None, f"0000:{i:02x}:00.0", "NVIDIA H100 80GB HBM3", "ok") for i in (0, 1))
    return build_verdict([ecc, skip], RunFacts(
        level=Level.QUICK, started_at=1767225600.0, duration_s=0.25, host="n1", software=SOFTWARE, gpus=gpus,
        checks=(CheckEntry.of("ecc", 1, Status.FAIL, 0.0012), CheckEntry.of("xid", 1, Status.SKIP, 0.0004)),
        source=VerdictSource("snapshot", "/x/h100.json", True), injected=("bitflip:gpu=1",)))


def test_the_builder_writes_the_schema_and_reads_back_what_it_wrote():
    jsonschema = pytest.importorskip("jsonschema")
    v = built()
    doc = v.to_json()
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert (doc["status"], doc["action"], doc["exit_code"]) == ("fail", "reset-gpu", 1)
    assert doc["results"][0]["metrics"]["temp"] == {"value": None, "unit": ""}  # NaN is null in JSON
    assert doc["counts"] == {"pass": 0, "warn": 0, "fail": 1, "skip": 1, "error": 0}
    back = Verdict.from_json(json.loads(json.dumps(doc)))
    assert back == v and back.to_json() == doc and back.counts == v.counts
    assert back.results[0].metric_value("dbe") == 2 and back.results[0].thresholds[0].status is Status.FAIL


def test_the_hooks_could_not_judge_verdict_is_the_builders():
    jsonschema = pytest.importorskip("jsonschema")
    v = unjudged_verdict("slurm.prolog", "usage error", level=Level.QUICK, started_at=10.0, duration_s=0.5,
                         host="gpu7", software=SOFTWARE)
    jsonschema.Draft202012Validator(SCHEMA).validate(v.to_json())
    same = build_verdict([Result("slurm.prolog", Status.ERROR, "usage error", action=Action.INVESTIGATE)],
                         RunFacts(level=Level.QUICK, started_at=10.0, duration_s=0.5, host="gpu7", software=SOFTWARE,
                                  checks=(CheckEntry.of("slurm.prolog", 1, Status.ERROR, 0.5),)))
    assert v == same and (v.status, v.exit_code, v.source.kind, v.gpus) == (Status.ERROR, 3, "none", ())


def _mutated(change) -> dict:
    doc = copy.deepcopy(built().to_json())
    change(doc)
    return doc


# Fields the sweep did not check before the verdict was typed: each refused, named.
NEW_FIELD_PROBLEMS = {
    "time": (lambda d: d.update(time=5), "time is 5, not a string"),
    "duration": (lambda d: d.update(duration_s=-1), "duration_s is -1, not a number >= 0"),
    "level": (lambda d: d.update(level=9), "level is 9, not an integer 1-4"),
    "level-bool": (lambda d: d.update(level=True), "level is True, not an integer 1-4"),
    "version": (lambda d: d.update(gpucheck_version=None), "gpucheck_version is null, not a string"),
    "software": (lambda d: d["software"].update(driver=550), "software.driver is 550, not a string or null"),
    "source": (lambda d: d.update(source=[]), "source is a list, not an object"),
    "synthetic": (lambda d: d["source"].update(synthetic="yes"), "source.synthetic is 'yes', not a boolean"),
    "check-status": (lambda d: d["checks"][1].update(status="ok"), "checks[1].status is 'ok', not one of"),
    "check-level": (lambda d: d["checks"][0].update(level="1"), "checks[0].level is '1', not an integer 1-4"),
    "gpu-uuid": (lambda d: d["gpus"][1].update(uuid=7), "gpus[1].uuid is 7, not a string or null"),
    "gpu-state": (lambda d: d["gpus"][0].update(state=None), "gpus[0].state is null, not a string"),
    "threshold-op": (lambda d: d["results"][0]["thresholds"][0].update(op="=>"),
                     "results[0].thresholds[0].op is '=>', not one of"),
    "threshold-limit": (lambda d: d["results"][0]["thresholds"][0].update(limit=[0]),
                        "results[0].thresholds[0].limit is a list, not a number, a string, a boolean or null"),
    "threshold-unit": (lambda d: d["results"][0]["thresholds"][0].pop("unit"),
                       "results[0].thresholds[0].unit is null, not a string"),
    "thresholds": (lambda d: d["results"][1].update(thresholds=None), "results[1].thresholds is null, not a list"),
    "evidence": (lambda d: d["results"][0].update(evidence=[1]), "results[0].evidence is a list, not a list of strings"),
    "result-duration": (lambda d: d["results"][1].update(duration_s="0.1"),
                        "results[1].duration_s is '0.1', not a number or null"),
    "injected": (lambda d: d.update(injected="bitflip"), "injected is 'bitflip', not a list of strings"),
}


@pytest.mark.parametrize("name", NEW_FIELD_PROBLEMS)
def test_every_field_the_verdict_holds_is_checked(name):
    change, words = NEW_FIELD_PROBLEMS[name]
    doc = _mutated(change)
    assert verdict_problem(doc) is None  # what the sweep checked before: these passed it
    with pytest.raises(VerdictError) as e:
        Verdict.from_json(doc)
    assert words in str(e.value), str(e.value)
    o = classify(NodeRun("n1", 1, json.dumps(doc)))
    assert o.status == "error" and o.reason == f"invalid verdict: {e.value}" and o.inputs is None


def test_the_sweeps_checks_come_first():
    """A document with an old problem and a new one: the old one is named, as before."""
    doc = _mutated(lambda d: d.update(time=5, host=None))
    with pytest.raises(VerdictError, match=r"^host is null, not a string$"):
        Verdict.from_json(doc)
    with pytest.raises(VerdictError, match="schema 'gpucheck.sweep' is not gpucheck.verdict"):
        Verdict.from_json({**built().to_json(), "schema": "gpucheck.sweep"})
    with pytest.raises(VerdictError, match=r"schema_version '2.0' is not supported \(want 1.x\)"):
        Verdict.from_json({**built().to_json(), "schema_version": "2.0"})


def test_a_later_minor_version_is_passed_on_as_the_node_sent_it(tmp_path):
    """A 1.x after this one may add fields (at the top, in a result, in a GPU): the sweep reads what
    it knows and its report holds the node's verdict unchanged."""
    newer = _mutated(lambda d: d.update(schema_version="1.9", future={"x": [1, 2]}))
    newer["results"][0]["confidence"] = 0.9
    newer["gpus"][0]["numa_node"] = 1
    newer["software"].pop("cupy")  # an unknown version is as good as a null one
    v = Verdict.from_json(copy.deepcopy(newer))
    assert v.schema_version == "1.9" and v.software.get("cupy") is None and v.to_json() == newer
    plan = SweepPlan(nodes=["n1"])
    with VerdictSpool(str(tmp_path)) as spool:
        outcome = keep_summary(classify(NodeRun("n1", 1, json.dumps(newer))), spool)
        assert outcome.status == "fail" and outcome.failing == ["ecc:gpu1"]
        report = build_report([outcome], compare_inputs({}), plan=plan, started_at=0.0, duration_s=1.0)
        doc = json.loads("".join(report_chunks(report, spool)))
    assert doc["nodes"][0]["verdict"] == newer


def test_the_report_reads_every_verdict_with_the_parser(tmp_path, capsys):
    from gpucheck.cli.main import main
    from gpucheck.report.inputs import load_input

    good = ri.slow_gpu_verdict()
    broken = {**good, "level": 9}
    f = tmp_path / "v.json"
    f.write_text(json.dumps(broken))
    assert main(["report", str(f), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"{f}: not a verdict gpucheck can read: level is 9, not an integer 1-4" in err and err.count("\n") == 1
    history = tmp_path / "history.jsonl"
    history.write_text(json.dumps(good) + "\n" + json.dumps(broken) + "\n" + json.dumps(good) + "\n")
    got = load_input(str(history))
    assert (got.kind, len(got.verdicts), got.skipped_lines) == ("history", 2, 1)
    sweep = json.loads(ri.sweep_report(4))
    bad_node = sweep["nodes"][1]["node"]
    sweep["nodes"][1]["verdict"]["results"][0]["thresholds"] = "none"
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    got = load_input(str(path))
    assert bad_node not in got.node_verdicts and len(got.node_verdicts) == 2  # and one node was unreachable
    assert all(nv.checks and nv.inputs.throughput for nv in got.node_verdicts.values())
