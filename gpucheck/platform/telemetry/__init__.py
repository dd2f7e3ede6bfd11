"""Telemetry: a thin layer over NVML and sysfs that returns plain data.

- `nvml`: the only module that calls NVML (lazy `pynvml` import, typed failure kinds, sessions
  over a backend: live pynvml or a replay, the cheap per-second `sample()`, Xid event watches,
  the GPUs' running processes).
- `reader`: one GPU's snapshot entry from a session (live or replayed: the same code).
- `replay`: a recorded snapshot answering the reader's pynvml calls (`--snapshot`).
- `source`: the run's telemetry source (live, replay; `fake` for tests), chosen at the edge and
  carried in the check Context.
- `sysfs`: NVIDIA GPUs the kernel sees on the PCI bus, independent of the driver.
- `snapshot`: `collect_snapshot()` / `load_snapshot()` / `dump_snapshot()`; the format is
  documented in docs/snapshot.md and typed in `model`.
- `enums`, `throttle`: NVML's enum values (pynvml's constants) under gpucheck's stable names.
- `fields`: what each field may hold, and the view of an entry the checks judge.

Importing this package loads no NVML library and imports no pynvml.
"""
