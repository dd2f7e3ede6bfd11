"""The check SDK: everything a check module imports from gpucheck, in one place (the compute
checks' worker helpers are in gpucheck.sdk.workers, imported where a check computes: a level-1 run
never loads the worker plumbing).

A check is a run function declared with `define(...)` and listed in its module's `CHECKS`
(docs/checks.md):

- the contract (gpucheck.core.check, gpucheck.core.levels): `define`, `Level`, `Need`, `Context`,
  `Slice`, `RunOptions`, `compute_skip`;
- a check's own options (gpucheck.core.options): `option` (a field of its options dataclass),
  `Option`, `flag_of`;
- results and rules (gpucheck.core.result): `Result`, `Status`, `Action`, `Basis`, `Rule`, `Key`,
  `evaluate`, `settle`, `Threshold`;
- the limits of a check's settings (gpucheck.core.config): `Limit`;
- fault injection (gpucheck.core.inject): `injections_for_gpu`, `InjectionArgs`, `fraction`,
  `choice`;
- the snapshot helpers of the level-1 checks (gpucheck.sdk.snapshot): `each_gpu`,
  `apply_unreadable`, `get`, `gpu_state_result`, ...

The names are defined in those modules; this one only gathers them.
"""

from __future__ import annotations

from ..core.check import Check, CheckSpec, Context, Need, RunOptions, Slice, compute_skip, define
from ..core.config import Limit
from ..core.inject import InjectionArgs, choice, fraction, injections_for_gpu
from ..core.levels import Level
from ..core.options import MAX_DIMENSION, Option, flag_of, option
from ..core.result import Action, Basis, Key, Result, Rule, Status, Threshold, evaluate, settle
from ..platform.telemetry.nvml import NOT_IN_FORMAT
from .snapshot import (NOT_IN_CAPTURE, apply_unreadable, counter_growth, each_gpu, format_gaps, get, gpu_state_result,
                       latest_metrics_by, nvml_unavailable, nvml_unjudged, previous_interval, selected_gpus_or_skip,
                       snapshot_time, status_if_unreadable, unreadable_fields)

__all__ = [
    "Check", "CheckSpec", "Context", "Level", "Need", "RunOptions", "Slice", "compute_skip", "define",
    "Limit",
    "MAX_DIMENSION", "Option", "flag_of", "option",
    "InjectionArgs", "choice", "fraction", "injections_for_gpu",
    "Action", "Basis", "Key", "Result", "Rule", "Status", "Threshold", "evaluate", "settle",
    "NOT_IN_CAPTURE", "NOT_IN_FORMAT", "apply_unreadable", "counter_growth", "each_gpu", "format_gaps", "get", "gpu_state_result",
    "latest_metrics_by", "nvml_unavailable", "nvml_unjudged", "previous_interval", "selected_gpus_or_skip",
    "snapshot_time", "status_if_unreadable", "unreadable_fields",
]
