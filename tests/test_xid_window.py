"""--since: durations, timestamps, boot, all, last-pass (the cursor), and filtering by window."""

from __future__ import annotations

import calendar

import pytest

from gpucheck.kernlog.scan import cursor_epoch, resolve_window, scan, scan_read
from gpucheck.kernlog.sources import Chunk, LogPaths, ReadResult
from gpucheck.kernlog.timeparse import parse_duration, parse_timestamp, validate_since
from gpucheck.state import State

NOW = 1_800_000_000.0
BOOT = 1_799_990_000.0


def test_durations():
    assert parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45s") == 45
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("1.5h") == 5400
    for bad in ("", "h", "2x", "2h junk", "-1h"):
        assert parse_duration(bad) is None


def test_timestamps():
    t = calendar.timegm((2024, 5, 18, 19, 2, 39, 0, 0, 0))
    assert parse_timestamp("2024-05-18T19:02:39Z") == t
    assert parse_timestamp("2024-05-18T21:02:39+02:00") == t
    assert parse_timestamp("@1716058959") == 1716058959
    assert parse_timestamp("1716058959.5") == 1716058959.5
    assert parse_timestamp("yesterday") is None


def test_validate_since_accepts_keywords_and_rejects_nonsense():
    for ok in ("boot", "ALL", "last-pass", "2h", "2024-05-18T19:02:39Z"):
        validate_since(ok)
    with pytest.raises(ValueError, match="duration"):
        validate_since("next tuesday")


def test_windows():
    assert resolve_window("all", now=NOW, boot_time=BOOT).start is None
    assert resolve_window("boot", now=NOW, boot_time=BOOT).start == BOOT
    assert resolve_window("2h", now=NOW, boot_time=BOOT).start == NOW - 7200
    w = resolve_window("boot", now=NOW, boot_time=None)
    assert w.start is None and "unknown" in w.note


def test_last_pass_reads_the_cursor_the_run_pipeline_writes(tmp_path):
    st = State(tmp_path)
    w = resolve_window("last-pass", now=NOW, boot_time=BOOT, state=st)
    assert w.start == BOOT and "no last-pass cursor" in w.note and "since boot" in w.note
    st.write_cursor("last-pass", {"time": "2027-01-15T08:00:00Z", "epoch": NOW - 60})
    w = resolve_window("last-pass", now=NOW, boot_time=BOOT, state=st)
    assert w.start == NOW - 60 and w.note is None
    st.write_cursor("last-pass", {"time": "2027-01-15T08:00:00Z"})  # epoch missing: the time is read
    assert resolve_window("last-pass", now=NOW, boot_time=BOOT, state=st).start == \
        calendar.timegm((2027, 1, 15, 8, 0, 0, 0, 0, 0))
    assert cursor_epoch({"time": "junk"}) is None and cursor_epoch(None) is None
    w = resolve_window("last-pass", now=NOW, boot_time=BOOT, state=None)
    assert w.start == BOOT and "no state directory" in w.note


def _read(lines):
    r = ReadResult(source="test", boot_time=BOOT)
    r.chunks.append(Chunk("test", lines, boot_time=BOOT, ref_time=NOW))
    return r


def test_scan_keeps_only_the_window_and_untimed_events():
    lines = [
        "[ 100.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, old",
        "[ 9000.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.",
        "nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
        "[ 50.0] nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 1 x",
    ]
    w = resolve_window("@%d" % (BOOT + 1000), now=NOW, boot_time=BOOT)
    sc = scan_read(_read(lines), w)
    assert [e.xid for e in sc.events] == [79]
    assert [s.sxid for s in sc.sxid_events] == [20034]
    assert sc.before_window == 2 and sc.untimed == 1
    sc = scan_read(_read(lines), resolve_window("all", now=NOW, boot_time=BOOT))
    assert [e.xid for e in sc.events] == [13, 79] and sc.before_window == 0


def test_scan_end_to_end_with_a_cursor(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(
        "2027-01-15T07:00:00+00:00 h kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
        "2027-01-15T09:00:00+00:00 h kernel: NVRM: Xid (PCI:0000:5e:00): 48, pid=1, name=a, DBE\n")
    st = State(tmp_path / "state")
    st.write_cursor("last-pass", {"time": "2027-01-15T08:00:00Z",
                                  "epoch": calendar.timegm((2027, 1, 15, 8, 0, 0, 0, 0, 0))})
    stat = tmp_path / "stat"
    stat.write_text("btime 1700000000\n")
    sc = scan(files=[str(log)], since="last-pass", state=st, paths=LogPaths(proc_stat=str(stat)))
    assert [e.xid for e in sc.events] == [48] and sc.before_window == 1
