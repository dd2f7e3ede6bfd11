"""Compatibility module: the fleet commands now live in gpucheck.cli.sweep (`gpucheck sweep`
and the remote options), gpucheck.cli.slurm (`gpucheck slurm`) and gpucheck.cli.bisect
(`gpucheck bisect`). Imports from here keep working."""

from .bisect import bisect_command  # noqa: F401
from .slurm import HookCommand, epilog_command, prolog_command, resume_command, slurm_group  # noqa: F401
from .sweep import build_plan, progress_sweep, remote_options, runner_settings, sweep_command  # noqa: F401
