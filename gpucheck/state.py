"""The state directory: verdict history (JSON lines) and small cursors.

/var/lib/gpucheck as root, $XDG_STATE_HOME/gpucheck (default ~/.local/state/gpucheck) otherwise,
or --state-dir. Every write is atomic: history lines are appended with one write() on an O_APPEND
descriptor under an exclusive lock (a reader never sees half a line); cursors and other files are
written to a temporary file and renamed into place.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

HISTORY_FILE = "history.jsonl"
# The history rotates to history.jsonl.1 (one older generation kept) past this size, so that a
# prolog that appends on every job never fills the disk.
HISTORY_MAX_BYTES = 32 * 1024 * 1024


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/gpucheck")
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpucheck"


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename.

    Raises OSError when the folder is not writable; nothing half-written is left behind.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class State:
    def __init__(self, root: str | os.PathLike[str], history_max_bytes: int = HISTORY_MAX_BYTES):
        self.root = Path(root)
        self.history_max_bytes = history_max_bytes

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)

    # -- history -------------------------------------------------------------------------------
    @property
    def history_path(self) -> Path:
        return self.root / HISTORY_FILE

    def _open_locked(self) -> int:
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def append_history(self, verdict: dict[str, Any]) -> None:
        self.ensure()
        line = (json.dumps(verdict, separators=(",", ":"), sort_keys=True) + "\n").encode()
        fd = self._open_locked()
        try:
            while True:
                # A writer that opened the file before someone else rotated it holds a lock on the
                # old generation: it must never judge (or rotate) that one, or it would rename the
                # fresh file over the full old generation and lose it. So: the live file first.
                try:
                    live = os.stat(self.history_path).st_ino == os.fstat(fd).st_ino
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
            view = memoryview(line)
            while view:  # one write() in practice; loop only on a short write
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)

    @property
    def rotated_path(self) -> Path:
        return self.root / (HISTORY_FILE + ".1")

    def iter_history(self) -> Iterator[dict[str, Any]]:
        """Verdicts in the history (the rotated generation first), oldest first; torn or foreign
        lines are skipped."""
        for path in (self.rotated_path, self.history_path):
            try:
                f = open(path, "rb")
            except (FileNotFoundError, IsADirectoryError, PermissionError):
                continue
            with f:
                for raw in f:
                    if not raw.endswith(b"\n"):
                        continue
                    try:
                        doc = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(doc, dict) and doc.get("schema") == "gpucheck.verdict":
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
    def _cursor_path(self, name: str) -> Path:
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"bad cursor name {name!r}")
        return self.root / f"cursor-{name}.json"

    def read_cursor(self, name: str) -> Any:
        try:
            return json.loads(self._cursor_path(name).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None

    def write_cursor(self, name: str, value: Any) -> None:
        self.ensure()
        atomic_write_text(self._cursor_path(name), json.dumps(value))
