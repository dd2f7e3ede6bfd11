"""The telemetry layer on a machine without GPUs: the NVML choke point's error mapping (the real
pynvml exception classes, raised from monkeypatched pynvml functions), snapshot collection from a
fake node, sysfs scanning of a temporary tree, snapshot loading, and `gpucheck telemetry dump`."""

from __future__ import annotations

import ctypes
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpucheck.core.check import Context
from gpucheck.cli.main import main
from gpucheck.tests_suite.registry import all_checks
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks
from gpucheck.platform.telemetry import nvml as N
from gpucheck.platform.telemetry.snapshot import (
    SnapshotError,
    collect_snapshot,
    dump_snapshot,
    load_snapshot,
    unreadable_snapshot,
    validate_snapshot,
)
from gpucheck.platform.telemetry.sysfs import nvidia_pci_devices
from gpucheck.platform.telemetry.throttle import reason_names

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"
LEVEL1_IDS = {"inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink", "recovery-action"}


def level1():
    return [c for c in all_checks() if c.id in LEVEL1_IDS]


def _real_nvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _clean_nvml_state():
    """Every test starts and ends with NVML not initialised in this process."""
    N._LIB._shutdown_at_exit()
    yield
    for th in threading.enumerate():
        if th.name == "gpucheck-nvml-read":
            th.join(5)
    N._LIB._shutdown_at_exit()


# -- a fake node: pynvml functions monkeypatched on the real module ---------------------------------
class FakeNode:
    """GPUs as dicts of pynvml function name -> value, exception instance, or callable(*args).
    Any nvml* function a GPU does not define raises the real NVMLError_NotSupported."""

    def __init__(self, gpus: list[dict[str, Any]], *, init_error: BaseException | None = None,
                 count: Any = None, system: dict[str, Any] | None = None):
        self.gpus = gpus
        self.init_error = init_error
        self.count = count if count is not None else len(gpus)
        self.system = {
            "nvmlSystemGetDriverVersion": "550.90.07",
            "nvmlSystemGetNVMLVersion": "12.550.90.07",
            "nvmlSystemGetCudaDriverVersion": 12040,
            **(system or {}),
        }
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeNode":
        for name in dir(pynvml):
            if name.startswith("nvml") and callable(getattr(pynvml, name)) and name[4:5].isupper():
                monkeypatch.setattr(pynvml, name, self._device_fn(name))
        monkeypatch.setattr(pynvml, "nvmlInit", self._init)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: self._count("nvmlShutdown"))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", self._get_count)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", self._handle)
        for name in self.system:
            monkeypatch.setattr(pynvml, name, self._system_fn(name))
        return self

    @staticmethod
    def _value(v: Any, *args: Any) -> Any:
        if isinstance(v, BaseException):
            raise v
        if callable(v):
            return v(*args)
        return v

    def _init(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def _get_count(self) -> int:
        self._count("nvmlDeviceGetCount")
        return self._value(self.count)

    def _handle(self, index: int) -> int:
        self._count("nvmlDeviceGetHandleByIndex")
        if index >= len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        self._value(self.gpus[index].get("handle"))
        return index

    def _system_fn(self, name: str):
        def fn(*args: Any) -> Any:
            self._count(name)
            return self._value(self.system[name], *args)
        return fn

    def _device_fn(self, name: str):
        def fn(handle: Any, *args: Any) -> Any:
            self._count(name)
            if not isinstance(handle, int) or handle >= len(self.gpus):
                raise pynvml.NVMLError_NotSupported()
            gpu = self.gpus[handle]
            if name not in gpu:
                raise pynvml.NVMLError_NotSupported()
            return self._value(gpu[name], *args)
        return fn


def field_values(values: dict[int, tuple[int, int]]):
    """A fake nvmlDeviceGetFieldValues: field id -> (nvmlReturn, unsigned int value)."""
    def fn(field_ids: list[int]) -> list[Any]:
        out = []
        for fid in field_ids:
            ret, val = values.get(fid, (pynvml.NVML_ERROR_NOT_SUPPORTED, 0))
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=ret, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                       value=SimpleNamespace(uiVal=val)))
        return out
    return fn


