"""pcie.aer: PCIe Advanced Error Reporting on the GPUs, NVSwitches, NICs and their upstream ports.

Three sources, one result each (metric `part` names it):

- **sysfs counters** (`aer_dev_correctable|nonfatal|fatal`, Linux 4.17+): judged as deltas since
  the previous run of this check (history in the state directory, as `pcie` judges replays):
  new fatal errors fail (reboot), new uncorrectable non-fatal ones fail (investigate), a
  correctable rate above `correctable_rate_warn_per_min` warns. Without a previous reading a
  counter says only "since boot": uncorrectable counts then warn (cannot tell when), correctable
  ones are a note. A counter that went back (a reset) gives no delta.
- **kernel-log AER lines** (gpucheck.platform.kernlog.aer) in the window (`since`, default
  last-pass as `xid`): a fatal or uncorrectable error on a GPU, NIC or NVSwitch, or on a port the
  log or the PCI tree ties to one, fails naming the device; `correctable_burst_warn` correctable
  errors within `burst_window_s` on one of them warn. A line without a readable time is in the
  window (unknown, never old). Errors on ports nothing ties to a GPU or NIC (a laptop's chipset
  port) warn when uncorrectable and are a note when correctable.
- **lspci -vvv** (a capture `gpucheck judge` reads): set UESta bits of a GPU, NIC or NVSwitch warn
  (sticky status, no time), set CESta bits are a note; a "(downgraded)" link is a note (the `pcie`
  check judges width against the maximum).

A replayed snapshot is judged on what it recorded (`pcie_aer`, `kernel_log`); a part it does not
hold is a skip naming what to record. A source that cannot be read on a node with these devices is
`error`; a node with none of them is a plain skip.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, TypedDict

from ..platform.fabric.aer import (AER_FILES, PcieAerRecord, counter_total, parse_aer_counters, parse_lspci_vvv,
                                   read_pcie_aer)
from ..platform.kernlog.aer import AerEvent, AerLog, AerParser
from ..platform.kernlog.scan import read_from_snapshot, resolve_window
from ..platform.kernlog.sources.base import ReadResult, read_boot_time
from ..platform.kernlog.sources.selection import SOURCES, read_kernel_log
from ..platform.kernlog.timeparse import parse_timestamp, validate_since
from ..sdk import (Action, Context, Key, Level, Limit, Result, Rule, Status, counter_growth, define, evaluate,
                   latest_metrics_by, previous_interval, settle, snapshot_time)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import Snapshot

ID = "pcie.aer"
SYSFS, KERNEL_LOG, LSPCI = "sysfs counters", "kernel log", "lspci"
DRIVER_ROLES = {"nvidia": "gpu", "mlx5_core": "nic", "mlx4_core": "nic", "nvidia-nvswitch": "nvswitch"}
ROLE_WORDS = {"gpu": "GPU", "nic": "NIC", "nvswitch": "NVSwitch", "upstream": "port"}


class AerParams(TypedDict):
    """pcie.aer's parameters (DEFAULTS merged with [checks."pcie.aer"])."""

    sysfs_root: str
    since: str
    source: str
    files: list[str]
    read_timeout_s: float
    correctable_rate_warn_per_min: float
    min_window_s: float
    correctable_burst_warn: int
    burst_window_s: float


DEFAULTS: AerParams = {
    "sysfs_root": "/sys",
    "since": "last-pass",  # the kernel-log window, as the xid check's
    "source": "auto",
    "files": [],  # read these kernel-log files instead of the source (as the xid check's `files`)
    "read_timeout_s": 8.0,
    "correctable_rate_warn_per_min": 8,  # the class of DCGM's PCIe replay limit (8/min): link-level retries
    "min_window_s": 60,  # growth over a shorter interval is judged as if over this long
    "correctable_burst_warn": 2,  # correctable AER reports on one device within burst_window_s
    "burst_window_s": 60,
}
LIMITS = {
    "since": Limit("str", parse=validate_since, words="a window: a duration (2h), a timestamp, boot, all or last-pass"),
    "source": Limit("str", choices=SOURCES),
    "files": Limit("list", item="str"),
    "read_timeout_s": Limit("real", 0, above=True),
    "correctable_rate_warn_per_min": Limit("real", 0),
    "min_window_s": Limit("real", 0, above=True),
    "correctable_burst_warn": Limit("int", 1),
    "burst_window_s": Limit("real", 0, above=True),
}

