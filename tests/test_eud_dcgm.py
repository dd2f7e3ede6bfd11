"""eud.dcgm through the real subprocess path, with a FAKE `dcgmi` (a shell script written by each
test into tmp_path) that prints a fixture, says the host engine is down, hangs past the timeout,
ignores SIGTERM, or prints garbage. The fixtures are hand-written from DCGM's documented format."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.tests_suite import eud_dcgm as dcgm_mod
from gpucheck.tests_suite.eud_dcgm import DcgmOptions, dcgm_check, parse_dcgm_level, settings_changes, site_settings
from gpucheck.eud.dcgm_run import diag_argv, find_dcgmi, probe_hostengine, run_command
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks

FIX = Path(__file__).resolve().parent / "fixtures" / "dcgm"

FAKE_DCGMI = r"""#!/bin/sh
# Fake dcgmi for gpucheck's tests. Behaviour from the environment (see tests/test_eud_dcgm.py).
echo "$*" >> "$FAKE_DCGMI_LOG"
case "$1" in
discovery)
    case "$FAKE_DCGMI_HOSTENGINE" in
    down) echo "Error: unable to establish a connection to the specified host: localhost"
          echo "Error: Unable to connect to host engine. Host engine connection invalid/disconnected."
          exit 255 ;;
    hang) sleep 60 ;;
    esac
    echo "2 GPUs found."
    exit 0 ;;
diag)
    case "$FAKE_DCGMI_DIAG" in
    fixture) cat "$FAKE_DCGMI_FIXTURE"; exit "${FAKE_DCGMI_RC:-0}" ;;
    garbage) echo "Segmentation fault (core dumped)" >&2; exit 139 ;;
    sleep)
        sleep 300 &
        echo $! > "$FAKE_DCGMI_PIDFILE"
        wait ;;
    stubborn)
        trap '' TERM
        sleep 300 &
        echo $! > "$FAKE_DCGMI_PIDFILE"
        while :; do wait; done ;;
    esac ;;
esac
exit 2
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake dcgmi on PATH; returns a helper to configure it and read what it was asked."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "dcgmi"
    script.write_text(FAKE_DCGMI)
    script.chmod(0o755)
    log = tmp_path / "dcgmi.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_DCGMI_LOG", str(log))
    monkeypatch.setenv("FAKE_DCGMI_PIDFILE", str(tmp_path / "child.pid"))
    monkeypatch.setenv("FAKE_DCGMI_HOSTENGINE", "up")

    class Fake:
        path = str(script)
        pidfile = tmp_path / "child.pid"

        @staticmethod
        def diag(mode, fixture=None, rc=0):
            monkeypatch.setenv("FAKE_DCGMI_DIAG", mode)
            if fixture:
                monkeypatch.setenv("FAKE_DCGMI_FIXTURE", str(FIX / fixture))
            monkeypatch.setenv("FAKE_DCGMI_RC", str(rc))

        @staticmethod
        def hostengine(state):
            monkeypatch.setenv("FAKE_DCGMI_HOSTENGINE", state)

        @staticmethod
        def calls():
            return [line.split() for line in log.read_text().splitlines()]

    return Fake


def _ctx(level=Level.EXTENDED, checks=None, after=None, dcgm_level=None, snapshot_path=None):
    """A node with GPUs 0 and 1 (a snapshot without NVML settings) that no job is using (a fake
    telemetry source: no process on any GPU; `after`: the snapshot it reads after the run)."""
    from gpucheck.platform.telemetry.fake import FakeTelemetry

    return Context(level=level, config=Config(checks={"eud.dcgm": dict(checks or {})}),
                   snapshot={"gpus": [{"index": 0}, {"index": 1}]}, options={"snapshot_path": snapshot_path},
                   check_options=[DcgmOptions(diag_level=dcgm_level)],
                   telemetry=FakeTelemetry(after))


def _run(ctx):
    return run_checks([dcgm_check], ctx, install_signal_handlers=False).results


