"""What every kernel-log source gives (ReadResult: chunks of lines, the attempts and why each
failed), where the sources are (LogPaths: injectable for tests), the boot time, and the
permission hints that make a refusal actionable."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field

DEFAULT_TIMEOUT_S = 8.0


@dataclass(frozen=True)
class LogPaths:
    kmsg: str = "/dev/kmsg"
    proc_stat: str = "/proc/stat"
    dmesg_restrict: str = "/proc/sys/kernel/dmesg_restrict"
    journalctl: tuple[str, ...] = ("journalctl",)
    dmesg: tuple[str, ...] = ("dmesg",)
    log_files: tuple[str, ...] = ("/var/log/kern.log", "/var/log/syslog", "/var/log/messages")


DEFAULT_PATHS = LogPaths()


@dataclass
class Chunk:
    """Lines from one origin, with what is needed to time them."""

    origin: str
    lines: list[str]
    boot_time: float | None = None  # for monotonic / kmsg stamps
    ref_time: float | None = None  # for syslog dates without a year


@dataclass
class Attempt:
    source: str
    detail: str
    ok: bool
    error: str | None = None

    def __str__(self) -> str:
        return f"{self.source} ({self.detail}): " + ("ok" if self.ok else str(self.error))


@dataclass
class ReadResult:
    source: str | None = None
    chunks: list[Chunk] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    bytes_read: int = 0
    records: int | None = None  # kmsg records / lines, when counted
    notes: list[str] = field(default_factory=list)
    boot_time: float | None = None
    coverage_start: float | None = None  # the oldest time the source still holds, when known
    undated: list[str] = field(default_factory=list)  # origins whose [seconds] stamps are not this boot's

    @property
    def ok(self) -> bool:
        return self.source is not None

    @property
    def error(self) -> str | None:
        if self.ok:
            return None
        if not self.attempts:
            return "no kernel-log source was tried"
        return "cannot read the kernel log: " + "; ".join(
            f"{a.source} ({a.detail}): {a.error}" for a in self.attempts if not a.ok
        )

    @property
    def lines(self) -> list[str]:
        return [ln for c in self.chunks for ln in c.lines]

    def describe(self) -> str:
        if not self.ok:
            return "nothing read"
        size = _human(self.bytes_read)
        rec = f", {self.records} records" if self.records is not None else ""
        return f"{self.source} ({size}{rec})"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def read_boot_time(proc_stat: str = DEFAULT_PATHS.proc_stat) -> float | None:
    """The boot time (epoch) from /proc/stat's btime, or from the monotonic clock."""
    try:
        with open(proc_stat, "rb") as f:
            for raw in f:
                if raw.startswith(b"btime "):
                    return float(raw.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None


def permission_hint(paths: LogPaths = DEFAULT_PATHS) -> str:
    try:
        with open(paths.dmesg_restrict) as f:
            restrict = f.read().strip()
    except OSError:
        restrict = None
    if os.geteuid() != 0:
        if restrict == "1":
            return ("kernel.dmesg_restrict=1 and gpucheck is not root: run it as root, give it "
                    "CAP_SYSLOG, or point --file at a copy of the log")
        return "gpucheck is not root: run it as root or give it CAP_SYSLOG"
    return "root without CAP_SYSLOG (a container?): grant CAP_SYSLOG or read the host's log with --file"


def oserror_text(e: OSError, what: str, paths: LogPaths) -> str:
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM):
        return f"{what}: permission denied ({permission_hint(paths)})"
    if isinstance(e, FileNotFoundError):
        return f"{what}: no such file"
    if isinstance(e, IsADirectoryError):
        return f"{what}: is a directory"
    return f"{what}: {e.strerror or e}"
