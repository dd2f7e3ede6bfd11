"""Kernel-log lines -> Xid / SXid events (pure: no I/O, no clock).

Recognised forms (all seen on real machines):

- ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``
- the old form without ``PCI:``: ``NVRM: Xid (0000:01:00): 31, Ch 0000005a, engmask ...``
- ``pid='<unknown>', name=<unknown>``; no pid at all (``62, 223b6a66 ...``, ``154, GPU recovery ...``)
- MIG addresses ``(PCI:0000:3b:00 GPU-I:01 GPU-CI:00)``; domains other than 0000; upper-case hex
- NVLink5 (Xid 144-150): ``149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 ...)``
- recovery action (Xid 154): ``154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)``
- bus loss without a number (an implied Xid 79): ``NVRM: GPU at 0000:61:00.0 has fallen off the bus.``,
  ``NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.``, and the three-line
  ``NVRM: The NVIDIA GPU 0000:5d:00.0`` ... ``NVRM: fallen off the bus and is not responding to commands.``
- NVSwitch: ``nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 22013, Non-fatal, Link 60 ...`` followed by the
  ``..., Severity 0 ...`` and ``..., Data {0x...}`` lines of the same SXid (one event)
- the driver's PCI -> UUID lines: ``NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...`` (+ board serial)

- an Xid line whose address token is not a PCI address (``Xid (PCI:...): 145``, a redacted or
  cut address, a GPU ordinal): the event is kept, on "GPU unknown" (`pci_bus_id` None, the token in
  `gpu_token`)
- fault signatures that carry no Xid number (`XidEvent.signature`, judged from catalog.SIGNATURES):
  ``nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED]`` (the GPU is
  unusable until reset), ``... [NV_ERR_GPU_IS_LOST]``, GSP heartbeat timeouts
  (``_kgspIsHeartbeatTimedOut: Heartbeat timed out``, ``GSP RM heartbeat timed out``), GSP RPC
  timeouts (the ``_kgspLogRpcTimeout`` / ``_kgspLogXid119`` "GSP Timeout" banners, "Back to back
  GSP RPC timeout detected"), ``RmInitAdapter failed`` (with its ``rm_init_adapter failed`` line as
  related evidence). They name their GPU by a PCI address where the line has one, else by the
  driver's ordinal (``NVRM: GPU6 ...``) or not at all: "GPU unknown"
- a bus-loss line without an Xid number and without an address is an implied Xid 79 on "GPU unknown"

Numbers that appear only in other text ("caused by previous Xid 149", ``_kgspLogXid119`` banners)
are not events. Anything else that looks like an Xid, SXid or bus-loss report but matches none of
these is kept as an "unrecognised" line, never dropped. Other NVRM chatter (GSP RPC history tables,
module loading) is context, not an event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypedDict, Union

from .timeparse import iso_utc, parse_prefix

MAX_LINE_CHARS = 4096  # longer lines are cut (a huge line never costs more than this)
MERGE_WINDOW_S = 60.0  # a bus-loss line within this of an Xid 79 for the same GPU is that event
MERGE_LINES = 20  # ... or within this many relevant lines when a time is missing
SXID_CONT_WINDOW_S = 5.0  # Severity/Data lines follow their SXid header within this

_BUS = r"(?P<bus>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2})(?:\.[0-7])?"

XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?" + _BUS +
    r"(?:\s+GPU-I:\s*(?P<gi>\d+))?(?:\s+GPU-CI:\s*(?P<ci>\d+))?\s*\):\s*(?P<xid>\d+)\b,?\s*(?P<rest>.*)$"
)
_PID_RE = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d+),\s*name=(?P<name>[^,]*)(?:,\s*(?P<text>.*))?$")
_NVLINK5_RE = re.compile(
    r"^(?P<unit>[A-Za-z][A-Za-z0-9_/]*)\s+(?P<fatal>Link Fatal|Fatal|Nonfatal|Non-fatal)\b"
    r"(?:\s+(?P<xc>XC\d+))?(?:\s+(?P<inst>i\d+))?(?:\s+Link\s+(?P<link>-?\d+))?(?:\s*\((?P<words>[^)]*)\))?"
)
_LINK_RE = re.compile(r"\b[Ll]ink\s+(?P<link>\d+)")
_HEX_RE = re.compile(r"0x[0-9A-Fa-f]+")
_RECOVERY_RE = re.compile(
    r"recovery action changed from (?P<fc>0x[0-9A-Fa-f]+)\s*\((?P<fl>[^)]*)\)\s*to\s*"
    r"(?P<tc>0x[0-9A-Fa-f]+)(?:\s*\((?P<tl>[^)]*)\))?"
)
_CAUSED_RE = re.compile(r"caused by previous Xid (?P<xid>\d+)")
# An Xid line whose address is no PCI address: "(PCI:...)", a redacted one, a GPU ordinal.
ODD_XID_RE = re.compile(r"NVRM: Xid \((?P<token>[^()]{0,64})\):\s*(?P<xid>\d+)\b,?\s*(?P<rest>.*)$")

# Fault signatures without an Xid number: name -> pattern (first match wins).
SIGNATURE_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("reset_required", re.compile(r"\[NV_ERR_RESET_REQUIRED\]|Assertion failed: Reset required")),
    ("gpu_lost", re.compile(r"\[NV_ERR_GPU_IS_LOST\]")),
    ("gsp_heartbeat_timeout", re.compile(r"_kgspIsHeartbeatTimedOut: Heartbeat timed out|GSP RM heartbeat timed out")),
    ("gsp_rpc_timeout", re.compile(r"_kgsp(?:LogRpcTimeout|LogXid119):\s*\*+\s*GSP (?:Timeout|Failure)"
                                   r"|Back to back GSP RPC timeout detected")),
    ("init_failed", re.compile(r"RmInitAdapter failed")),
)
_INIT_TAIL_RE = re.compile(r"rm_init_adapter failed")
_SIG_BUS_RES = (
    re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?" + _BUS + r":"),
    re.compile(r"\(PCI:" + _BUS + r"\)"),
)
_ORDINAL_RE = re.compile(r"NVRM: (?P<ord>GPU\d{1,3})\s")

_BUS_LOSS_RES = (
    re.compile(r"NVRM: GPU at (?:PCI:)?" + _BUS + r":? has fallen off the bus"),
    re.compile(r"NVRM: GPU (?:PCI:)?" + _BUS + r":\s*GPU has fallen off the bus"),
)
_THE_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (?:PCI:)?" + _BUS)
_ANNOUNCE_RE = re.compile(
    r"NVRM: GPU at (?:PCI:)?" + _BUS + r":\s+(?P<uuid>GPU-[0-9A-Fa-f]{8}-[0-9A-Fa-f-]{27,})"
)
_SERIAL_RE = re.compile(r"NVRM: GPU Board Serial Number:\s*(?P<serial>\S+)")
SXID_RE = re.compile(
    r"(?:nvidia-nvswitch(?P<sw>\d+)\s*:\s*)?SXid \((?:PCI:)?" + _BUS + r"\):\s*(?P<sxid>\d+)\b,?\s*(?P<rest>.*)$"
)
_SXID_HEADER_RE = re.compile(r"^(?P<fatal>Fatal|Non-fatal|Nonfatal)\b,?\s*(?P<text>.*)$")
_SXID_SEVERITY_RE = re.compile(r"^Severity\s+(?P<sev>\d+)\b\s*(?P<text>.*)$")
_SXID_DATA_RE = re.compile(r"^Data\s*\{(?P<data>[^}]*)\}?")

# Lines that must be an event: when one of these matches no known form, it is "unrecognised".
_LOOKS_LIKE = re.compile(r"NVRM: Xid|SXid|fallen off the bus")


class NvlinkFault(TypedDict):
    """What an NVLink Xid (74, 144-150) says about the link."""

    unit: str | None  # 144-150: the unit that reported it
    fatal: bool
    severity_text: str | None  # 144-150: "Fatal" / "Nonfatal"
    link: int | None
    xc: str | None
    instance: str | None
    words: list[str]  # the hex words of the message


class RecoveryChange(TypedDict):
    """Xid 154: the GPU's recovery action, from and to (code and label)."""

    from_code: int
    from_label: str
    to_code: int
    to_label: str | None


