"""--since: durations, timestamps, boot, all, last-pass (the cursor), and filtering by window."""

from __future__ import annotations

import calendar

import pytest

from gpucheck.platform.kernlog.cursor import mark_epoch as cursor_epoch
from gpucheck.platform.kernlog.scan import resolve_window, scan, scan_read
from gpucheck.platform.kernlog.sources.base import Chunk, LogPaths, ReadResult
from gpucheck.platform.kernlog.timeparse import parse_duration, parse_timestamp, validate_since
from gpucheck.core.state import State

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
    sc = scan(files=[str(log)], since="last-pass", state=st, paths=LogPaths(proc_stat=str(stat)),
              now=calendar.timegm((2027, 1, 15, 10, 0, 0, 0, 0, 0)))
    assert [e.xid for e in sc.events] == [48] and sc.before_window == 1


# -- a window start that cannot be trusted is ignored, never hides events ------------------------
@pytest.mark.parametrize("cursor,why", [
    ({"time": "2027-01-15T09:00:00Z", "epoch": NOW + 3600}, "ahead of now"),  # clock stepped back
    ({"epoch": 1e308}, "ahead of now"),
    ({"epoch": float("nan")}, "no time that can be read"),
    ({"epoch": float("inf")}, "no time that can be read"),
    ({"epoch": -5.0}, "not a time since 1970"),
    ({"time": "junk"}, "no time that can be read"),
    ({"time": "9999-12-31T23:59:59Z"}, "ahead of now"),
    ("a string", "no time that can be read"),
])
def test_a_last_pass_cursor_ahead_of_now_or_absurd_is_ignored_and_the_boot_judged(tmp_path, cursor, why):
    st = State(tmp_path)
    st.write_cursor("last-pass", cursor)
    w = resolve_window("last-pass", now=NOW, boot_time=BOOT, state=st)
    assert w.start == BOOT and w.since == "last-pass"
    assert w.note.startswith("warning: ignored the last-pass cursor") and why in w.note and "since boot" in w.note
    sc = scan_read(_read(["[ 9000.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus."]), w)
    assert [e.xid for e in sc.events] == [79] and sc.before_window == 0


def test_a_cursor_of_now_or_earlier_is_honoured():
    assert resolve_window("last-pass", now=NOW, boot_time=BOOT, state=_Cursor({"epoch": NOW})).start == NOW


class _Cursor:
    def __init__(self, value):
        self.value = value

    def read_cursor(self, name):
        return self.value


def test_since_values_that_are_no_time_are_usage_errors():
    for bad in ("@nan", "@inf", "@1e308", "@-5", "@"):
        assert parse_timestamp(bad) is None
        with pytest.raises(ValueError):
            validate_since(bad)


def test_a_since_timestamp_ahead_of_now_is_ignored_and_a_huge_duration_is_everything():
    w = resolve_window("@%d" % (NOW + 86400), now=NOW, boot_time=BOOT)
    assert w.start == BOOT and "ahead of now" in w.note and w.note.startswith("ignored --since")
    w = resolve_window("9" * 400 + "d", now=NOW, boot_time=BOOT)  # inf seconds ago
    assert w.start is None and "everything" in w.label
    w.to_dict()


def test_the_xid_check_judges_the_whole_boot_under_a_cursor_from_the_future(tmp_path):
    """The reproduced bug: a last-pass cursor in the future hid every Xid ("1 older event not
    judged"); a NaN or 1e308 cursor made the check error forever."""
    import time

    from gpucheck.core.check import Context
    from gpucheck.core.config import Config
    from gpucheck.core.result import Status
    from gpucheck.tests_suite import xid as xid_mod

    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - 60))
    log = tmp_path / "kern.log"
    log.write_text(f"{stamp} n kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n")
    snap = {"nvml": {"ok": True}, "gpus": [{"index": 0, "pci_bus_id": "0000:3b:00.0", "state": "ok"}]}
    for cursor in ({"epoch": now + 86400 * 365}, {"epoch": float("nan")}, {"epoch": 1e308}):
        st = State(tmp_path / "state")
        st.write_cursor("last-pass", cursor)
        ctx = Context(config=Config(checks={"xid": {"files": [str(log)], "since": "last-pass"}}), snapshot=snap,
                      state=st)
        res = {r.subject: r for r in xid_mod.run(ctx)}
        assert res["gpu0"].status == Status.FAIL, (cursor, res["gpu0"].summary)
        assert any("ignored the last-pass cursor" in e for e in res["node"].evidence)
        assert not any("before the window" in e for e in res["node"].evidence)


# -- times that name no time are unknown, never old; a window compares at the line's resolution --

def _xid_check(tmp_path, lines: list[str], cursor: dict | None):
    """The xid check on a kernel-log file, with a last-pass cursor (None: judge everything)."""
    from gpucheck.core.check import Context
    from gpucheck.core.config import Config
    from gpucheck.tests_suite import xid as xid_mod

    log = tmp_path / "kern.log"
    log.write_text("".join(line + "\n" for line in lines))
    st = State(tmp_path / "state")
    if cursor is not None:
        st.write_cursor("last-pass", cursor)
    snap = {"nvml": {"ok": True}, "gpus": [{"index": 0, "pci_bus_id": "0000:3b:00.0", "state": "ok"}]}
    ctx = Context(config=Config(checks={"xid": {"files": [str(log)], "since": "last-pass" if cursor else "all"}}),
                  snapshot=snap, state=st)
    return {r.subject: r for r in xid_mod.run(ctx)}


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus."


