"""The real readers on temporary files, FIFOs, fake commands and permission-denied paths."""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import random
import threading
from pathlib import Path

import pytest

from gpucheck.platform.kernlog import capture_for_snapshot, sources
from gpucheck.platform.kernlog.sources.base import LogPaths
from gpucheck.platform.kernlog.sources.linefilter import iter_relevant_lines
from gpucheck.platform.kernlog.sources.selection import read_kernel_log
from gpucheck.platform.kernlog.sources.kmsg import read_kmsg

FIX = Path(__file__).parent / "fixtures" / "kernlog"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def paths_for(tmp_path: Path, **kw) -> LogPaths:
    stat_file = tmp_path / "stat"
    stat_file.write_text("cpu  1 2 3\nbtime 1700000000\n")
    base = dict(kmsg=str(tmp_path / "no-kmsg"), proc_stat=str(stat_file),
                dmesg_restrict=str(tmp_path / "restrict"),
                journalctl=(str(tmp_path / "no-journalctl"),), dmesg=(str(tmp_path / "no-dmesg"),),
                log_files=(str(tmp_path / "no-kern.log"),))
    base.update(kw)
    return LogPaths(**base)


def script(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


# -- the line filter -----------------------------------------------------------------------------

def test_filter_finds_lines_across_any_chunk_boundary():
    lines = [b"noise line %d" % i for i in range(200)]
    lines[17] = b"May 18 19:02:39 h kernel: " + XID79.encode()
    lines[18] = b"nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 20034, Fatal, Link 30"
    lines[199] = b"NVRM: last line without newline"
    data = b"\n".join(lines)
    want = [lines[17], lines[18], lines[199]]
    for chunk in (1, 2, 3, 7, 64, 1000, 1 << 20):
        got = list(iter_relevant_lines(io.BytesIO(data), chunk_bytes=chunk))
        assert got == want, chunk


def test_filter_cuts_huge_lines_and_skips_their_rest():
    huge = b"NVRM: " + b"x" * 5000 + b"NVRM" + b"y" * 5000
    data = b"a\n" + huge + b"\n" + b"NVRM: Xid (PCI:0000:01:00): 13, ok\n"
    for chunk in (10, 333, 4096, 1 << 20):
        got = list(iter_relevant_lines(io.BytesIO(data), chunk_bytes=chunk, max_line=1000))
        assert len(got) == 2, chunk
        assert len(got[0]) == 1000 and got[0].startswith(b"NVRM: x")
        assert got[1] == b"NVRM: Xid (PCI:0000:01:00): 13, ok"


def garbage(size: int, seed: int) -> bytes:
    """`size` random bytes (seeded: the same bytes every run) holding none of the filter's needles:
    os.urandom once held an "SXid" (about 1 run in 7,000), a line the test did not expect."""
    from gpucheck.platform.kernlog.sources.linefilter import NEEDLES

    data = random.Random(seed).randbytes(size)
    while any(n in data for n in (*NEEDLES, b"nvidia-nvswitch")):
        for n in (*NEEDLES, b"nvidia-nvswitch"):
            data = data.replace(n, n.lower().replace(b"x", b"y"))
    return data


def test_filter_survives_binary_garbage(tmp_path):
    rnd = garbage(300_000, seed=26)
    p = tmp_path / "garbage.log"
    p.write_bytes(rnd + b"\n" + XID79.encode() + b"\n" + rnd)
    res = read_kernel_log(files=[str(p)], paths=paths_for(tmp_path))
    assert res.ok and res.lines == [XID79]
    assert res.bytes_read == p.stat().st_size


# -- /dev/kmsg -----------------------------------------------------------------------------------

def test_kmsg_records_file_drops_continuations(tmp_path):
    k = read_kmsg(str(FIX / "kmsg_records.txt"))
    assert k.records == 6 and k.first_seq == 1000 and k.first_usec == 5_000_000
    assert all(not ln.startswith(" ") for ln in k.lines)
    assert len(k.lines) == 5 and k.lines[1].startswith("4,1001,812417230,-;NVRM: Xid")


def test_kmsg_from_fifo_reads_to_the_end_without_blocking(tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    data = (FIX / "kmsg_records.txt").read_bytes()
    w = threading.Thread(target=lambda: Path(fifo).write_bytes(data))
    w.start()
    fd_keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open at once
    w.join(5)
    k = read_kmsg(str(fifo))
    os.close(fd_keep)
    assert k.records == 6 and any("79" in ln for ln in k.lines)


def test_kmsg_epipe_means_overwritten_and_reading_goes_on(tmp_path, monkeypatch):
    real_read = os.read
    calls = {"n": 0}

    def flaky_read(fd, n):
        calls["n"] += 1
        if calls["n"] == 1:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return real_read(fd, n)

    monkeypatch.setattr(sources.kmsg.os, "read", flaky_read)
    p = paths_for(tmp_path, kmsg=str(FIX / "kmsg_records.txt"))
    res = read_kernel_log("kmsg", paths=p)
    assert res.ok and res.source == "kmsg" and res.records == 6
    assert any("overwritten" in n for n in res.notes)
    assert any("wrapped" in n for n in res.notes)  # first seq 1000: older records are gone
    assert res.coverage_start == pytest.approx(1700000000 + 5.0)


@pytest.mark.skipif(not os.path.exists("/dev/kmsg"), reason="no /dev/kmsg on this machine")
def test_real_dev_kmsg_reads_when_permitted():
    try:
        k = read_kmsg("/dev/kmsg")
    except PermissionError:
        pytest.skip("/dev/kmsg not readable here (the permission tests cover this)")
    assert k.records > 0 and k.first_seq is not None


# -- permission denied: a real EACCES/EPERM, as the unprivileged user -------------------------------

def _as_nobody(fn):
    """Run fn() with uid 65534 in a forked child when root (root reads everything), else here."""
    if os.geteuid() != 0:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = json.dumps(fn()).encode()
            os.write(w, out)
        except BaseException as e:  # noqa: BLE001
            os.write(w, json.dumps({"child_error": repr(e)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


@pytest.fixture
def open_dir(tmp_path):
    """A folder the unprivileged user may enter (pytest's own tmp folders are private)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="gpucheck-xid-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_unreadable_file_is_an_error_saying_permission_denied(open_dir):
    secret = open_dir / "kern.log"
    secret.write_text(XID79 + "\n")
    secret.chmod(0)
    p = paths_for(open_dir, log_files=(str(secret),))

    def attempt():
        res = read_kernel_log("files", paths=p)
        return {"ok": res.ok, "error": res.error, "lines": res.lines}

    out = _as_nobody(attempt)
    assert "child_error" not in out, out
    assert out["ok"] is False and out["lines"] == []
    assert "permission denied" in out["error"] and str(secret) in out["error"]


@pytest.mark.skipif(not os.path.exists("/dev/kmsg"), reason="no /dev/kmsg")
def test_dev_kmsg_permission_denied_names_dmesg_restrict(tmp_path):
    try:
        restrict = Path("/proc/sys/kernel/dmesg_restrict").read_text().strip()
    except OSError:
        pytest.skip("no dmesg_restrict")
    if restrict != "1":
        pytest.skip("kernel.dmesg_restrict=0: everyone may read /dev/kmsg here")
    p = LogPaths(proc_stat=paths_for(tmp_path).proc_stat)

    def attempt():
        res = read_kernel_log("kmsg", paths=p)
        return {"ok": res.ok, "error": res.error}

    out = _as_nobody(attempt)
    assert out["ok"] is False
    assert "/dev/kmsg: permission denied" in out["error"] and "dmesg_restrict=1" in out["error"]


def test_nothing_readable_anywhere_lists_every_source_tried(tmp_path):
    p = paths_for(tmp_path)
    res = read_kernel_log("auto", paths=p)
    assert not res.ok and res.lines == []
    err = res.error
    for what in ("kmsg", "journal", "dmesg", "files"):
        assert f"{what} (" in err
    assert "no such file" in err


# -- commands ------------------------------------------------------------------------------------

def test_journal_without_entries_is_an_error_not_an_empty_log(tmp_path):
    j = script(tmp_path, "journalctl", 'echo "No journal files were found." >&2; exit 0')
    res = read_kernel_log("journal", paths=paths_for(tmp_path, journalctl=(j,)))
    assert not res.ok and "returned no kernel messages" in res.error


def test_journal_empty_window_is_fine_when_the_journal_has_entries(tmp_path):
    j = script(tmp_path, "journalctl", 'case "$*" in *--since*) exit 0;; *) echo "2024-05-18T19:00:00+0000 h kernel: Linux";; esac')
    res = read_kernel_log("journal", since=1716058800.0, paths=paths_for(tmp_path, journalctl=(j,)))
    assert res.ok and res.lines == []


def test_dmesg_not_permitted_is_reported(tmp_path):
    d = script(tmp_path, "dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1')
    res = read_kernel_log("dmesg", paths=paths_for(tmp_path, dmesg=(d,)))
    assert not res.ok and "Operation not permitted" in res.error


def test_auto_falls_back_in_order_and_says_what_failed(tmp_path):
    j = script(tmp_path, "journalctl", "exit 1")
    d = script(tmp_path, "dmesg", f'echo "[ 5107.644336] {XID79}"; echo "[ 5108.0] usb 1-1: hello"')
    res = read_kernel_log("auto", paths=paths_for(tmp_path, journalctl=(j,), dmesg=(d,)))
    assert res.ok and res.source == "dmesg"
    assert [a.source for a in res.attempts] == ["kmsg", "journal", "dmesg"]
    assert res.lines == [f"[ 5107.644336] {XID79}"]
    assert res.chunks[0].boot_time == 1700000000.0


def test_journal_gets_since_and_previous_boot(tmp_path):
    log = tmp_path / "args"
    j = script(tmp_path, "journalctl", f'echo "$*" >> {log}; echo "2024-05-18T19:02:39+0000 h kernel: {XID79}"')
    res = read_kernel_log("auto", boot=-1, since=1716058800.0, paths=paths_for(tmp_path, journalctl=(j,)))
    assert res.ok and res.source == "journal (boot -1)"
    args = log.read_text()
    assert "-k -b -1" in args and "--since @1716058800" in args and "short-iso-precise" in args


def test_hung_command_is_killed(tmp_path):
    d = script(tmp_path, "dmesg", "exec sleep 30")
    res = read_kernel_log("dmesg", paths=paths_for(tmp_path, dmesg=(d,)), timeout_s=0.5)
    assert not res.ok and "timed out" in res.error


def test_kmsg_wrap_falls_back_to_the_journal(tmp_path):
    j = script(tmp_path, "journalctl", f'echo "2024-05-18T19:02:39+0000 h kernel: {XID79}"')
    p = paths_for(tmp_path, kmsg=str(FIX / "kmsg_records.txt"), journalctl=(j,))
    res = read_kernel_log("auto", since=1700000000.0, paths=p)
    assert res.source == "journal" and any("instead" in n for n in res.notes)


# -- files -----------------------------------------------------------------------------------------

def test_rotated_and_gzipped_files_oldest_first_and_old_ones_skipped(tmp_path):
    base = tmp_path / "kern.log"
    base.write_text("May 18 19:02:39 h kernel: NVRM: newest\n")
    (tmp_path / "kern.log.1").write_text("May 17 19:02:39 h kernel: NVRM: older\n")
    with gzip.open(tmp_path / "kern.log.2.gz", "wt") as f:
        f.write("May 16 19:02:39 h kernel: NVRM: oldest\n")
    for name, mt in (("kern.log.2.gz", 1000), ("kern.log.1", 2000), ("kern.log", 3000)):
        os.utime(tmp_path / name, (mt, mt))
    p = paths_for(tmp_path, log_files=(str(base),))
    res = read_kernel_log("files", paths=p)
    assert res.ok and [ln.split("NVRM: ")[1] for ln in res.lines] == ["oldest", "older", "newest"]
    res = read_kernel_log("files", since=1500, paths=p)
    assert [ln.split("NVRM: ")[1] for ln in res.lines] == ["older", "newest"]


def test_stdin_and_corrupt_gzip(tmp_path):
    res = read_kernel_log(files=["-"], stdin=io.BytesIO(XID79.encode() + b"\n"), paths=paths_for(tmp_path))
    assert res.ok and res.source == "stdin" and res.lines == [XID79]
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    res = read_kernel_log(files=[str(bad)], paths=paths_for(tmp_path))
    assert not res.ok and str(bad) in res.error
    res = read_kernel_log(files=[str(tmp_path)], paths=paths_for(tmp_path))
    assert not res.ok and "is a directory" in res.error


def test_capture_for_snapshot_keeps_relevant_lines_and_errors(tmp_path):
    p = paths_for(tmp_path, kmsg=str(FIX / "kmsg_records.txt"))
    snap = capture_for_snapshot(max_lines=2, source="kmsg", paths=p)
    assert snap["source"] == "kmsg" and snap["error"] is None and snap["boot_time"] == 1700000000.0
    assert len(snap["lines"]) == 2 and snap["lines"][-1].startswith("4,1005,")
    assert any("left out" in n for n in snap["notes"])
    snap = capture_for_snapshot(source="kmsg", paths=paths_for(tmp_path))
    assert snap["lines"] == [] and "no such file" in snap["error"]
    json.dumps(snap)


def test_big_file_segments_scan_like_the_stream(tmp_path, monkeypatch):
    """The forked per-CPU segment scan of a big plain file finds exactly what the stream finds."""
    import random

    rng = random.Random(3)
    out = []
    for i in range(3000):
        r = rng.random()
        if r < 0.02:
            out.append(f"[{i}.000001] {XID79}")
        elif r < 0.03:
            out.append(f"[{i}.5] nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link {i % 64} x")
        elif r < 0.035:
            out.append("NVRM" + "z" * 5000)  # long lines near segment cuts
        else:
            out.append(f"[{i}.2] usb 1-{i}: some noise with V and X and M in it NVR VRM SXi")
    p = tmp_path / "big.log"
    p.write_bytes("\n".join(out).encode() + b"\nNVRM: last line without a newline")
    with open(p, "rb") as f:
        want = [b.decode() for b in iter_relevant_lines(f, chunk_bytes=4096)]
    monkeypatch.setattr(sources.files, "PARALLEL_MIN_BYTES", 8192)
    monkeypatch.setattr(sources.files, "_usable_cpus", lambda: 4)
    monkeypatch.setattr(sources.files.threading, "active_count", lambda: 1)
    lines, n = sources.files.read_file(str(p))
    assert lines == want and n == p.stat().st_size
    assert want[-1] == "NVRM: last line without a newline" and len(want) > 60


def _die_like_sigbus(job):
    import faulthandler
    import signal

    faulthandler.disable()  # pytest's handler would print the child's traceback
    os.kill(os.getpid(), signal.SIGBUS)  # what a file truncated under a memory map does


def test_a_worker_killed_by_sigbus_falls_back_to_the_stream(tmp_path, monkeypatch):
    p = tmp_path / "big.log"
    p.write_bytes(b"noise\n" * 5000 + XID79.encode() + b"\n" + b"noise\n" * 5000)
    monkeypatch.setattr(sources.files, "PARALLEL_MIN_BYTES", 8192)
    monkeypatch.setattr(sources.files, "_usable_cpus", lambda: 2)
    monkeypatch.setattr(sources.files.threading, "active_count", lambda: 1)
    monkeypatch.setattr(sources.files, "_scan_segment", _die_like_sigbus)
    lines, n = sources.files.read_file(str(p))
    assert lines == [XID79] and n == p.stat().st_size
