"""The runner with test-local checks: pass, fail, crash, hang, needs, interrupt, timeout."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gpucheck.core import runner as runner_mod
from gpucheck.core.check import Context, Need, define
from gpucheck.core.levels import Level
from gpucheck.core.result import Action, Result, Status
from gpucheck.core.runner import run_checks


def _mk(id, fn, level=1, needs=(), budget_s=5.0):
    return define(id, title=id, level=level, needs=needs, budget_s=budget_s)(fn)


def ok_check(ctx):
    return [Result("ok", Status.PASS, "fine", gpu=0)]


def failing_check(ctx):
    return [Result("bad", Status.FAIL, "broken", gpu=1, action=Action.RESET_GPU)]


def raising_check(ctx):
    raise RuntimeError("boom in check")


def empty_check(ctx):
    return []


def test_pass_fail_and_crash_are_isolated():
    checks = [_mk("ok", ok_check), _mk("bad", failing_check), _mk("boom", raising_check), _mk("empty", empty_check)]
    out = run_checks(checks, Context(), install_signal_handlers=False)
    by = {r.check_id: r for r in out.runs}
    assert by["ok"].status is Status.PASS
    assert by["bad"].status is Status.FAIL
    assert by["bad"].results[0].action is Action.RESET_GPU
    boom = by["boom"].results[0]
    assert boom.status is Status.ERROR
    assert "RuntimeError: boom in check" in boom.summary
    assert any("raise RuntimeError" in line for line in boom.evidence)
    assert by["empty"].results[0].status is Status.ERROR
    assert out.interrupted is None


@pytest.mark.slow
def test_hung_check_is_a_fail_and_the_run_goes_on(monkeypatch):
    monkeypatch.setattr(runner_mod, "BUDGET_SLACK_S", 0.0)
    monkeypatch.setattr(runner_mod, "BUDGET_FACTOR", 1.0)
    release = threading.Event()

    def hangs(ctx):
        release.wait(30)
        return [Result("hang", Status.PASS, "late")]

    t0 = time.monotonic()
    out = run_checks([_mk("hang", hangs, budget_s=0.3), _mk("ok", ok_check)], Context(), install_signal_handlers=False)
    release.set()
    assert time.monotonic() - t0 < 5
    hang = out.runs[0].results[0]
    assert hang.status is Status.FAIL and hang.summary.startswith("hang:")
    assert hang.thresholds[0].metric == "duration_s"
    assert out.runs[1].status is Status.PASS


def test_unmet_needs_skip_with_reason(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    checks = [
        _mk("needs-root", ok_check, needs=(Need.ROOT,)),
        _mk("needs-gpu", ok_check, needs=(Need.GPU,)),
        _mk("needs-two", ok_check, needs=(Need.MULTI_GPU,)),
    ]
    one_gpu = {"gpus": [{"index": 0, "state": "ok"}, {"index": 1, "state": "lost"}]}
    out = run_checks(checks, Context(snapshot=one_gpu), install_signal_handlers=False)
    by = {r.check_id: r for r in out.runs}
    assert by["needs-root"].results[0].summary == "needs root"
    assert by["needs-gpu"].status is Status.PASS  # one usable GPU is present
    assert by["needs-two"].results[0].summary == "needs at least 2 GPUs, this node has 1"  # lost one not counted
    out = run_checks(checks[1:2], Context(snapshot={"gpus": []}), install_signal_handlers=False)
    assert out.runs[0].status is Status.SKIP and "no usable GPU" in out.runs[0].results[0].summary


def test_cpu_device_satisfies_gpu_need():
    out = run_checks([_mk("g", ok_check, needs=(Need.GPU, Need.MULTI_GPU))],
                     Context(device="cpu", workers=2), install_signal_handlers=False)
    assert out.runs[0].status is Status.PASS


def test_level_of_explicit_check_is_raised_to_its_own():
    seen = {}

    def lv(ctx):
        seen["level"] = ctx.level
        return [Result("lv", Status.PASS, "ok")]

    run_checks([_mk("lv", lv, level=3)], Context(level=Level.QUICK), install_signal_handlers=False)
    assert seen["level"] == Level.EXTENDED


def test_sigterm_gives_partial_outcome_with_partial_results():
    def long_check(ctx):
        done = 0
        while not ctx.cancel.wait(0.05):
            done += 1
        return [Result("long", Status.PASS, f"stopped after {done} rounds", gpu=0)]

    checks = [_mk("ok", ok_check), _mk("long", long_check, budget_s=60), _mk("after", ok_check)]
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    out = run_checks(checks, Context())
    timer.cancel()
    assert out.interrupted == "SIGTERM"
    by = {r.check_id: r for r in out.runs}
    assert by["ok"].status is Status.PASS
    assert by["long"].results[0].summary.startswith("stopped after")
    assert any("interrupted by SIGTERM" in e for e in by["long"].results[0].evidence)
    assert by["after"].status is Status.ERROR
    assert by["after"].results[0].summary == "not run: interrupted by SIGTERM"
    # the handlers are restored
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler, None) or callable(
        signal.getsignal(signal.SIGTERM))


def test_whole_run_timeout_is_partial():
    def slow(ctx):
        ctx.cancel.wait(10)
        return [Result("slow", Status.PASS, "cut short")]

    out = run_checks([_mk("slow", slow, budget_s=60), _mk("next", ok_check)], Context(), timeout_s=0.4,
                     install_signal_handlers=False)
    assert out.interrupted == "timeout"
    assert out.runs[0].results[0].summary == "cut short"
    assert "whole-run timeout" in out.runs[0].results[0].evidence[-1]
    assert out.runs[1].results[0].summary == "not run: whole-run timeout"


def test_skip_without_reason_is_refused():
    with pytest.raises(ValueError):
        Result("x", Status.SKIP, "")


def test_torch_need_knows_cpu_only_builds(monkeypatch, tmp_path):
    import importlib.util
    from types import SimpleNamespace

    from gpucheck.core.check import missing_need

    (tmp_path / "lib").mkdir()
    fake = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: fake if name == "torch" else None)
    assert "CPU-only build" in missing_need(Need.TORCH, Context(device="auto"))
    assert missing_need(Need.TORCH, Context(device="cpu")) is None
    (tmp_path / "lib" / "libtorch_cuda.so").write_bytes(b"")
    assert missing_need(Need.TORCH, Context(device="cuda")) is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "not installed" in missing_need(Need.TORCH, Context(device="cpu"))


def test_snapshot_replay_never_computes_on_this_machine():
    from gpucheck.core.check import missing_need

    snap = {"gpus": [{"index": 0, "state": "ok"}]}
    assert missing_need(Need.GPU, Context(snapshot=snap)) is None
    why = missing_need(Need.GPU, Context(snapshot=snap, options={"snapshot_path": "/x.json"}))
    assert "recorded snapshot" in why
    assert missing_need(Need.GPU, Context(snapshot=snap, device="cpu", options={"snapshot_path": "/x.json"})) is None


# -- one execution object per check: a typed interruption, no hung check left running where it can stop --

@pytest.fixture
def exact_budget(monkeypatch):
    """A check's budget is its declared one: no factor, no slack."""
    monkeypatch.setattr(runner_mod, "BUDGET_SLACK_S", 0.0)
    monkeypatch.setattr(runner_mod, "BUDGET_FACTOR", 1.0)


