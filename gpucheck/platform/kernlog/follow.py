"""`gpucheck xid --follow`: stream new Xid / SXid events as they arrive, until stopped.

Line sources: /dev/kmsg (from its end; blocking poll), `journalctl -k -f`, or a growing file
(tail). Where NVML works, its Xid events (nvmlEventTypeXidCriticalError) are streamed too, from a
second thread; an NVML event that repeats a kernel-log event of the same GPU and Xid within a few
seconds is not printed twice.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from typing import Callable, Iterator

from ..pci import short_bus_id
from .parse import Item, Parser, XidEvent
from .sources.base import DEFAULT_PATHS, LogPaths, read_boot_time
from .sources.kmsg import KMSG_READ_BYTES
from .sources.linefilter import NEEDLES

FOLLOW_SOURCES = ("kmsg", "journal", "file")
NVML_DUP_WINDOW_S = 5.0
NVML_ERROR_TIMEOUT = 10  # nvmlReturn_t NVML_ERROR_TIMEOUT: nothing happened within the wait


def _records(data: bytes) -> list[bytes]:
    return [r for r in data.split(b"\n") if r and r[:1] not in (b" ", b"\t")]


def follow_fd_lines(path: str, stop: threading.Event, *, poll_s: float = 0.5,
                    from_end: bool = True, on_ready: Callable[[], None] | None = None) -> Iterator[str]:
    """Relevant lines appended to `path` (/dev/kmsg, a file, a FIFO) from now on. `on_ready` is
    called once the source is open and positioned (what comes after it is "new")."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if from_end:
            try:
                os.lseek(fd, 0, os.SEEK_END)  # /dev/kmsg: after the newest record; a file: its end
            except OSError:
                pass  # a FIFO cannot seek: everything written from now on is new anyway
        if on_ready is not None:
            on_ready()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        partial = b""
        while not stop.is_set():
            if not poller.poll(poll_s * 1000):
                continue
            try:
                chunk = os.read(fd, KMSG_READ_BYTES)
            except (BlockingIOError, InterruptedError):
                continue
            except BrokenPipeError:
                continue  # kmsg: records overwritten under us; go on with the next one
            if not chunk:
                stop.wait(poll_s)  # end of a file / FIFO without a writer: wait for more
                continue
            data = partial + chunk
            last = data.rfind(b"\n")
            if last < 0:
                partial = data
                continue
            partial = data[last + 1:]
            for rec in _records(data[:last]):
                if any(nd in rec for nd in NEEDLES):
                    yield rec.decode("utf-8", "replace")
    finally:
        os.close(fd)


def follow_command_lines(argv: list[str], stop: threading.Event) -> Iterator[str]:
    """Relevant lines a long-running command (journalctl -kf) prints, until stop or its end."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    watcher = threading.Thread(target=lambda: (stop.wait(), proc.terminate()), daemon=True)
    watcher.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if stop.is_set():
                break
            if any(nd in raw for nd in NEEDLES):
                yield raw.decode("utf-8", "replace").rstrip("\r\n")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()


def nvml_xid_events(stop: threading.Event, emit: Callable[[XidEvent], None],
                    wait_ms: int = 500) -> str | None:
    """Emit NVML Xid events until `stop`; returns why it could not (None when it ran)."""
    from ..telemetry.nvml import NvmlCallError, NvmlSession, text

    s = NvmlSession()
    if not s.ok:
        return f"NVML Xid events unavailable: {s.error}"
    es = None
    try:
        n = s.device_count() or 0
        if n == 0:
            return "NVML Xid events unavailable: no GPU"
        es = s.call("nvmlEventSetCreate")
        mask = s.constant("nvmlEventTypeXidCriticalError", 0x8)
        registered = 0
        for i in range(n):
            try:
                s.call("nvmlDeviceRegisterEvents", s.handle(i), mask, es)
                registered += 1
            except NvmlCallError:
                continue
        if not registered:
            return "NVML Xid events unavailable: no GPU accepts event registration"
        while not stop.is_set():
            try:
                data = s.call("nvmlEventSetWait_v2", es, wait_ms)
            except NvmlCallError as e:
                if e.failure.code == NVML_ERROR_TIMEOUT:
                    continue
                return f"NVML Xid events stopped: {e.failure}"
            xid = int(getattr(data, "eventData", 0))
            bus = None
            try:
                pci = s.call("nvmlDeviceGetPciInfo", data.device)
                bus = short_bus_id(text(getattr(pci, "busId", b"")))
            except NvmlCallError:
                pass
            emit(XidEvent(xid, bus, time.time(), f"NVML: Xid {xid} on PCI {bus or 'unknown'}",
                          text="reported by NVML", time_kind="wallclock"))
        return None
    except NvmlCallError as e:
        return f"NVML Xid events unavailable: {e.failure}"
    finally:
        if es is not None:
            try:
                s.call("nvmlEventSetFree", es)
            except NvmlCallError:
                pass
        s.close()


def follow(
    on_item: Callable[[Item, str], None],
    stop: threading.Event,
    *,
    source: str = "kmsg",
    file: str | None = None,
    paths: LogPaths = DEFAULT_PATHS,
    nvml: bool = True,
    poll_s: float = 0.5,
    on_note: Callable[[str], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Call on_item(item, origin) for each new event (origin "kmsg", "journal", "file", "nvml")
    until `stop` is set or the line source ends. Raises OSError when the source cannot be opened."""
    if source not in FOLLOW_SOURCES:
        raise ValueError(f"--follow reads one of {', '.join(FOLLOW_SOURCES)}, not {source!r}")
    lock = threading.Lock()
    recent: dict[tuple[str | None, int], float] = {}

    def deliver(item: Item, origin: str) -> None:
        with lock:
            if isinstance(item, XidEvent):
                key = (item.pci_bus_id, item.xid)
                now = time.monotonic()
                seen = recent.get(key)
                recent[key] = now
                if origin == "nvml" and seen is not None and now - seen <= NVML_DUP_WINDOW_S:
                    return
            on_item(item, origin)

    nvml_thread = None
    if nvml:
        def nvml_main() -> None:
            why = nvml_xid_events(stop, lambda ev: deliver(ev, "nvml"))
            if why and on_note:
                on_note(why)

        nvml_thread = threading.Thread(target=nvml_main, name="xid-nvml", daemon=True)
        nvml_thread.start()

    boot_time = read_boot_time(paths.proc_stat)
    parser = Parser()
    if source == "kmsg":
        lines = follow_fd_lines(paths.kmsg, stop, poll_s=poll_s, on_ready=on_ready)
        origin = "kmsg"
    elif source == "file":
        if not file:
            raise ValueError("--follow of a file needs --file")
        lines = follow_fd_lines(file, stop, poll_s=poll_s, on_ready=on_ready)
        origin = "file"
    else:
        argv = list(paths.journalctl) + ["-k", "-f", "-n", "0", "-o", "short-iso-precise", "--no-pager", "-q"]
        lines = follow_command_lines(argv, stop)
        origin = "journal"
        if on_ready is not None:
            on_ready()
    try:
        for line in lines:
            for item in parser.feed(line, boot_time=boot_time, ref_time=time.time()):
                deliver(item, origin)
    finally:
        stop.set()
        if nvml_thread is not None:
            nvml_thread.join(2.0)
