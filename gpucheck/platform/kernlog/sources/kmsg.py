"""/dev/kmsg: the kernel ring buffer, read non-blocking to its end."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .base import DEFAULT_PATHS, Attempt, Chunk, LogPaths, ReadResult, oserror_text
from .linefilter import MAX_LINE_BYTES, NEEDLES, decode_line, has_needle

KMSG_READ_BYTES = 1 << 16  # one /dev/kmsg record per read(); the kernel caps a record at 8 KiB


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
                if has_needle(rec, needles):
                    out.append(decode_line(rec[:MAX_LINE_BYTES]))
        if partial and partial[:1] not in (b" ", b"\t"):
            records += 1
            if first_seq is None:
                first_seq, first_usec = _kmsg_head(partial)
            if has_needle(partial, needles):
                out.append(decode_line(partial[:MAX_LINE_BYTES]))
    finally:
        os.close(fd)
    return KmsgRead(out, records, nbytes, first_seq, first_usec, overwritten)


def source_kmsg(res: ReadResult, paths: LogPaths, boot_time: float | None) -> bool:
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
