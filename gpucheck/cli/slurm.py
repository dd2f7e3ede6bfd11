"""`gpucheck slurm prolog|epilog|resume`: the Slurm hooks and resuming the nodes they drained.

See docs/fleet.md. The logic lives in gpucheck.fleet.hook (the hooks, and how they read their
arguments) and gpucheck.fleet.slurm (resume); this module parses options, renders and exits.
`slurm prolog|epilog` exit 0 (go) or 42 (judged unhealthy), and a usage error in their arguments
is one more could-not-judge outcome; `slurm resume` exits 0 (every node gpucheck drained is
back), 1 (some still fail), 2 (usage error) or 3 (stopped by a signal, or scontrol failed).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping

import click

from ..fleet.hook import EXIT_HOOK_UNHEALTHY
from ..platform.messages import say_error
from .level_option import LEVEL
from .numbers import DURATION
from .run import WORKER_COUNT
from .sweep import _duration, _nodes, build_plan, progress_sweep, remote_options, remote_settings, runner_settings


@click.group("slurm")
def slurm_group() -> None:
    """Slurm hooks (Prolog=/Epilog=) that drain unhealthy nodes, and resuming them.

    See docs/fleet.md for the slurm.conf lines and the wrapper scripts in scripts/slurm/.
    """


def hook_options(kind: str):
    def deco(f):
        budget_default = "15s" if kind == "prolog" else "60s"
        opts = [
            click.option("--level", "-l", type=LEVEL, metavar="LEVEL",
                         help="Level to run (prolog default 1; epilog: the config's, for the checks below)."),
            click.option("--check", "-c", "checks", multiple=True, metavar="ID",
                         help="Checks to run" + (" (default: xid, ecc, memory-remap)." if kind == "epilog" else ".")),
            click.option("--skip", "skips", multiple=True, metavar="ID", help="Skip these checks."),
            click.option("--budget", "budget_text", type=DURATION, default=budget_default, show_default=True, metavar="DURATION",
                         help="Time budget of the run; past it the verdict is partial (could not judge). Shrunk "
                              "(and said so) to end before Slurm's PrologEpilogTimeout, past which Slurm kills "
                              "the hook with SIGKILL and drains the node."),
            click.option("--on-error", type=click.Choice(["pass", "fail"]), default=None,
                         help=f"Could not judge: pass (log, do not drain, exit 0) or fail (drain, exit "
                              f"{EXIT_HOOK_UNHEALTHY}). Default: "
                              "$GPUCHECK_ON_ERROR, else the config's run.on_error, else pass."),
            click.option("--strict", is_flag=True, default=None, help="Treat warn as unhealthy."),
            click.option("--snapshot", metavar="FILE",
                         help="Judge a recorded snapshot instead of live NVML ({node} is replaced by the node name)."),
            click.option("--state-dir", metavar="DIR",
                         help="State directory for the history ({node} is replaced; default /var/lib/gpucheck)."),
            click.option("--config", "config_path", metavar="FILE", help="TOML config."),
            click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True),
            click.option("--workers", type=WORKER_COUNT, default=2, show_default=True),
            click.option("--no-drain", is_flag=True,
                         help=f"Judge and exit {EXIT_HOOK_UNHEALTHY} when unhealthy (the wrapper exits 1), but do "
                              "not drain."),
            click.option("--all-gpus", is_flag=True, help="Test all GPUs even when the job has only some."),
            click.option("--force", is_flag=True,
                         help="Load GPUs that processes are using (default: skipped, could not judge)."),
            click.option("--scontrol", metavar="PATH", help="scontrol to use (default: found in the usual places)."),
            click.option("--json", "as_json", is_flag=True, help="Print the verdict JSON instead of the table."),
        ]
        if kind == "epilog":
            opts += [
                click.option("--failed-level", default="2", show_default=True, metavar="LEVEL",
                             help="Level to run after a failed job (all its checks)."),
                click.option("--failed-budget", "failed_budget_text", type=DURATION, default="10m", show_default=True,
                             metavar="DURATION", help="Time budget after a failed job."),
                click.option("--failed-check", "failed_checks", multiple=True, metavar="ID",
                             help="Only these checks after a failed job (default: all of --failed-level)."),
            ]
        for o in reversed(opts):
            f = o(f)
        return f
    return deco


def _hook(kind: str, kw: dict[str, Any]) -> int:
    from ..fleet import hook

    values = dict(kw, budget_s=_duration(kw["budget_text"], "--budget"),
                  failed_budget_s=_duration(kw.get("failed_budget_text"), "--failed-budget"))
    return _hook_exit(hook.run_hook(hook.hook_options(kind, values), os.environ))


def _hook_exit(outcome) -> int:
    """Print the hook's line; make sure that no output left unwritten (stdout on a full disk,
    /dev/full) turns the exit code into Python's 120 at exit."""
    for stream, text in ((sys.stderr, f"gpucheck: {outcome.log_line}\n"), (sys.stdout, "")):
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            try:  # what could not be written goes nowhere
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass
    return outcome.exit_code


