"""Fleet building blocks without daemons: node sets, the remote command, classifying a node's
output, the fleet comparison (MAD outliers, bitwise majority), the Slurm hook's decisions with a
fake scontrol and a fake pipeline, and `slurm resume`'s choice of nodes."""

from __future__ import annotations

import errno
import json
import re
import shlex
import sys
import syslog
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_captures import capture, show_job  # noqa: E402

from gpucheck.cli.main import main  # noqa: E402
from gpucheck.core.levels import Level
from gpucheck.core.result import Result, Status
from gpucheck.core.verdict import InventoryEntry, RunFacts, Verdict, build_verdict
from gpucheck.fleet import compare, hook, slurm
from gpucheck.platform import fanout
from gpucheck.platform.fanout import NodeRun
from gpucheck.platform.nodeset import NodeSetError, fold, parse_node_map, parse_nodeset
from gpucheck.fleet.sweep import (NodeOutcome, SweepPlan, VerdictSpool, apply_fleet, build_report, classify,
                                  die_with_session, one_line, parse_verdict, remote_command, report_chunks, run_sweep)
from gpucheck.render.sweep_view import failing_text

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"


def verdict_of(capsys, *args: str) -> dict:
    rc = main(["run", "--json", "--no-history", *args])
    out, _ = capsys.readouterr()
    v = json.loads(out)
    assert v["exit_code"] == rc
    return v


# -- node sets -------------------------------------------------------------------------------

def test_nodeset_parse_and_fold():
    assert parse_nodeset("gpu[001-003,007],login1") == ["gpu001", "gpu002", "gpu003", "gpu007", "login1"]
    assert len(parse_nodeset("gpu[001-128,130]")) == 129
    assert fold(["gpu003", "gpu001", "gpu002", "gpu007"]) == "gpu[001-003,007]"
    assert fold([]) == ""


@pytest.mark.parametrize("text", ["gpu[1-", "a,,b", "gpu[3-1]", "", "  "])
def test_malformed_nodeset_is_an_error(text):
    with pytest.raises(NodeSetError):
        parse_nodeset(text)


@pytest.mark.parametrize("argv", [["sweep", "gpu[1-"], ["bisect", "n[3-1]", "--test", "true {nodes}"],
                                  ["slurm", "resume", "a,,b"]])
