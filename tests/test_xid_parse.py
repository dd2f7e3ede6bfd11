"""Kernel-log lines -> events: every real-world form, times, merging, garbage."""

from __future__ import annotations

import calendar
import time
from pathlib import Path

import pytest

from gpucheck.platform.kernlog.parse import MAX_LINE_CHARS, Parser, SXidEvent, Unrecognised, XidEvent, parse_lines
from gpucheck.platform.kernlog.timeparse import parse_prefix

FIX = Path(__file__).parent / "fixtures" / "kernlog"
BOOT = 1_700_000_000.0


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def one(line: str, **kw) -> XidEvent:
    r = parse_lines([line], **kw)
    assert len(r.events) == 1, (line, r)
    return r.events[0]


# -- Xid forms ---------------------------------------------------------------------------------

def test_modern_form_with_pid_and_name():
    ev = one("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.")
    assert (ev.xid, ev.pci_bus_id, ev.pid, ev.process) == (79, "0000:3b:00", 1234, "python3")
    assert ev.text == "GPU has fallen off the bus."
    assert not ev.implied


def test_old_form_without_pci_prefix():
    ev = one("NVRM: Xid (0000:01:00): 31, Ch 0000005a, engmask 00000101, intr 10000000")
    assert (ev.xid, ev.pci_bus_id, ev.pid) == (31, "0000:01:00", None)
    assert ev.text.startswith("Ch 0000005a")


def test_unknown_pid_and_name():
    ev = one("NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error")
    assert ev.pid is None and ev.process is None
    assert ev.text == "An uncorrectable double bit error"


def test_mig_address_domain_and_upper_case_hex():
    ev = one("NVRM: Xid (PCI:0000:3B:00 GPU-I:01 GPU-CI:00): 94, pid=7, name=a, Contained: SM (0x1).")
    assert (ev.pci_bus_id, ev.gpu_instance, ev.compute_instance) == ("0000:3b:00", 1, 0)
    ev = one("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008)")
    assert ev.pci_bus_id == "0018:01:00"
    ev = one("NVRM: Xid (PCI:00000000:AF:00): 13, pid=1, name=x, Graphics Exception")
    assert ev.pci_bus_id == "0000:af:00"


def test_no_pid_forms_keep_text():
    ev = one("NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 00000000 20662342")
    assert ev.xid == 62 and ev.pid is None and ev.text.startswith("223b6a66")


