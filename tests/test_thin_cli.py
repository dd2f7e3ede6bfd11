"""The policy the CLI used to hold, now in the core and tested there: what a sweep runs on the
nodes (fleet.remote), how a hook reads its arguments (fleet.hook), what becomes of a sweep's
report (fleet.sweep), resume's exit code (fleet.slurm), `repro record`'s outcomes
(repro_record); and the house rule that no function of these modules runs past ~80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpucheck.fleet import hook, remote, slurm, sweep
from gpucheck.fleet.compare import compare_inputs

ROOT = Path(__file__).resolve().parents[1]


# -- fleet.remote: the sweep's plan ----------------------------------------------------------------

def test_the_plan_passes_the_options_through_and_checks_node_arguments():
    opts = remote.RemoteOptions(level="2", checks=("ecc", "xid"), skips=("pcie",), injections=("slow:gpu=1",),
                                device="cpu", strict=True, force=True, run_args=("--workers", "3"),
                                node_args=("n[2-3]=--snapshot /x.json",), remote_cmd="/opt/gpucheck", fanout=7,
                                timeout_s=42.0, use_srun=True)
    plan = remote.build_plan(["n1", "n2", "n3"], opts)
    assert plan.run_args == ["--level", "2", "--check", "ecc", "--check", "xid", "--skip", "pcie", "--inject",
                             "slow:gpu=1", "--device", "cpu", "--strict", "--force", "--workers", "3"]
    assert plan.node_args == {"n2": "--snapshot /x.json", "n3": "--snapshot /x.json"}
    assert (plan.mode, plan.fanout, plan.timeout_s, plan.remote_cmd) == ("srun", 7, 42.0, "/opt/gpucheck")
    sub = remote.build_plan(["n1", "n2", "n3"], opts, subset=["n3", "n1"])
    assert sub.nodes == ["n1", "n3"] and sub.node_args == {"n3": "--snapshot /x.json"}


@pytest.mark.parametrize("spec, needle", [("n9=--x", "not in the node set"), ("n1", "want NODESET=VALUE"),
                                          ("n1=--snapshot 'unclosed", "n1:")])
def test_a_bad_node_argument_is_a_plan_error_naming_the_option(spec, needle):
    with pytest.raises(remote.PlanError) as e:
        remote.build_plan(["n1", "n2"], remote.RemoteOptions(node_args=(spec,)))
    assert e.value.option == "--node-args" and needle in str(e.value)


def test_runner_settings_carry_ssh_and_srun_options():
    s = remote.runner_settings(remote.RemoteOptions(srun_args=("--exclusive",), ssh_options="-oX=1", ssh_user="ops",
                                                    connect_timeout_s=3.0))
    assert s["srun"].extra_args == ["--exclusive"]
    assert (s["ssh"].ssh_options, s["ssh"].ssh_user, s["ssh"].connect_timeout_s) == ("-oX=1", "ops", 3.0)


# -- fleet.hook: the hook's options ------------------------------------------------------------------

def _values(**over):
    values = dict(level=None, checks=("xid,ecc", "pcie"), skips=(), budget_s=30.0, on_error=None, strict=None,
                  snapshot=None, state_dir="/s/{node}", config_path=None, device="auto", workers=2, no_drain=False,
                  scontrol=None, as_json=False, all_gpus=False, force=False)
    values.update(over)
    return values


def test_hook_options_from_the_command_line():
    opts = hook.hook_options("epilog", _values(failed_checks=("burn.gemm,poet.ortho",), failed_budget_s=90.0,
                                               no_drain=True))
    assert opts.kind == "epilog" and opts.checks == ["xid", "ecc", "pcie"] and opts.budget_s == 30.0
    assert opts.failed_checks == ["burn.gemm", "poet.ortho"] and opts.failed_budget_s == 90.0
    assert opts.drain is False and opts.state_dir == "/s/{node}"
    prolog = hook.hook_options("prolog", _values())
    assert prolog.failed_checks == [] and prolog.failed_level is None and prolog.drain is True


def test_a_hook_whose_arguments_cannot_be_parsed_still_reads_what_it_needs():
    args = ["--budget", "5x", "--on-error=fail", "--state-dir", "/a", "--state-dir=/b", "--no-drain", "--config"]
    opts = hook.options_from_args("prolog", args)
    assert (opts.on_error, opts.state_dir, opts.drain, opts.config_path) == ("fail", "/b", False, None)
    assert hook.options_from_args("epilog", ["--on-error", "maybe"]).on_error is None
    assert hook.option_value(["--scontrol", "/x/scontrol"], "--scontrol") == "/x/scontrol"


# -- fleet.sweep: the report and its warnings --------------------------------------------------------

def _report():
    plan = sweep.SweepPlan(nodes=["n1", "n2"])
    outcomes = [sweep.NodeOutcome("n1", "pass", ""), sweep.NodeOutcome("n2", "unreachable", "ssh: no route")]
    return plan, outcomes, sweep.build_report(outcomes, compare_inputs({}), plan=plan, started_at=0.0, duration_s=1.0)


def test_a_report_is_written_and_a_failed_one_is_a_warning_that_keeps_the_exit_code(tmp_path):
    _, _, report = _report()
    path = tmp_path / "report.json"
    assert sweep.save_report(report, None, str(path)) == []
    assert '"exit_code": 1' in path.read_text()
    (warning,) = sweep.save_report(report, None, str(tmp_path / "missing" / "r.json"))
    assert "was not written" in warning and "the sweep's result stands (exit 1)" in warning


def test_an_incomplete_spool_never_replaces_a_good_old_report(tmp_path):
    _, _, report = _report()
    path = tmp_path / "report.json"
    path.write_text("old and good")
    with sweep.VerdictSpool(str(tmp_path)) as spool:
        spool.error = "cannot keep n2's verdict: No space left on device"
        (warning,) = sweep.save_report(report, spool, str(path))
    assert "--report not written" in warning and path.read_text() == "old and good"


def test_an_interrupted_report_names_the_nodes_that_did_not_answer_and_exits_3():
    plan, outcomes, report = _report()
    sweep.mark_interrupted(report, plan, outcomes[:1], "SIGTERM")
    assert (report["interrupted"], report["unanswered"], report["planned"], report["exit_code"]) == \
        ("SIGTERM", "n2", 2, 3)


def test_the_spool_waits_next_to_a_regular_report_only(tmp_path):
    assert sweep.spool_folder(None) is None
    assert sweep.spool_folder(str(tmp_path / "new.json")) == str(tmp_path)
    assert sweep.spool_folder("/dev/null") is None


# -- fleet.slurm: resume -------------------------------------------------------------------------------

def test_resume_exit_codes():
    d = slurm.ResumeDecision
    assert slurm.resume_exit_code([d("n1", "", "", "resumed"), d("n2", "", "", "not-ours")]) == 0
    assert slurm.resume_exit_code([d("n1", "", "", "resumed"), d("n2", "", "", "still-bad")]) == 1
    assert slurm.resume_exit_code([d("n1", "", "", "still-bad"), d("n2", "", "", "interrupted")]) == 3


def test_resumes_sweep_test_judges_the_candidates_and_stops_on_a_signal():
    from gpucheck.platform.processes import Interrupted

    seen = []

    def fake_sweep(plan):
        seen.append(plan.nodes)
        outcomes = [sweep.NodeOutcome(n, "pass" if n == "n1" else "fail", "" if n == "n1" else "ecc")
                    for n in plan.nodes]
        return sweep.SweepRun(outcomes, 0.1, "SIGTERM" if len(plan.nodes) > 2 else None)

    test = slurm.sweep_test(["n1", "n2", "n3"], remote.RemoteOptions(), fake_sweep)
    assert test(["n2", "n1"]) == {"n1": (True, "pass"), "n2": (False, "fail: ecc")} and seen == [["n1", "n2"]]
    with pytest.raises(Interrupted) as e:
        test(["n1", "n2", "n3"])
    assert e.value.partial["n3"] == (False, "fail: ecc")


# -- repro_record ----------------------------------------------------------------------------------------

def test_record_without_a_usable_gpu_says_why_and_could_not_judge(tmp_path):
    from gpucheck.repro_record import RecordRequest, record_references

    said = []
    out = record_references(RecordRequest(out=str(tmp_path / "r.json"), device="cuda"),
                            lambda kind, text: said.append((kind, text)))
    assert out.exit_code == 3 and out.summary is None
    assert said and said[0][0] == "error" and "cannot record" in said[0][1]
    assert not (tmp_path / "r.json").exists()


def test_record_refuses_a_reference_path_it_cannot_write(tmp_path):
    from gpucheck.repro_record import RecordRequest, RecordUsageError, record_references

    with pytest.raises(RecordUsageError) as e:
        record_references(RecordRequest(out=str(tmp_path / "no-dir" / "r.json"), device="cpu"), lambda k, t: None)
    assert e.value.option == "--out"
    with pytest.raises(RecordUsageError) as e:
        record_references(RecordRequest(level="9", device="cpu"), lambda k, t: None)
    assert e.value.option is None and "level" in str(e.value).lower()


# -- no function over ~80 lines in the modules of this shape ------------------------------------------------

OWNED = ["gpucheck/cli/sweep.py", "gpucheck/cli/slurm.py", "gpucheck/cli/repro.py", "gpucheck/repro_record.py",
         "gpucheck/core/runner.py", "gpucheck/fleet/remote.py", "gpucheck/fleet/sweep.py", "gpucheck/fleet/hook.py",
         "gpucheck/fleet/slurm.py", "gpucheck/platform/fanout.py", *sorted(
             str(p.relative_to(ROOT)) for p in (ROOT / "gpucheck" / "platform" / "kernlog" / "sources").glob("*.py"))]


@pytest.mark.parametrize("path", OWNED)
def test_no_function_runs_past_80_lines(path):
    tree = ast.parse((ROOT / path).read_text())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80]
    assert not long, long