def test_malformed_nodeset_is_exit_2_with_one_line(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and "NODESET" in err[0]


def test_node_map():
    nodes = parse_nodeset("n[1-4]")
    assert parse_node_map(["n[2-3]=--snapshot /x.json", "n3=--strict"], nodes, what="--node-args") == {
        "n2": "--snapshot /x.json", "n3": "--snapshot /x.json --strict"}
    with pytest.raises(NodeSetError, match="n9 is not in the node set"):
        parse_node_map(["n9=--strict"], nodes, what="--node-args")
    with pytest.raises(NodeSetError, match="NODESET=VALUE"):
        parse_node_map(["--strict"], nodes, what="--node-args")


def test_node_args_for_unknown_node_is_usage_error(capsys):
    assert main(["sweep", "n[1-2]", "--node-args", "n7=--strict"]) == 2
    assert "n7 is not in the node set" in capsys.readouterr().err


# -- the remote command and the fan-out's command lines ---------------------------------------

def test_remote_command_quotes_arguments():
    cmd = remote_command("env X=1 /opt/gc/bin/gpucheck", ["--level", "2", "--inject", "slow:gpu=1,factor=0.5"],
                         "--snapshot '/a b/c.json'")
    assert cmd.startswith("env X=1 /opt/gc/bin/gpucheck run --json ")
    assert shlex.split(cmd)[-2:] == ["--snapshot", "/a b/c.json"]
    with pytest.raises(ValueError):
        remote_command("gpucheck", [], "--snapshot 'unclosed")


def test_one_line_keeps_the_exit_status_and_every_value(tmp_path):
    import subprocess

    doc = {"a": [1, {"b": "x\ny"}], "c": None}
    (tmp_path / "v.json").write_text(json.dumps(doc, indent=2))
    p = subprocess.run(one_line(f"cat {tmp_path / 'v.json'}; exit 3"), shell=True, capture_output=True, text=True)
    assert p.returncode == 3 and p.stdout.count("\n") == 1 and json.loads(p.stdout) == doc
    p = subprocess.run(one_line("/opt/nowhere/gpucheck run --json"), shell=True, capture_output=True, text=True)
    assert p.returncode == 127 and "not found" in p.stderr


def test_srun_command_runs_one_step_on_the_node():
    line = fanout.srun_command("gpucheck run --json --inject x:p=50%",
                               fanout.SrunSettings(extra_args=["--gres=gpu:8"]), 90)
    argv = shlex.split(line.replace("%h", "NODE").replace("%%", "%"))
    assert argv[:4] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=NODE"]
    assert "--time=3" in argv and "--gres=gpu:8" in argv
    assert argv[-3:] == ["/bin/sh", "-c", "gpucheck run --json --inject x:p=50%"]


def test_clush_conf_is_read_from_clustershell_cfgdir(tmp_path, monkeypatch):
    (tmp_path / "clush.conf").write_text("[Main]\nfanout: 7\nconnect_timeout: 3\nssh_options: -F /x/cfg\n"
                                         "ssh_user: ops\n")
    monkeypatch.setenv("CLUSTERSHELL_CFGDIR", str(tmp_path))
    s = fanout.resolve_ssh(fanout.SshSettings(ssh_options="-oPort=2222"))
    assert s.ssh_options == "-oPort=2222 -F /x/cfg" and s.ssh_user == "ops" and s.connect_timeout_s == 3.0
    assert fanout.default_fanout() == 7


@pytest.mark.slow
def test_exec_fanout_bounds_and_times_out(tmp_path):
    """ClusterShell's local exec worker: output per node, exit codes, a per-node timeout."""
    cmds = {f"h{i}": f"echo out-%h; echo err-%h >&2; exit {i}" for i in range(3)}
    cmds["slow"] = "sleep 30"
    seen = []
    runs = fanout.run_nodes(cmds, mode="exec", fanout=2, timeout_s=2, on_done=seen.append)
    assert [runs[f"h{i}"].rc for i in range(3)] == [0, 1, 2]
    assert runs["h1"].stdout == "out-h1" and runs["h1"].stderr == "err-h1"
    assert runs["slow"].timed_out and runs["slow"].rc is None
    assert sorted(r.node for r in seen) == sorted(cmds)


# -- classifying a node's output --------------------------------------------------------------

def test_classify_every_kind_of_answer(capsys):
    good = json.dumps(verdict_of(capsys, "--snapshot", str(SNAPS / "h100-healthy.json")))
    bad = json.dumps(verdict_of(capsys, "--snapshot", str(SNAPS / "h100-ecc-dbe.json")))

    o = classify(NodeRun("a", 0, good))
    assert (o.status, o.reason, o.failing, o.action) == ("pass", "", [], "none")
    o = classify(NodeRun("b", 1, bad))
    assert o.status == "fail" and o.failing == ["ecc:gpu3"] and o.action == "reset-gpu"
    assert o.reason.startswith("ecc gpu3: uncorrectable")
    o = classify(NodeRun("c", 255, "", "ssh: connect to host 127.0.0.9 port 22: Connection refused"))
    assert o.status == "unreachable" and "Connection refused" in o.reason
    o = classify(NodeRun("d", None, "{\"partial", timed_out=True), timeout_s=600)
    assert o.status == "timeout" and "600 s" in o.reason
    o = classify(NodeRun("e", 127, "", "bash: gpucheck: command not found"))
    assert o.status == "error" and o.reason == "gpucheck not installed (bash: gpucheck: command not found)"
    o = classify(NodeRun("f", 0, "Welcome to gpu017!\n" + good))
    assert o.status == "error" and o.reason.startswith("not a verdict: Welcome to gpu017!")
    o = classify(NodeRun("g", 0, json.dumps({"schema": "gpucheck.verdict", "schema_version": "2.0"})))
    assert o.status == "error" and "schema_version 2.0 is not supported" in o.reason
    o = classify(NodeRun("h", 2, "", "gpucheck run: error: unknown check 'nope'"))
    assert o.status == "error" and o.reason == "usage error on the node: gpucheck run: error: unknown check 'nope'"
    o = classify(NodeRun("i", 0, "x" * 1000))
    assert o.status == "error" and len(o.reason) < 230
    # A verdict that could not judge (exit code 3) is an error, never a pass.
    v = json.loads(good)
    v.update(exit_code=3, partial=True, interrupted="timeout")
    o = classify(NodeRun("j", 3, json.dumps(v)))
    assert o.status == "error" and o.reason == "run cut short (timeout)"
    assert parse_verdict(good)[0] is not None


def test_failing_text_groups_subjects():
    assert failing_text(["ecc:gpu0", "ecc:gpu3", "xid"]) == "ecc[gpu0,gpu3], xid"


def full_verdict(host: str, *, status: str = "pass", exit_code: int = 0, results=(), gpus=(), **extra) -> dict:
    """A verdict with every field the schema requires (schema_version 1.3: a later minor)."""
    return {"schema": "gpucheck.verdict", "schema_version": "1.3", "host": host, "time": "2026-01-01T00:00:00Z",
            "duration_s": 1.0, "level": 1, "level_name": "quick", "gpucheck_version": "0",
            "software": {"driver": None}, "gpus": list(gpus),
            "source": {"kind": "snapshot", "path": None, "synthetic": True}, "checks": [],
            "results": list(results), "status": status, "action": "none", "exit_code": exit_code,
            "counts": {s: 0 for s in ("pass", "warn", "fail", "skip", "error")}, "partial": False,
            "interrupted": None, "injected": [], **extra}


def test_run_sweep_with_a_fake_fanout_and_report():
    verdicts = {"n1": full_verdict("n1")}

    runs: dict[str, NodeRun] = {}

    def runner(commands, *, mode, fanout, timeout_s, on_done):
        assert mode == "ssh" and fanout == 8 and timeout_s == 60
        assert commands["n2"] == one_line(die_with_session("gpucheck run --json --level 2 --strict --timeout 55s", 60))
        runs.update({n: NodeRun(n, 0, json.dumps(verdicts["n1"])) if n == "n1" else NodeRun(n, 255, "", "No route")
                     for n in commands})
        for r in runs.values():
            on_done(r)
        return runs

    plan = SweepPlan(nodes=["n1", "n2"], remote_cmd="gpucheck", run_args=["--level", "2"],
                     node_args={"n2": "--strict"}, fanout=8, timeout_s=60)
    seen: list[NodeOutcome] = []
    with VerdictSpool() as spool:
        outcomes, _ = run_sweep(plan, runner=runner, on_node=seen.append, spool=spool)
        assert [o.status for o in outcomes] == ["pass", "unreachable"] and len(seen) == 2
        assert all(o.verdict is None for o in outcomes)  # summaries only: the verdict is in the spool
        assert runs["n1"].stdout == ""  # the node's output is released once it is classified
        rep = build_report(outcomes, compare.compare_inputs({}), plan=plan, started_at=0, duration_s=1.0)
        assert rep["bad"] == "n2" and rep["exit_code"] == 1
        assert rep["by_status"] == {"pass": "n1", "unreachable": "n2"}
        doc = json.loads("".join(report_chunks(rep, spool)))
    assert doc["schema"] == "gpucheck.sweep" and doc["nodes"][0]["verdict"] == verdicts["n1"]
    assert doc["nodes"][1]["verdict"] is None and doc["nodes"][1]["status"] == "unreachable"
    assert {k: v for k, v in doc.items() if k != "nodes"} == {k: v for k, v in rep.items() if k != "nodes"}


# -- fleet comparison -------------------------------------------------------------------------

def _typed(results: list[Result], gpus: tuple[InventoryEntry, ...] = ()) -> Verdict:
    """A verdict of these results and GPUs (the rest: a level-1 run at time 0)."""
    return build_verdict(results, RunFacts(level=Level.QUICK, started_at=0.0, duration_s=1.0, checks=(), software={},
                                           host="n", gpus=gpus))


def _perf_verdict(values: dict[int, float], model="NVIDIA H100 80GB HBM3") -> Verdict:
    return _typed([Result("burn.gemm", Status.PASS, "ok", gpu=g).metric("tflops_bf16", v, "TFLOP/s")
                   .metric("iterations_bf16", 100, "count") for g, v in values.items()],
                  tuple(InventoryEntry(g, None, None, None, model, "ok") for g in values))


def test_mad_outliers_name_the_slow_gpu():
    verdicts = {f"n{i}": _perf_verdict({0: 700 + i, 1: 702 - i}) for i in range(1, 9)}
    verdicts["n5"] = _perf_verdict({0: 703, 1: 450})
    rep = compare.performance_outliers(verdicts)
    (m,) = rep.metrics
    assert m.compared and m.metric == "tflops_bf16" and m.unit == "TFLOP/s" and m.nodes == 8
    assert [(o.node, o.subject) for o in m.outliers] == [("n5", "gpu1")]
    assert m.limit < 700 and m.median == pytest.approx(701.5, abs=1.5)
    assert rep.by_node.keys() == {"n5"} and "450 TFLOP/s" in rep.by_node["n5"][0]
    # counts are not throughput; a uniform fleet has no outlier (the relative floor)
    even = {f"n{i}": _perf_verdict({0: 700.0 + (i % 2) * 0.01}) for i in range(6)}
    assert compare.performance_outliers(even).by_node == {}


def test_mad_needs_enough_nodes_and_same_model():
    two = {"a": _perf_verdict({0: 700}), "b": _perf_verdict({0: 100})}
    rep = compare.performance_outliers(two)
    assert rep.by_node == {} and rep.metrics[0].compared is False
    mixed = {"a": _perf_verdict({0: 700}), "b": _perf_verdict({0: 702}), "c": _perf_verdict({0: 701}),
             "d": _perf_verdict({0: 300}, model="NVIDIA A100-SXM4-80GB")}
    assert compare.performance_outliers(mixed).by_node == {}


def _bitwise_verdict(digests: dict[str, str], fp="fp-h100") -> Verdict:
    return _typed([Result("repro.bitwise", Status.PASS, "ok").metric("digest_sets", {fp: digests})])


def test_bitwise_majority_names_the_odd_node_and_fail_it():
    verdicts = {n: _bitwise_verdict({"gemm.bf16": "aa", "gemm.fp32": "bb"}) for n in ("n1", "n2", "n3")}
    verdicts["n4"] = _bitwise_verdict({"gemm.bf16": "aa", "gemm.fp32": "XX"})
    cmp = compare.compare_fleet(verdicts)
    assert cmp.bitwise.compared and cmp.bitwise.by_node.keys() == {"n4"}
    assert "gemm.fp32" in cmp.bitwise.by_node["n4"][0] and "3 of 4" in cmp.bitwise.by_node["n4"][0]
    outcomes = [NodeOutcome(n, "pass", "") for n in verdicts]
    apply_fleet(outcomes, compare.findings_by_node(cmp))
    assert [(o.node, o.status) for o in outcomes] == [("n1", "pass"), ("n2", "pass"), ("n3", "pass"),
                                                       ("n4", "fail")]
    assert outcomes[3].reason.startswith("fleet: bitwise") and outcomes[3].action == "drain"  # corruption
    assert compare.bitwise_comparison({"a": _typed([])}).compared is False


# -- Slurm hooks: decisions with a fake pipeline and a fake scontrol ---------------------------

class FakeSlurm:
    def __init__(self, show_node: str = "", show_job: str = ""):
        self.calls: list[list[str]] = []
        self.show_node = show_node
        self.show_job = show_job
        self.rc = 0

    def __call__(self, argv):
        if argv[1:3] == ["show", "config"]:  # the hooks' PrologEpilogTimeout: none here
            return 0, "", ""
        self.calls.append(list(argv))
        if argv[1:4] == ["-o", "show", "node"]:
            return 0, self.show_node, ""
        if argv[1:4] == ["-o", "show", "job"]:
            return 0, self.show_job, ""
        return self.rc, "", "" if self.rc == 0 else "slurm_update error: Invalid node name specified"


def fake_execute(code, verdict=None, seen=None, boom=None):
    def execute(req, on_verdict=None, on_warning=None):
        if seen is not None:
            seen.append(req)
        if boom:
            raise boom
        if verdict is not None:
            on_verdict(Verdict.from_json(verdict))  # the pipeline hands on the typed verdict
        return code
    return execute


ENV = {"SLURMD_NODENAME": "gpu7", "SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice",
       "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_GPUS": "2,3"}


def test_job_env():
    e = slurm.job_env({**ENV, "SLURM_JOB_EXIT_CODE2": "0:9"})
    assert (e.node, e.job_id, e.user, e.gpus, e.gpus_from, e.failed) == ("gpu7", "4242", "alice", [2, 3],
                                                                          "SLURM_JOB_GPUS", True)
    e = slurm.job_env({"SLURMD_NODENAME": "x", "CUDA_VISIBLE_DEVICES": "GPU-aaaa", "SLURM_JOB_EXIT_CODE": "256"})
    assert e.gpus is None and "not a list of GPU indices" in e.gpus_note and e.exit_code == 1 and e.failed
    assert slurm.job_env({"SLURMD_NODENAME": "x"}).failed is None


@pytest.mark.parametrize("value", ["\u00b2", "0,\u00b2", "\u0663", "1\uff11", "99999999999999999999"])
def test_a_gpu_list_that_is_no_ascii_numbers_tests_every_gpu_and_never_crashes_the_hook(tmp_path, capsys,
                                                                                         monkeypatch, value):
    """SLURM_JOB_GPUS='²': str.isdigit() took it and int() raised, the hook exited 3 (gpucheck's own
    failure; a drain where on-error is fail); '٣' was read as GPU 3. Now an item that is no ASCII
    number makes the list no list of GPU indices: every GPU is tested, with a note, exit 0 when healthy."""
    e = slurm.job_env({**ENV, "SLURM_JOB_GPUS": value, "SLURM_JOB_EXIT_CODE": "\u00b2"})
    assert e.gpus is None and "is not a list of GPU indices: testing all GPUs" in e.gpus_note and e.exit_code is None
    for k, v in {**ENV, "SLURM_JOB_GPUS": value}.items():
        monkeypatch.setenv(k, v)
    rc = main(["slurm", "prolog", "--snapshot", str(SNAPS / "h100-healthy.json"), "--state-dir", str(tmp_path),
               "--scontrol", "/bin/false"])
    err = capsys.readouterr().err
    assert rc == 0 and ": healthy level 1" in err, err


def test_prolog_unhealthy_drains_with_gpucheck_reason(tmp_path, capsys):
    bad = verdict_of(capsys, "--snapshot", str(SNAPS / "h100-ecc-dbe.json"))
    sl, logs, seen = FakeSlurm(), [], []
    out = hook.run_hook(hook.HookOptions("prolog", state_dir=str(tmp_path / "{node}"), scontrol="/x/scontrol"),
                        ENV, runner=sl, log=lambda p, m: logs.append((p, m)), execute=fake_execute(1, bad, seen))
    assert out.exit_code == hook.EXIT_HOOK_UNHEALTHY and out.judgement == "unhealthy" and out.drained
    (req,) = seen
    assert req.gpus == [2, 3] and str(req.level) == "1" and req.timeout_s == 15.0 and req.on_error == "pass"
    assert req.state_dir == str(tmp_path / "gpu7") and req.history
    (call,) = sl.calls
    assert call[:4] == ["/x/scontrol", "update", "NodeName=gpu7", "State=DRAIN"]
    assert call[4] == "Reason=gpucheck: gpu3 ecc-dbe -> reset-gpu" and len(call[4]) <= 7 + slurm.REASON_MAX
    (p, line), = logs
    assert p == syslog.LOG_ERR and line.startswith("slurm prolog job=4242 node=gpu7 user=alice: UNHEALTHY")
    assert "drained, exit 42" in line
    # the prolog remembered the job's start and ECC counters for the epilog
    jobs = json.loads((tmp_path / "gpu7" / "cursor-slurm-jobs.json").read_text())
    assert jobs["4242"]["ecc"]["GPU-5e1f0c3a-77d2-4b1e-9a3c-000000000003"]["volatile_uncorrected"] == 2


def test_prolog_healthy_and_could_not_judge(tmp_path, capsys):
    good = verdict_of(capsys, "--snapshot", str(SNAPS / "h100-healthy.json"))
    sl, logs = FakeSlurm(), []
    opts = hook.HookOptions("prolog", state_dir=str(tmp_path))
    out = hook.run_hook(opts, ENV, runner=sl, log=lambda p, m: logs.append((p, m)), execute=fake_execute(0, good))
    assert (out.exit_code, out.judgement, sl.calls) == (0, "healthy", [])
    assert logs[-1][0] == syslog.LOG_INFO and "healthy level 1" in logs[-1][1]
    # could not judge: logged, node left alone, job runs
    out = hook.run_hook(opts, ENV, runner=sl, log=lambda p, m: logs.append((p, m)), execute=fake_execute(3))
    assert (out.exit_code, out.judgement, sl.calls) == (0, "could-not-judge", [])
    assert logs[-1][0] == syslog.LOG_WARNING and "not drained (on-error pass)" in logs[-1][1]
    # an internal error in gpucheck: the same, with the exception named
    out = hook.run_hook(opts, ENV, runner=sl, log=lambda p, m: logs.append((p, m)),
                        execute=fake_execute(0, boom=KeyError("gpus")))
    assert (out.exit_code, sl.calls) == (0, []) and "internal error: KeyError" in out.cause
    # fail-closed: the site asked for it
    closed = hook.HookOptions("prolog", state_dir=str(tmp_path), on_error="fail")
    out = hook.run_hook(closed, ENV, runner=sl, log=lambda p, m: logs.append((p, m)), execute=fake_execute(3))
    assert out.exit_code == hook.EXIT_HOOK_UNHEALTHY and out.drained
    assert sl.calls[-1][4].startswith("Reason=gpucheck: could not judge")
    # --no-drain: judged unhealthy (exit 42: the wrapper exits 1), but scontrol untouched
    sl2 = FakeSlurm()
    out = hook.run_hook(hook.HookOptions("prolog", state_dir=str(tmp_path), drain=False), ENV, runner=sl2,
                        log=lambda p, m: None, execute=fake_execute(1))
    assert out.exit_code == hook.EXIT_HOOK_UNHEALTHY and not out.drained and sl2.calls == []


def test_a_config_problem_is_named_and_does_not_drain(tmp_path):
    sl, logs = FakeSlurm(), []
    out = hook.run_hook(hook.HookOptions("prolog", state_dir=str(tmp_path), config_path=str(tmp_path / "no.toml")),
                        ENV, runner=sl, log=lambda p, m: logs.append((p, m)), execute=fake_execute(2))
    assert (out.exit_code, out.judgement, sl.calls) == (0, "could-not-judge", [])
    assert "no.toml: config file not found" in out.cause and "no.toml" in logs[-1][1]


def test_drain_failure_is_logged_and_still_exits_1(tmp_path, capsys):
    bad = verdict_of(capsys, "--snapshot", str(SNAPS / "h100-ecc-dbe.json"))
    sl, logs = FakeSlurm(), []
    sl.rc = 1
    out = hook.run_hook(hook.HookOptions("prolog", state_dir=str(tmp_path)), ENV, runner=sl,
                        log=lambda p, m: logs.append((p, m)), execute=fake_execute(1, bad))
    assert out.exit_code == hook.EXIT_HOOK_UNHEALTHY and not out.drained
    assert any("cannot drain" in m and "Invalid node name" in m for _, m in logs)


def test_epilog_after_failed_job_goes_deeper_and_names_ecc_growth(tmp_path, capsys):
    good = verdict_of(capsys, "--snapshot", str(SNAPS / "h100-healthy.json"))
    bad = verdict_of(capsys, "--snapshot", str(SNAPS / "h100-ecc-dbe.json"))
    sl, seen = FakeSlurm(), []
    opts = hook.HookOptions("prolog", state_dir=str(tmp_path))
    hook.run_hook(opts, ENV, runner=sl, log=lambda p, m: None, execute=fake_execute(0, good), now=lambda: 1000.0)
    env = {**ENV, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_JOB_EXIT_CODE2": "1:0"}
    out = hook.run_hook(hook.HookOptions("epilog", state_dir=str(tmp_path)), env, runner=sl,
                        log=lambda p, m: None, execute=fake_execute(1, bad, seen))
    (req,) = seen
    assert str(req.level) == "2" and req.check_patterns == [] and req.timeout_s == 600.0
    assert req.options["xid_since"] == "@1000.000"
    assert out.ecc_changes == ["gpu3 aggregate_uncorrected +2", "gpu3 volatile_uncorrected +2",
                               "gpu3 aggregate_corrected +5", "gpu3 volatile_corrected +5"]
    assert out.drained and sl.calls[-1][4] == "Reason=gpucheck: gpu3 ecc-in-job, gpu3 ecc-dbe -> reset-gpu"
    assert json.loads((tmp_path / "cursor-slurm-jobs.json").read_text()) == {}  # the job is forgotten
    # a job that ended well: only the Xid/ECC checks, the start time from scontrol when the
    # prolog left no record
    seen.clear()
    sl.show_job = show_job("77", state="COMPLETING", start="2026-01-02T03:04:05")
    env = {**env, "SLURM_JOB_ID": "77", "SLURM_JOB_EXIT_CODE2": "0:0"}
    out = hook.run_hook(hook.HookOptions("epilog", state_dir=str(tmp_path)), env, runner=sl,
                        log=lambda p, m: None, execute=fake_execute(0, good, seen))
    assert seen[0].check_patterns == ["xid", "ecc", "memory-remap"] and seen[0].timeout_s == 60.0
    assert seen[0].options["xid_since"].startswith("@17673") and out.plan["job_start_from"] == "scontrol StartTime"


@pytest.mark.parametrize("capture_name, job_id, start_from", [
    ("name-starttime", "5", "scontrol StartTime"),  # -J 'train StartTime=2030-01-01T00:00:00 ...'
    ("completed", "12", "scontrol StartTime"),  # -J 'c NodeList=n4 StartTime=2030-01-01T00:00:00'
    ("name-forged-chain", "7", "unknown (job 7: its own text"),  # a whole chain in the name: refused
])
def test_an_epilog_only_site_takes_the_job_start_from_slurm_not_from_the_job_name(tmp_path, capsys, capture_name,
                                                                                  job_id, start_from):
    """Real answers of Slurm 22.05 for jobs whose names hold `StartTime=2030-...`: the epilog's Xid
    window starts at Slurm's StartTime (a later start would hide an Xid logged during the job),
    or, where it cannot be told from the job's text, is the default window (wider), never the
    name's."""
    from gpucheck.platform.kernlog.timeparse import parse_timestamp

    good = verdict_of(capsys, "--snapshot", str(SNAPS / "h100-healthy.json"))
    text = capture(capture_name)
    sl, seen = FakeSlurm(show_job=text), []
    env = {**ENV, "SLURM_JOB_ID": job_id, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_JOB_EXIT_CODE2": "0:0"}
    out = hook.run_hook(hook.HookOptions("epilog", state_dir=str(tmp_path)), env, runner=sl, log=lambda p, m: None,
                        execute=fake_execute(0, good, seen))
    assert out.plan["job_start_from"].startswith(start_from)
    since = seen[0].options.get("xid_since")
    if start_from == "scontrol StartTime":
        real = re.findall(r"\sStartTime=(\S+)", text)[-1]
        assert since == f"@{parse_timestamp(real):.3f}" and not real.startswith("2030")
    else:
        assert since is None  # the default window: last-pass


SHOW = """NodeName=n1 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=debug Reason=admin: broken fan [root@2026-11-21T10:09:12]
NodeName=n2 Arch=x86_64 State=IDLE ThreadsPerCore=1 Partitions=debug
NodeName=n3 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Reason=gpucheck: ecc gpu3: x [y] [root@2026-11-21T10:09:12]
NodeName=n4 Arch=x86_64 State=DOWN+DRAIN ThreadsPerCore=1 Reason=gpucheck: xid 79 [slurm@2026-11-21T10:09:12]
"""


def test_parse_show_node_and_resume_only_gpucheck_drains():
    st = slurm.parse_show_node(SHOW)
    assert st["n1"].drained and not st["n1"].ours and st["n1"].reason == "admin: broken fan"
    assert st["n3"].ours and st["n3"].reason == "gpucheck: ecc gpu3: x [y]" and not st["n2"].drained
    sl, tested = FakeSlurm(show_node=SHOW), []

    def test(nodes):
        tested.append(list(nodes))
        return {"n3": (True, "pass"), "n4": (False, "fail: xid: Xid 79")}

    decisions = slurm.resume_nodes(["n1", "n2", "n3", "n4", "n5"], test=test, scontrol="scontrol", runner=sl,
                                   log=lambda p, m: None)
    assert tested == [["n3", "n4"]]
    assert [(d.node, d.decision) for d in decisions] == [("n1", "not-ours"), ("n2", "not-drained"),
                                                          ("n3", "resumed"), ("n4", "still-bad"), ("n5", "unknown")]
    updates = [c for c in sl.calls if c[1] == "update"]
    assert updates == [["scontrol", "update", "NodeName=n3", "State=RESUME"]]
    sl2 = FakeSlurm(show_node=SHOW)
    dry = slurm.resume_nodes(["n3"], test=test, scontrol="scontrol", runner=sl2, dry_run=True, log=lambda p, m: None)
    assert [d.decision for d in dry] == ["would-resume"] and not [c for c in sl2.calls if c[1] == "update"]


def _fake_fanout(monkeypatch, answers: dict[str, NodeRun]) -> None:
    def run_nodes(commands, *, mode, fanout, timeout_s, on_done, **_kw):
        for n in commands:
            on_done(answers[n])
        return {n: answers[n] for n in commands}

    monkeypatch.setattr(fanout, "run_nodes", run_nodes)


def test_a_report_that_cannot_be_written_never_masks_the_sweep_result(tmp_path, monkeypatch, capsys):
    """The sweep found a bad node (exit 1); writing --report then fails (a full disk): the old
    command exited 2, a usage error, hiding the bad node from a script that reads the exit code."""
    from gpucheck.platform import safeio

    _fake_fanout(monkeypatch, {"n1": NodeRun("n1", 0, json.dumps(full_verdict("n1"))),
                               "n2": NodeRun("n2", 255, "", "No route")})

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safeio, "write_output", full)
    report = tmp_path / "report.json"
    rc = main(["sweep", "n[1-2]", "--report", str(report)])
    err = capsys.readouterr().err
    assert rc == 1 and not report.exists()
    assert "WARNING: --report" in err and "the sweep's result stands (exit 1)" in err


def test_a_full_spool_never_masks_the_sweep_result_nor_replaces_an_old_report(tmp_path, monkeypatch, capsys):
    from gpucheck.fleet import sweep as sweep_mod

    _fake_fanout(monkeypatch, {"n1": NodeRun("n1", 0, json.dumps(full_verdict("n1"))),
                               "n2": NodeRun("n2", 255, "", "No route")})
    real_add = sweep_mod.VerdictSpool.add

    def add(self, node, verdict):
        self.error = self.error or f"cannot keep {node}'s verdict: No space left on device"

    monkeypatch.setattr(sweep_mod.VerdictSpool, "add", add)
    report = tmp_path / "report.json"
    report.write_text('{"old": true}\n')
    rc = main(["sweep", "n[1-2]", "--report", str(report)])
    err = capsys.readouterr().err
    assert rc == 1 and report.read_text() == '{"old": true}\n'
    assert "the report lacks those verdicts; --report not written" in err
    assert real_add is not add


@pytest.mark.parametrize("sweep_s, args, extra, run_s", [
    (600, [], "", 595), (60, [], "", 55), (3, [], "", 2), (1, [], "", 1), (600, ["--timeout", "30s"], "", 30),
    (600, ["--timeout", "2h"], "", 595), (600, [], "--timeout=10", 10), (600, ["--timeout", "bogus"], "", 595),
    (None, [], "", None),
])
def test_every_node_run_carries_a_deadline_inside_the_sweeps(sweep_s, args, extra, run_s):
    """Issue 26: a node's `gpucheck run` whose limit died with it (a stop at the wrong moment, a
    node without coreutils `timeout`) ran on with no time limit. Every node run now has its own
    --timeout, last on its command line (the one the run reads), within the sweep's limit and
    never longer than one the user asked for; `gpucheck run` itself accepts the line."""
    import shlex

    from gpucheck.cli.run import run_command

    plan = SweepPlan(nodes=["n1"], run_args=args, node_args={"n1": extra} if extra else {}, timeout_s=sweep_s)
    words = shlex.split(remote_command(plan.remote_cmd, plan.run_args, extra, plan.timeout_s))
    if run_s is None:
        assert "--timeout" not in words
        return
    assert words[-2:] == ["--timeout", f"{run_s}s"] and run_s < sweep_s + 1
    assert "--timeout" in plan.commands()["n1"]
    ctx = run_command.make_context("run", words[2:])
    assert ctx.params["timeout_text"] == f"{run_s}s"