COUNTER_RULES = (
    Rule("fatal_growth", ">", 0, Status.FAIL, Action.REBOOT, "fatal PCIe AER errors: {fatal_growth} new on {fatal_devices}"),
    Rule("nonfatal_growth", ">", 0, Status.FAIL, Action.INVESTIGATE,
         "uncorrectable (non-fatal) PCIe AER errors: {nonfatal_growth} new on {nonfatal_devices}"),
    Rule("correctable_rate_per_min", ">", Key("correctable_rate_warn_per_min"), Status.WARN, Action.INVESTIGATE,
         "correctable PCIe AER errors growing on {correctable_devices} ({detail})", "1/min"),
    Rule("uncorrectable_since_boot", ">", 0, Status.WARN, Action.INVESTIGATE,
         "uncorrectable PCIe AER errors counted since boot on {since_boot_devices} (no previous reading: "
         "cannot tell when)"),
)
KERNEL_RULES = (
    Rule("fatal_events", ">", 0, Status.FAIL, Action.REBOOT, "fatal PCIe AER in the kernel log on {fatal_devices}"),
    Rule("nonfatal_events", ">", 0, Status.FAIL, Action.INVESTIGATE,
         "uncorrectable (non-fatal) PCIe AER in the kernel log on {nonfatal_devices}"),
    Rule("correctable_burst", ">=", Key("correctable_burst_warn"), Status.WARN, Action.INVESTIGATE,
         "correctable PCIe AER in the kernel log: {correctable_burst} on {correctable_devices} within "
         "{burst_window_s} s"),
    Rule("unattributed_uncorrectable", ">", 0, Status.WARN, Action.INVESTIGATE,
         "uncorrectable PCIe AER on {unattributed_devices}, which the log does not tie to a GPU, NIC or NVSwitch"),
)
LSPCI_RULES = (
    Rule("uncorrectable_status_devices", ">", 0, Status.WARN, Action.INVESTIGATE,
         "uncorrectable AER status bits set (sticky since last cleared) on {uncorrectable_devices}"),
)


# -- who is who --------------------------------------------------------------------------------------


class Roles:
    """Bus id -> role (gpu, nic, nvswitch, upstream), the devices each upstream port is above, and
    GPU indices, from the snapshot's GPUs, the recorded PCI devices and the drivers the log names."""

    def __init__(self, snap: Mapping[str, Any], record: PcieAerRecord | None) -> None:
        self.role: dict[str, str] = {}
        self.below: dict[str, list[str]] = {}
        self.gpu_index: dict[str, int] = {}
        for d in record["devices"] if record is not None else []:
            self.role[str(d.get("bus_id"))] = str(d.get("role"))
            self.below[str(d.get("bus_id"))] = [str(b) for b in d.get("below") or []]
        for g in snap.get("gpus") or []:
            bus = g.get("pci_bus_id")
            if isinstance(bus, str) and isinstance(g.get("index"), int):
                self.role[bus] = "gpu"
                self.gpu_index[bus] = g["index"]

    def learn_drivers(self, drivers: Mapping[str, str]) -> None:
        for bus, drv in drivers.items():
            if bus not in self.role and drv in DRIVER_ROLES:
                self.role[bus] = DRIVER_ROLES[drv]

    def tied(self, bus: str, also: tuple[str, ...] = ()) -> list[str]:
        """The GPUs, NICs and NVSwitches `bus` is or is above, or that its report names."""
        out = [b for b in (bus, *also) if self.role.get(b) in ("gpu", "nic", "nvswitch")]
        out += [b for b in self.below.get(bus, []) if b not in out]
        return out

    def name(self, bus: str) -> str:
        role = self.role.get(bus)
        if role == "gpu" and bus in self.gpu_index:
            return f"GPU {self.gpu_index[bus]} ({bus})"
        if role == "upstream":
            below = self.below.get(bus) or []
            return f"port {bus} (above {', '.join(self.name(b) for b in below[:2])}{' ...' if len(below) > 2 else ''})"
        return f"{ROLE_WORDS.get(role or '', 'device')} {bus}"

    def names(self, buses: list[str], limit: int = 4) -> str | None:
        if not buses:
            return None
        shown = [self.name(b) for b in buses[:limit]]
        return ", ".join(shown) + (f" and {len(buses) - limit} more" if len(buses) > limit else "")