def sram_status(volatile_unc: int, aggregate_unc: int, exceeded: bool):
    def fn(ref: Any) -> int:
        st = ref._obj  # ctypes.byref(struct)
        st.volatileUncParity, st.volatileUncSecDed = volatile_unc, 0
        st.aggregateUncParity, st.aggregateUncSecDed = aggregate_unc, 0
        st.bThresholdExceeded = int(exceeded)
        return pynvml.NVML_SUCCESS
    return fn


def h100(i: int, **over: Any) -> dict[str, Any]:
    """One H100 SXM as pynvml would describe it (values modelled on nvidia-smi -q)."""
    bus = ["00000000:18:00.0", "00000000:2A:00.0"][i]
    g: dict[str, Any] = {
        "nvmlDeviceGetUUID": f"GPU-5e1f0c3a-77d2-4b1e-9a3c-0000000000{i:02d}",
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetSerial": f"16523220{i:05d}",
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=bus.encode(), pciDeviceId=0x233010DE),
        "nvmlDeviceGetArchitecture": pynvml.NVML_DEVICE_ARCH_HOPPER,
        "nvmlDeviceGetPersistenceMode": 1,
        "nvmlDeviceGetEccMode": [1, 1],
        "nvmlDeviceGetMigMode": [0, 0],
        "nvmlDeviceGetTotalEccErrors": lambda etype, ctype: 0,
        "nvmlDeviceGetMemoryErrorCounter": lambda etype, ctype, loc: 0,
        "nvmlDeviceGetSramEccErrorStatus": sram_status(0, 0, False),
        "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetTemperature": lambda sensor: 33,
        "nvmlDeviceGetTemperatureThreshold": lambda t: {0: 92, 1: 90, 3: 87}[t],
        "nvmlDeviceGetClockInfo": lambda clk: 1980,
        "nvmlDeviceGetMaxClockInfo": lambda clk: 1980,
        "nvmlDeviceGetCurrentClocksEventReasons": 0x1,
        "nvmlDeviceGetPowerUsage": 118400,
        "nvmlDeviceGetEnforcedPowerLimit": 700000,
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetGpuMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetPcieReplayCounter": 0,
        "nvmlDeviceGetFieldValues": field_values({pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (0, 4),
                                                  pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (0, 0)}),
        "nvmlDeviceGetNvLinkState": lambda link: 1,
        "nvmlDeviceGetNvLinkErrorCounter": lambda link, counter: 0,
    }
    g.update(over)
    return g


def pci_tree(root: Path, devices: list[tuple[str, int, int, int, str | None]]) -> Path:
    """A /sys/bus/pci/devices tree: (address, vendor, class, device, driver)."""
    base = root / "bus" / "pci" / "devices"
    base.mkdir(parents=True)
    drivers = root / "bus" / "pci" / "drivers"
    for addr, vendor, cls, dev, driver in devices:
        d = base / addr
        d.mkdir()
        (d / "vendor").write_text(f"{vendor:#06x}\n")
        (d / "class").write_text(f"{cls:#08x}\n")
        (d / "device").write_text(f"{dev:#06x}\n")
        if driver:
            (drivers / driver).mkdir(parents=True, exist_ok=True)
            (d / "driver").symlink_to(drivers / driver)
    return root


def h100_sysfs(tmp_path: Path, n: int = 2, driver: str | None = "nvidia") -> Path:
    addrs = ["0000:18:00.0", "0000:2a:00.0"][:n]
    return pci_tree(tmp_path / "sys", [(a, 0x10DE, 0x030200, 0x2330, driver) for a in addrs]
                    + [("0000:00:00.0", 0x8086, 0x060000, 0x09A2, None)])


