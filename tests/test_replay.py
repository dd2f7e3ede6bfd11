"""Recorded snapshots replay through the live reader, and a run's telemetry comes from one source.

- Replay (gpucheck.platform.telemetry.replay): a recording answers the pynvml calls the reader makes, so
  `--snapshot` goes through the reader's parsing, error mapping and lost-GPU handling. Every
  fixture, and every node the fake pynvml of test_telemetry can describe, reads back exactly;
  what a recording lacks is `not_in_capture` (never a pass); hostile recordings are failed reads,
  never a crash or a hang.
- Sources (gpucheck.platform.telemetry.source): chosen at the edge, carried in the Context; the test hooks
  that used to be threaded through run options are gone.
- NVML's enums come from pynvml's constants, not hand copies.
"""

from __future__ import annotations

import ast
import copy
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from test_telemetry import FakeNode, _clean_nvml_state, field_values, h100, h100_sysfs  # noqa: F401 - autouse fixture

from gpucheck import app
from gpucheck.core.check import Context, RunOptions
from gpucheck.core.levels import Level
from gpucheck.cli.main import main
from gpucheck.tests_suite.registry import all_checks
from gpucheck.core.result import Status
from gpucheck.core.runner import run_checks
from gpucheck.platform.telemetry import enums
from gpucheck.platform.telemetry import nvml as N
from gpucheck.platform.telemetry import snapshot as snapshot_mod
from gpucheck.platform.telemetry.fake import FakeTelemetry
from gpucheck.platform.telemetry.replay import ReplayNvml, recorded_failure, replay_session, replay_snapshot
from gpucheck.platform.telemetry.snapshot import collect_snapshot, dump_snapshot, load_snapshot, validate_snapshot
from gpucheck.platform.telemetry.source import LiveTelemetry, ReplayTelemetry

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "snapshots"
LEVEL1_IDS = {"inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink", "recovery-action"}


def plain(doc):
    return json.loads(json.dumps(doc))


def level1_results(snap):
    checks = [c for c in all_checks() if c.id in LEVEL1_IDS]
    out = run_checks(checks, Context(level=Level.QUICK, snapshot=snap), install_signal_handlers=False)
    return {(r.check, r.subject): (r.status, r.action, r.summary) for r in out.results}


def run_json(capsys, *args):
    rc = main(["run", *args, "--json", "--no-history"])
    return rc, json.loads(capsys.readouterr().out)


# -- every recording reads back through the reader -------------------------------------------------------
@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_every_fixture_replays_through_the_reader_exactly(name):
    doc = load_snapshot(FIXTURES / name)
    replayed = replay_snapshot(doc)
    validate_snapshot(replayed)
    assert plain(replayed) == plain(doc)
    assert level1_results(replayed) == level1_results(doc)


def test_run_snapshot_reads_every_gpu_through_the_reader(monkeypatch, capsys):
    """Before, `--snapshot` handed the JSON straight to the checks: the reader never ran."""
    seen = []
    real = snapshot_mod.read_gpu

    def counting(session, index):
        seen.append((type(session.nvml).__name__, index))
        return real(session, index)

    monkeypatch.setattr(snapshot_mod, "read_gpu", counting)
    rc, v = run_json(capsys, "--snapshot", str(FIXTURES / "h100-gpu-lost.json"))
    assert seen == [("ReplayNvml", i) for i in range(8)]
    assert rc == 1 and v["source"]["kind"] == "snapshot"
    lost = [r for r in v["results"] if r["check"] == "inventory" and r.get("gpu") == 5]
    assert lost and lost[0]["status"] == "fail"


