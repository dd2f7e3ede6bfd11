"""fabric.nvswitch: Fabric Manager logs and journals of real nodes, nvidia-smi Fabric sections of
real captures, NVML's fabric info through the reader and the replay, and the service state."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpucheck.core.check import Context, RunOptions
from gpucheck.core.levels import Level
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import Outcome, run_checks
from gpucheck.platform.fabric import nvmlfabric
from gpucheck.platform.fabric.fabricmanager import parse_fm_log, parse_service_state, read_log
from gpucheck.platform.telemetry.nvsmi import convert
from gpucheck.platform.telemetry.replay import replay_snapshot
from gpucheck.platform.telemetry.snapshot import load_snapshot
from gpucheck.tests_suite.registry import all_checks

FIX = Path(__file__).parent / "fixtures"
FM = FIX / "fabricmanager"
P, W, F, S, E = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR
CHECK = [c for c in all_checks() if c.id == "fabric.nvswitch"]


def doc(**extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": "gpucheck.snapshot", "version": 1, "synthetic": True, "source": "test", "host": "n1",
                         "captured_at": "unknown", "nvml": {"ok": False, "error": {"kind": "not_in_capture",
                                                                                  "message": "a pasted log"}},
                         "driver_version": None, "cuda_driver_version": None, "nvml_version": None,
                         "pci_nvidia_devices": [], "gpus": []}
    d.update(extra)
    return d


def fm_log(name: str, switches: list[str] | None = None, service: str | None = None) -> dict[str, Any]:
    return {"service": None if service is None else {"text": service, "error": None},
            "log": {"path": name, "lines": (FM / name).read_text().splitlines(), "error": None, "missing": False},
            "nvswitch_devices": switches}


def replay(snapshot: dict[str, Any]) -> Outcome:
    ctx = Context(level=Level.QUICK, snapshot=snapshot, options=RunOptions(snapshot_path="capture"))
    return run_checks(CHECK, ctx, install_signal_handlers=False)


def only(out: Outcome, subject: str | None = None) -> Any:
    found = [r for r in out.results if subject is None or r.subject == subject]
    assert len(found) == 1, [(r.subject, r.status, r.summary) for r in out.results]
    return found[0]


# -- Fabric Manager logs of real nodes --------------------------------------------------------------


@pytest.mark.parametrize("name, status, action, words", [
    ("gpud-h100-535-nvswitch-nonfatal-12028-and-restarts.log", W, Action.INVESTIGATE,
     "NVSwitch non-fatal error(s): 18 on NVSwitch 0000:83:00.0 port 34"),
    ("gpud-h100-multicast-team-inband-healthy.log", W, Action.INVESTIGATE, "1 on NVSwitch 0000:86:00.0 port 61"),
    ("nvtrust-128-h20-journal-fm-started-then-stopped.log", F, Action.DRAIN, "Fabric Manager failed to start"),
])
def test_fabric_manager_logs_of_real_nodes(name, status, action, words):
    r = only(replay(doc(fabric_manager=fm_log(name))), "fabric manager log")
    assert (r.status, r.action) == (status, action), r.summary
    assert words in r.summary


@pytest.mark.parametrize("name", ["gpu-operator-610-a40-nvlink-bridge-nothing-to-do.log",
                                  "cube-studio-29-rtx4090-pre-nvl5-nothing-to-do.log"])
def test_no_nvswitch_is_a_plain_skip_never_a_fail(name):
    """FM exits with NV_WARN_NOTHING_TO_DO (and its unit fails) on boxes without NVSwitches."""
    r = only(replay(doc(fabric_manager=fm_log(name))))
    assert r.status == S and "no NVSwitch on this system" in r.summary and "NOTHING_TO_DO" in r.summary
    # the same log on a node whose PCI bus holds NVSwitches: FM could not see them: judged, a fail
    out = replay(doc(fabric_manager=fm_log(name, switches=["0000:83:00.0"])))
    assert only(out, "fabric manager log").status == F


def test_the_log_parser_reads_times_switches_and_ports():
    events = parse_fm_log((FM / "gpud-h100-535-nvswitch-nonfatal-12028-and-restarts.log").read_text().splitlines())
    first = events[0]
    assert (first.kind, first.switch, first.port, first.code) == ("nvswitch_nonfatal", "0000:83:00.0", 34, 12028)
    assert first.time is not None
    assert [e.kind for e in events[-4:]] == ["started", "configured", "started", "configured"]
    ru = parse_fm_log((FM / "gpu-operator-610-a40-nvlink-bridge-nothing-to-do.log").read_text().splitlines())
    assert [e.kind for e in ru] == ["start_failed", "nothing_to_do", "start_failed"]
    assert all(e.time is None for e in ru)  # "11月" stamps: unknown, never old


def test_nonfatal_errors_older_than_the_window_are_not_judged():
    """Synthetic window: the same real log judged with a window shorter than the 5 h between its
    12028 burst and its newest line."""
    from gpucheck.tests_suite.fabric_nvswitch import DEFAULTS, judge_log

    lines = (FM / "gpud-h100-535-nvswitch-nonfatal-12028-and-restarts.log").read_text().splitlines()
    assert judge_log(lines, "x", None, {**DEFAULTS, "nonfatal_window_s": 3600}).status == P
    assert judge_log(lines, "x", None, DEFAULTS).status == W


def test_a_fatal_nvswitch_error_fails():
    """Synthetic (no real FM log with a fatal NVSwitch error was found: fixtures24/INDEX.md): the
    real 12028 line with "non-fatal" made "fatal", after the log's last start."""
    lines = (FM / "gpud-h100-535-nvswitch-nonfatal-12028-and-restarts.log").read_text().splitlines()
    fatal = lines[[i for i, l in enumerate(lines) if "non-fatal error 12028" in l][0]] \
        .replace("non-fatal", "fatal").replace("[Dec 19 2024 19:17:49]", "[Dec 20 2024 01:00:00]")
    rec = {"service": None, "nvswitch_devices": ["0000:83:00.0"],
           "log": {"path": "x", "lines": lines + [fatal], "error": None, "missing": False}}
    r = only(replay(doc(fabric_manager=rec)), "fabric manager log")
    assert (r.status, r.action) == (F, Action.REBOOT) and "NVSwitch 0000:83:00.0 port 34" in r.summary


