"""The state directory: verdict history (JSON lines) and small cursors.

/var/lib/gpucheck as root, $XDG_STATE_HOME/gpucheck (default ~/.local/state/gpucheck) otherwise,
or --state-dir. Created 0700 (its files 0600) whatever the umask; as root it must be owned by
root and not writable by group or others, and so must every folder on the way to it (a sticky
one such as /tmp excepted): gpucheck.platform.safeio.check_private_dir, RefusedPath otherwise. Every file
in it is opened with O_NOFOLLOW and used only when it is a regular file.

History lines are appended all or nothing: one write() of the whole line on an O_APPEND
descriptor under an exclusive lock, fsync, and on any error (a full disk, a short write, a
signal) the file is truncated back to its previous length. A torn last line left by a crash is
sealed with a newline before the next append, so the next verdict is never glued to it. The
reader skips torn or foreign lines and reports them (State.skipped_lines, State.skipped_notes).
Cursors and other files are replaced atomically (gpucheck.platform.safeio.replace_private); a cursor
that is read, changed and written back (State.update_cursor) is so under an exclusive lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..platform import safeio
from .jsonvalue import JsonValue

HISTORY_FILE = "history.jsonl"
# The history rotates to history.jsonl.1 (one older generation kept) past this size, so that a
# prolog that appends on every job never fills the disk.
HISTORY_MAX_BYTES = 32 * 1024 * 1024
# A history line longer than this is not read (skipped and reported): no verdict is that big.
HISTORY_LINE_MAX = 16 * 1024 * 1024
_NOTES_KEPT = 20
# How long a cursor's read-change-write waits for another writer's lock (they hold it for a read
# and a rename: milliseconds).
CURSOR_LOCK_TIMEOUT_S = 10.0


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/gpucheck")
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpucheck"


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a user-named output file safely (gpucheck.platform.safeio.write_output: a regular file by
    atomic rename, its mode kept; a FIFO, /dev/null or a terminal written through; anything else
    refused). Raises OSError (RefusedPath included); nothing half-written is left behind."""
    safeio.write_output(path, text)


