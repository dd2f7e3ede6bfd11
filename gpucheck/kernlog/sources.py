"""Reading the kernel log: /dev/kmsg, journalctl -k, dmesg, log files, any file or stdin.

A reader returns plain data (`ReadResult`): the relevant lines with their prefixes (prefiltered
cheaply: only lines holding ``NVRM`` or ``SXid`` survive), the source that gave them, and every
source tried with why it failed. Nothing here parses events or judges anything.

Every path and command is injectable (`LogPaths`) so that the real readers run in tests on
temporary files, FIFOs and fake commands.

Failure is data, never silence: when nothing could be read, `ReadResult.ok` is False and
`ReadResult.error` says which sources were tried and why each failed (permission denied with the
kernel.dmesg_restrict hint, command not found, no entries, ...).
"""

from __future__ import annotations

import errno
import glob
import gzip
import mmap
import os
import re
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Iterator

# A relevant line holds one of these (bytes test before any decoding or regex): every GPU
# driver line says NVRM, every NVSwitch error line SXid.
NEEDLES: tuple[bytes, ...] = (b"NVRM", b"SXid")
# In big buffers a needle is found through its rarest byte (bytes.find of one byte is memchr),
# each hit then checked in place. The rarest byte is picked per buffer from a sample of it.
ANCHOR_SAMPLE = 1 << 16
CHUNK_BYTES = 16 << 20
MAX_LINE_BYTES = 64 << 10  # longer lines are cut here (and their rest skipped)
KMSG_READ_BYTES = 1 << 16  # one /dev/kmsg record per read(); the kernel caps a record at 8 KiB
DEFAULT_TIMEOUT_S = 8.0

SOURCES = ("auto", "kmsg", "journal", "dmesg", "files")


@dataclass(frozen=True)
class LogPaths:
    kmsg: str = "/dev/kmsg"
    proc_stat: str = "/proc/stat"
    dmesg_restrict: str = "/proc/sys/kernel/dmesg_restrict"
    journalctl: tuple[str, ...] = ("journalctl",)
    dmesg: tuple[str, ...] = ("dmesg",)
    log_files: tuple[str, ...] = ("/var/log/kern.log", "/var/log/syslog", "/var/log/messages")


DEFAULT_PATHS = LogPaths()


@dataclass
class Chunk:
    """Lines from one origin, with what is needed to time them."""

    origin: str
    lines: list[str]
    boot_time: float | None = None  # for monotonic / kmsg stamps
    ref_time: float | None = None  # for syslog dates without a year


@dataclass
class Attempt:
    source: str
    detail: str
    ok: bool
    error: str | None = None

    def __str__(self) -> str:
        return f"{self.source} ({self.detail}): " + ("ok" if self.ok else str(self.error))


@dataclass
class ReadResult:
    source: str | None = None
    chunks: list[Chunk] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    bytes_read: int = 0
    records: int | None = None  # kmsg records / lines, when counted
    notes: list[str] = field(default_factory=list)
    boot_time: float | None = None
    coverage_start: float | None = None  # the oldest time the source still holds, when known
    undated: list[str] = field(default_factory=list)  # origins whose [seconds] stamps are not this boot's

    @property
    def ok(self) -> bool:
        return self.source is not None

    @property
    def error(self) -> str | None:
        if self.ok:
            return None
        if not self.attempts:
            return "no kernel-log source was tried"
        return "cannot read the kernel log: " + "; ".join(
            f"{a.source} ({a.detail}): {a.error}" for a in self.attempts if not a.ok
        )

    @property
    def lines(self) -> list[str]:
        return [ln for c in self.chunks for ln in c.lines]

    def describe(self) -> str:
        if not self.ok:
            return "nothing read"
        size = _human(self.bytes_read)
        rec = f", {self.records} records" if self.records is not None else ""
        return f"{self.source} ({size}{rec})"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


# -- boot time and permission hints -------------------------------------------------------------

