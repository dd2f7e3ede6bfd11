"""The reference file: recorded digests per fingerprint. JSON data only (never pickle).

    {
      "kind": "gpucheck.repro-refs",
      "version": 1,
      "references": [
        {
          "fingerprint": {...},                 # gpucheck.repro.fingerprint
          "key": "<sha256 of the fingerprint's canonical JSON>",
          "workload_version": "gpucheck-repro-1",
          "digests": {"gemm.bf16": "<64 hex>", ...},
          "recorded_at": "2025-01-01T00:00:00Z",
          "host": "node17",
          "updated_at": "...", "updated_host": "..."     # optional: when workloads were added
        }
      ]
    }

Rules: one entry per key; the key must be the SHA-256 of the entry's fingerprint (a hand-edited
fingerprint is caught); the workload version must be the fingerprint's. A malformed file is a
RefFileError naming the file and the place. Recording adds digests under the fingerprint's entry;
a digest that disagrees with one stored for the same fingerprint and workload is a RecordConflict
that shows both, and nothing is written. Writes are atomic (a temporary file and a rename) under
an exclusive lock, so two concurrent records never lose one another's digests.

Files (gpucheck.platform.safeio): the reference file and its lock are opened with O_NOFOLLOW and used only
when they are regular files (at most LIMITS["reference"] bytes); as root, the folder holding them
must be owned by root and not writable by group or others, and so must every folder on the way
(a sticky one excepted), else RefFileError naming it.

Nothing here imports torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, TypedDict, cast

from ..platform import safeio
from . import DEFAULT_REFERENCE_PATH
from .fingerprint import fingerprint_key, short_key

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import Fingerprint

KIND = "gpucheck.repro-refs"
VERSION = 1
DEFAULT_PATH = DEFAULT_REFERENCE_PATH
_HEX64 = "^[0-9a-f]{64}$"

SCHEMA: dict[str, Any] = {  # a JSON Schema document: JSON of every shape
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://gpucheck.dev/schema/repro-refs-1.json",
    "title": "gpucheck bitwise reproducibility references",
    "type": "object",
    "required": ["kind", "version", "references"],
    "additionalProperties": False,
    "properties": {
        "kind": {"const": KIND},
        "version": {"const": VERSION},
        "references": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["fingerprint", "key", "workload_version", "digests", "recorded_at", "host"],
                "additionalProperties": False,
                "properties": {
                    "fingerprint": {
                        "type": "object",
                        "required": ["device", "workload_version", "preset"],
                        "properties": {
                            "device": {"enum": ["cuda", "cpu"]},
                            "workload_version": {"type": "string", "minLength": 1},
                            "preset": {"type": "string", "minLength": 1},
                        },
                    },
                    "key": {"type": "string", "pattern": _HEX64},
                    "workload_version": {"type": "string", "minLength": 1},
                    "digests": {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": {"type": "string", "pattern": _HEX64},
                    },
                    "recorded_at": {"type": "string"},
                    "host": {"type": "string"},
                    "updated_at": {"type": "string"},
                    "updated_host": {"type": "string"},
                },
            },
        },
    },
}


class _EntryUpdate(TypedDict, total=False):
    updated_at: str  # when workloads were added to the entry, and on which host
    updated_host: str


class RefEntry(_EntryUpdate):
    """The digests recorded for one fingerprint."""

    fingerprint: "Fingerprint"  # as gpucheck.repro.fingerprint wrote it (validate: device, workload_version, preset)
    key: str  # fingerprint_key(fingerprint)
    workload_version: str
    digests: dict[str, str]  # workload -> sha256, hex
    recorded_at: str
    host: str


class RefDoc(TypedDict):
    """A reference file (SCHEMA)."""

    kind: str  # KIND
    version: int  # VERSION
    references: list[RefEntry]


# What `record` adds: (a fingerprint, {workload: digest}).
Record = tuple["Fingerprint", dict[str, str]]


class RefFileError(ValueError):
    """The reference file cannot be used: unreadable, not JSON, or not a gpucheck reference file."""


@dataclass
class Conflict:
    key: str
    workload: str
    stored: str
    new: str
    stored_host: str | None
    stored_at: str | None

    def describe(self) -> str:
        return (f"{self.workload} under fingerprint {short_key(self.key)}: stored {self.stored} "
                f"(recorded on {self.stored_host} at {self.stored_at}), this node {self.new}")


class RecordConflict(Exception):
    def __init__(self, path: str, conflicts: list[Conflict]):
        self.path = path
        self.conflicts = conflicts
        super().__init__(f"{path}: {len(conflicts)} digest(s) disagree with the recorded reference: "
                         + "; ".join(c.describe() for c in conflicts))


@dataclass
class RecordOutcome:
    path: str
    added: dict[str, list[str]] = field(default_factory=dict)  # key -> workloads added
    unchanged: dict[str, list[str]] = field(default_factory=dict)  # key -> workloads already recorded
    new_keys: list[str] = field(default_factory=list)
    written: bool = False


def empty() -> RefDoc:
    return {"kind": KIND, "version": VERSION, "references": []}


def _fail(path: str, where: str, msg: str) -> RefFileError:
    return RefFileError(f"{path}: {where}: {msg}" if where else f"{path}: {msg}")


def validate(doc: Any, path: str = "<reference file>") -> RefDoc:
    """Check `doc` against the format (SCHEMA, and the rules the schema cannot say); return it."""
    if not isinstance(doc, dict):
        raise _fail(path, "", "not a gpucheck reference file (the top level is not an object)")
    if doc.get("kind") != KIND:
        raise _fail(path, "kind", f"not a gpucheck reference file (kind {doc.get('kind')!r}, want {KIND!r})")
    v = doc.get("version")
    if not isinstance(v, int) or isinstance(v, bool):
        raise _fail(path, "version", f"must be an integer, not {v!r}")
    if v > VERSION:
        raise _fail(path, "version", f"version {v} was written by a newer gpucheck (this one reads {VERSION})")
    if v != VERSION:
        raise _fail(path, "version", f"unsupported version {v}")
    extra = set(doc) - {"kind", "version", "references"}
    if extra:
        raise _fail(path, "", f"unknown field(s) {', '.join(sorted(extra))}")
    refs = doc.get("references")
    if not isinstance(refs, list):
        raise _fail(path, "references", "must be a list")
    entry_props = SCHEMA["properties"]["references"]["items"]["properties"]
    required = SCHEMA["properties"]["references"]["items"]["required"]
    seen: set[str] = set()
    for i, e in enumerate(refs):
        where = f"references[{i}]"
        if not isinstance(e, dict):
            raise _fail(path, where, "must be an object")
        missing = [k for k in required if k not in e]
        if missing:
            raise _fail(path, where, f"missing {', '.join(missing)}")
        unknown = set(e) - set(entry_props)
        if unknown:
            raise _fail(path, where, f"unknown field(s) {', '.join(sorted(unknown))}")
        fp = e["fingerprint"]
        if not isinstance(fp, dict):
            raise _fail(path, f"{where}.fingerprint", "must be an object")
        for k in ("device", "workload_version", "preset"):
            if not isinstance(fp.get(k), str) or not fp.get(k):
                raise _fail(path, f"{where}.fingerprint.{k}", "missing or not a string")
        if fp["device"] not in ("cuda", "cpu"):
            raise _fail(path, f"{where}.fingerprint.device", f"must be cuda or cpu, not {fp['device']!r}")
        key = e["key"]
        if not _is_hex64(key):
            raise _fail(path, f"{where}.key", "must be 64 lowercase hex digits")
        if fingerprint_key(fp) != key:
            raise _fail(path, f"{where}.key", "does not match its fingerprint (was the fingerprint edited?)")
        if key in seen:
            raise _fail(path, f"{where}.key", f"fingerprint {short_key(key)} appears twice")
        seen.add(key)
        if e["workload_version"] != fp["workload_version"]:
            raise _fail(path, f"{where}.workload_version",
                        f"{e['workload_version']!r} differs from the fingerprint's {fp['workload_version']!r}")
        digests = e["digests"]
        if not isinstance(digests, dict) or not digests:
            raise _fail(path, f"{where}.digests", "must be a non-empty object")
        for w, d in digests.items():
            if not isinstance(w, str) or not w or not _is_hex64(d):
                raise _fail(path, f"{where}.digests.{w}", "must be 64 lowercase hex digits")
        for k in ("recorded_at", "host", "updated_at", "updated_host"):
            if k in e and not isinstance(e[k], str):
                raise _fail(path, f"{where}.{k}", "must be a string")
    return cast(RefDoc, doc)  # checked above, field by field


def _is_hex64(s: Any) -> bool:
    return isinstance(s, str) and len(s) == 64 and all(c in "0123456789abcdef" for c in s)


def loads(text: str | bytes, path: str = "<reference file>") -> RefDoc:
    try:
        doc = safeio.loads_json(text)
    except ValueError as e:
        raise _fail(path, "", f"not valid JSON ({e})") from None
    return validate(doc, path)


def check_folder(path: str | os.PathLike[str]) -> None:
    """As root: RefFileError when the folder of `path` (or one on the way) could be changed by
    users other than root (gpucheck.platform.safeio.check_private_dir). Nothing to check otherwise."""
    if os.geteuid() != 0:
        return
    p = Path(path)
    try:
        safeio.check_private_dir(p.parent, missing_ok=True)
    except OSError as e:
        raise _fail(str(p), "", f"refusing the reference file: {safeio.describe_error(e, str(p))}") from None


def load(path: str | os.PathLike[str], *, missing_ok: bool = False) -> RefDoc | None:
    """The validated file; None when it does not exist and missing_ok. RefFileError otherwise."""
    p = Path(path)
    check_folder(p)
    try:
        raw = safeio.read_private(p, "reference")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise _fail(str(p), "", "reference file not found") from None
    except PermissionError:
        raise _fail(str(p), "", "cannot read the reference file (permission denied)") from None
    except OSError as e:
        if isinstance(e, safeio.RefusedPath) and "directory" in (e.strerror or ""):
            raise _fail(str(p), "", "is a directory") from None
        raise _fail(str(p), "", f"cannot read the reference file: {safeio.describe_error(e, str(p))}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(str(p), "", f"cannot read the reference file: {e}") from None
    return loads(text, str(p))


def check_writable(path: str | os.PathLike[str]) -> None:
    """RefFileError when `record` could not write `path`: an unsafe folder (as root), a missing or
    unwritable folder, or something other than a regular file at the name (a symlink included)."""
    p = Path(path)
    check_folder(p)
    parent = p.parent if str(p.parent) else Path(".")
    try:
        st = os.stat(p, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _fail(str(p), "", safeio.describe_error(e, str(p))) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise _fail(str(p), "", "is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise _fail(str(p), "", f"is {kind}: the reference file is only ever a regular file, replaced by rename")
    if not parent.is_dir():
        raise _fail(str(p), "", f"folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _fail(str(p), "", f"folder {parent} is not writable")


def dumps(doc: RefDoc) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def entries(doc: RefDoc | None) -> dict[str, RefEntry]:
    """key -> entry."""
    return {e["key"]: e for e in (doc.get("references", []) if doc else [])}


def find(doc: RefDoc | None, key: str) -> RefEntry | None:
    return entries(doc).get(key)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def merge(doc: RefDoc, records: list[Record], *, host: str,
          now: str | None = None) -> tuple[RefDoc, RecordOutcome]:
    """A new document with `records` ([(fingerprint, {workload: digest})]) added to `doc`.
    RecordConflict (listing every disagreement) when any digest differs from a stored one; `doc`
    is never modified."""
    now = now or _now()
    new: RefDoc = json.loads(json.dumps(doc))  # a deep copy
    by_key = entries(new)
    out = RecordOutcome(path="")
    conflicts: list[Conflict] = []
    for fp, digests in records:
        key = fingerprint_key(fp)
        for w, d in digests.items():
            if not _is_hex64(d):
                raise ValueError(f"bad digest for {w}: {d!r}")
        entry = by_key.get(key)
        if entry is None:
            created: RefEntry = {"fingerprint": fp, "key": key, "workload_version": fp["workload_version"],
                                 "digests": dict(sorted(digests.items())), "recorded_at": now, "host": host}
            new["references"].append(created)
            by_key[key] = created
            out.new_keys.append(key)
            out.added.setdefault(key, []).extend(sorted(digests))
            continue
        added = []
        for w, d in sorted(digests.items()):
            old = entry["digests"].get(w)
            if old is None:
                entry["digests"][w] = d
                added.append(w)
            elif old != d:
                conflicts.append(Conflict(key, w, old, d, entry.get("host"), entry.get("recorded_at")))
            else:
                out.unchanged.setdefault(key, []).append(w)
        if added:
            entry["digests"] = dict(sorted(entry["digests"].items()))
            entry["updated_at"] = now
            entry["updated_host"] = host
            out.added.setdefault(key, []).extend(added)
    if conflicts:
        raise RecordConflict("<reference file>", conflicts)
    return validate(new), out


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.parent / f".{path.name}.lock"
    fd = safeio.open_private(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(path: str | os.PathLike[str], records: list[Record], *,
           host: str, now: str | None = None) -> RecordOutcome:
    """Add `records` to the file at `path` (created when missing, 0644), atomically, under a lock.
    RecordConflict: nothing written. RefFileError: the existing file is malformed, or (as root)
    its folder is unsafe. OSError (RefusedPath: a symlink or not a regular file at the name or
    at the lock) when it cannot be written."""
    p = Path(path)
    check_folder(p)
    with _locked(p):
        doc = load(p, missing_ok=True) or empty()
        try:
            new, out = merge(doc, records, host=host, now=now)
        except RecordConflict as e:
            raise RecordConflict(str(p), e.conflicts) from None
        out.path = str(p)
        if out.added:
            safeio.replace_private(p, dumps(new), new_mode=0o644)  # an existing file keeps its mode
            out.written = True
    return out


def permission_problems(path: str | os.PathLike[str], euid: int | None = None) -> list[str]:
    """Why a root gpucheck should not trust `path`: the file (or its folder) is writable by users
    other than root. Empty when not running as root, when the file does not exist, or when all
    is well."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return []
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return []
    problems = []
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH:
        problems.append(f"{p} is writable by every user (mode {mode:04o})")
    elif mode & stat.S_IWGRP and st.st_gid != 0:
        problems.append(f"{p} is writable by group {st.st_gid} (mode {mode:04o})")
    if st.st_uid != 0:
        problems.append(f"{p} is owned by uid {st.st_uid}, not root")
    try:
        dst = p.resolve().parent.stat()
        dmode = stat.S_IMODE(dst.st_mode)
        sticky = bool(dmode & stat.S_ISVTX)
        if not sticky and (dmode & stat.S_IWOTH or (dmode & stat.S_IWGRP and dst.st_gid != 0) or dst.st_uid != 0):
            problems.append(f"its folder {p.resolve().parent} lets other users replace it (mode {dmode:04o}, "
                            f"owner uid {dst.st_uid})")
    except OSError:
        pass
    return problems
