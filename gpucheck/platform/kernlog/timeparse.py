"""Kernel-log line prefixes -> absolute time, and `--since` -> a window start.

Every format a node produces is recognised here (pure functions, no I/O):

=====================  ==========================================================  =============
prefix                 example                                                     time is
=====================  ==========================================================  =============
kmsg record            ``6,1234,5107644336,-;NVRM: ...``                           boot + usec
monotonic (dmesg)      ``[ 5107.644336] NVRM: ...``                                boot + s
dmesg -T               ``[Sun Feb 23 16:24:18 2025] NVRM: ...``                    local time
syslog (BSD)           ``May 18 19:02:39 host kernel: [ 5107.644336] NVRM: ...``    local time, year inferred
ISO-8601 (journal,     ``2024-05-18T19:02:39.123456+00:00 host kernel: NVRM: ...``  as written
rsyslog, dmesg iso)    ``2024-05-18T19:02:39,123456+0000 NVRM: ...``
unix (short-unix)      ``1716058959.123456 host kernel: NVRM: ...``                as written
bare message           ``NVRM: Xid (PCI:0000:3b:00): 79, ...``                     unknown
=====================  ==========================================================  =============

A syslog line that also carries a ``[ secs]`` monotonic stamp is timed by its wall-clock date:
after a reboot the monotonic clock starts again, the date does not.

A prefix that names no possible time (a month 13, a 25th hour, a UTC offset of +99:00: no zone
is more than 14 hours from UTC) gives no time: such a line is undated, which a window keeps
(it cannot be placed before the window), never dated days off and left out.

Each time carries its resolution (`Stamp.resolution`): a syslog or `dmesg -T` line, or an
ISO time without a fraction, says only the second. A window compares at the line's resolution
(`in_window`): a line written in the second a window starts in may be inside it, so it is kept.
"""

from __future__ import annotations

import calendar
import functools
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from ..durations import DurationRangeError, parse_duration as _parse_duration

_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}

_KMSG_RE = re.compile(r"^(\d{1,3}),(\d+),(\d+),([^;]*);")
_MONO_RE = re.compile(r"^\[\s*(\d+)\.(\d+)\]\s?")
_CTIME_RE = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) "
    r"(\d\d):(\d\d):(\d\d) (\d{4})\]\s?"
)
_BSD_RE = re.compile(
    r"^(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\S+) "
)
_ISO_RE = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?\s+"
)
_UNIX_RE = re.compile(r"^(\d{9,11})\.(\d{1,9})\s+")
# After a syslog/journal prefix: "host kernel: " (host already consumed for BSD lines).
_TAG_RE = re.compile(r"^(?:(\S+) )?kernel: ")


MAX_UTC_OFFSET_S = 14 * 3600  # the farthest zone from UTC (Line Islands, +14:00)


@dataclass(frozen=True)
class Stamp:
    """The time of one line. `kind` says where it came from: kmsg, monotonic, wallclock or None;
    `resolution` what the line can tell apart (1.0: only the second; 1e-6: microseconds)."""

    epoch: float | None
    kind: str | None
    message: str
    resolution: float = 0.0


def in_window(t: float | None, resolution: float, start: float | None) -> bool:
    """Whether a line timed `t` (to `resolution` seconds: the true time is in [t, t + resolution))
    may lie at or after `start`: the start is compared at the line's own resolution, so that a
    line of the second the start falls in is inside. A line without a time is inside (it cannot
    be placed before anything)."""
    return start is None or t is None or t >= start or t + resolution > start


