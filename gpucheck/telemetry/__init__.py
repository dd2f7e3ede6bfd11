"""Telemetry: a thin layer over NVML and sysfs that returns plain data.

- `nvml`: the only module that calls NVML (lazy `pynvml` import, typed failure kinds,
  `NvmlSession` with the cheap per-second `sample()`).
- `sysfs`: NVIDIA GPUs the kernel sees on the PCI bus, independent of the driver.
- `snapshot`: `collect_snapshot()` / `load_snapshot()` / `dump_snapshot()`; the format is
  documented in docs/snapshot.md.
- `throttle`: names of the clock-event (throttle) reason bits.

Importing this package loads no NVML library.
"""

from .nvml import KINDS, NvmlFailure, NvmlSession
from .snapshot import SnapshotError, collect_snapshot, dump_snapshot, load_snapshot

__all__ = [
    "KINDS",
    "NvmlFailure",
    "NvmlSession",
    "SnapshotError",
    "collect_snapshot",
    "dump_snapshot",
    "load_snapshot",
]
