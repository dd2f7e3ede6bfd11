"""Telemetry while workers load the GPUs: a thread that samples the run's telemetry source once a
second.

Per sample and GPU: SM clock, temperature, power, clock-event (throttle) reasons, and any Xid
event the source delivered since the last tick. `summary(gpu)` folds the samples into the numbers
that go into that GPU's result: min/median/max SM clock, max temperature, mean power, the throttle
reasons seen, Xid codes.

The samples come from the run's telemetry source (gpucheck.platform.telemetry.source, `ctx.telemetry`):
live NVML through the one choke point, gpucheck.platform.telemetry.nvml, opened in the sampling thread, or
whatever source the edge chose (a fake in tests). Where it has no telemetry (no driver) the
sampler records why in `note` ("no NVML telemetry: ...") and is otherwise a no-op: that is
evidence, not an error.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import TYPE_CHECKING, Any

from ..platform.telemetry.model import Sample, TelemetrySummary, XidEvent

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.source import SamplingSession, TelemetrySource

# Clock-event reasons that are not a cause of low throughput under load (an idle GPU, clocks set
# by the administrator, a display, multi-GPU boost synchronisation).
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost"})


class Sampler:
    """Samples `gpus` from `source` every `interval_s` seconds in a daemon thread between start()
    and stop(). `source`: None is live NVML."""

    def __init__(
        self,
        gpus: list[int],
        *,
        source: "TelemetrySource | None" = None,
        interval_s: float = 1.0,
        watch_xid: bool = True,
    ):
        self.gpus = list(gpus)
        self.interval_s = float(interval_s)
        self.source = source
        self._watch_xid = watch_xid
        self._lock = threading.Lock()
        self._samples: dict[int, list[Sample]] = {g: [] for g in self.gpus}
        self._xids: dict[int, list[XidEvent]] = {g: [] for g in self.gpus}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.note: str | None = None  # why there is no (or partial) telemetry
        self.xid_note: str | None = None  # why Xid events were not watched

    @property
    def description(self) -> str:
        return self.source.description if self.source is not None else "NVML"

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
    def samples(self, gpu: int) -> list[Sample]:
        with self._lock:
            return list(self._samples.get(gpu, []))

    def latest(self, gpu: int) -> Sample | None:
        with self._lock:
            s = self._samples.get(gpu)
            return Sample(**s[-1]) if s else None

    def xid_events(self, gpu: int) -> list[XidEvent]:
        with self._lock:
            return list(self._xids.get(gpu, []))

    def summary(self, gpu: int) -> TelemetrySummary:
        return summarize(self.samples(gpu), self.xid_events(gpu), note=self.note)

    # -- the thread ---------------------------------------------------------------------------
    def _record(self, gpu: int, sample: Sample | None) -> None:
        if sample is None:
            return
        s: Sample = {**sample}
        s.setdefault("time", time.time())
        with self._lock:
            self._samples.setdefault(gpu, []).append(s)

    def _record_xid(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._xids.setdefault(gpu, []).append({"xid": int(xid), "time": time.time()})

    def _tick(self, session: "SamplingSession") -> None:
        for g in self.gpus:
            try:
                self._record(g, session.sample(g))
            except Exception as e:  # noqa: BLE001 - telemetry never breaks a burn
                self._record(g, _failed_sample(g, f"{type(e).__name__}: {e}"))
        try:
            events = session.poll_xid()
        except Exception as e:  # noqa: BLE001 - nor does the Xid watch
            events, session.xid_note = None, f"Xid event watch stopped: {type(e).__name__}: {e}"
        for gpu, xid in events or []:
            self._record_xid(gpu, xid)
        if session.xid_note and not self.xid_note:
            self.xid_note = session.xid_note

    def _run(self) -> None:
        source = self.source
        if source is None:
            from ..platform.telemetry.source import LiveTelemetry

            source = LiveTelemetry()
        try:
            session = source.sampling(self.gpus, watch_xid=self._watch_xid)
        except Exception as e:  # noqa: BLE001 - a source that cannot open is a note
            self.note = f"no telemetry: {type(e).__name__}: {e}"
            return
        try:
            if session.note:
                self.note = session.note
                return
            self.xid_note = session.xid_note
            self._loop(session)
        finally:
            session.close()

    def _loop(self, session: "SamplingSession") -> None:
        while True:
            t = time.monotonic()
            self._tick(session)
            if self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t))):
                break
        self._tick(session)  # one last reading at the end of the load


def _failed_sample(gpu: int, error: str) -> Sample:
    return {"index": gpu, "sm_clock_mhz": None, "temperature_c": None, "power_w": None, "throttle_reasons": None,
            "throttle_reason_names": None, "error": error, "time": time.time()}


def _values(samples: list[Sample], key: str) -> list[float]:
    values: list[Any] = [s.get(key) for s in samples]
    return [float(v) for v in values if isinstance(v, (int, float))]


def summarize(samples: list[Sample], xids: list[XidEvent] | None = None,
              note: str | None = None) -> TelemetrySummary:
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