class State:
    """A state directory. With `host` (the node a run judges: gpucheck.core.verdict.node_host),
    the history is read as that host's alone: a directory shared by several hosts (a default
    state directory on NFS, replays of other nodes' snapshots with --state-dir) holds every
    host's verdicts, each naming its host, and a node's deltas, baselines and reports read only
    its own. A line without a host (no verdict lacks one) is kept: old files stay readable."""

    def __init__(self, root: str | os.PathLike[str], history_max_bytes: int = HISTORY_MAX_BYTES,
                 host: str | None = None):
        self.root = Path(root)
        self.history_max_bytes = history_max_bytes
        self.host = host
        self.skipped_lines = 0  # torn or unreadable history lines skipped by the last full read
        self.skipped_notes: list[str] = []
        self.other_hosts = 0  # verdicts of other hosts passed over by the last full read

    def check(self) -> None:
        """RefusedPath (an OSError) when the state directory, or the part of its path that exists,
        breaks the rules of the module. Creates nothing."""
        safeio.check_private_dir(self.root, missing_ok=True)

    def ensure(self) -> None:
        """Create the directory (0700) where missing, after the same checks."""
        safeio.check_private_dir(self.root, create=True)

    # -- history -------------------------------------------------------------------------------
    @property
    def history_path(self) -> Path:
        return self.root / HISTORY_FILE

    def _open_locked(self) -> int:
        fd = safeio.open_private(self.history_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def append_history(self, verdict: Mapping[str, JsonValue]) -> None:
        """Append a verdict's document (Verdict.to_json) as one line."""
        self.ensure()
        line = (json.dumps(verdict, separators=(",", ":"), sort_keys=True) + "\n").encode()
        fd = self._open_locked()
        try:
            while True:
                # A writer that opened the file before someone else rotated it holds a lock on the
                # old generation: it must never judge (or rotate) that one, or it would rename the
                # fresh file over the full old generation and lose it. So: the live file first.
                try:
                    live = os.stat(self.history_path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:  # renamed away and not yet created again
                    live = False
                if not live:
                    os.close(fd)
                    fd = self._open_locked()
                    continue
                size = os.fstat(fd).st_size
                if size == 0 or size + len(line) <= self.history_max_bytes:
                    break
                # Rotate under the lock of the live file, then append to a fresh one.
                os.replace(self.history_path, self.rotated_path)
                os.close(fd)
                fd = self._open_locked()
            _append_whole(fd, size, line)
        finally:
            os.close(fd)

    @property
    def rotated_path(self) -> Path:
        return self.root / (HISTORY_FILE + ".1")

    def _skip(self, note: str) -> None:
        self.skipped_lines += 1
        if len(self.skipped_notes) < _NOTES_KEPT:
            self.skipped_notes.append(note)

    def iter_history(self) -> Iterator[dict[str, Any]]:
        """Verdicts in the history (the rotated generation first), oldest first; with `host`, that
        host's only (other hosts' are counted in other_hosts). Torn, oversized
        or foreign lines are skipped and counted in skipped_lines / skipped_notes (reset at each
        read); a good line glued to a torn one (written by an older gpucheck) is recovered.
        RefusedPath (an OSError) when, as root, the directory breaks the rules (State.check)."""
        self.skipped_lines = 0
        self.skipped_notes = []
        self.other_hosts = 0
        if os.geteuid() == 0:
            self.check()
        for path in (self.rotated_path, self.history_path):
            try:
                fd = safeio.open_private(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                self._skip(f"{path}: not read: {safeio.describe_error(e, str(path))}")
                continue
            with os.fdopen(fd, "rb") as f:
                for doc in self._read_lines(f, path):
                    if self.host is None or not isinstance(doc.get("host"), str) or doc["host"] == self.host:
                        yield doc
                    else:
                        self.other_hosts += 1

    def _read_lines(self, f, path: Path) -> Iterator[dict[str, Any]]:
        number = 0
        while True:
            raw = f.readline(HISTORY_LINE_MAX + 1)
            if not raw:
                return
            number += 1
            if len(raw) > HISTORY_LINE_MAX:
                while raw and not raw.endswith(b"\n"):  # the rest of the oversized line
                    raw = f.readline(HISTORY_LINE_MAX)
                self._skip(f"{path.name} line {number}: longer than {HISTORY_LINE_MAX} bytes, skipped")
                continue
            if not raw.endswith(b"\n"):
                self._skip(f"{path.name} line {number}: incomplete last line (torn, or being written), skipped")
                return
            doc, torn = _parse_line(raw)
            if torn:
                self._skip(f"{path.name} line {number}: torn or not JSON, skipped"
                           + (" (the verdict glued after it was recovered)" if doc is not None else ""))
            elif doc is None:
                self._skip(f"{path.name} line {number}: not a gpucheck verdict, skipped")
            if doc is not None:
                yield doc

    def last_verdict(self, predicate=None) -> dict[str, Any] | None:
        last = None
        for doc in self.iter_history():
            if predicate is None or predicate(doc):
                last = doc
        return last

    def latest_metrics_by(self, check_id: str, key: str) -> dict[Any, tuple[dict[str, Any], Any]]:
        """For every value of metric `key` (a GPU UUID, say) among the history's results of
        `check_id`: (the metrics name->value of the latest such result, its verdict's time).

        One pass over the history, for counter deltas (NVLink, PCIe replays) keyed by a stable id.
        An unreadable history gives what was read so far.
        """
        found: dict[Any, tuple[dict[str, Any], Any]] = {}
        try:
            for doc in self.iter_history():
                for r in doc.get("results", []):
                    if not isinstance(r, dict) or r.get("check") != check_id:
                        continue
                    m = r.get("metrics", {})
                    if not isinstance(m, dict):
                        continue
                    kv = m.get(key, {})
                    val = kv.get("value") if isinstance(kv, dict) else None
                    if val is None or isinstance(val, (dict, list)):
                        continue
                    found[val] = (
                        {k: (v.get("value") if isinstance(v, dict) else None) for k, v in m.items()},
                        doc.get("time"),
                    )
        except OSError:
            pass
        return found

    def previous_metrics(self, check_id: str, key: str, value: Any) -> tuple[dict[str, Any], Any] | None:
        """The latest result of `check_id` whose metric `key` equals `value` (see latest_metrics_by)."""
        return self.latest_metrics_by(check_id, key).get(value)

    # -- cursors -------------------------------------------------------------------------------
    def _cursor_path(self, name: str, *, legacy: bool = False) -> Path:
        """cursor-NAME.json, or with `host` cursor-NAME@HOST.json: a cursor is a node's (the
        Xid last-pass mark of one node must never hide another's Xids in a shared directory)."""
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"bad cursor name {name!r}")
        if self.host is None or legacy:
            return self.root / f"cursor-{name}.json"
        host = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in self.host)
        return self.root / f"cursor-{name}@{host.lstrip('.') or '_'}.json"

    def read_cursor(self, name: str) -> Any:
        """The cursor's value; None when it is missing or not JSON. With `host`, that host's
        cursor, else (a directory written before cursors were kept per host) the shared one. OSError
        (RefusedPath: a symlink, not a regular file, an unsafe directory as root) when it cannot be read."""
        if os.geteuid() == 0:
            self.check()
        paths = [self._cursor_path(name)] + ([self._cursor_path(name, legacy=True)] if self.host is not None else [])
        for path in paths:
            try:
                raw = safeio.read_private(path, "cursor")
                break
            except FileNotFoundError:
                continue
        else:
            return None
        try:
            return safeio.loads_json(raw)
        except ValueError:
            return None

    def write_cursor(self, name: str, value: Any) -> None:
        self.ensure()
        safeio.replace_private(self._cursor_path(name), json.dumps(value) + "\n")

    def update_cursor(self, name: str, change: Callable[[Any], Any], *, lock_timeout_s: float | None = None) -> Any:
        """Read, change and replace cursor `name` as one step: under an exclusive flock of
        `cursor-NAME.lock` (a private file: safeio.open_private), so that two writers at once (two
        prologs starting together) never lose each other's change. `change(value)` gets the
        current value (None when missing or not JSON) and returns the new one, or None to leave
        the cursor as it is. Returns what `change` returned. OSError when the lock is not had
        within `lock_timeout_s` (default CURSOR_LOCK_TIMEOUT_S: a writer that hangs cannot hang
        this one) or a file cannot be used."""
        self.ensure()
        fd = safeio.open_private(self._cursor_path(name).with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _lock(fd, CURSOR_LOCK_TIMEOUT_S if lock_timeout_s is None else lock_timeout_s,
                  f"cursor {name} in {self.root}")
            value = change(self.read_cursor(name))
            if value is not None:
                self.write_cursor(name, value)
            return value
        finally:
            os.close(fd)


def _lock(fd: int, timeout_s: float, what: str) -> None:
    """An exclusive flock of `fd` within `timeout_s`; TimeoutError (an OSError) otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(errno.ETIMEDOUT, f"{what}: locked by another gpucheck for more than "
                                                    f"{timeout_s:g} s") from None
            time.sleep(0.01)


def _append_whole(fd: int, size: int, line: bytes) -> None:
    """Append `line` to the locked history `fd` of `size` bytes, all or nothing: a torn last line
    is sealed with a newline first; on any failure the file is cut back to `size`."""
    if size and os.pread(fd, 1, size - 1) != b"\n":
        line = b"\n" + line
    try:
        safeio.write_all(fd, line)
        os.fsync(fd)
    except BaseException:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise


def _is_verdict(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("schema") == "gpucheck.verdict"


def _parse_line(raw: bytes) -> tuple[dict[str, Any] | None, bool]:
    """(the verdict on this line or None, whether the line was torn). A torn line with a whole
    verdict glued after it (an append onto an unsealed torn tail) gives that verdict."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        pass
    else:
        return (doc if _is_verdict(doc) else None), False
    text = raw.decode("utf-8", "replace").rstrip("\n")
    decoder = json.JSONDecoder()
    start = text.find('{"', 1)
    for _ in range(1000):
        if start < 0:
            break
        try:
            doc, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            doc, end = None, -1
        if end == len(text) and _is_verdict(doc):
            return doc, True
        start = text.find('{"', start + 1)
    return None, True