# -- the service -------------------------------------------------------------------------------------

ACTIVE = "ActiveState=active\nSubState=running\nResult=success\nLoadState=loaded\n"
FAILED = "ActiveState=failed\nSubState=failed\nResult=exit-code\nLoadState=loaded\n"
ABSENT = "ActiveState=inactive\nSubState=dead\nResult=success\nLoadState=not-found\n"


@pytest.mark.parametrize("text, status, words", [
    (ACTIVE, P, "active/running"), (FAILED, F, "service is failed/failed (result exit-code)"),
    (ABSENT, F, "not installed"), ("garbage", E, "not systemctl show output"),
])
def test_service_state_on_a_node_with_nvswitches(text, status, words):
    """Synthetic `systemctl show -p ActiveState,SubState,Result,LoadState` outputs (its documented
    Key=Value form; a real one of nvidia-fabricmanager was not found)."""
    rec = {"service": {"text": text, "error": None}, "log": None, "nvswitch_devices": ["0000:83:00.0"]}
    r = only(replay(doc(fabric_manager=rec)), "fabric manager service")
    assert r.status == status and words in r.summary
    assert parse_service_state(ACTIVE)["active_state"] == "active"


def test_an_unreadable_source_on_a_node_with_nvswitches_is_an_error():
    rec = {"service": {"text": None, "error": "systemctl not found"}, "nvswitch_devices": ["0000:83:00.0"],
           "log": {"path": "/var/log/fabricmanager.log", "lines": [], "error": "cannot read: Permission denied",
                   "missing": False}}
    out = replay(doc(fabric_manager=rec))
    assert only(out, "fabric manager service").status == E and only(out, "fabric manager log").status == E
    # a replayed snapshot without fabric_manager: a skip naming what to record
    assert "not in this capture" in only(replay(doc(fabric_manager=None, nvml={"ok": True, "error": None}))).summary


def test_read_log_keeps_the_newest_whole_lines(tmp_path):
    log = tmp_path / "fm.log"
    log.write_text("".join(f"[Dec 19 2024 19:17:{i % 60:02d}] [INFO] [tid 1] line {i}\n" for i in range(2000)))
    rec = read_log(str(log), max_bytes=1000)
    assert rec["lines"][-1].endswith("line 1999") and rec["lines"][0].startswith("[Dec")
    assert read_log(str(tmp_path / "none"))["missing"] is True


# -- NVML / nvidia-smi fabric info ---------------------------------------------------------------------


def gpu_entry(fabric: Any) -> dict[str, Any]:
    s = load_snapshot(FIX / "snapshots" / "h100-healthy.json")
    g = s["gpus"][0]
    g["fabric"] = fabric
    return g


