"""pcie.aer: the AER kernel-log parser and the sysfs/lspci readers on real captures, and the check's
rules (kernel-log lines of real captures; sysfs counter deltas on synthetic trees, since no real
capture of aer_dev_* files of a GPU or NIC was found: fixtures24/INDEX.md)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from gpucheck.core.check import Context, RunOptions
from gpucheck.core.config import Config
from gpucheck.core.levels import Level
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import Outcome, run_checks
from gpucheck.core.state import State
from gpucheck.platform.fabric.aer import parse_aer_counters, parse_lspci_vvv, read_pcie_aer
from gpucheck.platform.kernlog.aer import AER_NEEDLES, parse_aer_lines
from gpucheck.platform.kernlog.sources.files import read_stream
from gpucheck.tests_suite import pcie_aer
from gpucheck.tests_suite.registry import all_checks

FIX = Path(__file__).parent / "fixtures"
AER_LOGS = FIX / "kernlog" / "aer"
LSPCI = FIX / "lspci" / "gpud-h100-hgx-lspci-vvv-gpus-nics-nvswitch.txt"
P, W, F, S, E = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR
CHECK = [c for c in all_checks() if c.id == "pcie.aer"]


def base_snapshot(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"kind": "gpucheck.snapshot", "version": 1, "synthetic": True, "source": "test", "host": "n1",
                           "captured_at": "2025-06-02T10:15:00Z", "nvml": {"ok": True, "error": None},
                           "driver_version": None, "cuda_driver_version": None, "nvml_version": None,
                           "pci_nvidia_devices": [], "gpus": []}
    doc.update(extra)
    return doc


def kernel_log(path: Path) -> dict[str, Any]:
    """A capture's lines as a recorded kernel log, through the same line filter as a live read."""
    with open(path, "rb") as f:
        lines, _ = read_stream(f)
    return {"source": "file", "lines": lines, "error": None, "boot_time": None, "captured_at": None,
            "records": None, "notes": []}


def replay(snapshot: dict[str, Any], *, state: State | None = None, config: Config | None = None) -> Outcome:
    ctx = Context(level=Level.QUICK, snapshot=snapshot, options=RunOptions(snapshot_path="capture"), state=state,
                  config=config)
    return run_checks(CHECK, ctx, install_signal_handlers=False)


def part(out: Outcome, subject: str) -> Any:
    (r,) = [r for r in out.results if r.subject == subject]
    return r


# -- the kernel-log parser -----------------------------------------------------------------------


def test_parser_ties_a_root_port_fatal_error_to_the_gpu_below_it():
    log = parse_aer_lines((AER_LOGS / "gpu-burn-1-aer-surprise-down-xid79.log").read_text().splitlines())
    corrected, fatal = log.events
    assert (corrected.device, corrected.severity, corrected.errors, corrected.tied_to) == (
        "0000:00:02.0", "corrected", ("Replay Timer Timeout",), ())
    assert (fatal.device, fatal.severity, fatal.layer) == ("0000:00:02.0", "fatal", "Transaction Layer")
    assert fatal.errors == ("Surprise Down Error",) and fatal.tied_to == ("0000:02:00.0",)
    assert log.drivers["0000:02:00.0"] == "nvidia"
    assert fatal.time is None  # [seconds] stamps without this log's boot time: unknown, never old


def test_parser_relative_stamps_and_localized_months_are_unknown_times_not_rejected():
    log = parse_aer_lines((AER_LOGS / "returnn-1500-dmesg-relative-aer-fatal-sdes.log").read_text().splitlines())
    (fatal,) = log.events
    assert fatal.errors == ("SDES", "CmpltTO") and fatal.time is None
    assert set(fatal.tied_to) == {"0000:03:00.0", "0000:03:00.1"} and "0000:00:03.0" in log.recovery_failed
    ru = parse_aer_lines((AER_LOGS / "gsconnect-1052-journal-localized-month-aer.log").read_text().splitlines())
    assert [(e.device, e.severity, e.errors, e.time) for e in ru.events] == [("0000:00:1c.5", "corrected", ("RxErr",), None)] * 3