def read_boot_time(proc_stat: str = DEFAULT_PATHS.proc_stat) -> float | None:
    """The boot time (epoch) from /proc/stat's btime, or from the monotonic clock."""
    try:
        with open(proc_stat, "rb") as f:
            for raw in f:
                if raw.startswith(b"btime "):
                    return float(raw.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None


def permission_hint(paths: LogPaths = DEFAULT_PATHS) -> str:
    try:
        with open(paths.dmesg_restrict) as f:
            restrict = f.read().strip()
    except OSError:
        restrict = None
    if os.geteuid() != 0:
        if restrict == "1":
            return ("kernel.dmesg_restrict=1 and gpucheck is not root: run it as root, give it "
                    "CAP_SYSLOG, or point --file at a copy of the log")
        return "gpucheck is not root: run it as root or give it CAP_SYSLOG"
    return "root without CAP_SYSLOG (a container?): grant CAP_SYSLOG or read the host's log with --file"


def oserror_text(e: OSError, what: str, paths: LogPaths) -> str:
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM):
        return f"{what}: permission denied ({permission_hint(paths)})"
    if isinstance(e, FileNotFoundError):
        return f"{what}: no such file"
    if isinstance(e, IsADirectoryError):
        return f"{what}: is a directory"
    return f"{what}: {e.strerror or e}"


# -- the fast line filter -----------------------------------------------------------------------

class Counter:
    def __init__(self) -> None:
        self.bytes = 0


def _has_needle(b: bytes | bytearray, needles: tuple[bytes, ...]) -> bool:
    return any(nd in b for nd in needles)


def _matching_lines(data: Any, start: int, end: int, needles: tuple[bytes, ...],
                    max_line: int) -> list[bytes]:
    """Complete lines in data[start:end] (end is the position of a newline) holding a needle.

    A needle is searched for through its anchor byte (bytes.find of one byte is memchr), and each
    hit is checked in place; a line is taken once, then the search goes on after it.
    """
    spans: dict[int, int] = {}
    find, rfind = data.find, data.rfind
    sample = data[start:start + ANCHOR_SAMPLE]
    for nd in needles:
        k = min(range(len(nd)), key=lambda i: sample.count(nd[i:i + 1]))
        a = nd[k:k + 1]
        j = k - 1 if k > 0 else min(1, len(nd) - 1)  # a neighbour byte: a cheap first check
        b = nd[j]
        m = len(nd)
        p = find(a, start + k, end)
        while p >= 0:
            if data[p - k + j] != b or data[p - k:p - k + m] != nd:
                p = find(a, p + 1, end)
                continue
            ls = rfind(b"\n", start, p) + 1
            if ls == 0:
                ls = start
            le = find(b"\n", p, end)
            if le < 0:
                le = end
            spans[ls] = le
            p = find(a, le + 1 + k, end) if le < end else -1
    if not spans:
        return []
    out = []
    for ls in sorted(spans):
        le = spans[ls]
        out.append(bytes(data[ls:min(le, ls + max_line)]))
    return out


def iter_relevant_lines(f: IO[bytes], *, needles: tuple[bytes, ...] = NEEDLES,
                        chunk_bytes: int = CHUNK_BYTES, max_line: int = MAX_LINE_BYTES,
                        counter: Counter | None = None) -> Iterator[bytes]:
    """Lines of a binary stream (without the newline) that hold one of `needles`, in order.

    Reads big chunks and searches them with bytes.find, so the cost is close to one pass over
    the data. Garbage and binary data pass through harmlessly; a line longer than `max_line` is
    cut there and the rest of it skipped (a huge line costs nothing more).
    """
    carry = b""
    skipping = False  # inside the rest of an overlong line
    readinto = getattr(f, "readinto", None)
    # The buffer starts small and grows to chunk_bytes while reads keep filling it.
    buf = bytearray(min(chunk_bytes, 1 << 16)) if readinto is not None else None
    while True:
        if buf is not None:
            n = readinto(buf)  # type: ignore[misc]
            if not n:
                break
            data: bytes | bytearray = buf if n == len(buf) else buf[:n]
            if n == len(buf) and len(buf) < chunk_bytes:
                buf = bytearray(min(chunk_bytes, len(buf) * 8))
        else:
            data = f.read(chunk_bytes)
            if not data:
                break
        if counter is not None:
            counter.bytes += len(data)
        first_nl = data.find(b"\n")
        if first_nl < 0:
            if skipping:
                continue
            carry += bytes(data)
            if len(carry) > max_line:
                head = carry[:max_line]
                if _has_needle(head, needles):
                    yield head
                carry, skipping = b"", True
            continue
        if skipping:
            skipping = False
        else:
            line = carry + data[:first_nl] if carry else bytes(data[:first_nl])
            if len(line) > max_line:
                line = line[:max_line]
            if _has_needle(line, needles):
                yield line
        carry = b""
        last_nl = data.rfind(b"\n")
        if last_nl > first_nl:
            yield from _matching_lines(data, first_nl + 1, last_nl, needles, max_line)
        tail = bytes(data[last_nl + 1:])
        if len(tail) > max_line:
            head = tail[:max_line]
            if _has_needle(head, needles):
                yield head
            skipping = True
        else:
            carry = tail
    if carry and not skipping and _has_needle(carry, needles):
        yield carry


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "replace").rstrip("\r")