# -- sysfs counters ----------------------------------------------------------------------------------


def device_totals(record: PcieAerRecord) -> tuple[dict[str, list[int | None]], dict[str, str], bool]:
    """(bus id -> [correctable, nonfatal, fatal] totals (None: no such file), bus/kind -> why a file
    could not be read or parsed, whether any device exposes an AER file)."""
    totals: dict[str, list[int | None]] = {}
    unreadable: dict[str, str] = {}
    exposed = False
    for d in record.get("devices") or []:
        bus, texts, errors = str(d.get("bus_id")), d.get("aer") or {}, d.get("errors") or {}
        row: list[int | None] = []
        for kind in AER_FILES:
            if kind in errors:
                unreadable[f"{bus}/aer_dev_{kind}"] = f"could not read {bus}/aer_dev_{kind} ({errors[kind]})"
                row.append(None)
                continue
            try:
                counts = parse_aer_counters(texts.get(kind))
            except ValueError as e:
                unreadable[f"{bus}/aer_dev_{kind}"] = f"{bus}/aer_dev_{kind} does not parse ({e})"
                row.append(None)
                continue
            exposed = exposed or counts is not None
            row.append(None if counts is None else counter_total(counts, kind))
        totals[bus] = row
    return totals, unreadable, exposed


class _Growth:
    """Per-kind growth since the previous reading: the devices that grew, the sums, the highest
    correctable rate, the devices without a delta and their uncorrectable counts since boot."""

    def __init__(self) -> None:
        self.sums = [0, 0, 0]
        self.grew: list[list[str]] = [[], [], []]
        self.rate: float | None = None
        self.no_delta: list[str] = []
        self.since_boot = 0
        self.since_boot_devices: list[str] = []
        self.any_delta = False


def _growth(totals: dict[str, list[int | None]], prev_counts: Any, interval: float | None,
            p: AerParams) -> _Growth:
    out = _Growth()
    window_min = max(interval or 0.0, float(p["min_window_s"])) / 60.0
    for bus, row in totals.items():
        old = prev_counts.get(bus) if isinstance(prev_counts, dict) and interval is not None else None
        for i, cur in enumerate(row):
            growth, _ = counter_growth(cur, old[i] if isinstance(old, list) and len(old) == 3 else None)
            if growth is None:
                if cur is not None and i > 0 and cur > 0:  # uncorrectable since boot, no delta
                    out.since_boot += cur
                    out.since_boot_devices.append(bus)
                if cur is not None and bus not in out.no_delta:
                    out.no_delta.append(bus)
                continue
            out.any_delta = True
            if growth > 0:
                out.sums[i] += growth
                out.grew[i].append(bus)
            if i == 0:
                rate = round(growth / window_min, 3)
                out.rate = rate if out.rate is None else max(out.rate, rate)
    return out


def judge_counters(record: PcieAerRecord, roles: Roles, p: AerParams, prev: Any, now: float | None) -> Result:
    """The sysfs counters' result (see the module)."""
    if record.get("error"):
        return Result(ID, Status.ERROR, f"could not read the PCIe AER counters: {record['error']}",
                      evidence=[str(record["error"])], subject=SYSFS)
    totals, unreadable, exposed = device_totals(record)
    if not exposed and not unreadable:
        return Result(ID, Status.SKIP, f"{len(totals)} GPU/NIC/NVSwitch device(s) and ports, but no aer_dev_* "
                                       "files (kernel before 4.17, or AER not enabled): counters not exposed", subject=SYSFS)
    interval, why_no_interval = previous_interval(prev, now)
    g = _growth(totals, prev[0].get("counters") if prev else None, interval, p)
    metrics: dict[str, Any] = {
        "part": SYSFS, "snapshot_time": now, "devices": len(totals), "counters": totals,
        "interval_s": None if interval is None else round(interval, 1),
        "fatal_growth": g.sums[2] if g.any_delta else None, "nonfatal_growth": g.sums[1] if g.any_delta else None,
        "correctable_rate_per_min": g.rate, "uncorrectable_since_boot": g.since_boot if g.no_delta else None,
    }
    facts = {"fatal_devices": roles.names(g.grew[2]), "nonfatal_devices": roles.names(g.grew[1]),
             "correctable_devices": roles.names(g.grew[0]), "since_boot_devices": roles.names(g.since_boot_devices)}
    r = evaluate(ID, COUNTER_RULES, metrics, limits=dict(p), facts=facts, subject=SYSFS,
                 units={"correctable_rate_per_min": "1/min", "interval_s": "s", "snapshot_time": "s"},
                 ok_summary=f"PCIe AER counters of {len(totals)} GPU/NIC/NVSwitch device(s) and ports: "
                            + ("no new errors" if g.any_delta else f"no delta ({why_no_interval})"))
    if g.no_delta and not g.any_delta:
        r.evidence.append(f"counters since boot: {_since_boot_text(totals, roles)}")
    for field, why in unreadable.items():
        r.unjudged[f"pcie_aer.{field}"] = Status.ERROR
        r.evidence.append(why)
    return _settled(r, list(unreadable.values()))