def test_parser_syslog_times_and_a_gpu_line_inside_the_ports_block():
    log = parse_aer_lines((AER_LOGS / "pop-os-3363-journal-aer-correctable-gpu.log").read_text().splitlines())
    port, gpu = log.events
    assert port.tied_to == ("0000:00:00.0", "0000:07:00.0") and port.errors == ("BadTLP", "BadDLLP", "Rollover", "Timeout")
    assert (gpu.device, gpu.driver, gpu.severity) == ("0000:07:00.0", "nvidia", "corrected")
    assert port.time is not None and port.time == gpu.time


def test_the_line_filter_keeps_every_aer_line_a_live_read_needs():
    """A live read keeps only lines with a needle (NVRM, SXid, the AER ones): every line the AER
    parser uses passes it, so a recorded snapshot judges what the capture shows."""
    for path in sorted(AER_LOGS.glob("*.log")):
        text = path.read_text()
        full = parse_aer_lines(text.splitlines())
        filtered = parse_aer_lines(kernel_log(path)["lines"])
        assert [(e.device, e.severity, e.tied_to) for e in filtered.events] == [
            (e.device, e.severity, e.tied_to) for e in full.events], path.name
    assert b"AER" in AER_NEEDLES


# -- the check on real kernel logs ---------------------------------------------------------------


@pytest.mark.parametrize("name, status, action, names", [
    ("gpu-burn-1-aer-surprise-down-xid79.log", F, Action.REBOOT, "GPU 0000:02:00.0"),
    ("returnn-1500-dmesg-relative-aer-fatal-sdes.log", F, Action.REBOOT, "GPU 0000:03:00.0"),
    ("pop-os-3363-journal-aer-correctable-gpu.log", W, Action.INVESTIGATE, "GPU 0000:07:00.0"),
    ("pop-os-3363-journal-aer-correctable-rootport.log", P, Action.NONE, "0000:00:03.1: not tied"),
    ("returnn-1486-dmesg-relative-aer-corrected-timeout.log", P, Action.NONE, "0000:00:03.0: not tied"),
    ("gsconnect-1052-journal-localized-month-aer.log", P, Action.NONE, "0000:00:1c.5: not tied"),
])
def test_kernel_log_verdicts_of_real_captures(name, status, action, names):
    out = replay(base_snapshot(kernel_log=kernel_log(AER_LOGS / name)))
    r = part(out, "kernel log")
    assert (r.status, r.action) == (status, action), r.summary
    assert names in r.summary + " ".join(r.evidence)
    assert part(out, "sysfs counters").status == S  # not in a kernel-log capture: a skip naming what to add


def test_a_root_port_error_is_the_gpus_when_the_pci_tree_says_so():
    """returnn #1486's three correctable reports on 0000:00:03.0 name no device below it; with the
    recorded PCI tree (the port above the GPU) they are the GPU's, and a burst: warn."""
    record = {"source": "sysfs", "error": None, "lspci": None, "devices": [
        {"bus_id": "0000:03:00.0", "role": "gpu", "vendor": "0x10de", "device": "0x1e04", "pci_class": "0x030000",
         "below": [], "aer": {"correctable": None, "nonfatal": None, "fatal": None}, "errors": {}},
        {"bus_id": "0000:00:03.0", "role": "upstream", "vendor": "0x8086", "device": "0x6f08",
         "pci_class": "0x060400", "below": ["0000:03:00.0"], "aer": {"correctable": None, "nonfatal": None,
                                                                       "fatal": None}, "errors": {}}]}
    log = kernel_log(AER_LOGS / "returnn-1486-dmesg-relative-aer-corrected-timeout.log")
    r = part(replay(base_snapshot(kernel_log=log, pcie_aer=record)), "kernel log")
    assert r.status == W and "3 on GPU 0000:03:00.0 within 60 s" in r.summary
    assert "port 0000:00:03.0 (above GPU 0000:03:00.0): corrected Data Link Layer (tied to GPU 0000:03:00.0)" in r.evidence[0]
    assert r.metrics["correctable_burst"] == 3
    # one report is below the burst threshold
    one = dict(log, lines=log["lines"][:2])  # one report: "error received" and its "PCIe Bus Error" line
    assert part(replay(base_snapshot(kernel_log=one, pcie_aer=record)), "kernel log").status == P


