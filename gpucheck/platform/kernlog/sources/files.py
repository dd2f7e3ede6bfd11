"""Log files: syslog's kern.log/messages and their rotations, any file (.gz decompressed) or a
stream; a big plain file is searched by one forked worker per CPU."""

from __future__ import annotations

import glob
import gzip
import mmap
import os
import stat
import sys
import threading
from typing import IO

from .base import Attempt, Chunk, LogPaths, ReadResult, oserror_text
from .dating import boot_for
from .linefilter import MAX_LINE_BYTES, NEEDLES, Counter, decode_line, has_needle, iter_relevant_lines, matching_lines


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
    (gpucheck.platform.safeio.open_input: a FIFO or a device such as /dev/zero would never end; it is a
    RefusedPath, an OSError); there is no size limit: the file is read as a stream, and only
    matching lines (each cut at MAX_LINE_BYTES) are kept."""
    from ...safeio import open_input

    raw = os.fdopen(open_input(path), "rb")
    if path.endswith(".gz"):
        return _OwnedGzipFile(raw)  # type: ignore[return-value]
    return raw


def read_stream(f: IO[bytes], *, needles: tuple[bytes, ...] = NEEDLES) -> tuple[list[str], int]:
    counter = Counter()
    lines = [decode_line(b) for b in iter_relevant_lines(f, needles=needles, counter=counter)]
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
        lines = matching_lines(mm, start, last_nl, NEEDLES, MAX_LINE_BYTES) if last_nl > start else []
        tail_start = last_nl + 1 if last_nl >= start else start
        if tail_start < end:  # a last line without a newline
            tail = mm[tail_start:min(end, tail_start + MAX_LINE_BYTES)]
            if has_needle(tail, NEEDLES):
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
                return [decode_line(b) for lines, _ in parts for b in lines], sum(n for _, n in parts)
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


# -- the files source -----------------------------------------------------------------------------

def nothing_to_examine(files: list[str]) -> str:
    """Why a log of no bytes is no kernel log: the files (or stdin) named, "empty: nothing to examine"."""
    return f"{', '.join(files) or 'the log'}: empty: nothing to examine"


def read_files(res: ReadResult, files: list[str], paths: LogPaths, boot_time: float | None,
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
        chunks.append(Chunk(p, lines, boot_time=boot_for(res, p, lines, paths, boot_time), ref_time=mtime))
        nbytes += n
    if nbytes == 0:  # nothing examined: never a pass
        res.attempts.append(Attempt(source, ", ".join(files), False, nothing_to_examine(files)))
        return False
    res.attempts.append(Attempt(source, ", ".join(files), True))
    res.source = source if source != "file" else "file:" + ",".join(files)
    res.chunks.extend(chunks)
    res.bytes_read += nbytes
    return True


def source_logfiles(res: ReadResult, paths: LogPaths, boot_time: float | None, since: float | None) -> bool:
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
        if read_files(res, files, paths, boot_time, "files"):
            res.source = "files:" + base
            return True
    if not tried:
        res.attempts.append(Attempt("files", ", ".join(paths.log_files), False, "none of these files exists"))
    return False
