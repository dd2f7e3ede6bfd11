"""The `xid` check's verdicts: fail/warn/pass/error/skip, mapping, selection, windows, replays."""

from __future__ import annotations

import time
from pathlib import Path


from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.xid.judge import judge
from gpucheck.platform.kernlog.mapping import GpuInfo, GpuMap, from_announcements, from_snapshot
from gpucheck.platform.kernlog.parse import parse_lines
from gpucheck.tests_suite.registry import CHECK_MODULES
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks
from gpucheck.core.state import State
from gpucheck.tests_suite import xid as xid_mod

FIX = Path(__file__).parent / "fixtures" / "kernlog"


def _boot_epoch() -> float:
    with open("/proc/stat") as f:
        return float(next(line for line in f if line.startswith("btime ")).split()[1])


# Five minutes ago, and never before this machine's boot: the check reads this machine's clock and
# boot time; its events must come after the boot (a window since boot; a freshly booted CI machine
# has no five minutes behind it) and a window start ahead of the clock is ignored.
T0 = max((int(time.time()) - 300) // 60 * 60, (int(_boot_epoch()) // 60 + 1) * 60)
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
SNAP = {
    "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + 7200)),
    "nvml": {"ok": True},
    "gpus": [
        {"index": 0, "uuid": UUID0, "pci_bus_id": "00000000:3B:00.0", "state": "ok"},
        {"index": 1, "uuid": UUID1, "pci_bus_id": "00000000:5E:00.0", "state": "ok"},
    ],
}


def iso(offset_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(T0 + offset_s))


def xid_line(offset_s: float, bus: str, xid: int, text: str = "x") -> str:
    return f"{iso(offset_s)} node kernel: NVRM: Xid (PCI:{bus}): {xid}, pid=42, name=python3, {text}"


def ctx_for(tmp_path: Path, lines: list[str], *, snapshot=SNAP, gpus=None, options=None, state=None,
            **overrides) -> Context:
    log = tmp_path / "kern.log"
    log.write_text("\n".join(lines) + "\n")
    checks = {"xid": {"files": [str(log)], "since": "all", **overrides}}
    return Context(level=Level.QUICK, config=Config(checks=checks), snapshot=snapshot, gpus=gpus,
                   options=options or {}, state=state)


def by_subject(results):
    return {r.subject: r for r in results}


def test_check_is_registered_at_level_1_with_last_pass_default():
    assert "gpucheck.tests_suite.xid" in CHECK_MODULES
    (check,) = xid_mod.CHECKS
    assert check.id == "xid" and check.spec.level == Level.QUICK
    assert check.spec.defaults["since"] == "last-pass"
    Config(checks={"xid": {"repeat_limit": 5, "ignore_xids": [13]}}).validate_checks([check.spec])


def test_fallen_off_the_bus_fails_that_gpu_with_reboot(tmp_path):
    res = xid_mod.run(ctx_for(tmp_path, [
        xid_line(10, "0000:3b:00", 79, "GPU has fallen off the bus."),
        f"{iso(10)} node kernel: NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    ]))
    r = by_subject(res)
    assert r["gpu0"].status == Status.FAIL and r["gpu0"].action == Action.REBOOT
    assert r["gpu0"].metrics["critical_events"] == 1 and r["gpu0"].metrics["uuid"] == UUID0
    assert "Xid 79" in r["gpu0"].summary and "GPU 0" in r["gpu0"].summary
    assert any("GPU has fallen off the bus" in e for e in r["gpu0"].evidence)
    assert r["gpu1"].status == Status.PASS and r["node"].status == Status.PASS
    assert r["node"].metrics["xid_events"] == 1  # the bus-loss line is the same event


def test_application_xids_pass_until_they_repeat(tmp_path):
    two = [xid_line(i, "0000:5e:00", 13, "Graphics Exception") for i in range(2)]
    r = by_subject(xid_mod.run(ctx_for(tmp_path, two)))
    assert r["gpu1"].status == Status.PASS and r["gpu1"].action == Action.NONE
    assert "application-class" in r["gpu1"].summary
    three = [xid_line(i, "0000:5e:00", 13, "Graphics Exception") for i in range(3)]
    r = by_subject(xid_mod.run(ctx_for(tmp_path, three)))
    assert r["gpu1"].status == Status.WARN and r["gpu1"].action == Action.INVESTIGATE
    assert "more than 2" in r["gpu1"].summary
    r = by_subject(xid_mod.run(ctx_for(tmp_path, three, repeat_limit=3)))
    assert r["gpu1"].status == Status.PASS


def test_dbe_with_row_remap_failure_means_drain_and_reset(tmp_path):
    r = by_subject(xid_mod.run(ctx_for(tmp_path, [
        xid_line(1, "0000:3b:00", 48, "An uncorrectable double bit error (DBE)"),
        xid_line(2, "0000:3b:00", 64, "Row Remapper: Failed"),
    ])))
    assert r["gpu0"].status == Status.FAIL and r["gpu0"].action == Action.DRAIN
    r = by_subject(xid_mod.run(ctx_for(tmp_path, [xid_line(1, "0000:3b:00", 48, "DBE")])))
    assert r["gpu0"].action == Action.RESET_GPU


def test_warn_class_and_unknown_xids_warn(tmp_path):
    r = by_subject(xid_mod.run(ctx_for(tmp_path, [
        xid_line(1, "0000:3b:00", 94, "Contained: SM"),
        xid_line(2, "0000:5e:00", 250, "from a future driver"),
    ])))
    assert r["gpu0"].status == Status.WARN and r["gpu0"].action == Action.RESTART_APP
    assert r["gpu1"].status == Status.WARN and "unknown Xid 250" in r["gpu1"].summary


def test_unmapped_bus_and_selection(tmp_path):
    lines = [xid_line(1, "0000:5e:00", 79, "GPU has fallen off the bus."),
             xid_line(2, "0000:c1:00", 119, "Timeout after 6s of waiting for RPC response from GPU4 GSP!")]
    res = xid_mod.run(ctx_for(tmp_path, lines, gpus=[0]))
    r = by_subject(res)
    assert "gpu1" not in r  # GPU 1 is not selected: its Xid 79 is not judged here
    assert r["gpu0"].status == Status.PASS
    assert r["pci:0000:c1:00"].status == Status.FAIL and r["pci:0000:c1:00"].action == Action.RESET_GPU
    assert any("outside the selection" in e for e in r["node"].evidence)


def test_nvswitch_fatal_sxid_fails(tmp_path):
    res = xid_mod.run(ctx_for(tmp_path, (FIX / "nvswitch.log").read_text().splitlines()))
    r = by_subject(res)
    assert r["nvswitch:0000:04:00"].status == Status.FAIL and r["nvswitch:0000:04:00"].action == Action.REBOOT
    assert r["nvswitch:0000:08:00"].status == Status.PASS
    assert len([e for e in r["nvswitch:0000:08:00"].evidence if "22013" in e]) == 3


def test_unrecognised_lines_warn_on_the_node(tmp_path):
    r = by_subject(xid_mod.run(ctx_for(tmp_path, ["NVRM: Xid (43, pid: 5678): ROBUST_CHANNEL_X"])))
    assert r["node"].status == Status.WARN and r["node"].metrics["unrecognised_lines"] == 1
    assert any("unrecognised" in e for e in r["node"].evidence)
    r = by_subject(xid_mod.run(ctx_for(tmp_path, ["NVRM: Xid (43, pid: 5678): ROBUST_CHANNEL_X"],
                                       unrecognised_warn=False)))
    assert r["node"].status == Status.PASS


def test_unreadable_log_is_an_error_never_a_pass(tmp_path):
    ctx = Context(config=Config(checks={"xid": {"files": [str(tmp_path / "missing.log")]}}), snapshot=SNAP)
    (r,) = xid_mod.run(ctx)
    assert r.status == Status.ERROR and "missing.log: no such file" in r.summary
    assert any("not a healthy log" in e for e in r.evidence)


def test_an_empty_log_is_nothing_examined_an_error_never_a_pass(tmp_path, capsys):
    """An empty kernel-log file used to pass: nothing was examined (issue 26). In a run it is an
    error naming the file; `xid --file` refuses it up front like any empty input (exit 2, as
    `report` does); an empty standard input is read, found empty: an error, exit 3."""
    import io

    from gpucheck.cli.main import main
    from gpucheck.platform.kernlog.sources.selection import read_kernel_log

    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    ctx = Context(config=Config(checks={"xid": {"files": [str(empty)], "since": "all"}}), snapshot=SNAP)
    (r,) = xid_mod.run(ctx)
    assert r.status == Status.ERROR and f"{empty}: empty: nothing to examine" in r.summary
    res = read_kernel_log(files=["-"], stdin=io.BytesIO(b""))
    assert not res.ok and "stdin: empty: nothing to examine" in (res.error or "")
    quiet = tmp_path / "quiet.log"  # no Xid, but something examined: a pass
    quiet.write_text("Nov 27 10:00:00 node kernel: eth0: link up\n")
    assert read_kernel_log(files=[str(quiet)]).ok
    assert main(["xid", "--file", str(empty)]) == 2
    assert f"{empty}: empty: nothing to examine" in capsys.readouterr().err
    # a live source that gives nothing at all: an error too (dmesg printing nothing, an empty
    # rotation set of syslog files), never a pass
    from gpucheck.platform.kernlog.sources.base import LogPaths

    silent = LogPaths(kmsg=str(tmp_path / "no-kmsg"), dmesg=("true",), journalctl=(str(tmp_path / "no-journalctl"),),
                      log_files=(str(empty),))
    for source in ("dmesg", "files", "auto"):
        res = read_kernel_log(source, paths=silent)
        assert not res.ok, source
    assert "printed nothing" in (read_kernel_log("dmesg", paths=silent).error or "")
    assert "empty: nothing to examine" in (read_kernel_log("files", paths=silent).error or "")


def test_bad_setting_is_an_error(tmp_path):
    (r,) = xid_mod.run(ctx_for(tmp_path, [], since="whenever"))
    assert r.status == Status.ERROR and "bad xid setting" in r.summary


def test_epilog_job_start_overrides_the_window(tmp_path):
    lines = [xid_line(10, "0000:3b:00", 79, "GPU has fallen off the bus."),
             xid_line(100, "0000:5e:00", 95, "Uncontained")]
    r = by_subject(xid_mod.run(ctx_for(tmp_path, lines, options={"xid_since": T0 + 50})))
    assert r["gpu0"].status == Status.PASS and r["gpu1"].status == Status.FAIL
    assert any("before the window" in e for e in r["node"].evidence)


def test_last_pass_cursor_hides_handled_errors(tmp_path):
    st = State(tmp_path / "state")
    lines = [xid_line(10, "0000:3b:00", 79, "GPU has fallen off the bus.")]
    r = by_subject(xid_mod.run(ctx_for(tmp_path, lines, state=st, since="last-pass")))
    assert r["gpu0"].status == Status.FAIL
    assert any("no last-pass cursor" in e for e in r["node"].evidence)
    st.write_cursor("last-pass", {"time": iso(20), "epoch": T0 + 20})
    r = by_subject(xid_mod.run(ctx_for(tmp_path, lines, state=st, since="last-pass")))
    assert r["gpu0"].status == Status.PASS and "since the last passing run" in r["node"].summary


def test_snapshot_replay_uses_the_recorded_log_or_skips(tmp_path):
    snap = dict(SNAP, kernel_log={
        "source": "kmsg", "boot_time": T0, "error": None,
        "lines": ["4,1003,5107644336,-;NVRM: Xid (PCI:0000:5e:00): 79, pid='<unknown>', name=<unknown>, "
                  "GPU has fallen off the bus."]})
    ctx = Context(snapshot=snap, options={"snapshot_path": "node17.json"})
    r = by_subject(xid_mod.run(ctx))
    assert r["gpu1"].status == Status.FAIL and "snapshot:kmsg" in r["node"].summary
    assert any("replayed snapshot" in e for e in r["node"].evidence)
    (skip,) = xid_mod.run(Context(snapshot=SNAP, options={"snapshot_path": "x.json"}))
    assert skip.status == Status.SKIP and skip.summary == "snapshot has no kernel log"
    bad = dict(SNAP, kernel_log={"source": "kmsg", "lines": [], "error": "/dev/kmsg: permission denied"})
    (err,) = xid_mod.run(Context(snapshot=bad, options={"snapshot_path": "x.json"}))
    assert err.status == Status.ERROR and "permission denied" in err.summary


def test_runs_under_the_runner(tmp_path):
    ctx = ctx_for(tmp_path, [xid_line(1, "0000:3b:00", 119, "Timeout after 6s ... GSP!")])
    out = run_checks(xid_mod.CHECKS, ctx, install_signal_handlers=False)
    (run,) = out.runs
    assert run.status == Status.FAIL and any(r.action == Action.RESET_GPU for r in run.results)


# -- mapping -------------------------------------------------------------------------------------

def test_mapping_from_snapshot_and_driver_lines():
    m = from_snapshot(SNAP)
    assert m.lookup("0000:3b:00").index == 0 and m.lookup("0000:5e:00").uuid == UUID1
    parsed = parse_lines(["NVRM: GPU at PCI:0000:3b:00: GPU-11111111-2222-3333-4444-555555555555",
                          "NVRM: GPU Board Serial Number: 1650124014249",
                          "NVRM: GPU at PCI:0000:c1:00: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"])
    drv = from_announcements(parsed.announcements)
    assert drv.lookup("0000:c1:00").index is None and drv.lookup("0000:c1:00").uuid.startswith("GPU-aaaa")
    both = m.merged_with(drv)
    assert both.lookup("0000:3b:00").serial == "1650124014249" and both.lookup("0000:3b:00").index == 0
    assert both.lookup("0000:c1:00").uuid.startswith("GPU-aaaa") and both.source == "snapshot+driver-log"


def test_driver_line_uuid_reaches_the_evidence_without_a_snapshot(tmp_path):
    lines = ["NVRM: GPU at PCI:0000:c1:00: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
             xid_line(5, "0000:c1:00", 46, "GPU stopped processing")]
    r = by_subject(xid_mod.run(ctx_for(tmp_path, lines, snapshot=None)))
    res = r["pci:0000:c1:00"]
    assert res.status == Status.FAIL and res.gpu is None
    assert "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee" in res.evidence[0]


def test_judge_is_pure_and_orders_results():
    p = parse_lines([xid_line(1, "0000:5e:00", 13), xid_line(2, "0000:3b:00", 79, "GPU has fallen off the bus.")])
    gm = GpuMap([GpuInfo("0000:3b:00", 0), GpuInfo("0000:5e:00", 1), GpuInfo("0000:99:00", 2)], "test")
    res = judge(check="xid", events=p.events, sxid_events=[], unrecognised=[], gpu_map=gm, params={},
                read_summary="test", window_label="since boot", inventory=gm.gpus())
    assert [r.subject for r in res] == ["node", "gpu0", "gpu1", "gpu2"]
    assert [r.status for r in res] == [Status.PASS, Status.FAIL, Status.PASS, Status.PASS]


def test_a_job_start_that_is_no_time_or_ahead_of_now_is_ignored_and_the_boot_judged(tmp_path):
    """The epilog's job start is a cursor too (its record in the state directory): "@nan" made
    every event "before the window" (a pass), a start in the future did the same."""
    lines = [xid_line(10, "0000:3b:00", 79, "GPU has fallen off the bus.")]
    for start in ("@nan", float("nan"), f"@{time.time() + 86400:.3f}"):
        r = by_subject(xid_mod.run(ctx_for(tmp_path, lines, options={"xid_since": start}, since="last-pass")))
        assert r["gpu0"].status == Status.FAIL, (start, r["gpu0"].summary)
        assert any(e.startswith(("warning: ignored the job start", "ignored --since")) for e in r["node"].evidence)
