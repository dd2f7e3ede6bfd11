"""dmesg: the kernel ring buffer through the dmesg command."""

from __future__ import annotations

from .base import Attempt, Chunk, LogPaths, ReadResult, oserror_text, permission_hint
from .command import first_line, run_command


def source_dmesg(res: ReadResult, paths: LogPaths, boot_time: float | None, timeout_s: float) -> bool:
    argv = list(paths.dmesg)
    try:
        lines, nbytes, rc, stderr = run_command(argv, timeout_s=timeout_s)
    except OSError as e:
        res.attempts.append(Attempt("dmesg", argv[0], False, oserror_text(e, argv[0], paths)))
        return False
    if rc != 0:
        why = first_line(stderr) or f"exit status {rc}"
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
