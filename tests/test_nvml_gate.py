"""The gate and NVML: a driver that does not answer never starves the kernel-log check, a job's GPU
that NVML no longer lists fails the node (a user's `--gpus` typo stays a usage error), and an
exception of gpucheck's own telemetry reader is "could not judge", never a drain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from xid_log import xid79_config

from gpucheck import app
from gpucheck.cli.main import main
from gpucheck.fleet import hook
from gpucheck.platform.telemetry import nvml as N
from gpucheck.platform.telemetry.source import ReplayTelemetry

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEALTHY = SNAPS / "h100-healthy.json"
ENV = {"SLURMD_NODENAME": "gpu7", "SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice"}


def healthy() -> dict:
    return json.loads(HEALTHY.read_text())


def run_json(req: app.RunRequest) -> tuple[int, dict]:
    captured: list = []
    rc = app.execute(req, on_verdict=captured.append)
    return rc, captured[-1].to_json()


def by_check(v) -> dict[str, list[dict]]:
    """The results of a verdict (its JSON, or a typed Verdict as its JSON) by check."""
    out: dict[str, list[dict]] = {}
    for r in (v if isinstance(v, dict) else v.to_json())["results"]:
        out.setdefault(r["check"], []).append(r)
    return out


class HungReplay(ReplayTelemetry):
    """A recording whose NVML never answers (until `release` is set): a hung driver."""

    def __init__(self, doc: dict, release: threading.Event):
        super().__init__(doc)
        self.release = release
        self.abandoned = False

    def snapshot(self, timeout_s=None):
        self.release.wait(60)
        return super().snapshot()

    def abandon(self, thread: threading.Thread) -> None:
        self.abandoned = thread.is_alive()


class RaisingReplay(ReplayTelemetry):
    """A recording (8 GPUs on the PCI bus) whose reader raises `exc`."""

    def __init__(self, doc: dict, exc: Exception):
        super().__init__(doc)
        self.exc = exc

    def snapshot(self, timeout_s=None):
        raise self.exc


# -- 1. a hung NVML is bounded by what the run's time limit leaves; xid still judges -----------------

def test_the_wait_for_nvml_leaves_a_reserve_for_the_kernel_log_check():
    from gpucheck.tests_suite.registry import all_checks
    from gpucheck.core.selection import select

    level1 = select(all_checks(max_level=1), 1, [], [])
    nvml_only = select(all_checks(max_level=1), 1, ["ecc"], [])
    now = 100.0
    assert app.telemetry_wait(level1, None, now) == app.LIVE_TELEMETRY_TIMEOUT_S
    assert app.telemetry_wait(level1, now + 13.2, now) == pytest.approx(13.2 - app.KERNEL_LOG_RESERVE_S)
    assert app.telemetry_wait(level1, now + 2.0, now) == pytest.approx(1.0)  # at most half is reserved
    assert app.telemetry_wait(nvml_only, now + 2.0, now) == pytest.approx(2.0)  # nothing else to leave it to
    assert app.telemetry_wait(level1, now + 100.0, now) == app.LIVE_TELEMETRY_TIMEOUT_S
    assert app.telemetry_wait(level1, now - 1.0, now) == 0.0


@pytest.mark.slow
def test_a_hung_nvml_is_an_error_of_every_nvml_check_and_xid_still_fails_the_node(tmp_path):
    release = threading.Event()
    source = HungReplay(healthy(), release)
    t0 = time.monotonic()
    try:
        rc, v = run_json(app.RunRequest(level=1, skip_patterns=["repro.bitwise"], telemetry=source, timeout_s=4.0,
                                        config_path=str(xid79_config(tmp_path)), history=False, json=True))
    finally:
        release.set()
    assert time.monotonic() - t0 < 4.0 + 1.0  # the run's hard limit
    assert rc == 1 and v["status"] == "fail" and not v["partial"]
    checks = by_check(v)
    assert any(r["status"] == "fail" and "Xid 79" in r["summary"] for r in checks["xid"]), checks["xid"]
    for check in ("inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink", "recovery-action"):
        (r,) = checks[check]
        assert r["status"] == "error" and "NVML did not answer within" in r["summary"], r
    assert source.abandoned  # the hung read is left behind: its NVML is never shut down at exit


@pytest.mark.slow
def test_a_hung_nvml_alone_is_could_not_judge_never_a_pass(tmp_path):
    release = threading.Event()
    try:
        rc, v = run_json(app.RunRequest(check_patterns=["inventory", "ecc"], telemetry=HungReplay(healthy(), release),
                                        timeout_s=2.0, history=False, json=True))
    finally:
        release.set()
    assert rc == 3 and v["status"] == "error"
    assert {r["status"] for r in v["results"]} == {"error"}


@pytest.mark.slow
def test_a_hung_nvml_in_a_prolog_on_the_jobs_gpus_still_lets_xid_drain(tmp_path, monkeypatch):
    """A job with GPUs (SLURM_JOB_GPUS) on a node whose NVML hangs: the job's GPUs cannot be checked
    against NVML, which is no usage error (that would skip every check and pass the node)."""
    from gpucheck.platform.telemetry import snapshot as telemetry_snapshot

    release = threading.Event()
    monkeypatch.setattr(telemetry_snapshot, "collect_snapshot", lambda *a, **k: release.wait(60) and {})
    calls: list[list[str]] = []
    opts = hook.HookOptions("prolog", config_path=str(xid79_config(tmp_path, "0000:18:00")),
                            state_dir=str(tmp_path / "state"), budget_s=4.0, skips=["repro.bitwise"])
    try:
        out = hook.run_hook(opts, {**ENV, "SLURM_JOB_GPUS": "0,1"},
                            runner=lambda argv: (calls.append(argv), (0, "", ""))[1], log=lambda p, m: None)
    finally:
        release.set()
    assert out.judgement == "unhealthy" and out.exit_code == hook.EXIT_HOOK_UNHEALTHY, out.log_line
    assert "Xid 79" in out.cause and calls and calls[0][3] == "State=DRAIN"


HANGING_PYNVML = '''
"""A pynvml whose driver answers nvmlInit and then never again (nvmlShutdown included)."""
import threading

class NVMLError(Exception):
    pass

def nvmlInit():
    pass

def _hang(*args):
    threading.Event().wait()

nvmlDeviceGetCount = _hang
nvmlShutdown = _hang
'''


@pytest.mark.slow
def test_a_driver_call_that_never_returns_never_holds_the_process_exit(tmp_path):
    """The reader stuck in the driver is a daemon thread and NVML is not shut down at exit (that
    call would hang too): `gpucheck run` ends within its --timeout and exits with its verdict."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pynvml.py").write_text(textwrap.dedent(HANGING_PYNVML))
    argv = [sys.executable, "-m", "gpucheck", "run", "--timeout", "4s", "--skip", "repro.bitwise", "--json",
            "--config", str(xid79_config(tmp_path)), "--state-dir", str(tmp_path / "state")]
    env = {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{ROOT}"}
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    v = json.loads(r.stdout)
    assert r.returncode == 1 and v["status"] == "fail", r.stderr[-800:]
    (inventory,) = by_check(v)["inventory"]
    assert inventory["status"] == "error" and "NVML did not answer within" in inventory["summary"]
    assert took < 30  # 4 s and the interpreter's start and exit: not a wait for the hung driver


# -- 2. a job's GPU that NVML does not list fails the node; a user's typo stays a usage error ----------

def seven_of_eight(tmp_path: Path, *, on_the_bus: bool) -> Path:
    """The healthy 8-GPU recording with GPU 7 gone from NVML (and, unless `on_the_bus`, from PCI)."""
    snap = healthy()
    (seven,) = [g for g in snap["gpus"] if g["index"] == 7]
    snap["gpus"].remove(seven)
    if not on_the_bus:
        snap["pci_nvidia_devices"] = [d for d in snap["pci_nvidia_devices"] if d["bus_id"] != seven["pci_bus_id"]]
    path = tmp_path / "seven.json"
    path.write_text(json.dumps(snap))
    return path


def test_a_job_gpu_gone_from_nvml_and_the_bus_drains_the_node(tmp_path):
    calls: list[list[str]] = []
    opts = hook.HookOptions("prolog", snapshot=str(seven_of_eight(tmp_path, on_the_bus=False)),
                            state_dir=str(tmp_path / "state"))
    out = hook.run_hook(opts, {**ENV, "SLURM_JOB_GPUS": "6,7"},
                        runner=lambda argv: (calls.append(argv), (0, "", ""))[1], log=lambda p, m: None)
    assert out.judgement == "unhealthy" and out.exit_code == hook.EXIT_HOOK_UNHEALTHY, out.log_line
    assert "GPU(s) 7 of this run (the job's GPUs) missing" in out.cause
    assert calls and calls[0][3] == "State=DRAIN"
    (node,) = [r for r in by_check(out.verdict)["inventory"] if r.get("gpu") is None]
    assert node["status"] == "fail" and node["action"] == "reboot"
    assert node["metrics"]["selected_gpus_not_in_nvml"]["value"] == 1


def test_the_hooks_gpus_are_the_schedulers_and_a_runs_are_the_users(tmp_path):
    captured = []

    def execute(req, on_verdict, on_warning=None):
        captured.append(req)
        return 0

    hook.run_hook(hook.HookOptions("prolog", state_dir=str(tmp_path / "s")), {**ENV, "SLURM_JOB_GPUS": "7"},
                  runner=lambda argv: (0, "", ""), log=lambda p, m: None, execute=execute)
    hook.run_hook(hook.HookOptions("prolog", state_dir=str(tmp_path / "s")), ENV,
                  runner=lambda argv: (0, "", ""), log=lambda p, m: None, execute=execute)
    assert (captured[0].gpus, captured[0].gpus_assigned) == ([7], True)
    assert (captured[1].gpus, captured[1].gpus_assigned) == (None, False)
    assert app.RunRequest().gpus_assigned is False


def test_a_users_gpus_typo_is_still_a_usage_error(tmp_path, capsys):
    rc = main(["run", "--snapshot", str(HEALTHY), "--gpus", "9", "--no-history"])
    err = capsys.readouterr().err
    assert rc == 2 and "--gpus: no GPU 9 on this node" in err
    rc = main(["run", "--snapshot", str(seven_of_eight(tmp_path, on_the_bus=True)), "--gpus", "7", "--no-history"])
    assert rc == 2 and "--gpus: no GPU 7" in capsys.readouterr().err


def test_gpus_on_a_node_whose_nvml_is_down_are_judged_not_refused(capsys):
    """Which GPUs exist is unknown when NVML does not work: `--gpus 0` is judged (the inventory
    check fails a node whose GPUs are on the bus without a driver), not a usage error."""
    rc = main(["run", "--snapshot", str(SNAPS / "driver-not-loaded.json"), "--gpus", "0", "--no-history", "--json"])
    v = json.loads(capsys.readouterr().out)
    assert rc == 1 and by_check(v)["inventory"][0]["status"] == "fail"


# -- 3. gpucheck's own reader bug is could-not-judge, never a drain ---------------------------------

def test_our_own_reader_bug_is_an_error_not_a_failed_node(tmp_path):
    doc = healthy()
    assert len(doc["pci_nvidia_devices"]) == 8  # GPUs on the bus: "NVML unavailable" would fail the node
    rc, v = run_json(app.RunRequest(level=1, skip_patterns=["repro.bitwise", "xid", "pcie.aer",
                                                   "fabric.nvswitch"], history=False, json=True,
                                    telemetry=RaisingReplay(doc, KeyError("memory_total"))))
    assert rc == 3 and v["status"] == "error" and v["action"] == "none"
    (inventory,) = by_check(v)["inventory"]
    assert inventory["status"] == "error"
    assert "gpucheck's own telemetry reader failed (KeyError: 'memory_total'" in inventory["summary"]
    assert "\n" not in inventory["summary"]
    assert all(r["status"] == "error" for r in v["results"])


def test_a_bug_deep_in_the_reader_is_named_with_where_it_happened(monkeypatch):
    from gpucheck.platform.telemetry import snapshot as telemetry_snapshot

    def broken(s, index):
        return {"index": index} | None  # TypeError: our own parsing, not NVML

    monkeypatch.setattr(telemetry_snapshot, "read_gpu", broken)
    snap = app._collect_live(ReplayTelemetry(healthy()), 10.0)
    err = snap["nvml"]["error"]
    assert snap["nvml"]["ok"] is False and err["kind"] == N.INTERNAL_ERROR
    assert "TypeError" in err["message"] and "in broken" in err["message"]


@pytest.mark.parametrize("exc, kind", [
    (lambda: __import__("pynvml").NVMLError_DriverNotLoaded(), N.DRIVER_NOT_LOADED),
    (lambda: __import__("pynvml").NVMLError_LibraryNotFound(), N.LIBRARY_NOT_FOUND),
], ids=["driver-not-loaded", "library-not-found"])
def test_a_real_nvml_failure_out_of_the_reader_is_still_judged(exc, kind):
    rc, v = run_json(app.RunRequest(check_patterns=["inventory"], history=False, json=True,
                                    telemetry=RaisingReplay(healthy(), exc())))
    (inventory,) = v["results"]
    assert rc == 1 and inventory["status"] == "fail" and inventory["action"] == "reboot"
    assert inventory["metrics"]["nvml_error"]["value"] == kind


def test_a_library_is_not_shut_down_at_exit_while_a_call_is_stuck_in_it():
    from types import SimpleNamespace

    calls: list[str] = []
    fake = SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: calls.append("shutdown"))
    lib = N.Library(load=lambda: fake)
    N.NvmlSession(lib)  # the hung reader's session: never closed
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, args=(30,), daemon=True)
    stuck.start()
    lib.abandon(stuck)
    try:
        lib._shutdown_at_exit()
        assert calls == [] and lib.abandoned  # nvmlShutdown would wait for the hung driver
    finally:
        release.set()
        stuck.join(5)
    assert not lib.abandoned  # the call came back: shut down at exit as before
    lib._shutdown_at_exit()
    assert calls == ["shutdown"]