def _fake_nodes():
    """Nodes the fake pynvml of test_telemetry describes: (name, gpus, FakeNode keywords)."""
    no_link_count = field_values({pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (0, 1)})
    return [
        ("healthy", [h100(0), h100(1)], {}),
        ("permission, probed links, not supported", [h100(0), h100(
            1, nvmlDeviceGetRemappedRows=pynvml.NVMLError_NotSupported(),
            nvmlDeviceGetSramEccErrorStatus=pynvml.NVMLError_NoPermission(),
            nvmlDeviceGetFieldValues=no_link_count,
            nvmlDeviceGetNvLinkState=lambda link: 1 if link < 3 else (_ for _ in ()).throw(
                pynvml.NVMLError_InvalidArgument()),
            nvmlDeviceGetNvLinkErrorCounter=lambda link, c: 5 if (link, c) == (2, 0) else 0,
            nvmlDeviceGetTotalEccErrors=lambda e, c: 2 if (e, c) == (1, 0) else 0)], {}),
        ("lost at the handle, reset mid-read", [h100(0, handle=pynvml.NVMLError_GpuIsLost()), h100(
            1, nvmlDeviceGetPcieReplayCounter=pynvml.NVMLError_ResetRequired())], {}),
        ("lost at the links", [h100(0, nvmlDeviceGetNvLinkState=pynvml.NVMLError_GpuIsLost())], {}),
        ("no nvlink, unknown field", [h100(0, nvmlDeviceGetNvLinkState=pynvml.NVMLError_NotSupported(),
                                           nvmlDeviceGetFieldValues=field_values({}))], {}),
        ("a link not supported, a counter unreadable", [h100(
            0, nvmlDeviceGetNvLinkState=lambda link: (_ for _ in ()).throw(pynvml.NVMLError_NotSupported())
            if link == 1 else 1,
            nvmlDeviceGetNvLinkErrorCounter=lambda link, c: (_ for _ in ()).throw(pynvml.NVMLError_Unknown())
            if (link, c) == (3, 2) else 0)], {}),
        ("unreadable links and fields", [h100(
            0, nvmlDeviceGetNvLinkState=pynvml.NVMLError_NoPermission(),
            nvmlDeviceGetTemperature=pynvml.NVMLError_Unknown(),
            nvmlDeviceGetEccMode=pynvml.NVMLError_NoPermission())], {}),
        ("driver not loaded", [], {"init_error": pynvml.NVMLError_DriverNotLoaded()}),
        ("count fails", [h100(0)], {"count": pynvml.NVMLError_LibRmVersionMismatch()}),
    ]


@pytest.mark.parametrize("name,gpus,kw", _fake_nodes(), ids=[n for n, _, _ in _fake_nodes()])
def test_a_live_read_recorded_and_replayed_is_the_same_read(monkeypatch, tmp_path, name, gpus, kw):
    """collect (the reader over fake pynvml) -> dump -> load -> replay (the reader over the
    recording): identical, lost GPUs, failed reads and probed links included."""
    FakeNode(gpus, **kw).install(monkeypatch)
    live = collect_snapshot(sysfs_root=h100_sysfs(tmp_path))
    path = tmp_path / "node.json"
    path.write_text(dump_snapshot(live))
    replayed = replay_snapshot(load_snapshot(path))
    assert plain(replayed) == plain(live)


# -- what a recording lacks, or holds wrong -----------------------------------------------------------------
def _healthy():
    return json.loads((FIXTURES / "h100-healthy.json").read_text())


def test_a_field_the_recording_lacks_is_not_in_capture_never_a_pass(tmp_path, capsys):
    """Before, a missing field read as "not supported": its rule was skipped and the GPU passed."""
    doc = _healthy()
    del doc["gpus"][2]["ecc_errors"]["volatile_uncorrected"]
    path = tmp_path / "trimmed.json"
    path.write_text(json.dumps(doc))
    rc, v = run_json(capsys, "--snapshot", str(path), "--check", "ecc")
    (r,) = [r for r in v["results"] if r.get("gpu") == 2]
    assert r["status"] == "error" and r["summary"] == "ecc_errors.volatile_uncorrected not in this capture"
    assert rc == 3 and v["status"] == "error"
    others = [r["status"] for r in v["results"] if r.get("gpu") != 2]
    assert others and set(others) == {"pass"}


