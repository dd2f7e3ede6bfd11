"""One story per sweep (issue 26): the node's own verdict and the fleet comparison are merged
once (gpucheck.fleet.sweep.apply_fleet), and the grid, the node lines, the summary, the JSON
report, the HTML page and the exit code all read that one judged object.

The verdicts are real: `gpucheck run --level 2 --check repro.bitwise` on CPU workers, one run
with `--inject bitflip:gpu=N`; the nodes are a fake fan-out that answers with them (as in
tests/test_fleet_units.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.fleet import compare
from gpucheck.fleet.sweep import NodeOutcome, apply_fleet
from gpucheck.platform import fanout
from gpucheck.platform.fanout import NodeRun

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp: Path, workers: int, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "gpucheck", "run", "--level", "2", "--device", "cpu", "--workers", str(workers),
           "--check", "repro.bitwise", "--no-history", "--state-dir", str(tmp), "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         timeout=300)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("state")
    return {"clean2": _run(tmp, 2), "flip2": _run(tmp, 2, "--inject", "bitflip:gpu=1"),
            "clean1": _run(tmp, 1), "flip1": _run(tmp, 1, "--inject", "bitflip:gpu=0")}


def _sweep(monkeypatch, capsys, tmp_path, answers: dict[str, dict], *args: str) -> tuple[int, str, dict, str]:
    runs = {n: NodeRun(n, int(v["exit_code"]), json.dumps({**v, "host": n})) for n, v in answers.items()}

    def run_nodes(commands, *, mode, fanout, timeout_s, on_done, **_kw):
        for n in commands:
            on_done(runs[n])
        return {n: runs[n] for n in commands}

    monkeypatch.setattr(fanout, "run_nodes", run_nodes)
    nodeset = ",".join(answers)
    report = tmp_path / "sweep.json"
    rc = main(["sweep", nodeset, "--report", str(report), *args])
    text = capsys.readouterr().out
    page = tmp_path / "page.html"
    assert main(["report", str(report), "-o", str(page)]) in (0, 1)
    capsys.readouterr()
    return rc, text, json.loads(report.read_text()), page.read_text()


@pytest.mark.slow
def test_a_node_whose_gpus_disagree_is_localised_by_the_fleet_and_fails_with_drain(verdicts, monkeypatch, capsys,
                                                                                 tmp_path):
    """Three 2-GPU nodes, GPU 1 of n3 flips a bit: n3 alone WARNs ("cannot tell which GPU is
    wrong"); the fleet's majority tells. It used to list n3 as missing, and the sweep printed
    "all nodes healthy", exit 0."""
    assert verdicts["flip2"]["status"] == "warn"  # the node alone cannot tell which GPU
    rc, text, doc, page = _sweep(monkeypatch, capsys, tmp_path, {"n1": verdicts["clean2"], "n2": verdicts["clean2"],
                                                                 "n3": verdicts["flip2"]})
    assert rc == 1 and doc["exit_code"] == 1 and doc["bad"] == "n3"
    assert "all nodes healthy" not in text and "bad nodes: n3" in text
    (n3,) = [n for n in doc["nodes"] if n["node"] == "n3"]
    assert n3["status"] == "fail" and n3["action"] == "drain"
    assert "repro.bitwise:gpu1" in n3["failing"] and n3["checks"]["repro.bitwise"] == "fail"
    assert n3["reason"].startswith("fleet: bitwise gpu1: gemm.fp32 differs from the fleet majority (2 of 2 nodes")
    assert n3["reason"].count("fleet:") == 1 and n3["reason"].count("bitwise gpu1") == 1
    print(text)
    flat = " ".join(text.split())  # output that is not a terminal is wrapped
    assert "fleet: fleet:" not in flat and flat.count("differs from the fleet majority") == 1
    grid_row = next(line for line in text.splitlines() if line.startswith("n3 "))
    assert grid_row.split()[1:] == ["FAIL", "FAIL"], grid_row
    assert "Nothing failed" not in page and "Every node passed" not in page and "drain" in page


@pytest.mark.slow
def test_a_fleet_outlier_is_failing_in_its_grid_column_with_one_message_and_drain(verdicts, monkeypatch, capsys,
                                                                                  tmp_path):
    """One worker per node: the node passes on its own (two runs agree), the fleet fails it. The
    grid used to show `ok` in its repro column, the message repeated ("fleet: fleet: bitwise:
    ...; bitwise: ..."), the action was investigate (burn's corruption verdict says drain)."""
    rc, text, doc, _ = _sweep(monkeypatch, capsys, tmp_path, {"n1": verdicts["clean1"], "n2": verdicts["clean1"],
                                                              "n3": verdicts["flip1"]})
    (n3,) = [n for n in doc["nodes"] if n["node"] == "n3"]
    assert rc == 1 and n3["status"] == "fail" and n3["action"] == "drain"
    assert n3["checks"]["repro.bitwise"] == "fail" and n3["failing"] == ["repro.bitwise"]
    assert n3["reason"] == "fleet: " + n3["fleet"][0] and n3["fleet"][0].startswith("bitwise: digests differ")
    grid_row = next(line for line in text.splitlines() if line.startswith("n3 "))
    assert grid_row.split()[1:] == ["FAIL", "FAIL"], grid_row
    flat = " ".join(text.split())  # output that is not a terminal is wrapped
    assert "fleet: fleet:" not in flat and flat.count("digests differ from the fleet majority") == 1
    assert "-> drain" in flat


@pytest.mark.slow
def test_a_warn_node_is_never_called_healthy(verdicts, monkeypatch, capsys, tmp_path):
    """Too few nodes for a fleet majority: the node's own warn stands (exit 0 without --strict),
    and the summary names it instead of "all nodes healthy"."""
    rc, text, doc, page = _sweep(monkeypatch, capsys, tmp_path, {"n1": verdicts["flip2"]})
    assert rc == 0 and doc["nodes"][0]["status"] == "warn"
    assert "all nodes healthy" not in text
    assert "no bad node, but not all passed: warn: n1" in text
    assert "Every node passed" not in page and "not every node passed" in page


def _finding(check="repro.bitwise", subject="node", text="bitwise: x", action="drain"):
    return compare.FleetFinding(check, subject, text, action)


def test_merge_keeps_the_worse_own_status_and_the_stronger_action_and_tells_one_story():
    bad = NodeOutcome("n1", "error", "xid: cannot read the kernel log", action="investigate", failing=["xid"],
                      checks=(("xid", "error"), ("repro.bitwise", "pass")))
    ok = NodeOutcome("n2", "warn", "repro.bitwise gpu0: no majority", action="investigate",
                     checks=(("repro.bitwise", "warn"),))
    slow = NodeOutcome("n3", "fail", "ecc gpu2: uncorrectable", action="rma", failing=["ecc:gpu2"])
    apply_fleet([bad, ok, slow], {"n1": [_finding()], "n2": [_finding(subject="gpu1", text="bitwise gpu1: y")],
                                  "n3": [_finding("burn.gemm", "gpu1", "slow burn.gemm", "investigate")]})
    assert (bad.status, bad.action, bad.failing) == ("fail", "drain", ["xid", "repro.bitwise"])
    assert bad.reason == "xid: cannot read the kernel log; fleet: bitwise: x"
    assert dict(bad.checks) == {"xid": "error", "repro.bitwise": "fail"}
    assert (ok.status, ok.action, ok.failing) == ("fail", "drain", ["repro.bitwise:gpu1"])
    assert ok.reason == "fleet: bitwise gpu1: y; repro.bitwise gpu0: no majority"
    assert (slow.status, slow.action) == ("fail", "rma")  # rma is stronger than the finding's investigate
    assert dict(slow.checks) == {"burn.gemm": "fail"}
