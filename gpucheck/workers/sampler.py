"""Telemetry while workers load the GPUs: a thread that samples NVML once a second.

Per sample and GPU: SM clock, temperature, power, clock-event (throttle) reasons, and any Xid
event NVML delivered since the last tick. `summary(gpu)` folds the samples into the numbers that
go into that GPU's result: min/median/max SM clock, max temperature, mean power, the throttle
reasons seen, Xid codes.

NVML comes from the one choke point, `gpucheck.telemetry.nvml.NvmlSession`, imported lazily in
the sampling thread. Where there is no NVML (CPU workers, no driver) the sampler records why in
`note` ("no NVML telemetry: ...") and is otherwise a no-op: that is evidence, not an error.

Tests (and replays) pass `sample_fn(gpu) -> dict` with the keys of NvmlSession.sample instead of
NVML; `xid_fn() -> [(gpu, xid), ...]` likewise feeds Xid events.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable

# Clock-event reasons that are not a cause of low throughput under load (an idle GPU, clocks set
# by the administrator, a display, multi-GPU boost synchronisation).
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost"})

NVML_ERROR_TIMEOUT = 10  # nvml.h NVML_ERROR_TIMEOUT: nvmlEventSetWait found nothing


class Sampler:
    """Samples `gpus` every `interval_s` seconds in a daemon thread between start() and stop()."""

    def __init__(
        self,
        gpus: list[int],
        *,
        interval_s: float = 1.0,
        sample_fn: Callable[[int], dict[str, Any] | None] | None = None,
        xid_fn: Callable[[], list[tuple[int, int]]] | None = None,
        watch_xid: bool = True,
    ):
        self.gpus = list(gpus)
        self.interval_s = float(interval_s)
        self._sample_fn = sample_fn
        self._xid_fn = xid_fn
        self._watch_xid = watch_xid
        self._lock = threading.Lock()
        self._samples: dict[int, list[dict[str, Any]]] = {g: [] for g in self.gpus}
        self._xids: dict[int, list[dict[str, Any]]] = {g: [] for g in self.gpus}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.note: str | None = None  # why there is no (or partial) telemetry
        self.xid_note: str | None = None  # why Xid events were not watched

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "Sampler":
        if self._thread is None and self.gpus:
            self._thread = threading.Thread(target=self._run, name="gpucheck-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 3.0) -> None:
        """Stop sampling; a sampler stuck in a driver call is abandoned, never waited for."""
        self._stop.set()
        th = self._thread
        if th is not None:
            th.join(timeout_s)
            if th.is_alive() and self.note is None:
                self.note = f"NVML sampling did not stop within {timeout_s:g} s (driver hang?)"

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading ----------------------------------------------------------------------------
    def samples(self, gpu: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._samples.get(gpu, []))

    def latest(self, gpu: int) -> dict[str, Any] | None:
        with self._lock:
            s = self._samples.get(gpu)
            return dict(s[-1]) if s else None

    def xid_events(self, gpu: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._xids.get(gpu, []))

    def summary(self, gpu: int) -> dict[str, Any]:
        return summarize(self.samples(gpu), self.xid_events(gpu), note=self.note)

    # -- the thread ---------------------------------------------------------------------------
    def _record(self, gpu: int, sample: dict[str, Any] | None) -> None:
        if sample is None:
            return
        s = dict(sample)
        s.setdefault("time", time.time())
        with self._lock:
            self._samples.setdefault(gpu, []).append(s)

    def _record_xid(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._xids.setdefault(gpu, []).append({"xid": int(xid), "time": time.time()})

    def _tick(self, sample: Callable[[int], dict[str, Any] | None], poll_xid: Callable[[], None] | None) -> None:
        for g in self.gpus:
            try:
                self._record(g, sample(g))
            except Exception as e:  # noqa: BLE001 - telemetry never breaks a burn
                self._record(g, {"error": f"{type(e).__name__}: {e}"})
        if poll_xid is not None:
            poll_xid()

    def _run(self) -> None:
        if self._sample_fn is not None:
            poll = None
            if self._xid_fn is not None:
                def poll() -> None:
                    for gpu, xid in self._xid_fn():  # type: ignore[misc]
                        self._record_xid(gpu, xid)
            self._loop(self._sample_fn, poll)
            return
        try:
            from ..telemetry.nvml import NvmlSession
        except ImportError as e:
            self.note = f"no NVML telemetry: gpucheck.telemetry.nvml unavailable ({e})"
            return
        with NvmlSession() as nv:
            if not nv.ok:
                self.note = f"no NVML telemetry: {nv.error}"
                return
            watcher = _XidWatcher(nv, self.gpus, self._record_xid) if self._watch_xid else None
            if watcher is not None and watcher.note:
                self.xid_note = watcher.note
            try:
                self._loop(nv.sample, watcher.poll if watcher is not None and watcher.ok else None)
            finally:
                if watcher is not None:
                    watcher.close()

    def _loop(self, sample: Callable[[int], dict[str, Any] | None], poll_xid: Callable[[], None] | None) -> None:
        while True:
            t = time.monotonic()
            self._tick(sample, poll_xid)
            if self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t))):
                break
        self._tick(sample, poll_xid)  # one last reading at the end of the load


class _XidWatcher:
    """Xid critical-error events through an NVML event set (best effort: some drivers and
    containers refuse event registration; then `note` says so and Xids come from the xid check)."""

    def __init__(self, nv: Any, gpus: list[int], record: Callable[[int, int], None]):
        self.nv = nv
        self.record = record
        self.note: str | None = None
        self.ok = False
        self._set = None
        mod = nv.nvml
        try:
            self._set = mod.nvmlEventSetCreate()
            etype = getattr(mod, "nvmlEventTypeXidCriticalError", 0x8)
            for g in gpus:
                mod.nvmlDeviceRegisterEvents(nv.handle(g), etype, self._set)
            self.ok = True
        except Exception as e:  # noqa: BLE001
            self.note = f"Xid events not watched during the load: {type(e).__name__}: {e}"
            self.close()

    def poll(self) -> None:
        if not self.ok or self._set is None:
            return
        mod = self.nv.nvml
        wait = getattr(mod, "nvmlEventSetWait_v2", None) or mod.nvmlEventSetWait
        for _ in range(64):  # drain what is pending, bounded
            try:
                data = wait(self._set, 0)
            except Exception as e:  # noqa: BLE001
                if getattr(e, "value", None) != NVML_ERROR_TIMEOUT:
                    self.note = f"Xid event watch stopped: {type(e).__name__}: {e}"
                    self.ok = False
                return
            try:
                gpu = int(mod.nvmlDeviceGetIndex(data.device))
            except Exception:  # noqa: BLE001
                gpu = -1
            self.record(gpu, int(data.eventData))

    def close(self) -> None:
        if self._set is not None:
            try:
                self.nv.nvml.nvmlEventSetFree(self._set)
            except Exception:  # noqa: BLE001
                pass
            self._set = None


def _values(samples: list[dict[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in samples if isinstance(s.get(key), (int, float))]


def summarize(samples: list[dict[str, Any]], xids: list[dict[str, Any]] | None = None,
              note: str | None = None) -> dict[str, Any]:
    """Fold samples into one GPU's telemetry summary. Values are None when never read."""
    clocks = _values(samples, "sm_clock_mhz")
    temps = _values(samples, "temperature_c")
    power = _values(samples, "power_w")
    reasons: list[str] = []
    for s in samples:
        for name in s.get("throttle_reason_names") or []:
            if name not in reasons:
                reasons.append(name)
    errors: list[str] = []
    for s in samples:
        e = s.get("error")
        if e and e not in errors:
            errors.append(str(e))
    return {
        "samples": len(samples),
        "sm_clock_min_mhz": min(clocks) if clocks else None,
        "sm_clock_median_mhz": statistics.median(clocks) if clocks else None,
        "sm_clock_max_mhz": max(clocks) if clocks else None,
        "temperature_max_c": max(temps) if temps else None,
        "power_mean_w": round(statistics.fmean(power), 1) if power else None,
        "throttle_reasons": reasons,
        "slowdown_reasons": [r for r in reasons if r not in BENIGN_REASONS],
        "errors": errors,
        "xid": sorted({int(x["xid"]) for x in (xids or [])}),
        "note": note if not samples else None,
    }