# -- error mapping ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "exc, kind",
    [
        (pynvml.NVMLError_NotSupported, "not_supported"),
        (pynvml.NVMLError_FunctionNotFound, "not_supported"),
        (pynvml.NVMLError_GpuIsLost, "gpu_lost"),
        (pynvml.NVMLError_ResetRequired, "reset_required"),
        (pynvml.NVMLError_NoPermission, "no_permission"),
        (pynvml.NVMLError_DriverNotLoaded, "driver_not_loaded"),
        (pynvml.NVMLError_LibraryNotFound, "library_not_found"),
        (pynvml.NVMLError_Unknown, "other"),
        (pynvml.NVMLError_LibRmVersionMismatch, "other"),
        (pynvml.NVMLError_Timeout, "other"),
    ],
)
def test_every_nvml_error_maps_to_one_kind(exc, kind):
    f = N.classify(exc())
    assert f.kind == kind
    assert f.code == exc().value
    assert str(exc().value) in f.message


def test_missing_pynvml_module_is_our_installation_problem_not_a_missing_driver(monkeypatch, tmp_path):
    def no_module():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(N, "import_pynvml", no_module)
    monkeypatch.setattr(N._LIB, "module", None)
    s = N.NvmlSession()
    assert not s.ok and s.error.kind == "internal_error"
    assert s.sample(0)["error"] == "internal_error"
    snap = collect_snapshot(sysfs_root=tmp_path)
    assert snap["nvml"] == {"ok": False, "error": {"kind": "internal_error", "message": snap["nvml"]["error"]["message"]}}
    assert "pynvml" in snap["nvml"]["error"]["message"]


@pytest.mark.skipif(_real_nvml_present(), reason="a real NVML library is installed here")
def test_this_machine_without_driver_gives_library_not_found_and_never_raises(tmp_path):
    with N.NvmlSession() as s:
        assert not s.ok
        assert s.error.kind == "library_not_found"
        assert s.device_count() is None
        sample = s.sample(0)
    assert sample["error"] == "library_not_found"
    assert {sample[k] for k in ("sm_clock_mhz", "temperature_c", "power_w", "throttle_reasons")} == {None}
    assert isinstance(sample["time"], float)
    snap = collect_snapshot(sysfs_root=tmp_path)
    validate_snapshot(snap)
    assert snap["nvml"]["ok"] is False and snap["gpus"] == []


# -- sessions: init once, shut down once, cheap sampling --------------------------------------------
def test_init_once_shutdown_once_across_sessions(monkeypatch):
    node = FakeNode([h100(0)]).install(monkeypatch)
    with N.NvmlSession() as a:
        with N.NvmlSession() as b:
            assert a.ok and b.ok
            assert b.device_count() == 1
        assert node.calls.get("nvmlShutdown", 0) == 0
    assert node.calls["nvmlInit"] == 1
    assert node.calls["nvmlShutdown"] == 1