class XidFields(TypedDict):
    """The fields of one NVRM Xid message (parse_xid_message)."""

    xid: int
    pci_bus_id: str | None
    pid: int | None
    process: str | None
    text: str
    gpu_instance: int | None
    compute_instance: int | None
    gpu_token: str | None
    nvlink: NvlinkFault | None
    recovery: RecoveryChange | None
    caused_by: int | None


@dataclass
class XidEvent:
    xid: int | None  # None for a fault signature without an Xid number (`signature`)
    pci_bus_id: str | None
    time: float | None
    raw: str
    text: str = ""
    pid: int | None = None
    process: str | None = None
    implied: bool = False  # a bus-loss line without an Xid number (Xid 79)
    gpu_instance: int | None = None  # MIG
    compute_instance: int | None = None
    nvlink: NvlinkFault | None = None  # Xid 74 and 144-150: unit, fatal, link, words
    recovery: RecoveryChange | None = None  # Xid 154: from/to code and label
    caused_by: int | None = None  # Xid 45: "caused by previous Xid N"
    related: list[str] = field(default_factory=list)  # other lines of the same event
    time_kind: str | None = None
    time_resolution: float = 0.0  # what the line's time tells apart (timeparse.Stamp.resolution)
    seq: int = 0  # order of the line among the relevant lines
    signature: str | None = None  # a fault without an Xid number: a key of catalog.SIGNATURES
    gpu_token: str | None = None  # how the line names a GPU it gives no PCI address for ("PCI:...", "GPU6")

    @property
    def kind(self) -> int | str:
        """The Xid number, or the signature's name."""
        return self.xid if self.xid is not None else str(self.signature)

    def to_dict(self) -> dict[str, Any]:
        return {
            "xid": self.xid,
            "signature": self.signature,
            "gpu_token": self.gpu_token,
            "pci_bus_id": self.pci_bus_id,
            "time": iso_utc(self.time),
            "epoch": self.time,
            "time_source": self.time_kind,
            "pid": self.pid,
            "process": self.process,
            "text": self.text,
            "implied": self.implied,
            "mig": None if self.gpu_instance is None and self.compute_instance is None
            else {"gpu_instance": self.gpu_instance, "compute_instance": self.compute_instance},
            "nvlink": self.nvlink,
            "recovery_action": self.recovery,
            "caused_by_xid": self.caused_by,
            "raw": self.raw,
            "related": list(self.related),
        }