@pytest.mark.slow
def test_a_lock_held_by_a_hung_call_never_holds_the_exit():
    lib = N.Library(load=lambda: None)
    held, release = threading.Event(), threading.Event()

    def stuck_in_init():
        with lib.lock:
            held.set()
            release.wait(30)

    threading.Thread(target=stuck_in_init, daemon=True).start()
    assert held.wait(5)
    t0 = time.monotonic()
    try:
        lib._shutdown_at_exit()
    finally:
        release.set()
    assert time.monotonic() - t0 < 5


def test_the_xid_commands_nvml_map_abandons_a_hung_driver(monkeypatch):
    from gpucheck.cli import xid as xid_cli

    monkeypatch.setattr(xid_cli, "NVML_TIMEOUT_S", 0.1)
    release = threading.Event()
    try:
        gpu_map, note = xid_cli._nvml_map(lambda: release.wait(30))
        assert "did not answer" in note and N.live_library().abandoned
    finally:
        release.set()
    for th in threading.enumerate():
        if th.name == "xid-nvml-map":
            th.join(5)
    assert not N.live_library().abandoned


def test_a_driver_that_does_not_answer_within_the_whole_hang_limit_is_hung_and_fails_the_inventory():
    """Waiting the whole hang limit (no time limit cut it short) and getting no answer is a hung
    driver: kind `hung`, which the inventory check judges (GPUs on the bus: fail, reboot), unlike
    a wait that the run's time limit cut short (kind `timeout`: could not judge)."""
    from gpucheck.tests_suite.inventory import _no_nvml

    release = threading.Event()
    source = HungReplay(healthy(), release)
    try:
        limited = app._collect_live(source, 0.2, limited=True)
        hung = app._collect_live(source, 0.2, limited=False)
    finally:
        release.set()
    assert limited["nvml"]["error"]["kind"] == N.TIMEOUT
    assert hung["nvml"]["error"]["kind"] == N.HUNG and N.HUNG not in N.UNJUDGED_KINDS
    assert "the driver is hung" in hung["nvml"]["error"]["message"]
    hung["pci_nvidia_devices"] = [{"bus_id": "0000:18:00.0", "class": "0x030200", "device": "0x2335",
                                   "driver": "nvidia"}]

    class Ctx:
        config = None

    (result,) = _no_nvml(Ctx(), hung)
    assert result.status.value == "fail" and result.action.value == "reboot", result