def test_a_group_the_recording_lacks_fails_every_read_of_it():
    doc = _healthy()
    g = doc["gpus"][1]
    for key in ("remapped_rows", "nvlink", "power"):
        del g[key]
    out = replay_snapshot(doc)["gpus"][1]
    assert out["errors"] == {"remapped_rows": "not_in_capture", "nvlink.link_count": "not_in_capture",
                             "nvlink.links[0].state": "not_in_capture", "power.usage_w": "not_in_capture",
                             "power.limit_w": "not_in_capture"}
    assert out["nvlink"] == {"supported": None, "links": []}
    res = level1_results(replay_snapshot(doc))
    assert res[("memory-remap", "gpu1")][0] == Status.ERROR and res[("nvlink", "gpu1")][0] == Status.ERROR
    assert res[("clocks", "gpu1")][0] == Status.WARN


def test_a_replayed_not_in_format_reads_back_as_not_in_capture():
    """not_in_format belongs to converted captures (judged as converted, never replayed); a
    replay that meets one answers it as not in this capture: a failed read, never a value."""
    assert N.classify(recorded_failure(N.NOT_IN_FORMAT, None, "field")).kind == N.NOT_IN_CAPTURE


@pytest.mark.parametrize("kind", [k for k in N.KINDS
                                  if k not in ("not_supported", "gpu_lost", "reset_required", "not_in_format")])
def test_a_recorded_failure_is_raised_as_nvml_raises_it_and_reads_back(kind):
    failure = N.classify(recorded_failure(kind, None, "field"))
    assert failure.kind == kind
    if kind not in (N.NOT_IN_CAPTURE, *N.UNJUDGED_KINDS):  # an NVML return code, pynvml's, mapped by the reader's table
        assert failure.code == N.code(f"NVML_ERROR_{'UNKNOWN' if kind == 'other' else kind.upper()}")
    doc = _healthy()
    doc["gpus"][0]["pcie"]["replay_counter"] = None
    doc["gpus"][0]["errors"] = {"pcie.replay_counter": kind}
    assert plain(replay_snapshot(doc)) == plain(doc)


def test_recorded_messages_keep_their_return_code_or_their_text():
    f = N.classify(recorded_failure("driver_not_loaded", "Driver Not Loaded (NVML return code 9)", "NVML"))
    assert (f.kind, f.code, f.message) == ("driver_not_loaded", 9, "Driver Not Loaded (NVML return code 9)")
    f = N.classify(recorded_failure("other", "NVML did not answer within 30 s (driver hang?)", "NVML"))
    assert (f.kind, f.code, f.message) == ("other", None, "NVML did not answer within 30 s (driver hang?)")


HOSTILE = [
    ("throttle mask negative", lambda g: g["clocks"].update(throttle_reasons=-1), "clocks.throttle_reasons"),
    ("a count as text", lambda g: g["ecc_errors"].update(volatile_uncorrected="0"), "ecc_errors.volatile_uncorrected"),
    ("NaN temperature", lambda g: g["temperature"].update(gpu_c=float("nan")), "temperature.gpu_c"),
    ("a fraction of a page", lambda g: g["retired_pages"].update(single_bit=2.5), "retired_pages.single_bit"),
    ("a flag that is a number", lambda g: g["remapped_rows"].update(pending=1), "remapped_rows"),
    ("a group that is text", lambda g: g.update(ecc_mode="on"), "ecc_mode"),
    ("a link state NVML lacks", lambda g: g["nvlink"]["links"][3].update(state="banana"), "nvlink.links[3].state"),
    ("links that are text", lambda g: g["nvlink"].update(links="many"), "nvlink.link_count"),
]