def _possible(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> bool:
    """Whether the fields name a time that exists (a leap second, :60, does)."""
    try:
        datetime(year, month, day, hh, mm, min(ss, 59))
    except (ValueError, OverflowError):
        return False
    return ss <= 60


def _local(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> float | None:
    """Local time -> epoch (None for a time that does not exist: mktime would roll Feb 31 into
    March). Cached (consecutive log lines share their second), per time zone."""
    if not _possible(year, month, day, hh, mm, ss):
        return None
    return _local_cached(time.tzname, time.timezone, year, month, day, hh, mm, ss)


@functools.lru_cache(maxsize=4096)
def _local_cached(_tzname: tuple[str, str], _tz: int, year: int, month: int, day: int, hh: int, mm: int,
                  ss: int) -> float | None:
    try:
        return time.mktime((year, month, day, hh, mm, ss, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def _frac(digits: str | None) -> float:
    return int(digits) / (10 ** len(digits)) if digits else 0.0


def _resolution(digits: str | None) -> float:
    """What a time with these fraction digits can tell apart: 1 s without any."""
    return 10.0 ** -len(digits) if digits else 1.0


def _boot_resolution(boot_time: float | None, line_resolution: float) -> float:
    """A boot-clock line is boot time + its seconds: the kernel's boot time (/proc/stat btime) is
    a whole second, cut down, so such a time may be up to a second early."""
    if boot_time is not None and float(boot_time).is_integer():
        return 1.0 + line_resolution
    return line_resolution


def _strip_tag(rest: str) -> str:
    m = _TAG_RE.match(rest)
    if m:
        rest = rest[m.end():]
    m = _MONO_RE.match(rest)
    if m:
        rest = rest[m.end():]
    return rest


def parse_prefix(line: str, *, boot_time: float | None = None, ref_time: float | None = None) -> Stamp:
    """Split `line` into (absolute time, message).

    boot_time: epoch of the boot the monotonic stamps count from (kmsg, plain dmesg).
    ref_time: a time the line is known not to be much later than (the file's mtime, or now),
      used to give a year to syslog dates, which have none.
    """
    if not line:
        return Stamp(None, None, line)
    c = line[0]
    if c.isdigit():
        m = _KMSG_RE.match(line)
        if m:
            usec = int(m.group(3))
            t = boot_time + usec / 1e6 if boot_time is not None else None
            return Stamp(t, "kmsg" if t is not None else None, line[m.end():], _boot_resolution(boot_time, 1e-6))
        m = _ISO_RE.match(line)
        if m:
            t = _iso_epoch(m)
            return Stamp(t, "wallclock" if t is not None else None, _strip_tag(line[m.end():]),
                         _resolution(m.group(7)))
        m = _UNIX_RE.match(line)
        if m:
            return Stamp(int(m.group(1)) + _frac(m.group(2)), "wallclock", _strip_tag(line[m.end():]),
                         _resolution(m.group(2)))
        return Stamp(None, None, line)
    if c == "[":
        m = _MONO_RE.match(line)
        if m:
            secs = int(m.group(1)) + _frac(m.group(2))
            t = boot_time + secs if boot_time is not None else None
            return Stamp(t, "monotonic" if t is not None else None, line[m.end():],
                         _boot_resolution(boot_time, _resolution(m.group(2))))
        m = _CTIME_RE.match(line)
        if m:
            t = _local(int(m.group(6)), _MONTHS[m.group(1)], int(m.group(2)),
                       int(m.group(3)), int(m.group(4)), int(m.group(5)))
            return Stamp(t, "wallclock" if t is not None else None, line[m.end():], 1.0)
        return Stamp(None, None, line)
    if c in "JFMASOND":
        m = _BSD_RE.match(line)
        if m:
            ref = ref_time if ref_time is not None else time.time()
            year = time.localtime(ref).tm_year
            args = (_MONTHS[m.group(1)], int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)))
            t = _local(year, *args)
            # A date more than a day after the reference belongs to the year before (a log
            # that spans New Year, read in January).
            if t is not None and t > ref + 86400:
                t = _local(year - 1, *args)
            rest = line[m.end():]
            if rest.startswith("kernel: "):
                rest = rest[8:]
            m2 = _MONO_RE.match(rest)
            if m2:
                rest = rest[m2.end():]
            return Stamp(t, "wallclock" if t is not None else None, rest, 1.0)
    return Stamp(None, None, line)


def _iso_epoch(m: re.Match[str]) -> float | None:
    """The epoch of an ISO prefix; None when it names no possible time (a month 13, an hour 25,
    a UTC offset beyond +-14:00 or with a minute past 59): unknown, never dated elsewhere."""
    y, mo, d, hh, mi, ss = (int(m.group(i)) for i in range(1, 7))
    frac = _frac(m.group(7))
    tz = m.group(8)
    if tz is None:
        t = _local(y, mo, d, hh, mi, ss)
        return None if t is None else t + frac
    if not _possible(y, mo, d, hh, mi, ss):
        return None
    base = calendar.timegm((y, mo, d, hh, mi, ss, 0, 0, 0))
    if tz != "Z":
        digits = tz[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:4])
        offset = hours * 3600 + minutes * 60
        if minutes > 59 or offset > MAX_UTC_OFFSET_S:
            return None
        base -= (1 if tz[0] == "+" else -1) * offset
    return base + frac


# -- --since -----------------------------------------------------------------------------------

SINCE_KEYWORDS = ("boot", "all", "last-pass")


def parse_duration(text: str) -> float | None:
    """'2h', '90m', '1h30m', '45s', '7d' -> seconds; None when `text` is no duration (a bare
    number is not one here: it is an epoch timestamp)."""
    try:
        return _parse_duration(text, require_unit=True)
    except DurationRangeError:  # longer than any log (a year and more): the whole log, never a number
        return math.inf
    except ValueError:
        return None


def parse_timestamp(text: str) -> float | None:
    """'2024-05-18T19:02:39Z', '2024-05-18 19:02', '@1716058959', '1716058959.5' -> epoch.

    A timestamp without a zone is local time. None when `text` is no timestamp (an epoch is
    digits only: `@nan`, `@inf`, `@1e308` are none).
    """
    s = text.strip()
    if not s:
        return None
    if s.startswith("@"):
        s = s[1:]
        if not re.fullmatch(r"\d+(?:\.\d+)?", s):  # no nan, inf, 1e308, signs: digits only
            return None
        t = float(s)
        return t if math.isfinite(t) else None
    if re.fullmatch(r"\d{9,11}(?:\.\d+)?", s):
        return float(s)
    iso = s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s
    try:
        dt = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return time.mktime(dt.timetuple()) + dt.microsecond / 1e6
    return dt.timestamp()


def validate_since(text: str) -> str:
    """Return the canonical form of a --since value, or raise ValueError naming what is allowed."""
    s = (text or "").strip()
    if s.lower() in SINCE_KEYWORDS:
        return s.lower()
    if parse_duration(s) is not None or parse_timestamp(s) is not None:
        return s
    raise ValueError(
        f"cannot read {text!r} as a time: use a duration (2h, 30m, 1h30m, 7d), a timestamp "
        "(2024-05-18T19:02:39Z, @1716058959), boot, all or last-pass"
    )


def iso_utc(epoch: float | None) -> str | None:
    """ISO-8601 UTC with a Z; microseconds only when the time has a fraction."""
    if epoch is None:
        return None
    spec = "seconds" if float(epoch).is_integer() else "microseconds"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec=spec).replace("+00:00", "Z")


def usable_start(start: float | None, now: float) -> str | None:
    """Why a window start cannot be trusted (None when it can): a time ahead of now (the clock
    stepped back since it was written, or it was tampered with) would hide every event, and
    one before 1970 is no time a kernel logged anything at."""
    if start is None:
        return "it has no time that can be read"
    if not math.isfinite(start) or start < 0:
        return f"its time {start!r} is not a time since 1970"
    if start > now:
        return f"it is ahead of now ({_when(start)} > {iso_utc(now)}: clock stepped back, or tampering)"
    return None


def _when(t: float) -> str:
    try:
        return str(iso_utc(t))
    except (OverflowError, ValueError, OSError):  # beyond what a date can hold
        return repr(t)