def test_nvlink5_fields_are_kept():
    ev = one("NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
             "(0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert ev.nvlink["unit"] == "NETIR_LINK_EVT" and ev.nvlink["fatal"] is True
    assert ev.nvlink["link"] == 0 and ev.nvlink["words"][0] == "0x026001c6" and len(ev.nvlink["words"]) == 6
    ev = one("NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008)")
    assert ev.nvlink["fatal"] is False and ev.nvlink["unit"] == "SAW_MVB"
    ev = one("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)")
    assert ev.nvlink["link"] == -1 and ev.nvlink["fatal"] is True


def test_xid74_link_and_words():
    ev = one("NVRM: Xid (PCI:0000:8a:00): 74, pid=5, name=p, NVLink: fatal error detected on link 3"
             "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    assert ev.nvlink["link"] == 3 and ev.nvlink["fatal"] is True and "0x10000" in ev.nvlink["words"]


def test_xid154_recovery_action_is_read():
    ev = one("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    assert ev.recovery == {"from_code": 0, "from_label": "None", "to_code": 2, "to_label": "Node Reboot Required"}


def test_xid45_names_its_cause():
    ev = one("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149")
    assert ev.caused_by == 149


# -- bus loss ----------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "NVRM: GPU at 0000:61:00.0 has fallen off the bus.",
    "NVRM: GPU at PCI:0000:61:00: has fallen off the bus.",
    "NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.",
])
def test_bus_loss_without_number_is_implied_79(line):
    ev = one(line)
    assert (ev.xid, ev.pci_bus_id, ev.implied) == (79, "0000:61:00", True)


def test_bus_loss_after_explicit_79_is_the_same_event():
    r = parse_lines([
        f"[ 5107.644336] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[ 5107.644401] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    ], boot_time=BOOT)
    assert len(r.events) == 1
    ev = r.events[0]
    assert not ev.implied and ev.related == ["[ 5107.644401] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."]


def test_explicit_79_after_bus_loss_line_upgrades_the_event():
    r = parse_lines([
        "[ 10.0] NVRM: GPU at 0000:3b:00.0 has fallen off the bus.",
        "[ 10.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    ], boot_time=BOOT)
    assert len(r.events) == 1
    ev = r.events[0]
    assert not ev.implied and ev.pid == 1 and ev.time == BOOT + 10.0
    assert ev.related == ["[ 10.0] NVRM: GPU at 0000:3b:00.0 has fallen off the bus."]


def test_bus_losses_of_different_gpus_or_far_apart_are_separate():
    r = parse_lines([
        "[ 10.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        "[ 10.1] NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus.",
        "[ 5000.0] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    ], boot_time=BOOT)
    assert [(e.pci_bus_id, e.implied) for e in r.events] == [
        ("0000:3b:00", False), ("0000:5e:00", True), ("0000:3b:00", True)]


def test_three_line_driver_load_bus_loss():
    r = parse_lines((FIX / "driver_load_bus_loss.log").read_text().splitlines())
    assert [(e.xid, e.pci_bus_id, e.implied) for e in r.events] == [(79, "0000:5d:00", True)]
    assert r.events[0].related[0].endswith("NVRM: The NVIDIA GPU 0000:5d:00.0")
    assert r.unrecognised == []


# -- NVSwitch ----------------------------------------------------------------------------------

def test_sxid_header_severity_and_data_are_one_event():
    r = parse_lines((FIX / "nvswitch.log").read_text().splitlines(), boot_time=BOOT)
    assert [(s.sxid, s.pci_bus_id, s.fatal) for s in r.sxid_events] == [
        (22013, "0000:08:00", False), (20034, "0000:04:00", True),
        (10001, "0000:07:00", False), (12028, "0000:05:00", False)]
    first = r.sxid_events[0]
    assert first.switch == 3 and first.link == 60 and first.severity == 0
    assert len(first.raw) == 3 and first.data[0] == "0x0000003c" and len(first.data) == 9
    assert r.sxid_events[1].severity == 5 and r.sxid_events[2].link is None
    assert r.events == [] and r.unrecognised == []


def test_sxid_continuation_without_header_is_still_an_event():
    r = parse_lines(["nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 22013, Data {0x1, 0x2}"])
    assert len(r.sxid_events) == 1 and r.sxid_events[0].fatal is None and r.sxid_events[0].data == ["0x1", "0x2"]


# -- the driver's PCI -> UUID lines -------------------------------------------------------------

def test_announcements_map_bus_to_uuid_and_serial():
    r = parse_lines([
        "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
        "NVRM: GPU Board Serial Number: 1650124014249",
        "NVRM: GPU at 0000:03:00: GPU-B850F46D-D5EA-C752-DDF3-C4453E44D3F7",
    ])
    a = r.announcements
    assert a["0000:9b:00"].uuid == "GPU-509665ad-b600-ac93-3616-d754b23d636d"
    assert a["0000:9b:00"].serial == "1650124014249"
    assert a["0000:03:00"].uuid == "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"  # NVML's spelling
    assert r.events == [] and r.unrecognised == []


# -- times -------------------------------------------------------------------------------------

def test_every_prefix_gives_an_absolute_time(utc):
    t = calendar.timegm((2024, 5, 18, 19, 2, 39, 0, 0, 0))
    cases = [
        ("[ 5107.644336] NVRM: x", BOOT + 5107.644336, "monotonic"),
        ("6,1234,5107644336,-;NVRM: x", BOOT + 5107.644336, "kmsg"),
        ("[Sat May 18 19:02:39 2024] NVRM: x", t, "wallclock"),
        ("May 18 19:02:39 host kernel: [ 5107.644336] NVRM: x", t, "wallclock"),
        ("2024-05-18T19:02:39+0000 host kernel: NVRM: x", t, "wallclock"),
        ("2024-05-18T21:02:39.250000+02:00 host kernel: NVRM: x", t + 0.25, "wallclock"),
        ("2024-05-18T19:02:39,500000+00:00 NVRM: x", t + 0.5, "wallclock"),
        ("2024-05-18T19:02:39Z host kernel: NVRM: x", t, "wallclock"),
        ("1716058959.125 host kernel: NVRM: x", 1716058959.125, "wallclock"),
    ]
    for line, want, kind in cases:
        st = parse_prefix(line, boot_time=BOOT, ref_time=t + 3600)
        assert st.message == "NVRM: x", line
        assert st.epoch == pytest.approx(want, abs=1e-6), line
        assert st.kind == kind, line


def test_syslog_date_takes_the_year_before_when_in_the_future(utc):
    jan = calendar.timegm((2025, 1, 2, 0, 0, 0, 0, 0, 0))
    st = parse_prefix("Dec 31 23:59:59 host kernel: NVRM: x", ref_time=jan)
    assert st.epoch == calendar.timegm((2024, 12, 31, 23, 59, 59, 0, 0, 0))


def test_monotonic_without_boot_time_is_untimed_and_bare_lines_too():
    assert parse_prefix("[ 12.5] NVRM: x").epoch is None
    st = parse_prefix("NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=x, y")
    assert st.epoch is None and st.message.startswith("NVRM: Xid")


def test_multi_format_fixture(utc):
    r = parse_lines((FIX / "multi_format.log").read_text().splitlines(), boot_time=BOOT,
                    ref_time=calendar.timegm((2024, 6, 1, 0, 0, 0, 0, 0, 0)))
    got = [(e.xid, e.pci_bus_id) for e in r.events]
    assert got == [(79, "0000:3b:00"), (119, "0000:9b:00"), (48, "0000:5e:00"), (64, "0000:5e:00"),
                   (95, "0000:5e:00"), (13, "0000:18:00"), (31, "0000:18:00"), (62, "0000:18:00"),
                   (109, "0000:18:00")]
    assert r.events[0].related  # the syslog bus-loss line merged into the Xid 79
    assert r.events[2].time == pytest.approx(calendar.timegm((2024, 5, 18, 19, 5, 1, 0, 0, 0)) + 0.123456)
    assert r.events[4].time == pytest.approx(calendar.timegm((2024, 5, 18, 19, 5, 3, 0, 0, 0)) + 0.5)
    assert r.events[6].time == pytest.approx(BOOT + 9000.0)  # kmsg record
    assert r.events[-1].time is None  # a bare line


# -- garbage -----------------------------------------------------------------------------------

def test_unrecognised_xid_like_lines_are_kept_not_dropped():
    r = parse_lines([
        "NVRM: Xid (43, pid: 5678): ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "nvidia-nvswitch0: SXid (PCI:zz): 1, Fatal",
        "NVRM: GPU has fallen off the bus somewhere",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",  # context, not an event
    ])
    assert [type(u) for u in r.unrecognised] == [Unrecognised] * 2
    # A bus loss without an address still counts: an implied Xid 79 on "GPU unknown" (issue 15).
    assert [(e.xid, e.implied, e.pci_bus_id) for e in r.events] == [(79, True, None)]
    assert r.sxid_events == []


def test_garbage_binary_and_huge_lines_never_crash():
    rng = __import__("random").Random(7)
    lines = []
    for _ in range(300):
        n = rng.randint(0, 300)
        lines.append(bytes(rng.randrange(256) for _ in range(n)).decode("utf-8", "replace"))
    lines.append("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, " + "A" * 1_000_000)
    lines.append("NVRM: Xid (PCI:0000:3b:00):")  # truncated
    lines.append("NVRM: Xid (PCI:0000:3b:00): 99999999999999999999999, x")
    lines.append("\x00NVRM\x00: Xid \x00(PCI:0000:3b:00): 79")
    r = parse_lines(lines)
    big = [e for e in r.events if e.xid == 13]
    assert len(big) == 1 and len(big[0].raw) <= MAX_LINE_CHARS + 20
    assert all(isinstance(x, (XidEvent,)) for x in r.events)


def test_streaming_feed_returns_only_new_items():
    p = Parser()
    assert p.feed("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.", boot_time=BOOT)
    assert p.feed("[ 1.1] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", boot_time=BOOT) == []
    items = p.feed("nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 20034, Fatal, Link 30 LTSSM Fault Up")
    assert len(items) == 1 and isinstance(items[0], SXidEvent)
    assert p.feed("nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 20034, Severity 5 Engine instance 30") == []


def test_fast_bus_normaliser_agrees_with_gpucheck_pci():
    from gpucheck.platform.kernlog.parse import short_bus_id as fast
    from gpucheck.platform.pci import short_bus_id as ref

    for t in ("0000:3B:00", "00000000:af:00", "0018:01:00", "1:2:3", "FFFFFFFF:00:00", "0000:00:20", "ab:cd:1f"):
        assert fast(t) == ref(t), t