@pytest.mark.parametrize("prefix", [
    "{day}T{hms}+99:00",  # no zone is 99 hours from UTC: it was dated four days early
    "{day}T{hms}+05:75",  # a minute 75
    "{day}T{hms}-15:00",  # beyond the farthest zone
    "2026-13-40T{hms}+00:00",  # month 13, day 40: timegm rolled it into the next year
    "{day}T25:61:00Z",
])
def test_an_impossible_time_is_unknown_and_judged_inside_the_window(tmp_path, prefix):
    """The reproduced bug: `+99:00` dated the Xid 79 days before the last-pass cursor, so the
    window left it out and the check passed (`xid --since all` failed it)."""
    import time

    from gpucheck.core.result import Status
    from gpucheck.platform.kernlog.timeparse import parse_prefix

    now = time.time()
    day, hms = time.strftime("%Y-%m-%d", time.gmtime(now)), time.strftime("%H:%M:%S", time.gmtime(now - 30))
    line = f"{prefix.format(day=day, hms=hms)} n kernel: {XID79}"
    stamp = parse_prefix(line)
    assert stamp.epoch is None and stamp.message == XID79
    res = _xid_check(tmp_path, [line], {"epoch": now - 600})
    assert res["gpu0"].status == Status.FAIL, res["gpu0"].summary
    assert any("1 event(s) have no time and were judged as inside the window" in e for e in res["node"].evidence)


def test_a_possible_offset_still_dates_the_line():
    from gpucheck.platform.kernlog.timeparse import parse_prefix

    t = calendar.timegm((2026, 11, 27, 1, 2, 3, 0, 0, 0))
    for line in (f"2026-11-27T15:02:03+14:00 n kernel: {XID79}", f"2026-11-26T13:32:03-11:30 n kernel: {XID79}",
                 f"2026-11-27T01:02:03Z n kernel: {XID79}", f"2026-12-31T23:59:60Z n kernel: {XID79}"):
        stamp = parse_prefix(line)
        assert stamp.epoch is not None and stamp.resolution == 1.0, line
    assert parse_prefix(f"2026-11-27T15:02:03+14:00 n kernel: {XID79}").epoch == t


@pytest.mark.parametrize("fmt, resolution", [
    ("%Y-%m-%dT%H:%M:%S+00:00 n kernel: ", 1.0),  # rsyslog / journal without fractions
    ("%b %d %H:%M:%S n kernel: ", 1.0),  # BSD syslog (local time)
    ("[%a %b %d %H:%M:%S %Y] ", 1.0),  # dmesg -T (local time)
])
def test_an_xid_in_the_second_of_the_last_pass_is_inside_the_window(tmp_path, fmt, resolution):
    """The reproduced bug: a log that says only the second, and a last passing run that started
    at 12:00:00.6: an Xid 79 written at 12:00:00.8 reads as 12:00:00, before the cursor, and was
    hidden. Compared at the line's resolution, the second the cursor falls in is inside; the
    second before it is not."""
    import time

    from gpucheck.core.result import Status
    from gpucheck.platform.kernlog.timeparse import parse_prefix

    second = float(int(time.time()) - 120)
    cursor = second + 0.6
    local = fmt.startswith("%b") or fmt.startswith("[")
    stamp_of = (lambda t: time.strftime(fmt, time.localtime(t))) if local else (
        lambda t: time.strftime(fmt, time.gmtime(t)))
    same = stamp_of(second) + XID79
    assert parse_prefix(same).epoch == second and parse_prefix(same).resolution == resolution
    res = _xid_check(tmp_path, [same], {"epoch": cursor})
    assert res["gpu0"].status == Status.FAIL, res["gpu0"].summary
    before = stamp_of(second - 1) + XID79
    res = _xid_check(tmp_path, [before], {"epoch": cursor})
    assert res["gpu0"].status == Status.PASS, res["gpu0"].summary


def test_a_line_with_microseconds_is_compared_to_the_microsecond():
    from gpucheck.platform.kernlog.timeparse import in_window, parse_prefix

    second = calendar.timegm((2027, 1, 15, 12, 0, 0, 0, 0, 0))
    early = parse_prefix(f"2027-01-15T12:00:00.400000+00:00 n kernel: {XID79}")
    late = parse_prefix(f"2027-01-15T12:00:00.700000+00:00 n kernel: {XID79}")
    assert early.resolution == 1e-6 and not in_window(early.epoch, early.resolution, second + 0.6)
    assert in_window(late.epoch, late.resolution, second + 0.6)
    # a boot-clock line: boot time (/proc/stat btime) is a whole second cut down, so the line may
    # be up to a second later than it reads
    kmsg = parse_prefix("3,100,400000,-;" + XID79, boot_time=second)
    assert kmsg.epoch == second + 0.4 and in_window(kmsg.epoch, kmsg.resolution, second + 0.6)
    assert not in_window(kmsg.epoch, kmsg.resolution, second + 1.5)
