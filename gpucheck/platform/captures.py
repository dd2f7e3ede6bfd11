"""The capture kinds `gpucheck judge` reads, and how several captures of one node become the
snapshot-like documents the level-1 checks judge (docs/judge.md). Reading only: no judgement here.

A capture kind is a row of a table: its name, `detect(head, path) -> bool` (the first
HEAD_BYTES of the file, b"" for a folder, and its path) and `read(path) -> Fragment` (the
top-level keys of a snapshot document it gives, docs/snapshot.md; a key no kind here knows
passes through to the judged document unchanged, so a check that reads it sees it). A reader
raises CaptureReadError (one line) for a file it detected but cannot read.

The kinds of this module: a gpucheck snapshot (JSON), `nvidia-smi -q` and `nvidia-smi -q -x`,
`nvidia-smi nvlink -s` (the NVLink state -q does not print), DCGM diag JSON (`dcgmi diag -j`), kernel logs (dmesg, kern.log / syslog, journal). Other modules
add theirs with one line each, `register_all(NET_CAPTURE_KINDS)` (see the end of this module).

Several captures are one node (`steps`): captures of different kinds add up into one document;
several captures of one `series` kind (t0, t1, t2, ordered by the capture's own time when every
one has it, else by argument order) become a sequence of documents, the earlier ones judged first
into a history so that delta and flap rules compare each reading with the one before.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

HEAD_BYTES = 65536

Fragment = dict[str, object]  # top-level keys of a snapshot document (docs/snapshot.md), JSON values


class CaptureReadError(ValueError):
    """A file of a known kind that cannot be read (the message is one line and names the file)."""


@dataclass(frozen=True)
class CaptureKind:
    """One row of the capture table."""

    name: str  # shown to users ("nvidia-smi -q", "kernel log (dmesg)")
    detect: Callable[[bytes, Path], bool]
    read: Callable[[Path], Fragment]
    series: bool = True  # several captures of this kind are a time series (else they add up)
    generic: bool = False  # tried after every specific kind (a kernel log matches much)
    gpu_telemetry: bool = False  # gives the snapshot's GPU part (nvml, gpus, driver, ...)


_KINDS: list[CaptureKind] = []


def register(kind: CaptureKind) -> None:
    """Add a capture kind to the table `gpucheck judge` detects files against. Specific kinds are
    tried in registration order before generic ones; a name already registered is refused."""
    if any(k.name == kind.name for k in _KINDS):
        raise ValueError(f"capture kind {kind.name!r} is registered twice")
    _KINDS.append(kind)


def register_all(kinds: Sequence[CaptureKind]) -> None:
    """register() each of `kinds` (a module's list, e.g. NET_CAPTURE_KINDS)."""
    for kind in kinds:
        register(kind)


def kinds() -> list[CaptureKind]:
    """The table in detection order: specific kinds, then generic ones."""
    return [k for k in _KINDS if not k.generic] + [k for k in _KINDS if k.generic]


# -- files -------------------------------------------------------------------------------------------
def head_of(path: Path) -> bytes:
    """The first HEAD_BYTES of a regular file (gzip decompressed), b"" for a folder. Raises
    CaptureReadError for what cannot be read (a FIFO or a device is refused, never read)."""
    if path.is_dir():
        return b""
    from .kernlog.sources.files import open_log_file

    try:
        with open_log_file(os.fspath(path)) as f:
            return f.read(HEAD_BYTES)
    except (OSError, EOFError, ValueError) as e:
        raise CaptureReadError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None


def detect_kind(path: Path) -> CaptureKind | None:
    """The first kind whose detect() accepts `path`, or None. Raises CaptureReadError for a
    file that cannot be read or is empty."""
    head = head_of(path)
    if not path.is_dir() and not head.strip():
        raise CaptureReadError(f"{path}: empty file: nothing to judge")
    return next((k for k in kinds() if k.detect(head, path)), None)


def _text(head: bytes) -> str:
    return head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")


# -- gpucheck snapshot and nvidia-smi captures ---------------------------------------------------------
def _is_snapshot(head: bytes, path: Path) -> bool:
    return _text(head).startswith("{") and '"gpucheck.snapshot"' in _text(head)


def _nvsmi_format(head: bytes) -> str | None:
    from .telemetry.nvsmi import detect

    return detect(_text(head))


def read_text(path: Path) -> str:
    """A capture's text (.gz decompressed), at most the snapshot size limit (safeio.LIMITS)."""
    from .kernlog.sources.files import open_log_file
    from .safeio import LIMITS

    limit = LIMITS["snapshot"]
    try:
        with open_log_file(os.fspath(path)) as f:
            data = f.read(limit + 1)
    except (OSError, EOFError) as e:
        raise CaptureReadError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if len(data) > limit:
        raise CaptureReadError(f"{path}: too big: more than {limit} bytes (the limit for a capture)")
    return data.decode("utf-8", errors="replace")


def _read_snapshot(path: Path) -> Fragment:
    """A gpucheck snapshot or an nvidia-smi capture, converted (both validated as by load_snapshot)."""
    from .telemetry.snapshot import SnapshotError, snapshot_from_text

    try:
        return dict(snapshot_from_text(read_text(path), str(path)))
    except SnapshotError as e:
        raise CaptureReadError(str(e)) from None


# -- DCGM diag JSON ----------------------------------------------------------------------------------
_DCGM_ROOTS = ('"DCGM GPU Diagnostic"', '"DCGM Diagnostic"')


def _is_dcgm(head: bytes, path: Path) -> bool:
    text = _text(head)
    return "{" in text[:4096] and any(root in text for root in _DCGM_ROOTS)


def _read_dcgm(path: Path) -> Fragment:
    """`dcgmi diag -j` output, kept as its text (the eud.dcgm check parses it as it parses a
    live run's: gpucheck.eud.dcgm_parse)."""
    return {"dcgm_diag": {"path": str(path), "text": read_text(path)}}


# -- kernel logs -------------------------------------------------------------------------------------
_DMESG_RE = re.compile(  # [  12.345678], [+0.000844], [Fri Feb 12 11:47:20 2021], dmesg --decode, /dev/kmsg records
    r"^(<\d+>)?\[\s*[+]?\d+\.\d+\]|^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]|"
    r"^kern\s*:\s*\w+\s*:|^\d+,\d+,\d+,[-c+];|^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d+[+-]\d\d:?\d\d\s", re.M)
_SYSLOG_RE = re.compile(  # "Sep 19 16:18:04 host kernel: ...", its ISO form, a journal's banner lines
    r"^(\S+\s+\d{1,2}\s+\d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.,]+\S*)\s+\S+\s+[\w./@-]+(\[\d+\])?:|"
    r"^-- (Logs begin|Journal begins|Boot [0-9a-f]+ --|No entries)", re.M)


def _is_syslog(head: bytes, path: Path) -> bool:
    return bool(_SYSLOG_RE.search(_text(head)))


def _is_dmesg(head: bytes, path: Path) -> bool:
    return bool(_DMESG_RE.search(_text(head)))


def _has_kernel_lines(head: bytes, path: Path) -> bool:
    """Lines a kernel log holds, in any other form (a paste of bare "NVRM: Xid ..." lines)."""
    from .kernlog.sources.linefilter import NEEDLES

    return any(needle in head for needle in (*NEEDLES, b" kernel: ", b"\nkernel: "))


def _read_kernel_log(path: Path) -> Fragment:
    """The kernel log's relevant lines (the line filter of gpucheck.platform.kernlog.sources, as
    `telemetry dump` records them), as the snapshot's `kernel_log`: no boot time (the file
    does not say when its machine booted: dmesg's seconds since boot stay relative)."""
    from .kernlog.sources.files import read_file

    try:
        lines, size = read_file(os.fspath(path))
    except OSError as e:
        raise CaptureReadError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return {"kernel_log": {"source": f"file:{path}", "lines": lines, "error": None, "boot_time": None,
                           "captured_at": None, "records": None, "notes": [f"{path}: {size} bytes read"]}}


# -- nvidia-smi nvlink -s ------------------------------------------------------------------------------
def _is_nvlink_status(head: bytes, path: Path) -> bool:
    from .telemetry.nvlinkstatus import detect

    return detect(_text(head))


def _read_nvlink_status(path: Path) -> Fragment:
    """Each GPU's link states, as `nvlink_status` (applied to the GPU entries by assemble)."""
    from .telemetry.nvlinkstatus import parse

    text = read_text(path)
    try:
        gpus = parse(text)
    except ValueError as e:
        raise CaptureReadError(f"{path}: cannot read as nvidia-smi nvlink -s: {e}") from None
    return {"nvlink_status": {"path": str(path), "gpus": list(gpus)}}


COUNTERS_HINT = ("capture has no NVLink error counters (nvidia-smi nvlink -s prints states only): "
                 "record `gpucheck telemetry dump` on the node")
ONLY_NVLINK_HINT = "capture has no GPU telemetry besides NVLink: add `nvidia-smi -q`"


def _gap(g: dict[str, object], field_name: str, hint: str) -> None:
    from .telemetry.nvml import NOT_IN_FORMAT

    errors = g.setdefault("errors", {})
    capture = g.setdefault("capture", {})
    if isinstance(errors, dict) and isinstance(capture, dict):
        errors[field_name] = NOT_IN_FORMAT
        capture.setdefault("not_carried", {})[field_name] = hint


def _gpu_of_status(status: dict[str, object], hint: str = ONLY_NVLINK_HINT,
                   given: tuple[str, ...] = ()) -> dict[str, object]:
    """A GPU entry for a GPU that only a partial capture shows (nvlink -s, nvidia-smi's Fabric
    sections): its index, UUID and name where given; every other field not carried (`hint`: what to
    add), except the groups in `given` that the capture fills in."""
    from .telemetry.fields import GROUP_FIELDS, TOP_FIELDS
    from .telemetry.nvsmi import skeleton

    g: dict[str, object] = skeleton(int(str(status["index"])))
    g["uuid"], g["name"] = status.get("uuid"), status.get("name")
    for key in TOP_FIELDS:
        if key not in ("uuid", "name") and not key.endswith("_name") and key != "architecture_id":
            _gap(g, key, hint)
    for group in GROUP_FIELDS:
        if group not in given:
            _gap(g, group, hint)
    return g


def mark_partial_gpus(doc: Fragment, hint: str) -> None:
    """Say, in the document's `capture.not_carried`, that its GPU list comes from a partial capture
    (the GPUs it names, not what NVML lists): the inventory skips naming what to add."""
    capture = doc.setdefault("capture", {})
    if isinstance(capture, dict):
        capture.setdefault("not_carried", {})["gpus"] = hint


ONLY_FABRIC_HINT = "capture has no GPU telemetry besides the NVLink fabric: add `nvidia-smi -q`"


def apply_gpu_groups(doc: Fragment, shown: list[object], path: Path) -> list[str]:
    """Put the GPU groups a capture without GPU telemetry gives (nvidia-smi's Fabric sections:
    `{"index", "fabric"}` each) into the document's GPU entries, matched by index; GPUs only it
    shows become entries of their own when no capture holds GPU telemetry. Returns warnings."""
    parts = [s for s in shown if isinstance(s, dict) and isinstance(s.get("index"), int)]
    gpus, nvml = doc.get("gpus"), doc.get("nvml")
    if not isinstance(gpus, list):
        return [f"{path}: its GPU groups have no GPU entries to go into: not judged"]
    if isinstance(nvml, dict) and not nvml.get("ok") and not gpus:
        doc["nvml"] = {"ok": True, "error": None}
        mark_partial_gpus(doc, ONLY_FABRIC_HINT)
        gpus.extend(_gpu_of_status(s, ONLY_FABRIC_HINT, tuple(k for k in s if k != "index")) for s in parts)
    by_index = {g.get("index"): g for g in gpus if isinstance(g, dict)}
    warnings: list[str] = []
    for part in parts:
        g = by_index.get(part["index"])
        if g is None:
            warnings.append(f"{path}: GPU {part['index']} is in no other capture: its groups are not judged")
            continue
        for key, value in part.items():
            if key == "index":
                continue
            g[key] = value
            errors, capture = g.get("errors"), g.get("capture")
            if isinstance(errors, dict):
                errors.pop(key, None)
            if isinstance(capture, dict) and isinstance(capture.get("not_carried"), dict):
                capture["not_carried"].pop(key, None)
    return warnings


def apply_nvlink_status(doc: Fragment) -> list[str]:
    """Put an `nvlink_status` fragment's link states into the document's GPU entries (matched by
    UUID; GPUs only it shows become entries of their own when no capture holds GPU telemetry),
    the counters it does not carry marked so. Returns warnings."""
    status = doc.pop("nvlink_status", None)
    if not isinstance(status, dict):
        return []
    listed = status.get("gpus")
    shown: list[dict[str, object]] = [s for s in listed if isinstance(s, dict)] if isinstance(listed, list) else []
    gpus = doc.get("gpus")
    nvml = doc.get("nvml")
    warnings: list[str] = []
    if isinstance(nvml, dict) and not nvml.get("ok") and isinstance(gpus, list) and not gpus:
        doc["nvml"] = {"ok": True, "error": None}
        mark_partial_gpus(doc, ONLY_NVLINK_HINT)
        gpus.extend(_gpu_of_status(s) for s in shown)
    by_uuid = {g.get("uuid"): g for g in (gpus if isinstance(gpus, list) else []) if isinstance(g, dict)}
    for s in shown:
        g = by_uuid.get(s.get("uuid"))
        if g is None:
            warnings.append(f"{status.get('path')}: GPU {s.get('index')} ({s.get('uuid')}) is in no other capture: "
                            "its NVLinks are not judged")
            continue
        raw_links = s.get("links")
        links = [{"link": lk["link"], "state": lk["state"], "replay_errors": None, "recovery_errors": None,
                  "crc_flit_errors": None, "crc_data_errors": None}
                 for lk in (raw_links if isinstance(raw_links, list) else [])]
        g["nvlink"] = {"supported": True, "links": links, "all_inactive": bool(s.get("all_inactive"))}
        errors, capture = g.get("errors"), g.get("capture")
        if isinstance(errors, dict):
            errors.pop("nvlink", None)
        if isinstance(capture, dict) and isinstance(capture.get("not_carried"), dict):
            capture["not_carried"].pop("nvlink", None)
        for lk in links:
            for counter in ("replay_errors", "recovery_errors", "crc_flit_errors", "crc_data_errors"):
                _gap(g, f"nvlink.links[{lk['link']}].{counter}", COUNTERS_HINT)
    return warnings


# -- assembling several captures ---------------------------------------------------------------------
@dataclass
class Capture:
    """One file, its kind and what it gave."""

    path: Path
    kind: CaptureKind
    fragment: Fragment
    order: int  # its place on the command line


@dataclass
class Step:
    """One document to judge: the captures it is made of, and the assembled snapshot."""

    captures: list[Capture]
    document: Fragment
    warnings: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return ", ".join(str(c.path) for c in self.captures)

    @property
    def gpu_capture(self) -> Capture | None:
        return next((c for c in self.captures if c.kind.gpu_telemetry), None)


NO_GPU_TELEMETRY = ("the captures hold no GPU telemetry: add `nvidia-smi -q` (or a `gpucheck telemetry dump` "
                    "snapshot) of the node")


def capture_time(fragment: Fragment) -> float | None:
    """The capture's own time (its `captured_at`, ISO), seconds since the epoch, or None."""
    value = fragment.get("captured_at")
    if not isinstance(value, str) or value in ("", "unknown"):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def order_series(captures: list[Capture]) -> tuple[list[Capture], str | None]:
    """A series in the captures' own time order when every one has a time, else in argument
    order (and a note saying so)."""
    times = [capture_time(c.fragment) for c in captures]
    if all(t is not None for t in times):
        return [c for _, c in sorted(zip(times, captures), key=lambda tc: (tc[0], tc[1].order))], None
    return sorted(captures, key=lambda c: c.order), (
        f"{captures[0].kind.name} series ordered as given on the command line (not every capture has its own time)")


def plan_steps(captures: list[Capture]) -> tuple[list[list[Capture]], list[str]]:
    """The captures of each document to judge, oldest first. The series kinds' captures are
    aligned on the last one; every other capture (a kind given once, or one that adds up) goes
    with the last document."""
    by_kind: dict[str, list[Capture]] = {}
    for c in captures:
        by_kind.setdefault(c.kind.name, []).append(c)
    notes: list[str] = []
    series: list[list[Capture]] = []
    single: list[Capture] = []
    for group in by_kind.values():
        if group[0].kind.series and len(group) > 1:
            ordered, note = order_series(group)
            series.append(ordered)
            notes += [note] if note else []
        else:
            single += group
    length = max((len(s) for s in series), default=1)
    steps: list[list[Capture]] = [[] for _ in range(length)]
    for s in series:
        for i, c in enumerate(s):
            steps[length - len(s) + i].append(c)
    steps[-1].extend(sorted(single, key=lambda c: c.order))
    return [sorted(step, key=lambda c: c.order) for step in steps], notes


# The keys of a snapshot's GPU part: from the one capture that gives it (gpu_telemetry).
GPU_KEYS = ("kind", "version", "synthetic", "source", "host", "captured_at", "gpucheck_version", "nvml",
            "driver_version", "cuda_driver_version", "nvml_version", "pci_nvidia_devices", "gpus", "capture")


def no_gpu_telemetry(captured_at: str | None) -> Fragment:
    """The GPU part of a document whose captures hold no GPU telemetry: NVML not read, of kind
    not_in_format (the NVML checks skip naming what to add; never a fault, never a pass)."""
    from .. import __version__
    from .telemetry.model import KIND, VERSION
    from .telemetry.nvml import NOT_IN_FORMAT

    return {"kind": KIND, "version": VERSION, "synthetic": False,
            "source": f"captures judged by gpucheck judge {__version__}: no GPU telemetry among them",
            "host": "unknown", "captured_at": captured_at or "unknown", "gpucheck_version": __version__,
            "nvml": {"ok": False, "error": {"kind": NOT_IN_FORMAT, "message": NO_GPU_TELEMETRY}},
            "driver_version": None, "cuda_driver_version": None, "nvml_version": None,
            "pci_nvidia_devices": [], "gpus": []}


def merge_value(old: object, new: object) -> tuple[object, bool]:
    """Two captures' values of one key: lists add up, objects merge key by key (recursively),
    a missing or null value is filled; anything else: the later one, and False (a conflict)."""
    if old is None:
        return new, True
    if new is None:
        return old, True
    if isinstance(old, list) and isinstance(new, list):
        return old + new, True
    if isinstance(old, dict) and isinstance(new, dict):
        out, ok = dict(old), True
        for k, v in new.items():
            out[k], fine = merge_value(out.get(k), v)
            ok = ok and fine
        return out, ok
    return new, old == new


def _fabric_kinds() -> list[tuple[Any, ...]]:
    from .fabric.captures import FABRIC_CAPTURE_KINDS

    return list(FABRIC_CAPTURE_KINDS)


def _net_kinds() -> list[tuple[Any, ...]]:
    from .net.captures import NET_CAPTURE_KINDS

    return list(NET_CAPTURE_KINDS)


def assemble(step: list[Capture]) -> Step:
    """One document from the captures of one step: the GPU part from the first capture that has
    GPU telemetry (a second one is named in a warning and not used for it), every other key of
    every capture added up (merge_value); keys no kind here knows pass through."""
    gpu = next((c for c in step if c.kind.gpu_telemetry), None)
    times = [t for c in step if isinstance(t := c.fragment.get("captured_at"), str)]
    doc: Fragment = dict(gpu.fragment) if gpu is not None else no_gpu_telemetry(next(iter(times), None))
    warnings: list[str] = []
    for c in step:
        if c is gpu:
            continue
        if c.kind.gpu_telemetry:
            warnings.append(f"{c.path}: GPU telemetry also in {gpu.path if gpu else '?'}: judged from that one only")
        for key, value in c.fragment.items():
            if key == "gpus" and isinstance(value, list) and not c.kind.gpu_telemetry:
                warnings += apply_gpu_groups(doc, value, c.path)
                continue
            if key in GPU_KEYS:
                if key == "host" and doc.get("host") in (None, "unknown"):
                    doc["host"] = value
                continue
            doc[key], fine = merge_value(doc.get(key), value)
            if not fine:
                warnings.append(f"{c.path}: its {key!r} differs from an earlier capture's: the later one is judged")
    warnings += apply_nvlink_status(doc)
    return Step(captures=list(step), document=doc, warnings=warnings)


# -- the table ---------------------------------------------------------------------------------------
CAPTURE_KINDS: tuple[CaptureKind, ...] = (
    CaptureKind("gpucheck snapshot", _is_snapshot, _read_snapshot, gpu_telemetry=True),
    CaptureKind("nvidia-smi -q -x", lambda head, path: _nvsmi_format(head) == "nvidia-smi -q -x", _read_snapshot,
                gpu_telemetry=True),
    CaptureKind("DCGM diag JSON", _is_dcgm, _read_dcgm),
    CaptureKind("nvidia-smi nvlink -s", _is_nvlink_status, _read_nvlink_status),
    CaptureKind("nvidia-smi -q", lambda head, path: _nvsmi_format(head) == "nvidia-smi -q", _read_snapshot,
                gpu_telemetry=True),
    CaptureKind("kernel log (journal, syslog, kern.log)", _is_syslog, _read_kernel_log, series=False, generic=True),
    CaptureKind("kernel log (dmesg)", _is_dmesg, _read_kernel_log, series=False, generic=True),
    CaptureKind("kernel log (lines)", _has_kernel_lines, _read_kernel_log, series=False, generic=True),
)

register_all(CAPTURE_KINDS)
# Other modules' kinds, one line each: (name, detect, read) rows, specific kinds, a time series each.
register_all([CaptureKind(*row) for row in _fabric_kinds() + _net_kinds()])