def test_sample_is_cheap_and_typed(monkeypatch):
    node = FakeNode([h100(0, nvmlDeviceGetCurrentClocksEventReasons=0x48, nvmlDeviceGetPowerUsage=351234)]).install(monkeypatch)
    samples = [N.NvmlSession().sample(0) for _ in range(5)]  # the sampler's pattern: one session per call
    assert node.calls["nvmlInit"] == 1
    assert node.calls["nvmlDeviceGetHandleByIndex"] == 1
    s = samples[-1]
    assert s["sm_clock_mhz"] == 1980 and s["temperature_c"] == 33 and s["power_w"] == 351.234
    assert s["throttle_reasons"] == 0x48
    assert s["throttle_reason_names"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert s["error"] is None
    assert samples[0]["time"] <= s["time"] <= time.time()


def test_sample_of_a_lost_gpu_returns_nones(monkeypatch):
    FakeNode([h100(0, nvmlDeviceGetTemperature=pynvml.NVMLError_GpuIsLost(),
                   nvmlDeviceGetClockInfo=pynvml.NVMLError_GpuIsLost(),
                   nvmlDeviceGetPowerUsage=pynvml.NVMLError_GpuIsLost(),
                   nvmlDeviceGetCurrentClocksEventReasons=pynvml.NVMLError_GpuIsLost())]).install(monkeypatch)
    with N.NvmlSession() as s:
        out = s.sample(0)
        missing = s.sample(7)
    assert out["error"] == "gpu_lost"
    assert out["temperature_c"] is None and out["throttle_reason_names"] is None
    assert missing["error"] == "other"  # no GPU 7: NVML's INVALID_ARGUMENT


def test_throttle_reasons_fall_back_to_the_pre_r535_call(monkeypatch):
    FakeNode([h100(0, nvmlDeviceGetCurrentClocksEventReasons=pynvml.NVMLError_FunctionNotFound(),
                   nvmlDeviceGetCurrentClocksThrottleReasons=0x20)]).install(monkeypatch)
    snap = collect_snapshot(sysfs_root=Path("/nonexistent"))
    assert snap["gpus"][0]["clocks"]["throttle_reasons"] == 0x20
    assert snap["gpus"][0]["clocks"]["throttle_reason_names"] == ["sw_thermal_slowdown"]


def test_reason_names_cover_unknown_bits():
    assert reason_names(0) == []
    assert reason_names(0x1 | 0x80 | 0x800) == ["gpu_idle", "hw_power_brake_slowdown", "unknown_0x800"]


# -- collecting a fake node -------------------------------------------------------------------------
def test_collect_snapshot_of_a_fake_node(monkeypatch, tmp_path):
    gpu1 = h100(
        1,
        nvmlDeviceGetRemappedRows=pynvml.NVMLError_NotSupported(),
        nvmlDeviceGetSramEccErrorStatus=pynvml.NVMLError_NoPermission(),
        nvmlDeviceGetFieldValues=field_values({pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (0, 1)}),
        nvmlDeviceGetNvLinkState=lambda link: 1 if link < 3 else (_ for _ in ()).throw(pynvml.NVMLError_InvalidArgument()),
        nvmlDeviceGetNvLinkErrorCounter=lambda link, c: 5 if (link, c) == (2, pynvml.NVML_NVLINK_ERROR_DL_REPLAY) else 0,
        nvmlDeviceGetTotalEccErrors=lambda e, c: 2 if (e, c) == (1, 0) else 0,
    )
    FakeNode([h100(0), gpu1]).install(monkeypatch)
    snap = collect_snapshot(sysfs_root=h100_sysfs(tmp_path))
    validate_snapshot(snap)
    json.loads(dump_snapshot(snap))  # plain JSON data
    assert snap["nvml"] == {"ok": True, "error": None}
    assert (snap["driver_version"], snap["cuda_driver_version"], snap["nvml_version"]) == ("550.90.07", "12.4", "12.550.90.07")
    assert [d["bus_id"] for d in snap["pci_nvidia_devices"]] == ["0000:18:00.0", "0000:2a:00.0"]
    g0, g1 = snap["gpus"]
    assert g0["pci_bus_id"] == "0000:18:00.0" and g1["pci_bus_id"] == "0000:2a:00.0"
    assert g0["pci_device_id"] == "0x2330"
    assert g0["architecture"] == "hopper" and g0["architecture_id"] == 9
    assert g0["ecc_mode"] == {"current": True, "pending": True}
    assert g0["mig_mode"] == {"current": False, "pending": False}
    assert g0["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert g0["ecc_errors"]["sram_threshold_exceeded"] is False
    assert g0["temperature"] == {"gpu_c": 33, "slowdown_c": 90, "shutdown_c": 92, "gpu_max_c": 87}
    assert g0["clocks"]["throttle_reason_names"] == ["gpu_idle"]
    assert g0["power"] == {"usage_w": 118.4, "limit_w": 700.0}
    assert g0["nvlink"]["supported"] is True and len(g0["nvlink"]["links"]) == 4  # from field 91
    assert g0["recovery_action"] == 0 and g0["recovery_action_name"] == "none"
    assert g0["retired_pages"] == {"single_bit": None, "double_bit": None, "pending": None}  # not supported
    assert g0["errors"] == {}
    # GPU 1: not supported is None and not an error; a permission failure is recorded
    assert g1["remapped_rows"] == {"correctable": None, "uncorrectable": None, "pending": None, "failure": None}
    assert g1["errors"] == {"ecc_errors.sram_threshold_exceeded": "no_permission"}
    assert g1["ecc_errors"]["volatile_uncorrected"] == 2
    assert g1["recovery_action"] == 1 and g1["recovery_action_name"] == "gpu_reset"
    # no link-count field: links are probed until NVML says the index is invalid
    assert [lk["link"] for lk in g1["nvlink"]["links"]] == [0, 1, 2]
    assert g1["nvlink"]["links"][2]["replay_errors"] == 5
    # judged through the real runner
    out = run_checks(level1(), Context(snapshot=snap), install_signal_handlers=False)
    bad = {(r.check, r.subject, r.status, r.action) for r in out.results if r.status != Status.PASS}
    assert bad == {
        ("ecc", "gpu1", Status.FAIL, Action.RESET_GPU),
        ("recovery-action", "gpu1", Status.FAIL, Action.RESET_GPU),
        ("memory-remap", "gpu1", Status.SKIP, Action.NONE),
        ("nvlink", "gpu1", Status.WARN, Action.INVESTIGATE),
    }


def test_lost_and_reset_required_gpus(monkeypatch, tmp_path):
    lost_at_handle = h100(0, handle=pynvml.NVMLError_GpuIsLost())
    reset_mid_read = h100(1, nvmlDeviceGetPcieReplayCounter=pynvml.NVMLError_ResetRequired())
    FakeNode([lost_at_handle, reset_mid_read]).install(monkeypatch)
    snap = collect_snapshot(sysfs_root=h100_sysfs(tmp_path))
    validate_snapshot(snap)
    g0, g1 = snap["gpus"]
    assert g0["state"] == "lost" and g0["error"]["kind"] == "gpu_lost" and g0["uuid"] is None
    assert g1["state"] == "reset_required" and g1["error"]["kind"] == "reset_required"
    assert g1["uuid"].startswith("GPU-")  # read before the failure
    assert g1["nvlink"] == {"supported": None, "links": []}  # not read after it
    out = run_checks(level1(), Context(snapshot=snap), install_signal_handlers=False)
    per_gpu = {(r.check, r.gpu): (r.status, r.action) for r in out.results if r.gpu is not None}
    assert per_gpu[("ecc", 0)] == (Status.FAIL, Action.REBOOT)
    assert per_gpu[("nvlink", 1)] == (Status.FAIL, Action.RESET_GPU)
    assert per_gpu[("inventory", 1)] == (Status.FAIL, Action.RESET_GPU)


def test_driver_not_loaded_with_gpus_on_the_bus(monkeypatch, tmp_path):
    node = FakeNode([], init_error=pynvml.NVMLError_DriverNotLoaded()).install(monkeypatch)
    snap = collect_snapshot(sysfs_root=h100_sysfs(tmp_path, driver=None))
    validate_snapshot(snap)
    assert snap["nvml"]["ok"] is False and snap["nvml"]["error"]["kind"] == "driver_not_loaded"
    assert [d["driver"] for d in snap["pci_nvidia_devices"]] == [None, None]
    assert node.calls.get("nvmlShutdown", 0) == 0  # never initialised, never shut down
    out = run_checks(level1(), Context(snapshot=snap), install_signal_handlers=False)
    inv = [r for r in out.results if r.check == "inventory"]
    assert [(r.status, r.action) for r in inv] == [(Status.FAIL, Action.REBOOT)]
    assert "driver not loaded or GPU lost" in inv[0].summary


def test_device_count_failure_makes_nvml_unusable(monkeypatch, tmp_path):
    FakeNode([h100(0)], count=pynvml.NVMLError_Unknown()).install(monkeypatch)
    snap = collect_snapshot(sysfs_root=tmp_path)
    assert snap["nvml"]["ok"] is False and snap["nvml"]["error"]["kind"] == "other"


def test_gpu_without_nvlink_and_recovery_field_unknown_to_the_driver(monkeypatch, tmp_path):
    pcie_card = h100(
        0,
        nvmlDeviceGetNvLinkState=pynvml.NVMLError_NotSupported(),
        nvmlDeviceGetFieldValues=field_values({pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                                               (pynvml.NVML_ERROR_INVALID_ARGUMENT, 0)}),
    )
    FakeNode([pcie_card]).install(monkeypatch)
    snap = collect_snapshot(sysfs_root=tmp_path)
    g = snap["gpus"][0]
    assert g["nvlink"] == {"supported": False, "links": []}
    assert g["recovery_action"] is None and g["errors"] == {}
    out = run_checks(level1(), Context(snapshot=snap), install_signal_handlers=False)
    by = {r.check: r for r in out.results if r.gpu == 0}
    assert by["nvlink"].status == Status.SKIP and "no NvLink" in by["nvlink"].summary
    assert by["recovery-action"].status == Status.PASS
    assert "not supported by this driver" in by["recovery-action"].summary
    assert by["recovery-action"].metrics["recovery_action"] is None


def test_a_stuck_driver_call_times_out(monkeypatch, tmp_path):
    def slow_count():
        time.sleep(0.6)
        return 1

    FakeNode([h100(0)], count=slow_count).install(monkeypatch)
    t0 = time.monotonic()
    snap = collect_snapshot(sysfs_root=tmp_path, timeout_s=0.1)
    assert time.monotonic() - t0 < 0.5
    assert snap["nvml"]["ok"] is False and snap["nvml"]["error"]["kind"] == "timeout"
    assert "did not answer" in snap["nvml"]["error"]["message"]
    validate_snapshot(snap)
    for th in threading.enumerate():  # let the abandoned reader finish while the fake is installed
        if th.name == "gpucheck-nvml-read":
            th.join(5)


# -- sysfs ------------------------------------------------------------------------------------------
def test_sysfs_lists_nvidia_gpus_only(tmp_path):
    root = pci_tree(tmp_path, [
        ("0000:18:00.0", 0x10DE, 0x030200, 0x2330, "nvidia"),  # H100 SXM: 3D controller
        ("0000:18:00.1", 0x10DE, 0x040300, 0x22BA, None),  # the GPU's audio function
        ("0000:05:00.0", 0x10DE, 0x068000, 0x22A3, None),  # NVSwitch (bridge class)
        ("0000:3b:00.0", 0x10DE, 0x030000, 0x2684, None),  # a VGA-class NVIDIA GPU, no driver bound
        ("0000:00:01.0", 0x8086, 0x060400, 0x1901, "pcieport"),
    ])
    assert nvidia_pci_devices(root) == [
        {"bus_id": "0000:18:00.0", "class": "0x030200", "device": "0x2330", "driver": "nvidia"},
        {"bus_id": "0000:3b:00.0", "class": "0x030000", "device": "0x2684", "driver": None},
    ]
    assert nvidia_pci_devices(tmp_path / "missing") == []


# -- loading ----------------------------------------------------------------------------------------
def _good() -> dict[str, Any]:
    return json.loads((FIXTURES / "no-nvidia-devices.json").read_text())


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: d.update(kind="gpucheck.verdict"), "not a gpucheck snapshot"),
        (lambda d: d.update(version=2), "unsupported snapshot version"),
        (lambda d: d.pop("gpus"), "missing gpus"),
        (lambda d: d.update(nvml={"ok": False, "error": {"kind": "weird", "message": "x"}}), "nvml.error"),
        (lambda d: d.update(nvml={"ok": False, "error": None}), "says nothing"),
        (lambda d: d.update(gpus=[{"index": 0}, {"index": 0}]), "appears twice"),
        (lambda d: d.update(gpus=[{"index": 0, "state": "melted"}]), "state must be one of"),
        (lambda d: d.update(synthetic="yes"), "'synthetic' has the wrong type"),
    ],
)
def test_load_snapshot_rejects_what_is_not_one(tmp_path, mutate, words):
    d = _good()
    mutate(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(SnapshotError) as e:
        load_snapshot(p)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_load_snapshot_bad_json_missing_file_and_wrong_shape(tmp_path):
    p = tmp_path / "torn.json"
    p.write_text('{"kind": "gpucheck.snapshot", "vers')
    with pytest.raises(SnapshotError, match="not JSON"):
        load_snapshot(p)
    with pytest.raises(SnapshotError, match="no such file"):
        load_snapshot(tmp_path / "absent.json")
    p.write_text("[1, 2]")
    with pytest.raises(SnapshotError, match="JSON object"):
        load_snapshot(p)


def test_every_fixture_is_a_synthetic_snapshot_that_says_so():
    files = sorted(FIXTURES.glob("*.json"))
    assert len(files) >= 15
    for f in files:
        snap = load_snapshot(f)
        assert snap["synthetic"] is True
        assert snap["source"].startswith("synthetic: hand-made for tests, modelled on"), f.name


# -- the command ------------------------------------------------------------------------------------
def test_dump_writes_a_valid_snapshot_of_a_broken_node(monkeypatch, tmp_path, capsys):
    FakeNode([], init_error=pynvml.NVMLError_DriverNotLoaded()).install(monkeypatch)
    out = tmp_path / "node.json"
    rc = main(["telemetry", "dump", "-o", str(out), "--sysfs-root", str(h100_sysfs(tmp_path))])
    assert rc == 0
    snap = load_snapshot(out)
    assert snap["nvml"]["ok"] is False and snap["nvml"]["error"]["kind"] == "driver_not_loaded"
    assert len(snap["pci_nvidia_devices"]) == 2 and snap["synthetic"] is False
    assert isinstance(snap["kernel_log"], dict) and "lines" in snap["kernel_log"]  # recorded for the xid check
    assert "NVML unavailable: driver_not_loaded" in capsys.readouterr().err


def test_dump_to_stdout_and_to_an_unwritable_path(monkeypatch, tmp_path, capsys):
    FakeNode([h100(0)]).install(monkeypatch)
    assert main(["telemetry", "dump", "--sysfs-root", str(tmp_path), "--no-kernel-log"]) == 0
    snap = json.loads(capsys.readouterr().out)
    validate_snapshot(snap)
    assert "kernel_log" not in snap
    assert snap["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    target = tmp_path / "no-such-dir" / "node.json"
    assert main(["telemetry", "dump", "-o", str(target), "--sysfs-root", str(tmp_path), "--no-kernel-log"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err
    assert not target.parent.exists()
    assert main(["telemetry", "dump", "--timeout", "0"]) == 2  # bad option: usage error


def test_an_enum_older_drivers_do_not_know_reads_as_not_supported(monkeypatch, tmp_path):
    FakeNode([h100(0, nvmlDeviceGetMemoryErrorCounter=pynvml.NVMLError_InvalidArgument(),
                   nvmlDeviceGetSramEccErrorStatus=pynvml.NVMLError_FunctionNotFound(),
                   nvmlDeviceGetPcieReplayCounter=pynvml.NVMLError_InvalidArgument())]).install(monkeypatch)
    g = collect_snapshot(sysfs_root=tmp_path)["gpus"][0]
    assert g["ecc_errors"]["sram_volatile_uncorrected"] is None
    assert g["ecc_errors"]["sram_threshold_exceeded"] is None
    assert g["pcie"]["replay_counter"] is None
    assert g["errors"] == {"pcie.replay_counter": "other"}  # an invalid argument elsewhere is a real failure


def test_unreadable_snapshot_keeps_the_pci_bus_for_the_inventory(tmp_path):
    snap = unreadable_snapshot("other", "NVML did not answer within 10 s", sysfs_root=h100_sysfs(tmp_path))
    validate_snapshot(snap)
    assert snap["nvml"] == {"ok": False, "error": {"kind": "other", "message": "NVML did not answer within 10 s"}}
    out = run_checks(level1(), Context(snapshot=snap), install_signal_handlers=False)
    inv = [r for r in out.results if r.check == "inventory"]
    assert [(r.status, r.action) for r in inv] == [(Status.FAIL, Action.REBOOT)]
    assert unreadable_snapshot("frozen", "x", sysfs_root=tmp_path)["nvml"]["error"]["kind"] == "other"