@dataclass
class SXidEvent:
    sxid: int
    pci_bus_id: str | None
    time: float | None
    raw: list[str]
    switch: int | None = None  # N of nvidia-nvswitchN
    fatal: bool | None = None
    link: int | None = None
    text: str = ""
    severity: int | None = None  # the number of the "Severity N" line
    data: list[str] = field(default_factory=list)
    time_kind: str | None = None
    time_resolution: float = 0.0
    seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "sxid": self.sxid,
            "pci_bus_id": self.pci_bus_id,
            "switch": self.switch,
            "time": iso_utc(self.time),
            "epoch": self.time,
            "fatal": self.fatal,
            "link": self.link,
            "text": self.text,
            "severity_level": self.severity,
            "data": list(self.data),
            "raw": self.raw[0] if self.raw else "",
            "related": list(self.raw[1:]),
        }


@dataclass
class Unrecognised:
    raw: str
    time: float | None
    time_resolution: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"time": iso_utc(self.time), "raw": self.raw}


@dataclass
class GpuAnnouncement:
    pci_bus_id: str
    uuid: str
    serial: str | None = None
    time: float | None = None


Item = Union[XidEvent, SXidEvent, Unrecognised]


@dataclass
class ParseResult:
    events: list[XidEvent] = field(default_factory=list)
    sxid_events: list[SXidEvent] = field(default_factory=list)
    unrecognised: list[Unrecognised] = field(default_factory=list)
    announcements: dict[str, GpuAnnouncement] = field(default_factory=dict)
    lines: int = 0  # relevant lines fed


