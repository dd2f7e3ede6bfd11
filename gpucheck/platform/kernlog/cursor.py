"""The last-pass cursor: up to when the kernel log was judged healthy, for the node and per GPU.

`cursor-last-pass.json` in the state directory:

    {"time": ISO-8601, "epoch": float,                          # the node mark (may be absent)
     "by": "gpucheck xid --ack",                                # when a person set the node mark
     "gpus": {"GPU-<uuid>": {"time": ISO-8601, "epoch": float}}}  # GPU marks (may be absent)

The **node mark** says: every event of the log up to it was judged by a passing run that
examined every GPU of the node with the default window, or acknowledged (`gpucheck xid --ack`).
A **GPU mark** says the same for the events of that GPU alone (keyed by UUID, which survives
renumbering and reboots): a passing run that examined only some GPUs (a Slurm prolog of a job on
GPU 0, `gpucheck run --gpus 0`) moves only their marks.

An event of a GPU whose UUID is known is judged from the later of the node mark and that GPU's
mark. Every other event (an address no GPU with a UUID is known at, a GPU that NVML no longer
lists and the driver never named, an NVSwitch SXid, an unrecognised line) is judged from the node
mark, the oldest of all marks: no run on some GPUs can hide another GPU's error, even one that
later shows at an address of its own.

A mark moves only for what the run examined with the default window (`since = "last-pass"`, no
`ignore_xids`, not the epilog's job start): a narrower window or a judgement that treated some
Xids as harmless says nothing about the rest. See `window_is_default` and `advance`, and
docs/xid.md.

A cursor written by an older gpucheck (`{"time", "epoch"}` only) is read as a node mark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .timeparse import iso_utc, parse_timestamp, usable_start

LAST_PASS_CURSOR = "last-pass"
MAX_GPU_MARKS = 1024  # no node has that many GPUs; the newest marks are kept


def mark_epoch(mark: Any) -> float | None:
    """The time of a mark ({"time": ISO, "epoch": float}), or None when it has no time that
    parses to a finite epoch."""
    if not isinstance(mark, dict):
        return None
    ep = mark.get("epoch")
    if isinstance(ep, (int, float)) and not isinstance(ep, bool):
        return float(ep) if math.isfinite(ep) else None
    t = mark.get("time")
    return parse_timestamp(t) if isinstance(t, str) else None


def has_node_mark(cursor: Any) -> bool:
    return isinstance(cursor, dict) and ("epoch" in cursor or "time" in cursor)


def gpu_marks(cursor: Any) -> dict[str, Any]:
    """{uuid: mark} of a cursor (nothing when it has none, or they are not a table)."""
    marks = cursor.get("gpus") if isinstance(cursor, dict) else None
    return {k: v for k, v in marks.items() if isinstance(k, str) and k} if isinstance(marks, dict) else {}


@dataclass
class GpuStarts:
    """Where each GPU's events are judged from, past the window's start (the node mark)."""

    by_uuid: dict[str, float] = field(default_factory=dict)  # only marks later than the node mark
    notes: list[str] = field(default_factory=list)

    def start_for(self, uuid: str | None, node_start: float | None) -> float | None:
        if uuid and uuid in self.by_uuid:
            return self.by_uuid[uuid]
        return node_start


def gpu_starts(cursor: Any, node_start: float | None, now: float) -> GpuStarts:
    """The GPU marks of `cursor` that are later than `node_start` and can be trusted (see
    timeparse.usable_start: one ahead of now or with no time is ignored, with a warning note, and
    that GPU judged from the node mark)."""
    out = GpuStarts()
    for uuid, mark in sorted(gpu_marks(cursor).items()):
        ep = mark_epoch(mark)
        why = usable_start(ep, now)
        if why is not None:
            out.notes.append(f"warning: ignored the last-pass mark of {uuid}: {why}")
            continue
        assert ep is not None
        if node_start is None or ep > node_start:
            out.by_uuid[uuid] = ep
    if out.by_uuid:
        out.notes.append("GPUs passed on their own since: " + ", ".join(
            f"{uuid} {iso_utc(ep)}" for uuid, ep in sorted(out.by_uuid.items(), key=lambda kv: kv[1])))
    return out


def window_is_default(params: Mapping[str, Any], options: Any) -> bool:
    """Whether the xid check ran with the window the cursor speaks for: `since` last-pass, no
    Xid ignored by configuration, no job start given by the Slurm epilog (`options`: the run's
    gpucheck.core.check.RunOptions)."""
    since = str(params.get("since", "last-pass")).strip().lower()
    return since == "last-pass" and not params.get("ignore_xids") and getattr(options, "xid_since", None) in (None, "")


def covers_the_node(selection: Iterable[int] | None, inventory: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a run on `selection` (None: all) judged the events of every GPU of `inventory`
    (the snapshot's GPU entries): events of a GPU outside the selection are not judged."""
    if selection is None:
        return True
    chosen = set(selection)
    return all(g.get("index") in chosen for g in inventory)


def advance(cursor: Any, *, epoch: float, time: str | None, uuids: Iterable[str], whole: bool,
            now: float) -> dict[str, Any]:
    """The cursor after a passing run that started at `epoch` and examined, with the default
    window, the GPUs `uuids` (and every other event when `whole`). A mark never moves back (an
    `--ack` or another run may have written a later one meanwhile); a mark that cannot be trusted
    (no time, ahead of `now`) is dropped: a run writes its own in its place or leaves none."""

    def trusted(mark: Any) -> float | None:
        ep = mark_epoch(mark)
        return ep if ep is not None and 0 <= ep <= now else None

    cur = dict(cursor) if isinstance(cursor, dict) else {}
    node = trusted(cur)
    if node is None:
        cur = {k: v for k, v in cur.items() if k == "gpus"}
    marks = {u: m for u, m in gpu_marks(cur).items() if trusted(m) is not None}
    stamp = {"time": time or iso_utc(epoch), "epoch": epoch}
    if whole:
        if node is None or node < epoch:
            cur = {**stamp}  # a run's mark: who acked an older one no longer matters
            node = epoch
        marks = {u: m for u, m in marks.items() if trusted(m) > node}  # type: ignore[operator]
    else:
        for uuid in uuids:
            old = trusted(marks.get(uuid))
            if old is None or old < epoch:
                marks[uuid] = dict(stamp)
    if len(marks) > MAX_GPU_MARKS:
        newest = sorted(marks, key=lambda u: trusted(marks[u]) or 0.0)[-MAX_GPU_MARKS:]
        marks = {u: marks[u] for u in newest}
    cur.pop("gpus", None)
    if marks:
        cur["gpus"] = marks
    return cur
