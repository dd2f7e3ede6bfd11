"""`gpucheck xid`: JSON shape, table, exit codes, --ack, and --follow's streaming core."""

from __future__ import annotations

import io
import json
import socket
import os
import sys
import threading
import time
from pathlib import Path

from gpucheck.cli.main import main
from gpucheck.core.state import State
from gpucheck.platform.kernlog.follow import follow
from gpucheck.platform.kernlog.parse import SXidEvent, XidEvent
from gpucheck.platform.kernlog.sources.base import LogPaths

FIX = Path(__file__).parent / "fixtures" / "kernlog"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def run_cli(capsys, *args):
    rc = main(["xid", "--no-nvml", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_shape(capsys):
    rc, out, _ = run_cli(capsys, "--file", str(FIX / "xid_forms.log"), "--file", str(FIX / "nvswitch.log"), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["exit_code"] == 1 and doc["status"] == "fail"
    assert doc["schema"] == "gpucheck.xid" and doc["window"]["since"] == "all"
    for e in doc["events"]:
        assert isinstance(e["xid"], int)
        assert len(e["pci_bus_id"]) == 10 and e["pci_bus_id"].count(":") == 2
        assert e["pci_bus_id"] == e["pci_bus_id"].lower()
        assert {"time", "severity", "action", "raw"} <= set(e)
    by = {(e["xid"], e["pci_bus_id"]): e for e in doc["events"]}
    e79 = by[(79, "0000:af:00")]
    assert e79["severity"] == "critical" and e79["action"] == "reboot" and e79["related"]
    assert e79["raw"].endswith("GPU has fallen off the bus.")
    assert by[(149, "0000:00:00")]["nvlink"]["unit"] == "NETIR_LINK_EVT"
    assert by[(231, "0000:8a:00")]["name"] == "unknown Xid 231"
    assert [s["sxid"] for s in doc["sxid_events"]] == [22013, 20034, 10001, 12028]
    assert doc["sxid_events"][0]["pci_bus_id"] == "0000:08:00" and len(doc["sxid_events"][0]["data"]) == 9
    assert doc["unrecognised"] and doc["counts"]["unrecognised"] == 1
    assert doc["results"][0]["subject"] == "node"


def test_table_and_clean_log(capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "--file", str(FIX / "xid_forms.log"))
    assert rc == 1 and "GPU has fallen off the bus" in out and "Verdict: FAIL" in out
    assert "TIME (last)" in out and "COUNT" in out
    clean = tmp_path / "clean.log"
    clean.write_text("May 18 19:02:39 h kernel: usb 1-1: new device\n")
    rc, out, _ = run_cli(capsys, "--file", str(clean))
    assert rc == 0 and "No Xid or SXid events" in out


def test_exit_codes_for_errors_and_usage(capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "--file", str(tmp_path / "missing.log"))
    assert rc == 3 and "NOT READ" in out and "no such file" in out
    rc, out, _ = run_cli(capsys, "--file", str(tmp_path / "missing.log"), "--on-error", "fail", "--json")
    assert rc == 1 and json.loads(out)["status"] == "error"
    rc, _, err = run_cli(capsys, "--since", "whenever")
    assert rc == 2 and "--since" in err
    rc, _, err = run_cli(capsys, "--boot", "-1", "--source", "dmesg")
    assert rc == 2 and "journal" in err


def test_strict_turns_warn_into_1(capsys, tmp_path):
    f = tmp_path / "k.log"
    f.write_text("NVRM: Xid (PCI:0000:3b:00): 94, pid=1, name=a, Contained: SM\n")
    assert run_cli(capsys, "--file", str(f))[0] == 0
    assert run_cli(capsys, "--file", str(f), "--strict")[0] == 1


def test_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((XID79 + "\n").encode())))
    rc, out, _ = run_cli(capsys, "--file", "-", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["source"] == "stdin" and doc["events"][0]["xid"] == 79


def test_ack_moves_the_last_pass_cursor(capsys, tmp_path):
    log = tmp_path / "k.log"
    recent = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 5))
    log.write_text(f"{recent} h kernel: " + XID79 + "\n")  # after this boot's start, before the ack
    state = tmp_path / "state"
    rc, _, _ = run_cli(capsys, "--file", str(log), "--since", "last-pass", "--state-dir", str(state))
    assert rc == 1  # no cursor yet: everything since boot counts
    rc, out, _ = run_cli(capsys, "--ack", "--state-dir", str(state))
    assert rc == 0 and "last-pass cursor set" in out
    cur = State(state, host=socket.gethostname()).read_cursor("last-pass")  # this node's cursor (per host)
    assert abs(cur["epoch"] - time.time()) < 60 and cur["time"].endswith("Z")
    rc, out, _ = run_cli(capsys, "--file", str(log), "--since", "last-pass", "--state-dir", str(state), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["events"] == [] and doc["counts"]["before_window"] == 1
    rc, _, err = run_cli(capsys, "--ack", "--follow", "--state-dir", str(state))
    assert rc == 2


# -- --follow ------------------------------------------------------------------------------------

def _collect_follow(source, path, write, *, want, tmp_path, nvml=False):
    items, notes = [], []
    got = threading.Event()
    stop = threading.Event()

    def on_item(item, origin):
        items.append((item, origin))
        if len(items) >= want:
            got.set()

    stat = tmp_path / "stat"
    stat.write_text("btime 1700000000\n")
    paths = LogPaths(kmsg=path if source == "kmsg" else "/nonexistent", proc_stat=str(stat))
    ready = threading.Event()
    t = threading.Thread(target=follow, args=(on_item, stop),
                         kwargs=dict(source=source, file=path if source == "file" else None, paths=paths,
                                     nvml=nvml, poll_s=0.05, on_note=notes.append, on_ready=ready.set),
                         daemon=True)
    t.start()
    if source == "file":
        assert ready.wait(5)  # the file is open and at its end: what is written now is new
    write()
    assert got.wait(5), items
    stop.set()
    t.join(5)
    assert not t.is_alive()
    return items, notes


def test_follow_a_growing_file_prints_only_new_events(tmp_path):
    f = tmp_path / "kern.log"
    f.write_text(XID79 + "\n")  # already there: not new

    def write():
        with open(f, "a") as fh:
            fh.write("May 18 19:02:40 h kernel: NVRM: Xid (PCI:0000:5e:00): 48, pid=1, name=a, DBE\n")
            fh.write("May 18 19:02:40 h kernel: nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 20034, Fatal, Link 30 x\n")
            fh.flush()

    items, notes = _collect_follow("file", str(f), write, want=2, tmp_path=tmp_path, nvml=True)
    assert [type(i) for i, _ in items] == [XidEvent, SXidEvent]
    assert items[0][0].xid == 48 and items[0][1] == "file"
    if not os.path.exists("/dev/nvidiactl"):
        assert notes and "NVML Xid events unavailable" in notes[0]


def test_follow_kmsg_records_from_a_fifo(tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    rec = b"4,2000,5107644336,-;" + XID79.encode() + b"\n SUBSYSTEM=pci\n"

    def write():
        fd = os.open(fifo, os.O_WRONLY)
        os.write(fd, rec)
        os.close(fd)

    items, _ = _collect_follow("kmsg", str(fifo), write, want=1, tmp_path=tmp_path)
    ev, origin = items[0]
    assert origin == "kmsg" and ev.xid == 79 and ev.time == 1700000000 + 5107.644336