def _since_boot_text(totals: dict[str, list[int | None]], roles: Roles) -> str:
    busy = [(bus, row) for bus, row in totals.items() if any(v for v in row)]
    if not busy:
        return "all zero"
    return "; ".join(f"{roles.name(bus)}: correctable {row[0]}, non-fatal {row[1]}, fatal {row[2]}"
                     for bus, row in busy[:6]) + (f"; {len(busy) - 6} more" if len(busy) > 6 else "")


def _settled(r: Result, why: list[str]) -> Result:
    """A result with unjudged fields: never a pass (core.result.settle), the fields named."""
    if not r.unjudged or r.status == Status.FAIL:
        return r
    settle(r)
    if r.status == Status.ERROR:
        r.summary = "; ".join(why[:3]) + (f" (+{len(why) - 3} more)" if len(why) > 3 else "") + f"; {r.summary}"
    return r


# -- kernel-log lines ---------------------------------------------------------------------------------


def parse_read(read: ReadResult, start: float | None) -> tuple[AerLog, int]:
    """The AER events of what was read, those older than `start` left out (a line without a
    time is kept: unknown, never old), and how many were left out."""
    p = AerParser()
    for chunk in read.chunks:
        for line in chunk.lines:
            p.feed(line, boot_time=chunk.boot_time, ref_time=chunk.ref_time)
    log = p.result()
    kept = [e for e in log.events if start is None or e.time is None or e.time >= start]
    dropped = len(log.events) - len(kept)
    log.events = kept
    return log, dropped


def burst(times: list[float | None], window_s: float) -> int:
    """The most reports within any `window_s` (reports without a time count as one burst with
    each other: they cannot be spread out)."""
    timed = sorted(t for t in times if t is not None)
    untimed = len(times) - len(timed)
    best, lo = 0, 0
    for hi, t in enumerate(timed):
        while t - timed[lo] > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return max(best, untimed)


class _Sorted:
    """The window's events sorted by what they are tied to."""

    def __init__(self, events: list[AerEvent], roles: Roles) -> None:
        self.fatal: list[str] = []
        self.nonfatal: list[str] = []
        self.correctable: dict[str, list[float | None]] = {}
        self.unattributed: dict[str, list[AerEvent]] = {}
        for e in events:
            tied = roles.tied(e.device, e.tied_to)
            if not tied:
                self.unattributed.setdefault(e.device, []).append(e)
                continue
            key = e.device if e.device in tied else f"{tied[0]}"
            if e.severity == "fatal":
                self.fatal += [b for b in [e.device, *tied] if b not in self.fatal]
            elif e.severity == "nonfatal":
                self.nonfatal += [b for b in [e.device, *tied] if b not in self.nonfatal]
            else:
                self.correctable.setdefault(key, []).append(e.time)


def _event_text(e: AerEvent, roles: Roles) -> str:
    what = f"{e.severity} {e.layer or ''}".strip()
    bits = f" [{', '.join(e.errors)}]" if e.errors else ""
    tied = roles.tied(e.device, e.tied_to)
    via = f" (tied to {roles.names([b for b in tied if b != e.device])})" if [b for b in tied if b != e.device] else ""
    when = "time unknown" if e.time is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.time))
    return f"{roles.name(e.device)}: {what}{bits}{via}, {when}: {e.line[:200]}"