def _hook_failed(kind: str, args: list[str], cause: str) -> int:
    """The hook could not run (a usage error in its settings, a crash before the pipeline): a
    could-not-judge outcome like any other, logged, recorded and on-error, with what can be read
    from its arguments."""
    from ..fleet.hook import hook_failed, options_from_args

    return _hook_exit(hook_failed(options_from_args(kind, args), os.environ, cause))


def _under_slurm(environ: Mapping[str, str]) -> bool:
    """Whether this runs as a Slurm hook (slurmd sets the job's id, and the script context)."""
    return any(environ.get(v) for v in ("SLURM_SCRIPT_CONTEXT", "SLURM_JOB_ID", "SLURM_JOBID"))


class HookCommand(click.Command):
    """`slurm prolog|epilog`: a usage error in the hook's arguments (or a crash of gpucheck before
    it can judge) is one more could-not-judge outcome of the hook (logged, recorded in the history,
    then on-error: exit 0 or EXIT_HOOK_UNHEALTHY), never exit 2 that Slurm would take for a
    fault and drain the node for."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["gpucheck.hook_args"] = list(args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            ctx.meta["gpucheck.hook_usage"] = e
            return []
        except click.exceptions.Exit:  # --help: printed; as a hook it examined nothing
            if not _under_slurm(os.environ):
                raise
            ctx.meta["gpucheck.hook_help"] = True
            return []

    def invoke(self, ctx: click.Context) -> Any:
        args = ctx.meta.get("gpucheck.hook_args", [])
        if ctx.meta.get("gpucheck.hook_help"):
            return _hook_failed(self.name, args, "--help in the hook's arguments: the help was printed, "
                                                 "nothing was examined")
        error = ctx.meta.get("gpucheck.hook_usage")
        if error is None:
            try:
                return super().invoke(ctx)
            except click.UsageError as e:
                error = e
            except Exception as e:  # gpucheck's own bug before the hook could judge
                return _hook_failed(self.name, args, f"internal error: {type(e).__name__}: {e}")
        return _hook_failed(self.name, args, f"usage error in the hook's arguments: {error.format_message()}")


@slurm_group.command("prolog", cls=HookCommand)
@hook_options("prolog")
def prolog_command(**kw) -> int:
    """Slurm Prolog: quick checks of the job's GPUs; drain the node when unhealthy.

    Exit 0: go (healthy, or could not judge with on-error pass); 42: judged unhealthy (or could
    not judge with on-error fail): drained. The wrapper scripts/slurm/gpucheck-hook.sh turns 42
    into exit 1 and any other exit (gpucheck itself failed) into on-error.
    """
    return _hook("prolog", kw)


@slurm_group.command("epilog", cls=HookCommand)
@hook_options("epilog")
def epilog_command(**kw) -> int:
    """Slurm Epilog: Xid/ECC changes since the job started, deeper checks after a failed job.

    Exit codes as for the prolog: 0 go, 42 judged unhealthy (drained).
    """
    return _hook("epilog", kw)


@slurm_group.command("resume")
@click.argument("nodeset")
@remote_options
@click.option("--dry-run", is_flag=True, help="Show what would be resumed; change nothing.")
@click.option("--scontrol", metavar="PATH", help="scontrol to use.")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON.")
def resume_command(nodeset, dry_run, scontrol, as_json, **kw) -> int:
    """Resume the nodes of NODESET that gpucheck drained and that pass now.

    Nodes drained by people or other tools (a reason not starting with "gpucheck:") are never
    touched. The candidates are tested with a sweep (ssh, or --srun); exit 0 when every node
    gpucheck had drained is back, 1 when some still fail, 3 when SIGTERM/SIGINT stopped it
    (nothing is resumed after the signal).
    """
    from ..platform.nodeset import fold
    from ..fleet.slurm import default_runner, find_scontrol, resume_exit_code, resume_nodes, sweep_test
    from ..platform.processes import stop_on_signals

    nodes = _nodes(nodeset)
    build_plan(nodes, **kw)  # validate the options before touching anything
    opts = remote_settings(kw)
    settings = runner_settings(**kw)
    test = sweep_test(nodes, opts, lambda plan: progress_sweep(plan, settings, opts.strict, "resume: sweep"))
    with stop_on_signals():  # SIGTERM/SIGINT: stop the sweep, resume nothing more, report, exit 3
        try:
            decisions = resume_nodes(nodes, test=test, scontrol=find_scontrol(scontrol), runner=default_runner,
                                     dry_run=dry_run)
        except RuntimeError as e:
            say_error(str(e), "gpucheck slurm resume")
            return 3
        if as_json:
            click.echo(json.dumps([d.to_dict() for d in decisions], indent=2))
        else:
            for d in decisions:
                extra = f" ({d.reason})" if d.reason else ""
                click.echo(f"{d.node}: {d.decision}{extra}" + (f": {d.detail}" if d.detail else ""))
            for label, key in (("resumed", "resumed"), ("would resume", "would-resume"), ("still bad", "still-bad"),
                               ("not resumed (interrupted)", "interrupted")):
                ns = fold(d.node for d in decisions if d.decision == key)
                if ns:
                    click.echo(f"{label}: {ns}")
    return resume_exit_code(decisions)
