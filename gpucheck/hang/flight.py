"""PyTorch flight-recorder dumps: read one rank's dump safely and summarize it per process group.

PyTorch's flight recorder (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE > 0) keeps the
last collectives of every process group; the job writes them to `<prefix><rank>` (prefix from
TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE, default /tmp/nccl_trace_rank_) on a
watchdog timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) or when the job asks for it. The dump is a pickle
(or JSON) of plain containers: {"version", "pg_config", "pg_status", "entries": [{"pg_id",
"process_group": (name, desc), "collective_seq_id", "p2p_seq_id", "is_p2p", "profiling_name",
"state", ...}]}.

gpucheck runs as root and the dump is the job owner's file: it is opened without following a
symlink, must be a regular file owned by the process's user, no larger than FLIGHT_MAX_BYTES and
written after the process started (an older file is another run's), and is unpickled with an
unpickler that refuses every class and function, so a planted file cannot run code.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import re
import stat
from typing import Any

from .model import FlightSummary, PgSummary

DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
FLIGHT_MAX_BYTES = 256 << 20
OPS_KEPT = 16  # the last collectives of each process group kept in the summary
STALE_SLACK_S = 2.0


class FlightError(Exception):
    """A dump that exists but cannot be used; the message says why."""


class _PlainUnpickler(pickle.Unpickler):
    """Containers, strings and numbers only: no global is ever looked up."""

    def find_class(self, module: str, name: str):  # noqa: D102
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a flight-recorder dump holds plain data only")


def loads_plain(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


def prefix_for(environ: dict[str, str], explicit: str | None = None) -> str:
    if explicit:
        return explicit
    for var in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        if environ.get(var):
            return environ[var]
    return DEFAULT_PREFIX


def read_dump_file(path: str, *, owner_uid: int | None, not_before: float | None) -> dict[str, Any] | None:
    """The dump's document, None when there is no file; FlightError when it is refused or unreadable."""
    if not os.path.isabs(path):
        raise FlightError(f"{path}: not an absolute path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FlightError(f"{path}: a symbolic link (refused)") from None
        raise FlightError(f"{path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FlightError(f"{path}: not a regular file (refused)")
        if owner_uid is not None and st.st_uid != owner_uid:
            raise FlightError(f"{path}: owned by uid {st.st_uid}, not by the process's user {owner_uid} (refused)")
        if st.st_size > FLIGHT_MAX_BYTES:
            raise FlightError(f"{path}: {st.st_size} bytes, more than {FLIGHT_MAX_BYTES} (refused)")
        if not_before is not None and st.st_mtime < not_before - STALE_SLACK_S:
            raise FlightError(f"{path}: written before the process started (another run's dump)")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(FLIGHT_MAX_BYTES + 1)
    finally:
        os.close(fd)
    return parse_dump_bytes(data, path)


def parse_dump_bytes(data: bytes, what: str = "dump") -> dict[str, Any]:
    try:
        doc = json.loads(data) if data.lstrip()[:1] == b"{" else loads_plain(data)
    except (ValueError, pickle.UnpicklingError, EOFError, TypeError, IndexError, AttributeError,
            MemoryError, RecursionError) as e:
        raise FlightError(f"{what}: not a flight-recorder dump ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise FlightError(f"{what}: not a flight-recorder dump (no entries)")
    return doc


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _pg_ranks(doc: dict[str, Any], name: str, desc: str) -> list[int] | None:
    cfg = doc.get("pg_config")
    if not isinstance(cfg, dict):
        return None
    entry = cfg.get(name)
    if not isinstance(entry, dict) and desc == "default_pg":
        entry = cfg.get("")  # torch 2.13 files the default group's config under "" (its entries say "0")
    if not isinstance(entry, dict):
        matches = [c for c in cfg.values() if isinstance(c, dict) and c.get("desc") == desc and desc]
        entry = matches[0] if len(matches) == 1 else None
    if entry is None:
        return None
    ranks = entry.get("ranks")
    if isinstance(ranks, str):
        ranks = [int(x) for x in re.findall(r"\d+", ranks)] if re.fullmatch(r"\[[\d,\s]*\]", ranks.strip()) else None
    if isinstance(ranks, list) and all(_int(r) is not None for r in ranks):
        return list(ranks)
    return None


def summarize(doc: dict[str, Any]) -> FlightSummary:
    """Per process group: the last collective this rank entered, and the last OPS_KEPT (seq, op)."""
    pgs: dict[str, PgSummary] = {}
    ops: dict[str, dict[int, str]] = {}  # per process group: sequence number -> collective
    for e in doc["entries"]:
        if not isinstance(e, dict):
            continue
        pgt = e.get("process_group")
        name = str(pgt[0]) if isinstance(pgt, (list, tuple)) and pgt else str(e.get("pg_id", "?"))
        desc = str(pgt[1]) if isinstance(pgt, (list, tuple)) and len(pgt) > 1 else ""
        pg = pgs.setdefault(name, {"desc": desc, "ranks": _pg_ranks(doc, name, desc), "ops": [], "last_seq": None,
                                   "last_op": None, "last_state": None, "last_p2p_seq": None, "last_p2p_op": None})
        op = str(e.get("profiling_name", "?"))
        if e.get("is_p2p"):
            seq = _int(e.get("p2p_seq_id"))
            if seq is not None and (pg["last_p2p_seq"] is None or seq >= pg["last_p2p_seq"]):
                pg["last_p2p_seq"], pg["last_p2p_op"] = seq, op
            continue
        seq = _int(e.get("collective_seq_id"))
        if seq is None:
            continue
        ops.setdefault(name, {})[seq] = op
        if pg["last_seq"] is None or seq >= pg["last_seq"]:
            pg["last_seq"], pg["last_op"], pg["last_state"] = seq, op, str(e.get("state", "?"))
    for name, by_seq in ops.items():
        pgs[name]["ops"] = [[s, by_seq[s]] for s in sorted(by_seq)[-OPS_KEPT:]]
    return {"version": str(doc.get("version", "?")), "entries": len(doc["entries"]), "pgs": pgs}


def read_rank(prefix: str, rank: int, *, owner_uid: int | None,
              not_before: float | None) -> tuple[FlightSummary | None, str | None]:
    """(summary, None), (None, None) when this rank wrote no dump, or (None, why it was not used)."""
    path = f"{prefix}{rank}"
    try:
        doc = read_dump_file(path, owner_uid=owner_uid, not_before=not_before)
    except FlightError as e:
        return None, str(e)
    if doc is None:
        return None, None
    summary = summarize(doc)
    summary["file"] = path
    return summary, None