def test_a_kernel_log_that_could_not_be_recorded_is_an_error_never_a_pass():
    broken = {"source": "kmsg", "lines": [], "error": "PermissionError: /dev/kmsg", "boot_time": None}
    r = part(replay(base_snapshot(kernel_log=broken)), "kernel log")
    assert r.status == E and "/dev/kmsg" in r.summary
    (r,) = replay(base_snapshot()).results  # neither AER counters nor a kernel log: one skip naming what to record
    assert r.status == S and "not in this capture" in r.summary


# -- lspci -vvv ----------------------------------------------------------------------------------------


def test_lspci_vvv_of_a_real_h100_node():
    devices = parse_lspci_vvv(LSPCI.read_text())
    roles = [d["role"] for d in devices]
    assert roles.count("gpu") == 8 and roles.count("nvswitch") == 4 and roles.count("nic") == 12
    gpu = devices[0]
    assert gpu["bus_id"] == "0000:19:00.0" and gpu["link_status"] == "Speed 32GT/s (ok), Width x16 (ok)"
    assert gpu["uncorrectable_set"] == [] and gpu["correctable_set"] == ["RxErr", "BadTLP", "Timeout"]
    assert not any(d["downgraded"] for d in devices)
    record = {"source": "lspci", "error": None, "devices": [], "lspci": LSPCI.read_text().splitlines()}
    r = part(replay(base_snapshot(pcie_aer=record)), "lspci")
    assert r.status == P and "sticky" in " ".join(r.evidence) and "GPU 0000:19:00.0 [RxErr, BadTLP, Timeout]" in " ".join(r.evidence)


def test_lspci_uncorrectable_status_bits_warn():
    """Synthetic (no real capture with UESta '+' on a GPU or NIC was found): the real H100 capture
    with one GPU's SDES bit set."""
    text = LSPCI.read_text().replace("UESta:\tDLP- SDES-", "UESta:\tDLP- SDES+", 1)
    assert text != LSPCI.read_text()
    record = {"source": "lspci", "error": None, "devices": [], "lspci": text.splitlines()}
    r = part(replay(base_snapshot(pcie_aer=record)), "lspci")
    assert r.status == W and "GPU 0000:19:00.0 [SDES]" in r.summary


# -- sysfs counters (synthetic trees: see the module docstring) -----------------------------------------

COR = "RxErr {rx}\nBadTLP 0\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR {rx}\n"
UNCOR = "Undefined 0\nDLP 0\nSDES {n}\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\n" \
        "UnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\nTLPBlockedErr 0\nPoisonTLPBlocked 0\n" \
        "TOTAL_ERR_{kind} {n}\n"


def sysfs_tree(root: Path, *, cor: int = 0, nonfatal: int = 0, fatal: int = 0, aer: bool = True) -> Path:
    """A synthetic sysfs: a root port 0000:00:01.0 with a GPU 0000:01:00.0 below it, and a
    storage controller (not judged), laid out as /sys/devices with /sys/bus/pci/devices links."""
    devs = root / "devices" / "pci0000:00"
    port, gpu, nvme = devs / "0000:00:01.0", devs / "0000:00:01.0" / "0000:01:00.0", devs / "0000:00:02.0"
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    for d, vendor, cls in ((port, "0x8086", "0x060400"), (gpu, "0x10de", "0x030200"), (nvme, "0x144d", "0x010802")):
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (d / "device").write_text("0x2330\n")
        if aer:
            (d / "aer_dev_correctable").write_text(COR.format(rx=cor))
            (d / "aer_dev_nonfatal").write_text(UNCOR.format(n=nonfatal, kind="NONFATAL"))
            (d / "aer_dev_fatal").write_text(UNCOR.format(n=fatal, kind="FATAL"))
        link = bus / d.name
        if not link.exists():
            os.symlink(os.path.relpath(d, bus), link)
    return root