@pytest.mark.parametrize("name, words", [
    ("azhpc-images-506-fabric-insufficient-resources.txt", "registration failed: insufficient resources"),
    ("dra-driver-626-fabric-health-unhealthy-grep.txt", "NVLink fabric unhealthy (summary unhealthy)"),
])
def test_nvidia_smi_fabric_sections_of_real_captures_fail(name, words):
    (fabric,) = nvmlfabric.parse_nvsmi_fabric((FIX / "nvsmi_fabric" / name).read_text())
    g = gpu_entry(fabric)
    s = doc(nvml={"ok": True, "error": None}, gpus=[g])
    r = only(replay(s), "gpu0")
    assert (r.status, r.action) == (F, Action.DRAIN) and words in r.summary


def test_a_healthy_h100_capture_has_a_completed_fabric_and_passes():
    snap = convert((FIX / "nvsmi" / "h100-x8-565-healthy.txt").read_text(), "h100")
    assert snap["gpus"][0]["fabric"]["state"] == "completed" and snap["gpus"][0]["fabric"]["status"] == "success"
    out = replay(snap)
    assert {r.status for r in out.results if r.gpu is not None} == {P} and len(out.results) == 9
    assert only(out, "fabric manager service").status == S  # FM state: not in an nvidia-smi capture


@pytest.mark.parametrize("fabric", [
    {"state": "completed", "status": "success", "clique_id": 2, "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
     "health_summary": "limited_capacity", "health": {"degraded_bw": "true", "route_recovery": "false",
                                                      "route_unhealthy": "false", "access_timeout_recovery": "false"}},
    {"state": "in_progress", "status": "success", "clique_id": 0, "cluster_uuid": "00000000-0000-0000-0000-000000000000",
     "health_summary": "not_supported", "health": {"degraded_bw": "not_supported", "route_recovery": "not_supported",
                                                   "route_unhealthy": "not_supported",
                                                   "access_timeout_recovery": "not_supported"}},
])
def test_fabric_info_reads_back_through_the_reader_and_the_replay(fabric):
    """The recorded group -> the v3 struct the replay fills -> the reader's decode: the same group."""
    s = load_snapshot(FIX / "snapshots" / "h100-healthy.json")
    for g in s["gpus"]:
        g["fabric"] = fabric
    back = replay_snapshot(s)
    assert back["gpus"][3]["fabric"] == fabric and "fabric" not in back["gpus"][3]["errors"]
    status = {r.gpu: r.status for r in replay(back).results if r.gpu is not None}
    assert set(status.values()) == ({W} if fabric["state"] == "completed" else {F})


def test_fabric_info_a_recording_without_it_is_not_in_capture_and_names_what_to_add():
    s = load_snapshot(FIX / "snapshots" / "h100-healthy.json")
    for g in s["gpus"]:
        del g["fabric"]
    back = replay_snapshot(s)
    assert back["gpus"][0]["errors"]["fabric"] == "not_in_capture"
    rec = {"service": {"text": ACTIVE, "error": None}, "log": None, "nvswitch_devices": ["0000:83:00.0"]}
    out = replay(dict(back, fabric_manager=rec))
    assert "not in this capture" in only(out, "node").summary and only(out, "fabric manager service").status == P


def test_decode_uses_pynvmls_own_constants():
    st = pynvml.c_nvmlGpuFabricInfo_v3_t()
    st.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    st.status = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    st.healthSummary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    st.healthMask = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
    f = nvmlfabric.decode(pynvml, st)
    assert (f["state"], f["status"], f["health_summary"]) == ("completed", "insufficient_resources", "unhealthy")
    assert f["health"]["route_unhealthy"] == "true" and f["health"]["degraded_bw"] == "not_supported"
    old = pynvml.c_nvmlGpuFabricInfo_t()  # the first struct (nvmlDeviceGetGpuFabricInfo): no health
    assert nvmlfabric.decode(pynvml, old)["health_summary"] is None
    assert ctypes.sizeof(st) > ctypes.sizeof(old)


def test_snapshot_fixtures_record_fabric():
    for p in sorted((FIX / "snapshots").glob("*.json")):
        for g in json.loads(p.read_text())["gpus"]:
            assert "fabric" in g, p.name


# -- the capture kinds for `gpucheck judge` ----------------------------------------------------------