def _subjects(results):
    return {r.subject: r for r in results}


def _dead(pid: int, wait_s: float = 3.0) -> bool:
    """Gone, or a zombie (killed, waiting for whoever inherited it to reap it)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


# -- not installed / host engine down -----------------------------------------------------------------
def test_no_dcgmi_is_a_skip_that_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    (r,) = _run(_ctx())
    assert r.status == Status.SKIP
    assert r.summary.startswith("DCGM not installed: 'dcgmi' not found on PATH")
    (r,) = _run(_ctx(checks={"dcgmi_path": str(tmp_path / "nope" / "dcgmi")}))
    assert r.status == Status.SKIP and "not found at that path" in r.summary


def test_host_engine_down_is_a_skip_with_dcgmis_words(fake):
    fake.hostengine("down")
    fake.diag("fixture", "v3_r3_all_pass.json")
    (r,) = _run(_ctx())
    assert r.status == Status.SKIP
    assert r.summary.startswith("DCGM host engine not answering (is nv-hostengine running?): "
                                "`dcgmi discovery -l` exited 255")
    assert "Host engine connection invalid/disconnected" in r.summary
    assert [c[0] for c in fake.calls()] == ["discovery"]  # diag never ran


def test_host_engine_that_hangs_is_a_skip_after_the_probe_timeout(fake):
    fake.hostengine("hang")
    t0 = time.monotonic()
    (r,) = _run(_ctx(checks={"probe_timeout_s": 0.5}))
    assert r.status == Status.SKIP and "did not answer within 0.5 s" in r.summary
    assert time.monotonic() - t0 < 5.0


def test_probe_is_skipped_when_not_required(fake):
    fake.hostengine("down")  # dcgmi diag starts an embedded host engine on its own
    fake.diag("fixture", "v3_r3_all_pass.json")
    res = _run(_ctx(checks={"require_hostengine": False}))
    assert all(r.status == Status.PASS for r in res)
    assert [c[0] for c in fake.calls()] == ["diag"]


# -- runs -----------------------------------------------------------------------------------------------
def test_all_pass_run_and_the_command_line(fake):
    fake.diag("fixture", "v3_r3_all_pass.json")
    res = _subjects(_run(_ctx()))
    assert len(res) == 21 and all(r.status == Status.PASS for r in res.values())
    (probe, diag) = fake.calls()
    assert probe == ["discovery", "-l"]
    assert diag == ["diag", "-r", "3", "-j"]  # nothing that changes what DCGM does (no -p, -c, --parameters)
    r = res["gpu0/PCIe"]
    assert any(e.startswith("DCGM 3.3.5 (3.x JSON), driver 550.90.07; dcgmi diag -r 3 exit code 0") for e in r.evidence)


def test_level_gpus_and_host_options(fake):
    fake.diag("fixture", "v3_r3_all_pass.json")
    ctx = _ctx(level=Level.BURN_IN, checks={"host": "10.0.0.5:5555"})
    ctx.gpus = [0, 1]
    _run(ctx)
    assert fake.calls()[-1] == ["diag", "-r", "4", "-j", "-i", "0,1", "--host", "10.0.0.5:5555"]
    assert fake.calls()[0] == ["discovery", "-l", "--host", "10.0.0.5:5555"]
    _run(_ctx(dcgm_level="medium"))
    assert fake.calls()[-1][:3] == ["diag", "-r", "2"]
    (r,) = _run(_ctx(dcgm_level=7))
    assert r.status == Status.ERROR and "bad DCGM diag level 7" in r.summary


def test_a_memory_failure_fails_that_gpu_only(fake):
    fake.diag("fixture", "v3_r3_memory_fail_gpu1.json", rc=226)
    res = _subjects(_run(_ctx()))
    bad = res["gpu1/GPU Memory"]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN
    assert "Found 4 faulty memory elements on GPU 1" in bad.summary
    assert any("DCGM_FR_FAULTY_MEMORY (52)" in e for e in bad.evidence)
    assert any("exit code 226" in e for e in bad.evidence)
    assert [s for s, r in res.items() if r.status != Status.PASS] == ["gpu1/GPU Memory"]


def test_dcgm_gpu_ids_follow_serials_to_gpucheck_indices(fake):
    fake.diag("fixture", "v3_r3_memory_fail_gpu1.json", rc=226)
    snap = {"nvml": {"ok": False}, "gpus": [{"index": 0, "serial": "1650123000002"},
                                              {"index": 1, "serial": "1650123000001"}]}
    ctx = _ctx()
    ctx.snapshot = snap
    res = _subjects(_run(ctx))
    assert res["gpu0/GPU Memory"].status == Status.FAIL and res["gpu1/GPU Memory"].status == Status.PASS
    assert "DCGM GPU 1 is gpucheck GPU 0 (matched by serial)" in res["gpu0/GPU Memory"].evidence


def test_v4_document_through_the_check(fake):
    fake.diag("fixture", "v4_r3_mixed.json", rc=226)
    res = _subjects(_run(_ctx()))
    assert res["gpu1/software"].action == Action.RESET_GPU
    assert res["node/targeted_stress"].status == Status.WARN
    assert res["gpu0/pulse_test"].status == Status.SKIP


@pytest.mark.parametrize("mode, fixture, rc, summary", [
    ("garbage", None, 0, "could not read dcgmi's output (exit code 139): dcgmi printed nothing"),
    ("fixture", "malformed_truncated.json", 0, "could not read dcgmi's output (exit code 0): dcgmi's JSON does not parse"),
    ("fixture", "v4_runtime_error.json", 1,
     "DCGM could not run the diagnostic: Error: Diagnostic could not be run while DCGM is paused."),
])
def test_bad_output_is_an_error_with_the_reason_not_a_crash(fake, mode, fixture, rc, summary):
    fake.diag(mode, fixture, rc=rc)
    (r,) = _run(_ctx())
    assert r.status == Status.ERROR
    assert r.summary.startswith(summary)
    if mode == "garbage":
        assert "stderr: Segmentation fault (core dumped)" in r.evidence


def test_nonzero_exit_with_a_clean_document_is_a_warn(fake):
    fake.diag("fixture", "v3_r3_all_pass.json", rc=1)
    res = _subjects(_run(_ctx()))
    w = res["node/dcgmi"]
    assert w.status == Status.WARN and "exited with 1 although its JSON shows no failure" in w.summary


# -- timeout and cancel kill the process group -------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sleep", "stubborn"])
def test_timeout_kills_the_process_group(fake, mode):
    fake.diag(mode)
    t0 = time.monotonic()
    (r,) = _run(_ctx(checks={"timeout_s_r3": 1.0, "term_grace_s": 0.5}))
    took = time.monotonic() - t0
    assert r.status == Status.ERROR and r.action == Action.INVESTIGATE
    assert "dcgmi diag -r 3 did not finish within 1 s (timeout_s_r3)" in r.summary
    assert ("SIGTERM, then SIGKILL" in r.summary) == (mode == "stubborn")
    child = int(fake.pidfile.read_text())
    assert _dead(child), f"the fake dcgmi's child {child} survived"
    assert took < 6.0


@pytest.mark.slow
def test_cancel_stops_dcgmi_quickly(fake):
    fake.diag("stubborn")
    ctx = _ctx()
    threading.Timer(0.8, ctx.cancel.set).start()
    t0 = time.monotonic()
    (r,) = dcgm_check.run(ctx)
    assert r.status == Status.ERROR and r.summary.startswith("not finished: interrupted after")
    assert time.monotonic() - t0 < 5.0  # inside the runner's 5 s cancel grace
    assert _dead(int(fake.pidfile.read_text()))


def test_run_command_returns_output_and_exit_code(tmp_path):
    out = run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    assert (out.returncode, out.stdout, out.stderr, out.timed_out) == (3, "out\n", "err\n", False)
    missing = run_command([str(tmp_path / "absent")], timeout_s=1)
    assert missing.error and missing.error.startswith("FileNotFoundError")


# -- pieces -----------------------------------------------------------------------------------------------
def test_parse_level_and_argv():
    assert [parse_dcgm_level(v) for v in (1, "2", " 3 ", "xlong", "quick", "LONG")] == [1, 2, 3, 4, 1, 3]
    for bad in (0, 5, "r3", "", None):
        with pytest.raises(ValueError):
            parse_dcgm_level(bad)
    assert diag_argv("/usr/bin/dcgmi", 3) == ["/usr/bin/dcgmi", "diag", "-r", "3", "-j"]


def test_find_and_probe(fake, tmp_path):
    assert find_dcgmi("dcgmi") == fake.path and find_dcgmi(fake.path) == fake.path
    assert find_dcgmi("") is None and find_dcgmi(str(tmp_path / "x")) is None
    assert probe_hostengine(fake.path) == (True, "2 GPUs found.")


def test_budget_follows_the_dcgm_level():
    assert dcgm_check.spec.budget(_ctx()) == 3600 + 15 + 30 + 30
    assert dcgm_check.spec.budget(_ctx(dcgm_level=1)) == 300 + 15 + 30 + 30
    assert dcgm_check.spec.level == Level.EXTENDED and dcgm_check.spec.needs == ()


def test_replayed_snapshot_is_a_skip(fake):
    (r,) = _run(_ctx(snapshot_path="/tmp/other-node.json"))
    assert r.status == Status.SKIP and "recorded snapshot" in r.summary
    assert fake.calls() == []


# -- settings the site set -------------------------------------------------------------------------------
def _snap(limit=700.0, persistence=True):
    return {"nvml": {"ok": True, "error": None}, "gpus": [
        {"index": 0, "state": "ok", "serial": "1650123000001", "power": {"limit_w": limit},
         "persistence_mode": persistence, "ecc_mode": {"current": True, "pending": True},
         "mig_mode": {"current": False, "pending": False}},
        {"index": 1, "state": "ok", "serial": "1650123000002", "power": {"limit_w": 700.0},
         "persistence_mode": True, "ecc_mode": {"current": True, "pending": True},
         "mig_mode": {"current": False, "pending": None}}]}


def test_settings_changed_by_the_run_are_a_warn(fake):
    fake.diag("fixture", "v3_r3_all_pass.json")
    ctx = _ctx(after=_snap(limit=500.0, persistence=False))
    ctx.snapshot = _snap()
    res = _subjects(_run(ctx))
    s = res["node/settings"]
    assert s.status == Status.WARN and s.action == Action.INVESTIGATE
    assert s.summary == ("the DCGM run changed GPU settings: gpu0: power.limit_w 700.0 -> 500.0; "
                         "persistence_mode True -> False")
    ctx2 = _ctx(after=_snap())
    ctx2.snapshot = _snap()
    s2 = _subjects(_run(ctx2))["node/settings"]
    assert s2.status == Status.PASS and s2.summary == "GPU settings unchanged by the DCGM run (2 GPU(s))"


def test_settings_helpers():
    before = site_settings(_snap())
    assert before[1] == {"power.limit_w": 700.0, "persistence_mode": True, "ecc_mode.current": True,
                         "ecc_mode.pending": True, "mig_mode.current": False, "mig_mode.pending": None}
    after = site_settings(_snap(limit=650.0))
    assert settings_changes(before, after) == {0: ["power.limit_w 700.0 -> 650.0"]}
    after[1]["mig_mode.pending"] = True  # unreadable before: not compared
    assert settings_changes(before, after) == {0: ["power.limit_w 700.0 -> 650.0"]}
    assert dcgm_mod._settings_result(Context()) is None  # no snapshot before: nothing to compare
