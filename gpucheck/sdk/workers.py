"""The check SDK for compute checks: one worker process per GPU (gpucheck.workers.per_gpu), the
pool's outcome kinds and jobs (gpucheck.workers.pool) and the guard that never loads a GPU a job
is using (gpucheck.workers.busy). A compute check imports this inside the function that computes,
so that a level-1 run never loads the worker plumbing; the names are defined in those modules,
this one only gathers them. A check that drives the pool itself calls `pool.run_workers`, looked
up at the call: the tests replace it there.
"""

from __future__ import annotations

from ..workers import pool
from ..workers.busy import Guard, guard_context, guarded_targets, unknown_gpus
from ..workers.per_gpu import (TORCH_IMPORT_CPU_S, LevelDurations, LoadParams, LoadTime, PerGpuRun, PoolParams, Promise,
                               cut_short, deadline_problem, duration_slice, finish_result, level_duration, pool_budget,
                               job_gpu, progress_evidence, promised, returned_data, run_per_gpu, stop_timings,
                               stopped_early, telemetry_summary, unfinished_result, worker_data)
from ..workers.pool import CANCELLED, CRASHED, HUNG, OVER_BUDGET, WorkerJob, WorkerOutcome
from ..workers.results import (BurnDtype, BurnProgress, BurnResult, CopyBwGpu, CopyBwPair, CopyBwProgress,
                               CopyBwResult, LinkUnderLoad, MemtestConfirmation, MemtestCopy, MemtestErrorRecord, MemtestErrors,
                               MemtestProgress, MemtestResult, MemtestStall, PoetProgress, PoetResult, PoetViolation,
                               ReproProgress, ReproResult, SdcEvent, SetupError, WorkerProgress)

__all__ = [
    "Guard", "guard_context", "guarded_targets", "unknown_gpus",
    "TORCH_IMPORT_CPU_S", "LevelDurations", "LoadParams", "LoadTime", "PerGpuRun", "PoolParams", "Promise",
    "cut_short", "deadline_problem", "duration_slice", "finish_result", "level_duration", "pool_budget",
    "progress_evidence", "promised", "returned_data", "run_per_gpu", "stop_timings", "stopped_early",
    "telemetry_summary", "unfinished_result", "worker_data", "job_gpu",
    "pool", "CANCELLED", "CRASHED", "HUNG", "OVER_BUDGET", "WorkerJob", "WorkerOutcome",
    # what the workers return and report (gpucheck.workers.results)
    "BurnDtype", "BurnProgress", "BurnResult", "CopyBwGpu", "CopyBwPair", "CopyBwProgress", "CopyBwResult", "LinkUnderLoad",
    "MemtestConfirmation", "MemtestCopy", "MemtestErrorRecord", "MemtestErrors", "MemtestProgress", "MemtestResult", "MemtestStall", "PoetProgress",
    "PoetResult", "PoetViolation", "ReproProgress", "ReproResult", "SdcEvent", "SetupError", "WorkerProgress",
]
