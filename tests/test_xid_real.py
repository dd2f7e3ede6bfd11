"""Real kernel-log excerpts from public bug reports (tests/fixtures/kernlog/real, provenance in each
.source), read and judged through the same code as a live log: `gpucheck xid --file` (the file
reader, the parser, the catalog, the judge), plus the rules of issue 15 item 4 one by one.

Every excerpt asserts its events (Xid number or fault signature, and where it is attributed), the
results (subject, status, action) and the exit code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.xid import judge as J
from gpucheck.platform.kernlog.mapping import GpuMap
from gpucheck.platform.kernlog.parse import parse_lines
from gpucheck.platform.kernlog.scan import resolve_window, scan, scan_read
from gpucheck.platform.kernlog.sources.base import LogPaths
from gpucheck.platform.kernlog.sources.selection import read_kernel_log

REAL = Path(__file__).parent / "fixtures" / "kernlog" / "real"
U = "gpu:unknown"

# file -> (exit code, events as (Xid or signature, PCI address or the log's token), results)
CASES: dict[str, tuple[int, list[tuple], set[tuple[str, str, str]]]] = {
    "ogkm-1230-gsp-heartbeat-timeout.log": (
        1, [("gsp_heartbeat_timeout", "GPU6")] * 2 + [("gsp_rpc_timeout", "GPU6")],
        {(f"{U}:GPU6", "fail", "reset-gpu")}),
    "bazzite-4449-gsp-heartbeat-gpu-ordinal.log": (
        1, [("gsp_heartbeat_timeout", "GPU0")] * 2, {(f"{U}:GPU0", "fail", "reset-gpu")}),
    "ogkm-1125-heartbeat-after-resume.log": (1, [("gsp_heartbeat_timeout", None)] * 2, {(U, "fail", "reset-gpu")}),
    "sichek-51-reset-required-assert.log": (1, [("reset_required", None)], {(U, "fail", "reset-gpu")}),
    "ogkm-446-talos-gsp-reset-xid154.log": (
        1, [("gsp_rpc_timeout", None), (154, "0000:0b:00"), ("reset_required", None)],
        {(U, "fail", "reset-gpu"), ("pci:0000:0b:00", "fail", "reset-gpu")}),
    "ogkm-688-gpu-lost-assert-dgx-a100.log": (1, [("gpu_lost", None)] * 3, {(U, "fail", "reboot")}),
    "gpu-operator-1146-rminitadapter-failed.log": (
        1, [("init_failed", "0000:0a:00")] * 6, {("pci:0000:0a:00", "fail", "reboot")}),
    "ogkm-789-rminitadapter-gsp.log": (1, [("init_failed", "0000:98:00")], {("pci:0000:98:00", "fail", "reboot")}),
    "nvsentinel-155-fallen-off-bus-no-xid.log": (1, [(79, "0000:b3:00")], {("pci:0000:b3:00", "fail", "reboot")}),
    "nccl-2241-redacted-pci-xid145-137.log": (
        0, [(145, "PCI:..."), (137, "PCI:...")], {(f"{U}:PCI:...", "warn", "investigate")}),
    "gpud-1160-nvlink5-fatal-nonfatal.log": (
        1, [(144, "0000:01:00"), (149, "0000:00:00"), (149, "0000:00:00")],
        {("pci:0000:00:00", "fail", "reset-gpu"), ("pci:0000:01:00", "warn", "investigate")}),
    "gpud-1174-nvlink5-kmsg-inputs.log": (
        1, [(149, "0019:01:00"), (149, "0000:00:00"), (145, "0018:01:00")],
        {("pci:0000:00:00", "fail", "reset-gpu"), ("pci:0019:01:00", "fail", "reset-gpu"),
         ("pci:0018:01:00", "warn", "investigate")}),
    "ogkm-1150-xid45-caused-by-previous.log": (
        0, [(45, b) for b in ("0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00", "0000:dc:00", "0000:ba:00",
                              "0000:ed:00")],
        {(f"pci:0000:{b}:00", "pass", "none") for b in ("dc", "ed", "ba", "97")}),
    "gpud-46-xid13-xid109-ctime.log": (
        1, [(13, "0000:cb:00")] * 3 + [(109, "0000:cb:00")], {("pci:0000:cb:00", "fail", "reset-gpu")}),
    "gpud-500-xid119-pid-name.log": (1, [(119, "0000:9b:00")] * 5, {("pci:0000:9b:00", "fail", "reset-gpu")}),
    "ogkm-829-xid120-gsp-crashcat.log": (1, [(120, "0000:02:00")], {("pci:0000:02:00", "fail", "reset-gpu")}),
    "bumblebee-677-xid32-xid31.log": (
        0, [(32, "0000:01:00"), (32, "0000:01:00"), (31, "0000:01:00")], {("pci:0000:01:00", "pass", "none")}),
}


def xid_json(capsys, *files: Path) -> tuple[int, dict]:
    args = ["xid", "--no-nvml", "--json"]
    for f in files:
        args += ["--file", str(f)]
    rc = main(args)
    out, _ = capsys.readouterr()
    return rc, json.loads(out)


def test_every_real_excerpt_is_tested_and_has_a_source():
    assert {p.name for p in REAL.glob("*.log")} == set(CASES)
    assert all((REAL / f"{name}.source").is_file() for name in CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_excerpt(capsys, name):
    code, events, results = CASES[name]
    rc, doc = xid_json(capsys, REAL / name)
    got_events = [(e["xid"] if e["xid"] is not None else e["signature"], e["pci_bus_id"] or e["gpu_token"])
                  for e in doc["events"]]
    assert got_events == events
    got = {(r["subject"], r["status"], r["action"]) for r in doc["results"] if r["subject"] != "node"}
    assert got == results
    assert rc == code and doc["counts"]["unrecognised"] == 0
    assert doc["results"][0]["subject"] == "node"


def test_the_real_excerpts_cover_ten_xid_numbers_and_every_signature(capsys):
    rc, doc = xid_json(capsys, *(REAL / n for n in sorted(CASES)))
    xids = {e["xid"] for e in doc["events"] if e["xid"] is not None}
    sigs = {e["signature"] for e in doc["events"] if e["signature"] is not None}
    assert len(xids) >= 10, xids
    assert sigs == {"reset_required", "gpu_lost", "gsp_heartbeat_timeout", "gsp_rpc_timeout", "init_failed"}
    assert rc == 1 and doc["results"][0]["metrics"]["signature_events"]["value"] == len(
        [e for e in doc["events"] if e["signature"]])


# -- the rules, one by one ----------------------------------------------------------------------------
def test_numbers_in_caused_by_text_and_in_xid119_banners_are_not_events():
    r = parse_lines((REAL / "ogkm-1150-xid45-caused-by-previous.log").read_text().splitlines())
    assert {e.xid for e in r.events} == {45} and {e.caused_by for e in r.events} == {145, 149}
    # The _kgspLogXid119 banner (the form the driver prints before an Xid 119 line) is a GSP RPC
    # timeout signature, not an Xid 119 and not an unrecognised Xid-like line.
    r = parse_lines([
        "[  101.000001] NVRM: _kgspLogXid119: ********************************* GSP Timeout **********************************",
        "[  101.000002] NVRM: Xid (PCI:0000:01:00): 119, Timeout after 6s of waiting for RPC response from GPU0 GSP! "
        "Expected function 76 (GSP_RM_CONTROL) sequence 1321",
    ])
    assert [(e.xid, e.signature) for e in r.events] == [(None, "gsp_rpc_timeout"), (119, None)]
    assert r.unrecognised == []


def test_pid_and_process_name_are_parsed():
    r = parse_lines((REAL / "gpud-500-xid119-pid-name.log").read_text().splitlines())
    assert [(e.pid, e.process) for e in r.events][:2] == [(4071838, "python"), (28232, "cache_mgr_main")]
    r = parse_lines((REAL / "gpud-46-xid13-xid109-ctime.log").read_text().splitlines())
    assert (r.events[0].pid, r.events[0].process) == (None, None)  # pid='<unknown>', name=<unknown>
    assert (r.events[-1].pid, r.events[-1].process) == (1797828, "pt_main_thread")


def test_xid154_recovery_text_is_the_action():
    r = parse_lines((REAL / "ogkm-446-talos-gsp-reset-xid154.log").read_text().splitlines())
    e154 = [e for e in r.events if e.xid == 154][0]
    assert e154.recovery == {"from_code": 0, "from_label": "None", "to_code": 1, "to_label": "GPU Reset Required"}
    c = J.classify(e154)
    assert (c.severity, c.action) == ("critical", "reset-gpu") and "GPU Reset Required" in c.note


def test_nvlink5_xids_are_judged_by_their_fatal_token():
    r = parse_lines((REAL / "gpud-1174-nvlink5-kmsg-inputs.log").read_text().splitlines())
    judged = [(e.xid, e.nvlink["fatal"], J.classify(e).severity) for e in r.events]
    assert judged == [(149, True, "critical"), (149, True, "critical"), (145, False, "warning")]


def test_an_unusual_address_token_is_counted_on_gpu_unknown_never_dropped():
    lines = (REAL / "nccl-2241-redacted-pci-xid145-137.log").read_text().splitlines()
    r = parse_lines(lines)
    assert [(e.xid, e.pci_bus_id, e.gpu_token) for e in r.events] == [(145, None, "PCI:..."), (137, None, "PCI:...")]
    res = J.judge(check="xid", events=r.events, sxid_events=[], unrecognised=[], gpu_map=GpuMap(),
                  params=dict(J.DEFAULT_PARAMS), read_summary="test", window_label="in everything read",
                  selection=[0, 1])  # a --gpus selection never drops a GPU it cannot place
    unknown = [x for x in res if x.subject == "gpu:unknown:PCI:..."]
    assert len(unknown) == 1 and unknown[0].metrics["events"] == 2
    assert unknown[0].summary.startswith("GPU unknown (the log names it 'PCI:...', not by PCI address)")


def test_bus_losses_without_an_address_are_kept_apart_by_how_the_log_names_the_gpu():
    r = parse_lines(["NVRM: GPU has fallen off the bus.", "NVRM: GPU6 has fallen off the bus.",
                     "NVRM: GPU7 has fallen off the bus.", "NVRM: GPU6 has fallen off the bus."])
    assert [(e.xid, e.implied, e.gpu_token, len(e.related)) for e in r.events] == [
        (79, True, None, 0), (79, True, "GPU6", 1), (79, True, "GPU7", 0)]


def test_rm_init_adapter_tail_line_is_evidence_of_its_event():
    r = parse_lines((REAL / "gpu-operator-1146-rminitadapter-failed.log").read_text().splitlines())
    assert len(r.events) == 6 and all(len(e.related) == 1 and "rm_init_adapter failed" in e.related[0]
                                      for e in r.events)


# -- copied logs: [seconds] stamps are dated only when the file is this boot's log -------------------------
BOOT = 1_700_000_000


def _paths(tmp_path: Path, kmsg_records: list[str]) -> LogPaths:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("".join(r + "\n" for r in kmsg_records))
    stat = tmp_path / "stat"
    stat.write_text(f"btime {BOOT}\n")
    return LogPaths(kmsg=str(kmsg), proc_stat=str(stat))


def test_a_copied_log_gets_times_unknown_not_this_boots_dates(tmp_path):
    log = REAL / "ogkm-1230-gsp-heartbeat-timeout.log"
    sc = scan(files=[str(log)], since="2h", now=BOOT + 10 * 86400, paths=_paths(tmp_path, ["6,1,5000,-;NVRM: other"]))
    assert [e.time for e in sc.events] == [None, None, None]  # never BOOT + 24.3 s
    assert sc.untimed == 3 and sc.before_window == 0  # kept: they cannot be placed outside the window
    assert "times unknown" in sc.window.label and str(log) in sc.read.undated
    assert any("none of its [seconds]-stamped lines is in this boot's kernel log" in n for n in sc.read.notes)


def test_this_boots_own_dmesg_dump_is_dated(tmp_path):
    line = "NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 heartbeat 1899482 " \
           "heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200"
    dump = tmp_path / "dmesg.txt"
    dump.write_text(f"[   24.302465] {line}\n")
    sc = scan(files=[str(dump)], since="all", now=BOOT + 3600,
              paths=_paths(tmp_path, [f"4,812,24302465,-;{line}"]))
    assert [e.time for e in sc.events] == [pytest.approx(BOOT + 24.302465)] and sc.read.undated == []
    assert "times unknown" not in sc.window.label


def test_an_unreadable_live_log_leaves_copied_times_unknown(tmp_path):
    paths = LogPaths(kmsg=str(tmp_path / "no-kmsg"), proc_stat=_paths(tmp_path, []).proc_stat)
    read = read_kernel_log(files=[str(REAL / "bumblebee-677-xid32-xid31.log")], paths=paths)
    assert read.chunks[0].boot_time is None and "could not be read to compare" in read.notes[0]
    sc = scan_read(read, resolve_window("all", now=BOOT, boot_time=BOOT))
    assert all(e.time is None for e in sc.events)