def short_bus_id(text: str) -> str | None:
    """'0000:3B:00' / '00000000:af:00' (already shaped by the _BUS pattern) -> '0000:3b:00'.
    The same result as gpucheck.platform.pci.short_bus_id, without a second regex per line."""
    dom, bus, dev = text.split(":")
    d = int(dom, 16)
    if d > 0xFFFF:
        return None
    dv = int(dev, 16)
    if dv > 0x1F:
        return None
    return f"{d:04x}:{int(bus, 16):02x}:{dv:02x}"


def _int_or_none(s: str | None) -> int | None:
    if s is None:
        return None
    try:
        return int(s)
    except ValueError:
        return None


def parse_xid_message(msg: str) -> XidFields | None:
    """The fields of one ``NVRM: Xid (...)`` message, or None when it is no Xid line. An address
    token that is no PCI address gives `pci_bus_id` None and the token in `gpu_token`."""
    m = XID_RE.search(msg)
    if m:
        bus = short_bus_id(m.group("bus"))
        if bus is not None:
            return _xid_fields(int(m.group("xid")), bus, m.group("rest") or "",
                               _int_or_none(m.group("gi")), _int_or_none(m.group("ci")), None)
    o = ODD_XID_RE.search(msg)
    if o:
        return _xid_fields(int(o.group("xid")), None, o.group("rest") or "", None, None,
                           o.group("token").strip() or None)
    return None


def _xid_fields(xid: int, bus: str | None, rest: str, gi: int | None, ci: int | None,
                token: str | None) -> XidFields:
    out: XidFields = {
        "xid": xid, "pci_bus_id": bus, "pid": None, "process": None, "text": rest,
        "gpu_instance": gi, "compute_instance": ci, "gpu_token": token,
        "nvlink": None, "recovery": None, "caused_by": None,
    }
    pm = _PID_RE.match(rest)
    if pm:
        pid = pm.group("pid")
        out["pid"] = int(pid) if pid.isdigit() else None
        name = pm.group("name").strip()
        out["process"] = None if name in ("<unknown>", "'<unknown>'") else name
        out["text"] = pm.group("text") or ""
    text = out["text"]
    if 144 <= xid <= 150:
        out["nvlink"] = _nvlink5(text)
    elif xid == 74:
        lm = _LINK_RE.search(text)
        out["nvlink"] = {
            "unit": None,
            "fatal": "fatal" in text.lower() and "non-fatal" not in text.lower() and "nonfatal" not in text.lower(),
            "severity_text": None,
            "link": int(lm.group("link")) if lm else None,
            "xc": None,
            "instance": None,
            "words": _HEX_RE.findall(text),
        }
    elif xid == 154:
        rm = _RECOVERY_RE.search(text)
        if rm:
            out["recovery"] = {
                "from_code": int(rm.group("fc"), 16), "from_label": rm.group("fl").strip(),
                "to_code": int(rm.group("tc"), 16), "to_label": (rm.group("tl") or "").strip() or None,
            }
    elif xid == 45:
        cm = _CAUSED_RE.search(text)
        if cm:
            out["caused_by"] = int(cm.group("xid"))
    return out


def _nvlink5(text: str) -> NvlinkFault | None:
    """Xid 144-150: "<UNIT> Fatal|Nonfatal XC<n> i<n> Link <n> (words)"."""
    nm = _NVLINK5_RE.match(text)
    if not nm:
        return None
    return {
        "unit": nm.group("unit"),
        "fatal": "Fatal" in nm.group("fatal") and not nm.group("fatal").startswith("Non"),
        "severity_text": nm.group("fatal"),
        "link": _int_or_none(nm.group("link")),
        "xc": nm.group("xc"),
        "instance": nm.group("inst"),
        "words": _HEX_RE.findall(nm.group("words") or ""),
    }