@pytest.mark.parametrize("name,mutate,field", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_value_no_nvml_call_returns_is_a_failed_read(name, mutate, field):
    doc = _healthy()
    mutate(doc["gpus"][2])
    t0 = time.monotonic()
    g = replay_snapshot(doc)["gpus"][2]
    assert time.monotonic() - t0 < 5
    assert g["errors"].get(field) == "other", g["errors"]
    assert g["state"] == "ok"


def test_hostile_recordings_never_crash_hang_or_pass(tmp_path, capsys):
    doc = _healthy()
    g = doc["gpus"][0]
    g["retired_pages"]["double_bit"] = 10 ** 30  # a page list no machine could hold
    g["errors"] = {"pcie.link_width": "melted"}  # a failure kind gpucheck does not have: other
    doc["gpus"][1]["nvlink"]["links"][0]["link"] = True
    doc["gpus"][3]["state"] = "reset_required"
    doc["gpus"][3]["error"] = {"kind": "reset_required", "message": 42}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    t0 = time.monotonic()
    rc, v = run_json(capsys, "--snapshot", str(path), "--skip", "xid")
    assert time.monotonic() - t0 < 60
    by = {(r["check"], r.get("gpu")): r for r in v["results"]}
    assert by[("memory-remap", 0)]["status"] in ("error", "warn")
    assert by[("pcie", 0)]["status"] == "error" and "pcie.link_width (other)" in by[("pcie", 0)]["summary"]
    assert by[("nvlink", 1)]["status"] == "error"
    assert by[("inventory", 3)]["status"] == "fail"  # recorded as needing a reset
    assert rc == 1


def test_a_lost_gpu_recording_that_holds_every_field_is_lost_at_the_handle():
    doc = _healthy()
    doc["gpus"][4]["state"] = "lost"
    doc["gpus"][4]["error"] = {"kind": "gpu_lost", "message": "GPU is lost (NVML return code 15)"}
    g = replay_snapshot(doc)["gpus"][4]
    assert g["state"] == "lost" and g["uuid"] is None
    assert g["error"] == {"kind": "gpu_lost", "message": "GPU is lost (NVML return code 15)"}


def test_a_value_recorded_only_by_its_name_is_answered_with_its_nvml_number():
    """A converted nvidia-smi -q names the architecture, the recovery action and the clock-event
    reasons; NVML would have answered their numbers, and the reader names them again."""
    doc = _healthy()
    g = doc["gpus"][1]
    del g["architecture_id"], g["recovery_action"], g["clocks"]["throttle_reasons"]
    g["recovery_action_name"] = "node_reboot"
    g["clocks"]["throttle_reason_names"] = ["sw_power_cap", "hw_slowdown"]
    out = replay_snapshot(doc)["gpus"][1]
    assert (out["architecture_id"], out["recovery_action"], out["clocks"]["throttle_reasons"]) == (
        pynvml.NVML_DEVICE_ARCH_HOPPER, pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT, 0x4 | 0x8)
    assert out["errors"] == {} and out["clocks"]["throttle_reason_names"] == ["sw_power_cap", "hw_slowdown"]
    g["architecture"] = "steam"  # a name NVML does not have: not in this capture
    assert replay_snapshot(doc)["gpus"][1]["errors"] == {"architecture": "not_in_capture"}


def test_keys_the_reader_does_not_read_are_kept_as_recorded():
    doc = _healthy()
    doc["gpus"][0]["processes"] = [{"pid": 7, "name": "python"}]
    doc["kernel_log"] = {"source": "dmesg", "lines": []}
    out = replay_snapshot(doc)
    assert out["gpus"][0]["processes"] == [{"pid": 7, "name": "python"}] and out["kernel_log"] == doc["kernel_log"]


def test_a_replay_samples_and_lists_processes_through_the_same_readers():
    doc = _healthy()
    source = ReplayTelemetry(doc)
    session = source.sampling([0], watch_xid=True)
    try:
        s = session.sample(0)
        assert (s["sm_clock_mhz"], s["temperature_c"], s["throttle_reasons"]) == (
            doc["gpus"][0]["clocks"]["sm_mhz"], doc["gpus"][0]["temperature"]["gpu_c"],
            doc["gpus"][0]["clocks"]["throttle_reasons"])
        assert session.xid_note.startswith("Xid events not watched during the load: not_in_capture")
    finally:
        session.close()
    (procs,) = source.gpu_processes([0]).values()
    assert not procs.readable and procs.failure.kind == "not_in_capture"  # never "idle"
    assert not source.watches("cuda") and not source.watches("cpu")


def test_the_replay_answers_with_pynvml_constants_and_refuses_what_it_does_not_hold():
    nv = ReplayNvml(_healthy())
    assert nv.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert nv.c_nvmlEccSramErrorStatus_v1_t is pynvml.c_nvmlEccSramErrorStatus_v1_t
    with pytest.raises(N.NotInCapture):
        nv.nvmlDeviceGetBAR1MemoryInfo(0)
    with replay_session(_healthy()) as s:
        value, err = s.read("nvmlDeviceGetHandleByIndex", 99)
        assert value is None and err.code == pynvml.NVML_ERROR_INVALID_ARGUMENT


# -- sources at the edge, in the context ------------------------------------------------------------------
def test_the_old_test_hooks_are_not_options_any_more():
    for hook in ("sample_fn", "xid_fn", "snapshot_fn", "gpu_processes_fn"):
        with pytest.raises(TypeError, match=hook):
            Context(options={hook: lambda *a: None})
    assert isinstance(Context().telemetry, LiveTelemetry)
    assert Context(options={"xid_since": "@3"}).options == RunOptions(xid_since="@3")


def test_a_burn_config_cannot_turn_fp8_on_for_cpu_workers():
    """BurnConfig.fp8_on_cpu let a worker's args run fp8 on the CPU: a test hook in the product."""
    torch = pytest.importorskip("torch")
    from gpucheck.compute.gemm import BurnConfig, Burner
    from gpucheck.workers.pool import LocalChannel, WorkerJob

    cfg = BurnConfig.from_args({"duration_s": 0.2, "dtypes": ["fp8"], "size": 32, "fp8_on_cpu": True})
    assert not hasattr(cfg, "fp8_on_cpu")
    out = Burner(torch, torch.device("cpu"), LocalChannel(WorkerJob("t", gpu=0, device="cpu")), cfg).run()
    assert "fp8" not in out["dtypes"] and "fp8 runs only on CUDA GPUs" in out["skipped"]["fp8"]


def test_a_source_handed_to_the_run_is_the_one_it_judges(capsys):
    doc = json.loads((FIXTURES / "h100-remap-pending.json").read_text())
    fake = FakeTelemetry(doc)
    req = app.RunRequest(level=1, skip_patterns=["xid"], json=True, history=False, telemetry=fake)
    rc = app.execute(req)
    v = json.loads(capsys.readouterr().out)
    assert fake.reads == 1 and v["source"]["kind"] == "live"
    assert rc == 1 and any(r["check"] == "memory-remap" and r["status"] == "fail" for r in v["results"])


def test_a_hung_source_is_judged_unreadable_and_keeps_its_own_facts():
    class Hung(ReplayTelemetry):
        def snapshot(self, timeout_s=None):
            time.sleep(5)
            return super().snapshot()

    source = Hung(_healthy())
    snap = app._collect_live(source, 0.2)
    assert snap["nvml"]["ok"] is False and "did not answer" in snap["nvml"]["error"]["message"]
    assert snap["host"] == "gpu-h100-017" and len(snap["pci_nvidia_devices"]) == 8  # the recording's, not this node's


def test_the_sampler_and_the_guard_read_the_contexts_source():
    from gpucheck.workers.busy import guard_context
    from gpucheck.platform.telemetry.nvml import GpuProcess, GpuProcesses

    asked = []

    def processes(indices):
        asked.append(list(indices))
        return {i: GpuProcesses(i, (GpuProcess(4711, 1 << 30, ("compute",), "python"),) if i == 1 else ())
                for i in indices}

    ctx = Context(device="cuda", telemetry=FakeTelemetry(processes=processes))
    guard = guard_context(ctx, "cuda", "burn.gemm", [0, 1])
    assert asked == [[0, 1]] and guard.loaded == [0] and guard.skipped[0].gpu == 1


def test_xid_events_are_watched_through_the_session():
    lost = SimpleNamespace(device="h3", eventData=79)
    state = {"waits": 0}

    class Events:
        NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
        nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

        def nvmlInit(self):
            pass

        def nvmlShutdown(self):
            pass

        def nvmlDeviceGetHandleByIndex(self, i):
            return f"h{i}"

        def nvmlEventSetCreate(self):
            return "set"

        def nvmlDeviceRegisterEvents(self, h, etype, es):
            assert etype == pynvml.nvmlEventTypeXidCriticalError

        def nvmlEventSetWait_v2(self, es, ms):
            state["waits"] += 1
            if state["waits"] == 1:
                return lost
            raise pynvml.NVMLError_Timeout()

        def nvmlDeviceGetIndex(self, h):
            return int(h[1:])

        def nvmlEventSetFree(self, es):
            state["freed"] = True

    from gpucheck.platform.telemetry.source import NvmlSampling

    session = NvmlSampling(N.NvmlSession(N.Library(Events)), [3], watch_xid=True)
    assert session.xid_note is None
    assert session.poll_xid() == [(3, 79)]
    assert session.poll_xid() == []
    session.close()
    assert state["freed"]


# -- NVML's enums ------------------------------------------------------------------------------------------
ALLOWED_NUMBERS = {"VERSION", "NOT_IN_CAPTURE_RETURN", "NVIDIA_VENDOR", "GPU_CLASSES", "READ_TIMEOUT_S"}


def _module_numbers(path: Path) -> list[str]:
    """Module-level names bound to an int literal, or to a dict with int-literal keys."""
    found = []
    for node in ast.parse(path.read_text()).body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        names = [t.id for t in targets if isinstance(t, ast.Name)] + [
            e.id for t in targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)]
        literal_int = isinstance(value, ast.Constant) and type(value.value) is int
        tuple_ints = isinstance(value, (ast.Tuple, ast.List)) and any(
            isinstance(e, ast.Constant) and type(e.value) is int for e in value.elts)
        int_keys = isinstance(value, ast.Dict) and any(
            isinstance(k, ast.Constant) and type(k.value) is int for k in value.keys)
        if literal_int or tuple_ints or int_keys:
            found.extend(n for n in names if n not in ALLOWED_NUMBERS)
    return found