def test_a_mig_nodes_gres_indices_never_drain_it_as_missing_gpus(tmp_path, capsys):
    """On a node with MIG enabled, Slurm's GRES indices count MIG instances (a job's
    SLURM_JOB_GPUS=12 on 8 GPUs split in 7): no GPU is missing, so the node is never drained for
    it; every GPU is tested instead, and stderr says why."""
    snap = healthy()
    for g in snap["gpus"]:
        g["mig_mode"] = {"current": True, "pending": True}
    path = tmp_path / "mig.json"
    path.write_text(json.dumps(snap))
    calls: list[list[str]] = []
    opts = hook.HookOptions("prolog", snapshot=str(path), state_dir=str(tmp_path / "state"))
    out = hook.run_hook(opts, {**ENV, "SLURM_JOB_GPUS": "12,13"},
                        runner=lambda argv: (calls.append(argv), (0, "", ""))[1], log=lambda p, m: None)
    assert not calls, out.log_line
    assert out.exit_code == 0, out.log_line
    (node,) = [r for r in by_check(out.verdict)["inventory"] if r.get("gpu") is None]
    assert "selected_gpus_not_in_nvml" not in node["metrics"]
    tested = {r.get("gpu") for rs in by_check(out.verdict).values() for r in rs if r.get("gpu") is not None}
    assert tested == {g["index"] for g in snap["gpus"]}
    assert "MIG is enabled on GPU" in capsys.readouterr().err


def test_a_node_whose_mig_mode_cannot_be_read_never_drains_for_gres_indices(tmp_path, capsys):
    """Whether MIG is on could not be read (the read failed, not 'not supported'): the GRES
    indices may count MIG instances, so they are not judged as missing GPUs either."""
    snap = healthy()
    for g in snap["gpus"]:
        g["mig_mode"] = {"current": None, "pending": None}
        g.setdefault("errors", {})["mig_mode"] = "other"
    path = tmp_path / "mig-unknown.json"
    path.write_text(json.dumps(snap))
    calls: list[list[str]] = []
    opts = hook.HookOptions("prolog", snapshot=str(path), state_dir=str(tmp_path / "state"))
    out = hook.run_hook(opts, {**ENV, "SLURM_JOB_GPUS": "12"},
                        runner=lambda argv: (calls.append(argv), (0, "", ""))[1], log=lambda p, m: None)
    assert not calls and out.judgement != "unhealthy", out.log_line
    (node,) = [r for r in by_check(out.verdict)["inventory"] if r.get("gpu") is None]
    assert "selected_gpus_not_in_nvml" not in node["metrics"]
    assert "could not be read" in capsys.readouterr().err