def match_signature(msg: str) -> tuple[str, str | None, str | None] | None:
    """(signature name, PCI bus id or None, GPU token or None) of a fault line without an Xid
    number, or None."""
    for name, rx in SIGNATURE_RES:
        if rx.search(msg):
            for brx in _SIG_BUS_RES:
                bm = brx.search(msg)
                if bm:
                    bus = short_bus_id(bm.group("bus"))
                    if bus is not None:
                        return name, bus, None
            om = _ORDINAL_RE.search(msg)
            return name, None, om.group("ord") if om else None
    return None


class Parser:
    """Feed lines (oldest first); collect events. Streaming: `feed` returns what is new."""

    def __init__(self) -> None:
        self.result = ParseResult()
        self._seq = 0
        self._last79: dict[str, XidEvent] = {}
        self._open_sxid: dict[tuple[str | None, int], SXidEvent] = {}
        self._pending_the_gpu: tuple[str, float | None, str, int] | None = None
        self._last_announce: GpuAnnouncement | None = None
        self._last_announce_seq = -10
        self._last_init: XidEvent | None = None

    # -- helpers -------------------------------------------------------------------------------
    def _near(self, t1: float | None, s1: int, t2: float | None, s2: int, window_s: float) -> bool:
        if t1 is not None and t2 is not None:
            return abs(t2 - t1) <= window_s
        return abs(s2 - s1) <= MERGE_LINES

    def _add_79(self, ev: XidEvent) -> XidEvent | None:
        """Record an Xid 79 (explicit or implied); None when it is the same bus loss as before."""
        # Without an address, the way the line names the GPU keys it ("GPU6" is not "GPU7").
        bus = ev.pci_bus_id or "?" + (ev.gpu_token or "")
        prev = self._last79.get(bus)
        if prev is not None and self._near(prev.time, prev.seq, ev.time, ev.seq, MERGE_WINDOW_S):
            if prev.implied and not ev.implied:
                # The explicit Xid names the event; the bus-loss line becomes related evidence.
                prev.related.append(prev.raw)
                prev.raw, prev.text, prev.implied = ev.raw, ev.text, False
                prev.pid, prev.process = ev.pid, ev.process
                if ev.time is not None and (prev.time is None or ev.time < prev.time):
                    prev.time, prev.time_kind, prev.time_resolution = ev.time, ev.time_kind, ev.time_resolution
            else:
                prev.related.append(ev.raw)
            return None
        self._last79[bus] = ev
        self.result.events.append(ev)
        return ev

    def _signature(self, line: str, msg: str, stamp: Any, seq: int) -> list[Item] | None:
        """A fault signature without an Xid number (a new event, or evidence of the one it
        belongs to), or None when the line is none."""
        if _INIT_TAIL_RE.search(msg):  # "rm_init_adapter failed" follows its "RmInitAdapter failed!"
            bm = _SIG_BUS_RES[0].search(msg)
            bus = short_bus_id(bm.group("bus")) if bm else None
            last = self._last_init
            if last is not None and last.pci_bus_id == bus and seq - last.seq <= 3:
                last.related.append(line)
                return []
        found = match_signature(msg)
        if found is None:
            return None
        name, bus, token = found
        ev = XidEvent(None, bus, stamp.epoch, line, text=msg.split("NVRM:", 1)[-1].strip(), time_kind=stamp.kind,
                      time_resolution=stamp.resolution, seq=seq, signature=name, gpu_token=token)
        if name == "init_failed":
            self._last_init = ev
        self.result.events.append(ev)
        return [ev]

    def _unrecognised(self, line: str, stamp: Any) -> list[Item]:
        u = Unrecognised(line, stamp.epoch, stamp.resolution)
        self.result.unrecognised.append(u)
        return [u]

    # -- NVRM lines ----------------------------------------------------------------------------
    def _xid(self, line: str, f: XidFields, stamp: Any, seq: int) -> list[Item]:
        """An NVRM Xid line parsed into `f`: a new event (an Xid 79 may merge into the last)."""
        ev = XidEvent(
            xid=f["xid"], pci_bus_id=f["pci_bus_id"], time=stamp.epoch, raw=line, text=f["text"],
            pid=f["pid"], process=f["process"], gpu_instance=f["gpu_instance"],
            compute_instance=f["compute_instance"], nvlink=f["nvlink"], recovery=f["recovery"],
            caused_by=f["caused_by"], time_kind=stamp.kind, time_resolution=stamp.resolution, seq=seq,
            gpu_token=f["gpu_token"],
        )
        if ev.xid == 79:
            added = self._add_79(ev)
            return [added] if added is not None else []
        self.result.events.append(ev)
        return [ev]

    def _bus_loss(self, line: str, msg: str, stamp: Any, seq: int) -> list[Item]:
        """A "fallen off the bus" line: an implied Xid 79, on the bus its line (or the "The GPU"
        line just before it) names, else on the ordinal or "GPU unknown"."""
        bus = None
        for rx in _BUS_LOSS_RES:
            bm = rx.search(msg)
            if bm:
                bus = short_bus_id(bm.group("bus"))
                break
        if bus is None and self._pending_the_gpu is not None:
            pbus, ptime, praw, pseq = self._pending_the_gpu
            if seq - pseq <= 3:
                bus = pbus
                stamp_time = stamp.epoch if stamp.epoch is not None else ptime
                ev = XidEvent(79, bus, stamp_time, line, text="GPU has fallen off the bus",
                              implied=True, related=[praw], time_kind=stamp.kind, seq=seq,
                              time_resolution=stamp.resolution if stamp.epoch is not None else 1.0)
                self._pending_the_gpu = None
                added = self._add_79(ev)
                return [added] if added is not None else []
        # Without an address the bus loss still counts: on "GPU unknown" (or the ordinal).
        om = _ORDINAL_RE.search(msg) if bus is None else None
        ev = XidEvent(79, bus, stamp.epoch, line, text="GPU has fallen off the bus",
                      implied=True, time_kind=stamp.kind, time_resolution=stamp.resolution, seq=seq,
                      gpu_token=om.group("ord") if om else None)
        added = self._add_79(ev)
        return [added] if added is not None else []

    def _gpu_note(self, line: str, msg: str, stamp: Any, seq: int) -> bool:
        """Remember a line that names a GPU for the lines after it ("The GPU at ...", a UUID
        announcement, its serial); True when the line was one."""
        tm = _THE_GPU_RE.search(msg)
        if tm:
            bus = short_bus_id(tm.group("bus"))
            if bus is not None:
                self._pending_the_gpu = (bus, stamp.epoch, line, seq)
            return True
        am = _ANNOUNCE_RE.search(msg)
        if am:
            bus = short_bus_id(am.group("bus"))
            if bus is not None:
                ann = GpuAnnouncement(bus, "GPU-" + am.group("uuid")[4:].lower(), time=stamp.epoch)
                self.result.announcements[bus] = ann
                self._last_announce, self._last_announce_seq = ann, seq
            return True
        sm = _SERIAL_RE.search(msg)
        if sm:
            if self._last_announce is not None and seq - self._last_announce_seq <= 2:
                self._last_announce.serial = sm.group("serial")
            return True
        return False

    def _nvrm(self, line: str, msg: str, stamp: Any, seq: int) -> list[Item]:
        f = parse_xid_message(msg) if "Xid" in msg else None
        if f is not None:
            return self._xid(line, f, stamp, seq)
        sig = self._signature(line, msg, stamp, seq)
        if sig is not None:
            return sig
        if "fallen off the bus" in msg:
            return self._bus_loss(line, msg, stamp, seq)
        if self._gpu_note(line, msg, stamp, seq):
            return []
        if "Xid" in msg:  # an NVRM Xid line in a form we do not know
            return self._unrecognised(line, stamp)
        return []

    # -- SXid lines (NVSwitch) -----------------------------------------------------------------
    def _open_sxid_event(self, key: tuple[str | None, int], ev: SXidEvent) -> list[Item]:
        self._open_sxid[key] = ev
        self.result.sxid_events.append(ev)
        return [ev]

    def _sxid_continuation(self, line: str, sm2: re.Match, rest: str, stamp: Any, seq: int,
                           sev: re.Match | None, dat: re.Match | None) -> list[Item]:
        """A severity or data line: evidence of its open header, or an event of its own when
        the header is outside what we read."""
        bus, sxid = short_bus_id(sm2.group("bus")), int(sm2.group("sxid"))
        key = (bus, sxid)
        head = self._open_sxid.get(key)
        if head is not None and self._near(head.time, head.seq, stamp.epoch, seq, SXID_CONT_WINDOW_S):
            head.raw.append(line)
            if sev:
                head.severity = int(sev.group("sev"))
            if dat:
                head.data = _HEX_RE.findall(dat.group("data"))
            return []
        ev = SXidEvent(
            sxid=sxid, pci_bus_id=bus, time=stamp.epoch, raw=[line],
            switch=_int_or_none(sm2.group("sw")), fatal=None, text=rest,
            severity=int(sev.group("sev")) if sev else None,
            data=_HEX_RE.findall(dat.group("data")) if dat else [],
            time_kind=stamp.kind, time_resolution=stamp.resolution, seq=seq,
        )
        return self._open_sxid_event(key, ev)

    def _sxid(self, line: str, msg: str, stamp: Any, seq: int) -> list[Item]:
        sm2 = SXID_RE.search(msg)
        bus = short_bus_id(sm2.group("bus")) if sm2 else None
        if sm2 is None or bus is None:
            return self._unrecognised(line, stamp)
        sxid = int(sm2.group("sxid"))
        rest = sm2.group("rest") or ""
        key = (bus, sxid)
        hm = _SXID_HEADER_RE.match(rest)
        if hm:
            text = hm.group("text")
            lm = _LINK_RE.search(text)
            ev = SXidEvent(
                sxid=sxid, pci_bus_id=bus, time=stamp.epoch, raw=[line],
                switch=_int_or_none(sm2.group("sw")), fatal=hm.group("fatal") == "Fatal",
                link=int(lm.group("link")) if lm else None, text=text, time_kind=stamp.kind,
                time_resolution=stamp.resolution, seq=seq,
            )
            return self._open_sxid_event(key, ev)
        sev = _SXID_SEVERITY_RE.match(rest)
        dat = _SXID_DATA_RE.match(rest)
        if sev or dat:
            return self._sxid_continuation(line, sm2, rest, stamp, seq, sev, dat)
        # A header without Fatal/Non-fatal (older drivers): an event of unknown fatality.
        lm = _LINK_RE.search(rest)
        ev = SXidEvent(sxid=sxid, pci_bus_id=bus, time=stamp.epoch, raw=[line],
                       switch=_int_or_none(sm2.group("sw")), fatal=None,
                       link=int(lm.group("link")) if lm else None, text=rest,
                       time_kind=stamp.kind, time_resolution=stamp.resolution, seq=seq)
        return self._open_sxid_event(key, ev)

    # -- the one entry point -------------------------------------------------------------------
    def feed(self, line: str, *, boot_time: float | None = None, ref_time: float | None = None) -> list[Item]:
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + " [truncated]"
        line = line.rstrip("\r\n")
        stamp = parse_prefix(line, boot_time=boot_time, ref_time=ref_time)
        msg = stamp.message
        self._seq += 1
        self.result.lines += 1
        if "NVRM" in msg:
            return self._nvrm(line, msg, stamp, self._seq)
        if "SXid" in msg:
            return self._sxid(line, msg, stamp, self._seq)
        if _LOOKS_LIKE.search(msg):
            return self._unrecognised(line, stamp)
        return []


def parse_lines(lines, *, boot_time: float | None = None, ref_time: float | None = None) -> ParseResult:
    """Parse an iterable of lines (oldest first) in one go."""
    p = Parser()
    for line in lines:
        p.feed(line, boot_time=boot_time, ref_time=ref_time)
    return p.result