def test_read_pcie_aer_finds_the_gpu_and_its_upstream_port(tmp_path):
    rec = read_pcie_aer(sysfs_tree(tmp_path, cor=3))
    assert rec["error"] is None
    assert [(d["bus_id"], d["role"], d["below"]) for d in rec["devices"]] == [
        ("0000:01:00.0", "gpu", []), ("0000:00:01.0", "upstream", ["0000:01:00.0"])]
    assert parse_aer_counters(rec["devices"][0]["aer"]["correctable"])["TOTAL_ERR_COR"] == 3
    with pytest.raises(ValueError):
        parse_aer_counters("RxErr lots\n")
    assert read_pcie_aer(tmp_path / "nothing")["error"].startswith("cannot list")


def live(tree: Path, *, state: State | None = None, captured_at: str = "2025-06-02T10:15:00Z",
         log: Path = AER_LOGS / "gsconnect-1052-journal-localized-month-aer.log") -> Outcome:
    ctx = Context(level=Level.QUICK, snapshot=base_snapshot(captured_at=captured_at), state=state,
                  config=Config(checks={"pcie.aer": {"sysfs_root": str(tree), "files": [str(log)]}}))
    return run_checks(CHECK, ctx, install_signal_handlers=False)


def history(state: State, out: Outcome, time: str) -> None:
    state.append_history({"schema": "gpucheck.verdict", "time": time, "results": [r.to_dict() for r in out.results]})


def test_counter_deltas_between_runs(tmp_path):
    state = State(tmp_path / "state")
    tree = sysfs_tree(tmp_path / "sys", cor=5)
    first = part(live(tree, state=state), "sysfs counters")
    assert first.status == P and "no delta" in first.summary and "correctable 5" in " ".join(first.evidence)
    history(state, live(tree, state=state), "2025-06-02T10:15:00Z")
    sysfs_tree(tree, cor=205)  # 200 more on the GPU and on its port in ten minutes: 20/min > 8/min
    r = part(live(tree, state=state, captured_at="2025-06-02T10:25:00Z"), "sysfs counters")
    assert (r.status, r.action) == (W, Action.INVESTIGATE) and r.metrics["correctable_rate_per_min"] == 20.0
    assert "GPU 0000:01:00.0" in r.summary
    sysfs_tree(tree, cor=205, fatal=1)
    r = part(live(tree, state=state, captured_at="2025-06-02T10:25:00Z"), "sysfs counters")
    assert (r.status, r.action) == (F, Action.REBOOT) and "fatal PCIe AER errors: 2 new" in r.summary
    assert "port 0000:00:01.0 (above GPU 0000:01:00.0)" in r.summary
    sysfs_tree(tree, cor=205, nonfatal=1)
    r = part(live(tree, state=state, captured_at="2025-06-02T10:25:00Z"), "sysfs counters")
    assert (r.status, r.action) == (F, Action.INVESTIGATE)


def test_counters_without_history_warn_for_uncorrectable_since_boot(tmp_path):
    r = part(live(sysfs_tree(tmp_path, fatal=4)), "sysfs counters")
    assert r.status == W and "since boot" in r.summary and r.metrics["uncorrectable_since_boot"] == 8