# -- /dev/kmsg ----------------------------------------------------------------------------------

@dataclass
class KmsgRead:
    lines: list[str]
    records: int
    bytes: int
    first_seq: int | None
    first_usec: int | None
    overwritten: int  # EPIPE: records overwritten while we read


def _kmsg_head(rec: bytes) -> tuple[int | None, int | None]:
    try:
        head = rec.split(b";", 1)[0].split(b",")
        return int(head[1]), int(head[2])
    except (IndexError, ValueError):
        return None, None


def read_kmsg(path: str = DEFAULT_PATHS.kmsg, *, needles: tuple[bytes, ...] = NEEDLES) -> KmsgRead:
    """All records of the kernel ring buffer, read non-blocking to its end.

    Each read() of /dev/kmsg returns one record ``prio,seq,usec,flags;message`` followed by
    continuation lines that start with a space (dropped). EPIPE means the record we were about
    to read was overwritten: carry on with the next one. Works on a plain file or FIFO of such
    records too (several records per read). Raises OSError when the device cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    out: list[str] = []
    records = nbytes = overwritten = 0
    first_seq = first_usec = None
    partial = b""
    try:
        while True:
            try:
                chunk = os.read(fd, KMSG_READ_BYTES)
            except BlockingIOError:
                break  # EAGAIN: the end of the buffer
            except BrokenPipeError:
                overwritten += 1
                continue
            except InterruptedError:
                continue
            if not chunk:
                break
            nbytes += len(chunk)
            data = partial + chunk if partial else chunk
            parts = data.split(b"\n")
            partial = parts.pop()
            for rec in parts:
                if not rec or rec[:1] in (b" ", b"\t"):
                    continue  # continuation (dictionary) line
                records += 1
                if first_seq is None:
                    first_seq, first_usec = _kmsg_head(rec)
                if _has_needle(rec, needles):
                    out.append(_decode(rec[:MAX_LINE_BYTES]))
        if partial and partial[:1] not in (b" ", b"\t"):
            records += 1
            if first_seq is None:
                first_seq, first_usec = _kmsg_head(partial)
            if _has_needle(partial, needles):
                out.append(_decode(partial[:MAX_LINE_BYTES]))
    finally:
        os.close(fd)
    return KmsgRead(out, records, nbytes, first_seq, first_usec, overwritten)


# -- commands -----------------------------------------------------------------------------------

def run_command(argv: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                needles: tuple[bytes, ...] = NEEDLES) -> tuple[list[str], int, int, str]:
    """Run `argv`, filter its stdout on the fly. Returns (lines, bytes, returncode, stderr).

    Raises OSError when the command cannot be started; a command that outlives `timeout_s` is
    killed and reported with returncode -9 and a stderr that says so.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        try:
            proc.kill()
        except OSError:
            pass

    timer = threading.Timer(timeout_s, kill)
    timer.daemon = True
    timer.start()
    err_box: list[bytes] = []
    err_thread = threading.Thread(target=lambda: err_box.append(proc.stderr.read() if proc.stderr else b""),
                                  daemon=True)
    err_thread.start()
    counter = Counter()
    try:
        assert proc.stdout is not None
        lines = [_decode(b) for b in iter_relevant_lines(proc.stdout, needles=needles, counter=counter,
                                                          chunk_bytes=1 << 20)]
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err_thread.join(2.0)
    stderr = (err_box[0] if err_box else b"").decode("utf-8", "replace").strip()
    if timed_out.is_set():
        return lines, counter.bytes, -9, f"timed out after {timeout_s:g} s"
    return lines, counter.bytes, rc, stderr


