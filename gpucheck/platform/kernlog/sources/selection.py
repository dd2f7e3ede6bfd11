"""Which source to read: the one asked for, or the first that answers (kmsg, then the journal,
dmesg, the log files), with the journal taking over from a ring buffer that lost part of the
window."""

from __future__ import annotations

import sys
import time
from typing import IO

from .base import DEFAULT_PATHS, DEFAULT_TIMEOUT_S, Attempt, Chunk, LogPaths, ReadResult, read_boot_time
from .dating import boot_for
from .dmesg import source_dmesg
from .files import nothing_to_examine, read_files, read_stream, source_logfiles
from .journal import source_journal
from .kmsg import source_kmsg

SOURCES = ("auto", "kmsg", "journal", "dmesg", "files")


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
            if n == 0:  # nothing examined: never a pass
                res.attempts.append(Attempt("stdin", "-", False, nothing_to_examine(["stdin"])))
                return res
            res.attempts.append(Attempt("stdin", "-", True))
            res.source = "stdin"
            res.chunks.append(Chunk("stdin", lines, boot_time=boot_for(res, "stdin", lines, paths, boot_time),
                                    ref_time=time.time()))
            res.bytes_read = n
            return res
        read_files(res, list(files), paths, boot_time, "file")
        return res
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r} (one of {', '.join(SOURCES)})")
    if boot != 0:
        if source not in ("auto", "journal"):
            raise ValueError("--boot needs the journal: only journalctl keeps earlier boots")
        source_journal(res, paths, boot=boot, since=since, timeout_s=timeout_s)
        return res
    if source == "kmsg":
        source_kmsg(res, paths, boot_time)
    elif source == "journal":
        source_journal(res, paths, boot=0, since=since, timeout_s=timeout_s)
    elif source == "dmesg":
        source_dmesg(res, paths, boot_time, timeout_s)
    elif source == "files":
        source_logfiles(res, paths, boot_time, since)
    else:
        if source_kmsg(res, paths, boot_time):
            if res.coverage_start is not None and (since is None or res.coverage_start > since):
                # The ring buffer lost part of the window: the journal may still have it.
                alt = ReadResult(boot_time=boot_time)
                if source_journal(alt, paths, boot=0, since=since, timeout_s=timeout_s):
                    alt.attempts = res.attempts + alt.attempts
                    alt.notes = res.notes + ["read journalctl -k instead, which holds the whole boot"]
                    return alt
                res.attempts.extend(alt.attempts)
            return res
        for reader in (
            lambda: source_journal(res, paths, boot=0, since=since, timeout_s=timeout_s),
            lambda: source_dmesg(res, paths, boot_time, timeout_s),
            lambda: source_logfiles(res, paths, boot_time, since),
        ):
            if reader():
                break
    return res