def test_counters_a_node_without_aer_files_or_devices_is_a_skip_an_unreadable_file_an_error(tmp_path):
    assert part(live(sysfs_tree(tmp_path / "a", aer=False)), "sysfs counters").status == S
    empty = tmp_path / "b" / "bus" / "pci" / "devices"
    empty.mkdir(parents=True)
    (r,) = live(tmp_path / "b").results
    assert r.status == S and "no GPU, NIC or NVSwitch" in r.summary
    tree = sysfs_tree(tmp_path / "c")
    (tree / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0" / "aer_dev_fatal").write_text("garbage here\n")
    r = part(live(tree), "sysfs counters")
    assert r.status == E and "aer_dev_fatal does not parse" in r.summary


def test_a_replayed_snapshot_is_judged_on_its_recorded_counters(tmp_path):
    rec = read_pcie_aer(sysfs_tree(tmp_path, fatal=1))
    doc = base_snapshot(pcie_aer=copy.deepcopy(rec))
    r = part(replay(doc), "sysfs counters")
    assert r.status == W and r.metrics["uncorrectable_since_boot"] == 2


def test_a_report_without_a_readable_time_is_in_the_window_never_old():
    """returnn #1500's relative stamps give no time: with a known boot time (a window that starts
    at boot) the fatal report is still judged."""
    log = dict(kernel_log(AER_LOGS / "returnn-1500-dmesg-relative-aer-fatal-sdes.log"), boot_time=1748850000.0)
    r = part(replay(base_snapshot(kernel_log=log)), "kernel log")
    assert r.status == F and "time unknown" in r.evidence[0]
    # a timed report before the window is left out and said so
    old = dict(log, lines=["2025-06-01T00:00:00+00:00 host kernel: nvidia 0000:07:00.0: PCIe Bus Error: "
                           "severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)"])
    r = part(replay(base_snapshot(kernel_log=old)), "kernel log")
    assert r.status == P and "1 AER report(s) before the window" in " ".join(r.evidence)


def test_lspci_of_a_real_gb200_tray_has_no_nvswitch_and_no_aer_status():
    """gpud's GB200 `lspci` (one line per device): NVIDIA "PCI bridge" root ports are not
    NVSwitches ("Bridge: NVIDIA", class 0x0680); no -vvv: the AER part is a skip saying why."""
    text = (FIX / "lspci" / "gpud-gb200-lspci-nn.txt").read_text()
    devices = parse_lspci_vvv(text)
    assert not [d for d in devices if d["role"] == "nvswitch"]
    assert [d["bus_id"] for d in devices if d["role"] == "gpu"] and all(d["uncorrectable_set"] is None for d in devices)
    record = {"source": "lspci", "error": None, "devices": [], "lspci": text.splitlines()}
    r = part(replay(base_snapshot(pcie_aer=record)), "lspci")
    assert r.status == S and "no AER status" in r.summary


def test_a_recording_replays_through_run_snapshot(tmp_path, capsys):
    """`gpucheck telemetry dump` records pcie_aer (sysfs texts) and the AER kernel-log lines;
    `gpucheck run --snapshot` judges them with the same parsers (the synthetic tree's fatal count,
    gpu-burn #1's real log)."""
    import json

    from gpucheck import app
    from gpucheck.platform.telemetry.snapshot import SnapshotError, load_snapshot, validate_snapshot

    doc = base_snapshot(pcie_aer=read_pcie_aer(sysfs_tree(tmp_path / "sys", fatal=1)),
                        kernel_log=kernel_log(AER_LOGS / "gpu-burn-1-aer-surprise-down-xid79.log"))
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    assert load_snapshot(path)["pcie_aer"] == doc["pcie_aer"]
    seen: list = []
    rc = app.execute(app.RunRequest(snapshot_path=str(path), check_patterns=["pcie.aer"], history=False, json=True),
                     on_verdict=seen.append)
    results = {r["subject"]: r for r in seen[-1].to_json()["results"]}
    assert rc == 1 and results["kernel log"]["status"] == "fail" and results["sysfs counters"]["status"] == "warn"
    for bad in ({"devices": "x"}, {"devices": [{"bus_id": 1, "aer": {}}]}, "x"):
        with pytest.raises(SnapshotError, match="pcie_aer"):
            validate_snapshot(base_snapshot(pcie_aer=bad))
    with pytest.raises(SnapshotError, match="fabric_manager"):
        validate_snapshot(base_snapshot(fabric_manager={"service": None, "log": {"lines": [1]}, "nvswitch_devices": None}))


def test_telemetry_dump_records_pcie_aer_and_fabric_manager(tmp_path):
    """`gpucheck telemetry dump --sysfs-root TREE` records the AER texts of the synthetic tree and
    the Fabric Manager record (no NVSwitch on it)."""
    import json

    from gpucheck.cli.main import main

    tree = sysfs_tree(tmp_path / "sys", cor=7)
    out = tmp_path / "dump.json"
    try:
        main(["telemetry", "dump", "--sysfs-root", str(tree), "--no-kernel-log", "-o", str(out), "--timeout", "5"])
    except SystemExit as e:
        assert e.code in (0, None)
    doc = json.loads(out.read_text())
    gpu = [d for d in doc["pcie_aer"]["devices"] if d["role"] == "gpu"][0]
    assert gpu["bus_id"] == "0000:01:00.0" and "TOTAL_ERR_COR 7" in gpu["aer"]["correctable"]
    assert doc["fabric_manager"]["nvswitch_devices"] == []