@pytest.mark.parametrize("path, kind, check, status", [
    (FM / "gpud-h100-535-nvswitch-nonfatal-12028-and-restarts.log", "fabric manager log", "fabric.nvswitch", W),
    (FM / "nvtrust-128-h20-journal-fm-started-then-stopped.log", "fabric manager log", "fabric.nvswitch", F),
    (FM / "cube-studio-29-rtx4090-pre-nvl5-nothing-to-do.log", "fabric manager log", "fabric.nvswitch", S),
    (FIX / "nvsmi_fabric" / "dra-driver-626-fabric-health-unhealthy-grep.txt", "nvidia-smi fabric", "fabric.nvswitch", F),
    (FIX / "lspci" / "gpud-h100-hgx-lspci-vvv-gpus-nics-nvswitch.txt", "lspci", "pcie.aer", P),
])
def test_capture_kinds_detect_read_and_judge_real_captures(path, kind, check, status):
    from gpucheck.platform.fabric.captures import FABRIC_CAPTURE_KINDS

    head = path.read_bytes()[:65536]
    found = [(name, read) for name, detect, read in FABRIC_CAPTURE_KINDS if detect(head, path)]
    assert [name for name, _ in found] == [kind]
    fragment = found[0][1](path)
    snap = doc(**fragment)
    if "gpus" in fragment:  # the judge's assembly fills the GPU entries; here: the fabric group on a real entry
        snap["gpus"] = [gpu_entry(g["fabric"]) for g in fragment["gpus"]]
        snap["nvml"] = {"ok": True, "error": None}
    checks = [c for c in all_checks() if c.id == check]
    out = run_checks(checks, Context(level=Level.QUICK, snapshot=snap, options=RunOptions(snapshot_path=str(path))),
                     install_signal_handlers=False)
    judged = [r for r in out.results if r.status != S] or out.results
    assert {r.status for r in judged} == {status}, [(r.subject, r.status, r.summary) for r in out.results]


def test_capture_kinds_do_not_claim_other_captures():
    from gpucheck.platform.fabric.captures import FABRIC_CAPTURE_KINDS

    others = [*sorted((FIX / "nvsmi").glob("*.txt")), *sorted((FIX / "kernlog").rglob("*.log")),
              *sorted((FIX / "snapshots").glob("*.json"))]
    for p in others:
        assert not [n for n, detect, _ in FABRIC_CAPTURE_KINDS if detect(p.read_bytes()[:65536], p)], p.name
    service = b"ActiveState=failed\nSubState=failed\nResult=exit-code\nLoadState=loaded\n"
    assert [n for n, detect, _ in FABRIC_CAPTURE_KINDS if detect(service, "x")] == ["systemctl show nvidia-fabricmanager"]


def _pci(root: Path, name: str, vendor: str, cls: str) -> None:
    d = root / "bus" / "pci" / "devices" / name
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")


def test_live_a_node_without_nvswitch_skips_and_one_with_them_reads_the_service(tmp_path, monkeypatch):
    """Synthetic sysfs trees: a GPU only (skip, systemctl never run); 4 NVSwitches (class 0x068000)
    whose Fabric Manager cannot be asked (no systemd here): error, never a pass."""
    from gpucheck.core.config import Config
    from gpucheck.platform.fabric import fabricmanager

    calls: list[Any] = []
    monkeypatch.setattr(fabricmanager, "read_service", lambda *a: calls.append(a) or {"text": None,
                                                                                     "error": "systemctl not found"})
    _pci(tmp_path / "a", "0000:18:00.0", "0x10de", "0x030200")
    cfg = Config(checks={"fabric.nvswitch": {"sysfs_root": str(tmp_path / "a"), "log_path": str(tmp_path / "none")}})
    snap = doc(nvml={"ok": True, "error": None})
    (r,) = run_checks(CHECK, Context(level=Level.QUICK, snapshot=snap, config=cfg), install_signal_handlers=False).results
    assert r.status == S and "no NVSwitch on this system" in r.summary and not calls
    for i in range(4):
        _pci(tmp_path / "b", f"0000:8{3 + i}:00.0", "0x10de", "0x068000")
    cfg = Config(checks={"fabric.nvswitch": {"sysfs_root": str(tmp_path / "b"), "log_path": str(tmp_path / "none")}})
    out = run_checks(CHECK, Context(level=Level.QUICK, snapshot=snap, config=cfg), install_signal_handlers=False)
    assert only(out, "fabric manager service").status == E and only(out, "fabric manager log").status == S and calls