def _first_line(text: str) -> str:
    for ln in text.splitlines():
        if ln.strip():
            return ln.strip()
    return ""


# -- files --------------------------------------------------------------------------------------

class _OwnedGzipFile(gzip.GzipFile):
    """A GzipFile that closes the file it reads when it is closed."""

    def __init__(self, raw: IO[bytes]):
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def open_log_file(path: str) -> IO[bytes]:
    """Open a log file for binary reading; .gz files are decompressed. Regular files only
    (gpucheck.safeio.open_input: a FIFO or a device such as /dev/zero would never end; it is a
    RefusedPath, an OSError); there is no size limit: the file is read as a stream, and only
    matching lines (each cut at MAX_LINE_BYTES) are kept."""
    from ..safeio import open_input

    raw = os.fdopen(open_input(path), "rb")
    if path.endswith(".gz"):
        return _OwnedGzipFile(raw)  # type: ignore[return-value]
    return raw


def read_stream(f: IO[bytes], *, needles: tuple[bytes, ...] = NEEDLES) -> tuple[list[str], int]:
    counter = Counter()
    lines = [_decode(b) for b in iter_relevant_lines(f, needles=needles, counter=counter)]
    return lines, counter.bytes


# -- big plain files: one segment per CPU ----------------------------------------------------------

PARALLEL_MIN_BYTES = 128 << 20  # below this a file is scanned in this process
MAX_WORKERS = 8