def judge_kernel_log(read: ReadResult, start: float | None, label: str, roles: Roles, p: AerParams) -> Result:
    """The kernel-log result (see the module)."""
    if not read.ok:
        return Result(ID, Status.ERROR, f"could not judge the kernel log: {read.error}",
                      evidence=[f"{a.source}: {a.error}" for a in read.attempts if not a.ok], subject=KERNEL_LOG)
    log, dropped = parse_read(read, start)
    roles.learn_drivers(log.drivers)
    s = _Sorted(log.events, roles)
    worst = max(s.correctable.items(), key=lambda kv: burst(kv[1], float(p["burst_window_s"])), default=None)
    peak = burst(worst[1], float(p["burst_window_s"])) if worst else 0
    unattributed_uncorrectable = [b for b, evs in s.unattributed.items() if any(e.severity != "corrected" for e in evs)]
    metrics: dict[str, Any] = {
        "part": KERNEL_LOG, "events": len(log.events),
        "fatal_events": sum(1 for e in log.events if e.severity == "fatal" and roles.tied(e.device, e.tied_to)),
        "nonfatal_events": sum(1 for e in log.events if e.severity == "nonfatal" and roles.tied(e.device, e.tied_to)),
        "correctable_burst": peak, "unattributed_uncorrectable": len(unattributed_uncorrectable),
    }
    facts = {"fatal_devices": roles.names(s.fatal), "nonfatal_devices": roles.names(s.nonfatal),
             "correctable_devices": roles.names([worst[0]]) if worst else None,
             "unattributed_devices": ", ".join(unattributed_uncorrectable[:4]) or None,
             "burst_window_s": f"{float(p['burst_window_s']):g}"}
    r = evaluate(ID, KERNEL_RULES, metrics, limits=dict(p), facts=facts, subject=KERNEL_LOG,
                 ok_summary=f"no PCIe AER error of a GPU, NIC or NVSwitch in the kernel log {label}")
    r.evidence.extend(_event_text(e, roles) for e in log.events[:12])
    r.evidence.extend(f"recovery failed: {line[:200]}" for bus, line in log.recovery_failed.items()
                      if roles.tied(bus))
    quiet = sorted(b for b, evs in s.unattributed.items() if b not in unattributed_uncorrectable)
    if quiet:
        r.evidence.append(f"correctable AER on {', '.join(quiet[:4])}: not tied to a GPU, NIC or NVSwitch (not judged)")
    if dropped:
        r.evidence.append(f"{dropped} AER report(s) before the window ({label}) not judged")
    return r


def _kernel_read(ctx: Context, p: AerParams) -> tuple[ReadResult | None, float | None, str]:
    """What to judge: the recorded kernel log of a replayed snapshot (its whole boot), or this
    node's log in the window; (None, ...) when a replay holds no kernel log."""
    snap: Snapshot | dict[str, None] = ctx.snapshot or {}
    if ctx.options.snapshot_path:
        kl = snap.get("kernel_log")
        if not isinstance(kl, dict):
            return None, None, ""
        captured = snapshot_time(ctx)
        kl_boot = kl.get("boot_time") if isinstance(kl.get("boot_time"), (int, float)) else None
        window = resolve_window("boot", now=captured or time.time(), boot_time=kl_boot)
        return read_from_snapshot(kl, captured), window.start, window.label
    boot_time = read_boot_time()
    window = resolve_window(str(p["since"]), now=time.time(), boot_time=boot_time, state=ctx.state)
    files = [str(f) for f in p["files"] or []]
    read = read_kernel_log(str(p["source"]), files=files or None, since=window.start,
                           timeout_s=float(p["read_timeout_s"]), boot_time=boot_time)
    return read, window.start, window.label


# -- lspci -vvv ---------------------------------------------------------------------------------------


