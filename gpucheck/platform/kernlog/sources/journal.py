"""journalctl -k: this boot's (or an earlier boot's) kernel messages from the journal."""

from __future__ import annotations

from .base import Attempt, Chunk, LogPaths, ReadResult, oserror_text
from .command import first_line, run_command


def source_journal(res: ReadResult, paths: LogPaths, *, boot: int, since: float | None,
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
            why = first_line(stderr)
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
        last_err = first_line(stderr) or f"exit status {rc}"
        if "output" not in stderr.lower() and "short-iso-precise" not in stderr:
            break  # not a format problem: do not retry
    res.attempts.append(Attempt("journal", detail, False, last_err))
    return False