def test_a_hung_check_that_honours_cancel_is_stopped_alone_and_leaves_no_thread(exact_budget):
    """Past its budget a check is cancelled (its own cancel, not the run's) and the runner waits
    for it: no thread of it runs on beside the next check. The old runner never cancelled it and
    left its daemon thread running."""
    stopped = threading.Event()
    seen_by_next = {}

    def hangs_until_cancelled(ctx):
        ctx.cancel.wait(30)
        stopped.set()
        return [Result("hang", Status.PASS, "late")]

    def after(ctx):
        seen_by_next["cancel"] = ctx.cancel.is_set()
        seen_by_next["hung check stopped"] = stopped.is_set()
        return [Result("after", Status.PASS, "fine")]

    ctx = Context()
    out = run_checks([_mk("hang", hangs_until_cancelled, budget_s=0.3), _mk("after", after)], ctx,
                     install_signal_handlers=False)
    hang_run, after_run = out.runs
    assert hang_run.status is Status.FAIL and hang_run.results[0].summary.startswith("hang:")
    assert hang_run.interruption.kind is runner_mod.InterruptionKind.HANG
    assert hang_run.interruption.stops_the_run is None and not hang_run.left_running
    assert "cancelled at its budget: it stopped" in hang_run.results[0].evidence
    assert seen_by_next == {"cancel": False, "hung check stopped": True}
    assert after_run.status is Status.PASS and after_run.interruption is None
    assert not out.abandoned and out.interrupted is None and not ctx.cancel.is_set()
    assert not [t for t in threading.enumerate() if t.name == "check-hang"]


def test_a_hung_check_that_ignores_cancel_is_left_behind_and_said_so(exact_budget, monkeypatch):
    """A check stuck where cancel cannot reach (a driver call) is left behind after HANG_GRACE_S:
    the outcome says so (abandoned), so the pipeline kills its worker processes. The old runner
    reported it as not abandoned."""
    monkeypatch.setattr(runner_mod, "HANG_GRACE_S", 0.2)
    release = threading.Event()

    def stuck(ctx):
        release.wait(30)
        return [Result("stuck", Status.PASS, "late")]

    try:
        out = run_checks([_mk("stuck", stuck, budget_s=0.3), _mk("ok", ok_check)], Context(),
                         install_signal_handlers=False)
    finally:
        release.set()
    run = out.runs[0]
    assert run.status is Status.FAIL and run.left_running and out.abandoned
    assert any("left behind" in e for e in run.results[0].evidence)
    assert out.runs[1].status is Status.PASS and out.interrupted is None


def test_the_interruption_of_a_check_is_typed_for_a_signal_and_for_the_time_limit():
    def waits(ctx):
        ctx.cancel.wait(10)
        return [Result("w", Status.PASS, "cut short")]

    out = run_checks([_mk("w", waits, budget_s=60)], Context(), timeout_s=0.4, install_signal_handlers=False)
    assert out.runs[0].interruption == runner_mod.Interruption(runner_mod.InterruptionKind.TIMEOUT, "timeout")
    assert out.interrupted == "timeout"

    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    out = run_checks([_mk("w", waits, budget_s=60)], Context())
    timer.cancel()
    assert out.runs[0].interruption == runner_mod.Interruption(runner_mod.InterruptionKind.SIGNAL, "SIGTERM")
    assert out.interrupted == "SIGTERM"