def judge_lspci(lines: list[str]) -> Result:
    """The lspci -vvv result (a capture: sticky status bits, no counts and no time)."""
    devices = [d for d in parse_lspci_vvv("\n".join(lines)) if d["role"] is not None]
    if not devices:
        return Result(ID, Status.SKIP, "the lspci capture shows no GPU, NIC or NVSwitch", subject=LSPCI)
    with_aer = [d for d in devices if d["uncorrectable_set"] is not None]
    if not with_aer:
        return Result(ID, Status.SKIP, f"the lspci capture shows {len(devices)} GPU/NIC/NVSwitch device(s) but no "
                                       "AER status (run lspci -vvv as root)", subject=LSPCI)
    name = {"gpu": "GPU", "nic": "NIC", "nvswitch": "NVSwitch"}
    bad = [f"{name[str(d['role'])]} {d['bus_id']} [{', '.join(d['uncorrectable_set'] or [])}]"
           for d in with_aer if d["uncorrectable_set"]]
    r = evaluate(ID, LSPCI_RULES, {"part": LSPCI, "devices": len(devices), "devices_with_aer": len(with_aer),
                                   "uncorrectable_status_devices": len(bad)},
                 facts={"uncorrectable_devices": ", ".join(bad[:4]) + (" ..." if len(bad) > 4 else "")},
                 subject=LSPCI, ok_summary=f"lspci: no uncorrectable AER status on {len(with_aer)} GPU/NIC/NVSwitch "
                                           "device(s)")
    sticky = [f"{name[str(d['role'])]} {d['bus_id']} [{', '.join(d['correctable_set'] or [])}]"
              for d in with_aer if d["correctable_set"]]
    if sticky:
        r.evidence.append(f"correctable AER status bits set (sticky since last cleared; a state, not a rate: "
                          f"judge the sysfs counters' deltas) on {len(sticky)} device(s): {'; '.join(sticky[:8])}")
    down = [f"{d['bus_id']} ({d['link_status']})" for d in devices if d["downgraded"]]
    if down:
        r.evidence.append(f"links lspci calls downgraded (judged by the pcie check under load): {'; '.join(down[:8])}")
    return r


# -- the check ----------------------------------------------------------------------------------------


def _record(ctx: Context, p: AerParams) -> PcieAerRecord | None:
    """The AER record: the replayed snapshot's `pcie_aer` (None when it holds none), else sysfs."""
    if ctx.options.snapshot_path:
        rec = ctx.snapshot.get("pcie_aer") if ctx.snapshot else None
        return rec if isinstance(rec, dict) else None
    return read_pcie_aer(Path(str(p["sysfs_root"])))


def _not_in_capture(what: str, add: str, subject: str) -> Result:
    return Result(ID, Status.SKIP, f"{what} not in this capture (add {add})", subject=subject)


def run(ctx: Context) -> list[Result]:
    p = ctx.params(ID, DEFAULTS)
    snap: Mapping[str, Any] = ctx.snapshot or {}
    record = _record(ctx, p)
    roles = Roles(snap, record)
    if record is not None and not record.get("error") and not roles.role and not ctx.options.snapshot_path:
        return [Result(ID, Status.SKIP, "no GPU, NIC or NVSwitch on the PCI bus (nothing whose AER to judge)")]
    out: list[Result] = []
    if record is None:
        out.append(_not_in_capture("PCIe AER counters", "a `gpucheck telemetry dump` snapshot, or lspci -vvv", SYSFS))
    elif record.get("source") == "lspci":
        out.append(judge_lspci([str(x) for x in record.get("lspci") or []]))
    else:
        prev = latest_metrics_by(ctx, ID, "part").get(SYSFS)
        out.append(judge_counters(record, roles, p, prev, snapshot_time(ctx)))
    try:
        read, start, label = _kernel_read(ctx, p)
    except ValueError as e:
        return out + [Result(ID, Status.ERROR, f"bad pcie.aer setting: {e}", subject=KERNEL_LOG)]
    if read is None and record is None:  # an older recording, an nvidia-smi capture: one skip, named
        return [Result(ID, Status.SKIP, "not in this capture (record with gpucheck telemetry dump)")]
    if read is None:
        out.append(_not_in_capture("the kernel log", "dmesg or journalctl -k", KERNEL_LOG))
    else:
        out.append(judge_kernel_log(read, start, label, roles, p))
    return out


pcie_aer = define(ID, title="PCIe AER errors of GPUs, NICs, NVSwitches and their ports (sysfs counters, kernel log)",
                  level=Level.QUICK, needs=(), budget_s=10.0,
                  detects="fatal and uncorrectable PCIe errors before a GPU falls off the bus; correctable error storms",
                  defaults=DEFAULTS, limits=LIMITS)(run)

CHECKS = [pcie_aer]
