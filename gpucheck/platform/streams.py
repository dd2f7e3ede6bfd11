"""Standard output and error that can fail: a closed pipe (`gpucheck run | head`), stdout on a
full disk, a stdout whose encoding cannot take the text (LANG=C, PYTHONIOENCODING=latin-1).

None of these may change a judgement: a command that judged keeps its exit code, and what could
not be written is dropped (with one line on stderr said by the caller), so that Python's own flush
at exit cannot fail again and replace the exit code with its 120.
"""

from __future__ import annotations

import os
from typing import TextIO


STANDARD = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


def ensure_standard_streams() -> None:
    """A process started with descriptor 0, 1 or 2 closed (`gpucheck run >&-`) gets /dev/null
    there: otherwise the next file gpucheck opens takes that number, and what a child process
    writes to its stdout lands in it; and Python's sys.stdout is None, which every print would
    have to expect."""
    import sys

    for fd, name, mode in STANDARD:
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDWR)
            except OSError:
                continue
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            try:
                setattr(sys, name, open(fd, mode, encoding="utf-8", errors="backslashreplace", closefd=False))
            except OSError:
                pass


def escape_unencodable(stream: TextIO | None) -> None:
    """Text that `stream` cannot encode is written escaped (backslashreplace, as Python does on
    stderr), never an exception that ends the command."""
    try:
        stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        pass


def flush_or_discard(stream: TextIO | None) -> BaseException | None:
    """Flush `stream`; when that fails, point its file descriptor at /dev/null (what is still
    buffered is dropped there, at once or at exit) and return the error. No stream at all (a
    process started with that descriptor closed: sys.stdout is None) has nothing to flush."""
    if stream is None:
        return None
    try:
        stream.flush()
        return None
    except (OSError, ValueError) as e:
        discard(stream)
        return e


def discard(stream: TextIO) -> None:
    """Everything written to `stream` from now on, and what it still buffers, goes to /dev/null.
    A stream without a file descriptor of its own (a test's capture) is left as it is."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)