def test_the_telemetry_code_copies_no_nvml_number():
    """Before: ARCHITECTURES {2: "kepler", ...}, _CODE_KIND {3: ...}, FI_GPU_RECOVERY_ACTION = 230,
    the throttle bits, _VALUE_MEMBER, NVML_ERROR_TIMEOUT = 10 in the sampler, ..."""
    files = sorted((ROOT / "gpucheck" / "platform" / "telemetry").glob("*.py")) + [
        ROOT / "gpucheck" / "workers" / "sampler.py"]
    copied = {p.name: _module_numbers(p) for p in files}
    assert {k: v for k, v in copied.items() if v} == {}


def test_the_enum_tables_name_pynvml_constants():
    for table in (enums.ARCHITECTURES, enums.RECOVERY_ACTIONS, enums.NVLINK_STATES, enums.NVLINK_COUNTERS):
        resolved = enums.resolve(pynvml, table)
        assert resolved and all(getattr(pynvml, const) == resolved[name] for name, const in table if name in resolved)
    bits = enums.throttle_bits()
    assert bits["hw_slowdown"] == pynvml.nvmlClocksThrottleReasonHwSlowdown
    assert bits["board_limit"] == pynvml.nvmlClocksThrottleReasonBoardLimit and len(bits) == 11


def test_a_constant_this_pynvml_lacks_reads_as_not_supported(monkeypatch, tmp_path):
    FakeNode([h100(0)]).install(monkeypatch)
    monkeypatch.delattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    monkeypatch.delattr(pynvml, "NVML_TEMPERATURE_THRESHOLD_GPU_MAX")
    g = collect_snapshot(sysfs_root=tmp_path)["gpus"][0]
    assert g["recovery_action"] is None and g["temperature"]["gpu_max_c"] is None and g["errors"] == {}
    assert g["temperature"]["slowdown_c"] == 90


def test_importing_the_telemetry_package_imports_no_pynvml():
    import subprocess
    import sys

    code = ("import sys, gpucheck.platform.telemetry, gpucheck.platform.telemetry.source, gpucheck.core.check, gpucheck.app; "
            "assert 'pynvml' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_copy_of_a_recording_is_not_changed_by_its_replay():
    doc = _healthy()
    before = copy.deepcopy(doc)
    replay_snapshot(doc)
    assert doc == before


def test_replays_in_threads_do_not_share_handles():
    docs = [_healthy(), json.loads((FIXTURES / "v100-retired-pages.json").read_text())]
    out: dict[int, object] = {}

    def work(i):
        out[i] = plain(replay_snapshot(docs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {0: plain(docs[0]), 1: plain(docs[1])}
