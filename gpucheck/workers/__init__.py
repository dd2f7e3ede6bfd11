"""Worker processes for compute checks: one spawned process per GPU, supervised by the parent.

`gpucheck.workers.pool` is the reusable supervisor (`run_workers`), `gpucheck.workers.sampler` the
NVML sampling thread that runs beside it, `gpucheck.render.burn_display` a live rich table for long
burns. Nothing here imports torch: workers import it themselves, in their own process.
"""

from .pool import (
    CANCELLED,
    CRASHED,
    HUNG,
    KINDS,
    OK,
    OVER_BUDGET,
    LocalChannel,
    WorkerChannel,
    WorkerJob,
    WorkerOutcome,
    WorkerSetupError,
    run_workers,
    torch_device,
)

__all__ = [
    "CANCELLED",
    "CRASHED",
    "HUNG",
    "KINDS",
    "OK",
    "OVER_BUDGET",
    "LocalChannel",
    "WorkerChannel",
    "WorkerJob",
    "WorkerOutcome",
    "WorkerSetupError",
    "run_workers",
    "torch_device",
]