def _line_start_at_or_after(f: IO[bytes], pos: int, size: int) -> int:
    """The offset of the first line that starts at or after `pos`."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    offset = pos - 1
    while True:
        buf = f.read(1 << 16)
        if not buf:
            return size
        i = buf.find(b"\n")
        if i >= 0:
            return offset + i + 1
        offset += len(buf)


def _scan_segment(job: tuple[str, int, int]) -> tuple[list[bytes], int]:
    """The relevant lines of bytes [start, end) of a plain file (start and end are line starts,
    or the end of the file), searched in place through a read-only memory map."""
    path, start, end = job
    if end <= start:
        return [], 0
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        end = min(end, len(mm))
        last_nl = mm.rfind(b"\n", start, end)
        lines = _matching_lines(mm, start, last_nl, NEEDLES, MAX_LINE_BYTES) if last_nl > start else []
        tail_start = last_nl + 1 if last_nl >= start else start
        if tail_start < end:  # a last line without a newline
            tail = mm[tail_start:min(end, tail_start + MAX_LINE_BYTES)]
            if _has_needle(tail, NEEDLES):
                lines.append(tail)
        return lines, end - start
    finally:
        mm.close()


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_file(path: str) -> tuple[list[str], int]:
    """The relevant lines of one log file.

    A big plain file is cut at line starts into one segment per CPU, each searched through a
    memory map by a forked worker (only from a single-threaded process on Linux: forking a
    threaded one is unsafe). The map lives only in the workers: a file truncated under it
    (logrotate copytruncate) kills a worker with SIGBUS, never gpucheck, and the file is then read
    as a stream like everything else (.gz decompressed)."""
    st = os.stat(path)
    if not path.endswith(".gz") and stat.S_ISREG(st.st_mode) and st.st_size >= PARALLEL_MIN_BYTES:
        size = st.st_size
        workers = min(_usable_cpus(), MAX_WORKERS, max(1, size // (PARALLEL_MIN_BYTES // 2)))
        if workers >= 2 and sys.platform.startswith("linux") and threading.active_count() == 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            from concurrent.futures.process import BrokenProcessPool

            try:
                with open(path, "rb") as f:
                    bounds = [0] + [_line_start_at_or_after(f, size * i // workers, size)
                                    for i in range(1, workers)]
                bounds.append(size)
                jobs = [(path, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
                with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("fork")) as ex:
                    parts = list(ex.map(_scan_segment, jobs))
                return [_decode(b) for lines, _ in parts for b in lines], sum(n for _, n in parts)
            except (BrokenProcessPool, ValueError, OSError):
                pass  # read it as a stream below; a real access problem shows up there
    with open_log_file(path) as f:
        return read_stream(f)


def rotated_files(base: str, since: float | None) -> list[str]:
    """`base` and its rotations (base.1, base.2.gz, base-20240518[.gz]), oldest first; a file
    last written before `since` cannot hold a line of the window and is left out."""
    cands = {base}
    for pattern in (base + ".*", base + "-*"):
        cands.update(glob.glob(pattern))
    out = []
    for p in cands:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if not os.path.isfile(p):
            continue
        if since is not None and st.st_mtime < since and p != base:
            continue
        out.append((st.st_mtime, p))
    out.sort()
    return [p for _, p in out]


# -- the sources --------------------------------------------------------------------------------

def _src_kmsg(res: ReadResult, paths: LogPaths, boot_time: float | None) -> bool:
    try:
        k = read_kmsg(paths.kmsg)
    except OSError as e:
        res.attempts.append(Attempt("kmsg", paths.kmsg, False, oserror_text(e, paths.kmsg, paths)))
        return False
    if k.records == 0:
        res.attempts.append(Attempt("kmsg", paths.kmsg, False, f"{paths.kmsg}: no records"))
        return False
    res.attempts.append(Attempt("kmsg", paths.kmsg, True))
    res.source = "kmsg"
    res.chunks.append(Chunk(paths.kmsg, k.lines, boot_time=boot_time))
    res.bytes_read += k.bytes
    res.records = k.records
    if k.overwritten:
        res.notes.append(f"kmsg: {k.overwritten} record(s) overwritten while reading (EPIPE), carried on")
    if k.first_seq:
        start = boot_time + k.first_usec / 1e6 if boot_time is not None and k.first_usec is not None else None
        res.coverage_start = start
        res.notes.append(
            f"kmsg ring buffer has wrapped: the oldest record is #{k.first_seq}"
            + (f" (uptime {k.first_usec / 1e6:.0f} s)" if k.first_usec is not None else "")
            + "; older messages of this boot are no longer in it"
        )
    return True


def _src_journal(res: ReadResult, paths: LogPaths, *, boot: int, since: float | None,
                 timeout_s: float) -> bool:
    base = list(paths.journalctl) + ["-k", "-b", str(boot), "--no-pager", "-q"]
    if since is not None:
        base += ["--since", f"@{int(since)}"]
    detail = " ".join(base[:1] + base[1:5])
    last_err = ""
    def accept(lines, nbytes: int) -> bool:
        res.attempts.append(Attempt("journal", detail, True))
        res.source = "journal" if boot == 0 else f"journal (boot {boot})"
        res.chunks.append(Chunk(f"journalctl -k -b {boot}", lines))
        res.bytes_read += nbytes
        return True

    for fmt in ("short-iso-precise", "short-iso"):
        argv = base + ["-o", fmt]
        try:
            lines, nbytes, rc, stderr = run_command(argv, timeout_s=timeout_s)
        except OSError as e:
            res.attempts.append(Attempt("journal", detail, False, oserror_text(e, argv[0], paths)))
            return False
        if rc == 0 and nbytes > 0:
            return accept(lines, nbytes)
        if rc == 0:
            why = _first_line(stderr)
            if since is not None:
                # An empty window is possible; tell it apart from no access by asking without it.
                probe = list(paths.journalctl) + ["-k", "-b", str(boot), "--no-pager", "-q", "-n", "1"]
                try:
                    _, pbytes, prc, _ = run_command(probe, timeout_s=timeout_s)
                except OSError:
                    pbytes, prc = 0, 1
                if prc == 0 and pbytes > 0:
                    return accept(lines, nbytes)
            last_err = ("returned no kernel messages (no access to the journal, or journald keeps "
                        "no kernel messages)" + (f": {why}" if why else ""))
            break
        last_err = _first_line(stderr) or f"exit status {rc}"
        if "output" not in stderr.lower() and "short-iso-precise" not in stderr:
            break  # not a format problem: do not retry
    res.attempts.append(Attempt("journal", detail, False, last_err))
    return False


def _src_dmesg(res: ReadResult, paths: LogPaths, boot_time: float | None, timeout_s: float) -> bool:
    argv = list(paths.dmesg)
    try:
        lines, nbytes, rc, stderr = run_command(argv, timeout_s=timeout_s)
    except OSError as e:
        res.attempts.append(Attempt("dmesg", argv[0], False, oserror_text(e, argv[0], paths)))
        return False
    if rc != 0:
        why = _first_line(stderr) or f"exit status {rc}"
        if "not permitted" in why.lower() or "permission" in why.lower():
            why += f" ({permission_hint(paths)})"
        res.attempts.append(Attempt("dmesg", argv[0], False, why))
        return False
    if nbytes == 0:
        res.attempts.append(Attempt("dmesg", argv[0], False, "printed nothing"))
        return False
    res.attempts.append(Attempt("dmesg", argv[0], True))
    res.source = "dmesg"
    res.chunks.append(Chunk("dmesg", lines, boot_time=boot_time))
    res.bytes_read += nbytes
    return True


_MONO_LINE_RE = re.compile(r"^\[\s*(\d+)\.(\d{1,9})\]\s?(.*)$")
_KMSG_LINE_RE = re.compile(r"^\d{1,3},\d+,(\d+),[^;]*;(.*)$")


def boot_clock_stamps(lines: list[str], limit: int = 500) -> set[tuple[int, str]]:
    """(microseconds since boot, message) of lines timed by a boot clock: ``[ 5107.644336] ...``
    (dmesg) and kmsg records. At most `limit` of them."""
    out: set[tuple[int, str]] = set()
    for ln in lines:
        m = _MONO_LINE_RE.match(ln)
        if m:
            out.add((int(m.group(1)) * 1_000_000 + int(m.group(2).ljust(6, "0")[:6]), m.group(3).strip()))
        else:
            k = _KMSG_LINE_RE.match(ln)
            if k:
                out.add((int(k.group(1)), k.group(2).strip()))
        if len(out) >= limit:
            break
    return out


def not_this_boot(lines: list[str], paths: LogPaths, boot_time: float | None) -> str | None:
    """Why the [seconds] stamps of a copied log cannot be dated against this machine's boot (None
    when they can: there are none, or one of its lines is in this boot's kernel log, same stamp
    and text). A log copied from another machine, or from an earlier boot, counts its seconds from
    a boot whose time is unknown here: dating it by this boot would invent its times."""
    stamps = boot_clock_stamps(lines)
    if not stamps:
        return None
    if boot_time is None:
        return "this machine's boot time is unknown"
    try:
        live = read_kmsg(paths.kmsg)
    except OSError as e:
        return f"this boot's kernel log ({paths.kmsg}) could not be read to compare it ({e.strerror or e})"
    if stamps & boot_clock_stamps(live.lines, limit=1 << 30):
        return None
    return "none of its [seconds]-stamped lines is in this boot's kernel log"


def _boot_for(res: ReadResult, origin: str, lines: list[str], paths: LogPaths, boot_time: float | None) -> float | None:
    """The boot time a file's [seconds] stamps count from: this boot's, or None (times unknown)."""
    why = not_this_boot(lines, paths, boot_time)
    if why is None:
        return boot_time
    res.undated.append(origin)
    res.notes.append(f"times unknown for {origin}: its [seconds] stamps are not dated ({why})")
    return None


def _read_files(res: ReadResult, files: list[str], paths: LogPaths, boot_time: float | None,
                source: str) -> bool:
    chunks: list[Chunk] = []
    nbytes = 0
    for p in files:
        try:
            mtime = os.stat(p).st_mtime
            lines, n = read_file(p)
        except (OSError, EOFError) as e:
            text = oserror_text(e, p, paths) if isinstance(e, OSError) else f"{p}: {e}"
            res.attempts.append(Attempt(source, p, False, text))
            return False
        chunks.append(Chunk(p, lines, boot_time=_boot_for(res, p, lines, paths, boot_time), ref_time=mtime))
        nbytes += n
    res.attempts.append(Attempt(source, ", ".join(files), True))
    res.source = source if source != "file" else "file:" + ",".join(files)
    res.chunks.extend(chunks)
    res.bytes_read += nbytes
    return True


def _src_logfiles(res: ReadResult, paths: LogPaths, boot_time: float | None, since: float | None) -> bool:
    tried = False
    for base in paths.log_files:
        try:
            os.stat(base)
        except FileNotFoundError:
            continue
        except OSError as e:  # e.g. a folder on the way that we may not enter
            tried = True
            res.attempts.append(Attempt("files", base, False, oserror_text(e, base, paths)))
            continue
        tried = True
        files = rotated_files(base, since)
        if _read_files(res, files, paths, boot_time, "files"):
            res.source = "files:" + base
            return True
    if not tried:
        res.attempts.append(Attempt("files", ", ".join(paths.log_files), False, "none of these files exists"))
    return False


def read_kernel_log(
    source: str = "auto",
    *,
    files: list[str] | None = None,
    boot: int = 0,
    since: float | None = None,
    paths: LogPaths = DEFAULT_PATHS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stdin: IO[bytes] | None = None,
    boot_time: float | None = None,
) -> ReadResult:
    """Read the kernel log from `source` (auto, kmsg, journal, dmesg, files) or from `files`
    ("-" is stdin). `boot` (0 this boot, -1 the previous one) selects a journal boot; it implies
    the journal. `since` (epoch) lets sources that can skip older messages do so."""
    if boot_time is None:
        boot_time = read_boot_time(paths.proc_stat)
    res = ReadResult(boot_time=boot_time)
    if files:
        if "-" in files and len(files) > 1:
            raise ValueError("stdin (-) cannot be read together with other files")
        if list(files) == ["-"]:
            f = stdin if stdin is not None else sys.stdin.buffer
            lines, n = read_stream(f)
            res.attempts.append(Attempt("stdin", "-", True))
            res.source = "stdin"
            res.chunks.append(Chunk("stdin", lines, boot_time=_boot_for(res, "stdin", lines, paths, boot_time),
                                    ref_time=time.time()))
            res.bytes_read = n
            return res
        _read_files(res, list(files), paths, boot_time, "file")
        return res
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r} (one of {', '.join(SOURCES)})")
    if boot != 0:
        if source not in ("auto", "journal"):
            raise ValueError("--boot needs the journal: only journalctl keeps earlier boots")
        _src_journal(res, paths, boot=boot, since=since, timeout_s=timeout_s)
        return res
    if source == "kmsg":
        _src_kmsg(res, paths, boot_time)
    elif source == "journal":
        _src_journal(res, paths, boot=0, since=since, timeout_s=timeout_s)
    elif source == "dmesg":
        _src_dmesg(res, paths, boot_time, timeout_s)
    elif source == "files":
        _src_logfiles(res, paths, boot_time, since)
    else:
        if _src_kmsg(res, paths, boot_time):
            if res.coverage_start is not None and (since is None or res.coverage_start > since):
                # The ring buffer lost part of the window: the journal may still have it.
                alt = ReadResult(boot_time=boot_time)
                if _src_journal(alt, paths, boot=0, since=since, timeout_s=timeout_s):
                    alt.attempts = res.attempts + alt.attempts
                    alt.notes = res.notes + ["read journalctl -k instead, which holds the whole boot"]
                    return alt
                res.attempts.extend(alt.attempts)
            return res
        for reader in (
            lambda: _src_journal(res, paths, boot=0, since=since, timeout_s=timeout_s),
            lambda: _src_dmesg(res, paths, boot_time, timeout_s),
            lambda: _src_logfiles(res, paths, boot_time, since),
        ):
            if reader():
                break
    return res
