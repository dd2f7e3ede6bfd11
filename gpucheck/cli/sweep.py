"""`gpucheck sweep`: `gpucheck run --json` on many nodes, compared and classified; and the
options shared with `gpucheck slurm resume` (how to run gpucheck on the nodes).

See docs/fleet.md. The logic lives in gpucheck.fleet; this module parses options, shows progress
and tables, and maps outcomes to exit codes (0 healthy, 1 bad nodes found, 2 usage error,
3 could not judge).
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

import click

from ..app import UsageError, _check_writable
from ..platform.messages import say_error
from .level_option import LEVEL
from .numbers import DURATION, MAX_NODES, Count, FiniteFloat
from .run import parse_duration

if TYPE_CHECKING:  # pragma: no cover
    from ..core.documents import SweepReport
    from ..platform.fanout import RunnerSettings

DEFAULT_NODE_TIMEOUT = "10m"


def _nodes(text: str, param: str = "NODESET") -> list[str]:
    from ..platform.nodeset import NodeSetError, parse_nodeset

    try:
        return parse_nodeset(text)
    except NodeSetError as e:
        raise click.BadParameter(str(e), param_hint=param) from None


def _duration(text: str | None, param: str) -> float | None:
    try:
        return parse_duration(text)
    except click.BadParameter as e:
        raise click.BadParameter(e.format_message(), param_hint=param) from None


# -- options shared by sweep and slurm resume -------------------------------------------------

def remote_options(f):
    """How to run `gpucheck run --json` on the nodes, and with what arguments."""
    opts = [
        click.option("--level", "-l", type=LEVEL, metavar="LEVEL",
                     help="Level of the run on each node (default: the node's config)."),
        click.option("--check", "-c", "checks", multiple=True, metavar="ID",
                     help="Run only these checks (passed through)."),
        click.option("--skip", "skips", multiple=True, metavar="ID", help="Skip these checks (passed through)."),
        click.option("--snapshot", "snapshot_path", metavar="FILE",
                     help="Judge this recorded snapshot on every node (a path on the nodes)."),
        click.option("--inject", "injections", multiple=True, metavar="SPEC",
                     help="Fault injection on every node (passed through; use --node-args for one node)."),
        click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default=None,
                     help="Where compute checks run on the nodes (passed through)."),
        click.option("--strict", is_flag=True, help="Treat warn as bad (on the nodes and in the sweep)."),
        click.option("--force", is_flag=True,
                     help="Load GPUs that a job is using on the nodes (passed through; default: such GPUs are "
                          "skipped and the node could not be judged)."),
        click.option("--run-arg", "run_args", multiple=True, metavar="ARG",
                     help="Any other argument for `gpucheck run` on the nodes (repeatable)."),
        click.option("--node-args", "node_args", multiple=True, metavar="NODESET=ARGS",
                     help="Extra `gpucheck run` arguments for some nodes, e.g. 'n2=--snapshot /x/bad.json'."),
        click.option("--remote-cmd", default="gpucheck", show_default=True, metavar="CMD",
                     help="How to start gpucheck on the nodes (shell text: a path, or 'env X=1 python3 -m gpucheck')."),
        click.option("--fanout", type=Count(1, MAX_NODES), default=None,
                     help="Nodes at once (default: clush.conf's fanout, else 64)."),
        click.option("--timeout", "timeout_text", type=DURATION, default=DEFAULT_NODE_TIMEOUT, show_default=True, metavar="DURATION",
                     help="Per-node time limit; a node past it is 'timeout'."),
        click.option("--srun", "use_srun", is_flag=True, help="Run with srun (inside an allocation) instead of ssh."),
        click.option("--srun-arg", "srun_args", multiple=True, metavar="ARG", help="Extra srun argument (repeatable)."),
        click.option("--ssh-options", metavar="OPTS",
                     help="Extra ssh options (before clush.conf's ssh_options, so they win)."),
        click.option("--ssh-user", metavar="USER", help="ssh user (default: clush.conf's, else ssh's)."),
        click.option("--connect-timeout", "connect_timeout_text", type=DURATION, metavar="DURATION",
                     help="ssh connect timeout (default: clush.conf's connect_timeout)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def remote_settings(kw: dict[str, Any]):
    """The remote options as gpucheck.fleet.remote.RemoteOptions (durations parsed)."""
    from ..fleet.remote import RemoteOptions

    return RemoteOptions(
        level=kw["level"], checks=tuple(kw["checks"]), skips=tuple(kw["skips"]), snapshot_path=kw["snapshot_path"],
        injections=tuple(kw["injections"]), device=kw["device"], strict=kw["strict"], force=kw.get("force", False),
        run_args=tuple(kw["run_args"]), node_args=tuple(kw["node_args"]), remote_cmd=kw["remote_cmd"],
        fanout=kw["fanout"], timeout_s=_duration(kw["timeout_text"], "--timeout"), use_srun=kw["use_srun"],
        srun_args=tuple(kw.get("srun_args", ())), ssh_options=kw.get("ssh_options"), ssh_user=kw.get("ssh_user"),
        connect_timeout_s=_duration(kw.get("connect_timeout_text"), "--connect-timeout"))


def build_plan(nodes: list[str], *, subset: list[str] | None = None, **kw: Any):
    """gpucheck.fleet.remote.build_plan from the remote options; a PlanError is a usage error."""
    from ..fleet.remote import PlanError, build_plan as plan

    try:
        return plan(nodes, remote_settings(kw), subset=subset)
    except PlanError as e:
        raise click.BadParameter(str(e), param_hint=e.option) from None


def runner_settings(**kw: Any) -> "RunnerSettings":
    from ..fleet.remote import runner_settings as settings

    return settings(remote_settings(kw))


class _Progress:
    """A live progress bar on stderr (TTY only): nodes done / bad."""

    def __init__(self, total: int, label: str, strict: bool = False):
        self.total, self.done, self.bad, self.strict = total, 0, 0, strict
        self.progress = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            from ..render.console import make_console

            self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[bad]} bad", style="red", markup=False),
                                     TimeElapsedColumn(), console=make_console(sys.stderr), transient=True)
            self.task = self.progress.add_task(label, total=total, bad=0)
            self.progress.start()

    def node(self, outcome) -> None:
        self.done += 1
        self.bad += outcome.is_bad(self.strict)
        if self.progress is not None:
            self.progress.update(self.task, completed=self.done, bad=self.bad)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _print_sweep(outcomes, report: "SweepReport", strict: bool) -> None:
    from ..render.sweep_view import print_sweep

    print_sweep(outcomes, report, strict)


@click.command("sweep")
@click.argument("nodeset")
@remote_options
@click.option("--report", "report_path", metavar="FILE", help="Write the whole report (JSON) to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print the report JSON on stdout instead of the table.")
@click.option("--mad-z", type=FiniteFloat(min=0, max=1000, min_open=True), default=None,
              help="Robust z-score for throughput outliers (default 3.5).")
@click.option("--rel-floor", type=FiniteFloat(min=0, max=1), default=None,
              help="A throughput outlier is also at least this fraction below the median (default 0.05).")
def sweep_command(nodeset, report_path, as_json, mad_z, rel_floor, **kw) -> int:
    """Run `gpucheck run --json` on every node of NODESET, compare them, list the bad ones.

    NODESET uses Slurm/ClusterShell syntax, e.g. gpu[001-128,130]. Exit 0 when every node is
    healthy, 1 when any node fails, cannot be reached, times out or gives no verdict, 3 when
    SIGTERM/SIGINT stopped it (the nodes that answered are reported).
    """
    from ..fleet.sweep import VerdictSpool, report_chunks, save_report, spool_folder, sweep_report
    from ..platform.processes import stop_on_signals

    nodes = _nodes(nodeset)
    plan = build_plan(nodes, **kw)
    settings = runner_settings(**kw)
    if report_path:
        try:
            _check_writable(report_path, "--report")
        except UsageError as e:
            raise click.BadParameter(str(e).removeprefix("--report "), param_hint="--report") from None
    thresholds = {k: v for k, v in (("mad_z", mad_z), ("rel_floor", rel_floor)) if v is not None}

    # SIGTERM/SIGINT: stop the clients, report the nodes that answered, exit 3
    with stop_on_signals(), contextlib.ExitStack() as stack:
        spool = None
        if report_path or as_json:  # the verdicts wait on disk for the report
            try:
                spool = stack.enter_context(VerdictSpool(spool_folder(report_path)))
            except OSError as e:
                say_error(f"cannot create a temporary file: {e.strerror or e}", "gpucheck sweep")
                return 3
        with _progress(plan, kw["strict"]) as progress:
            outcomes, report = sweep_report(plan, settings, strict=kw["strict"], thresholds=thresholds, spool=spool,
                                            on_node=progress.node)
        for warning in save_report(report, spool, report_path):
            click.echo(f"gpucheck sweep: WARNING: {warning}", err=True)
        if as_json:
            for chunk in report_chunks(report, spool):
                sys.stdout.write(chunk)
        else:
            _print_sweep(outcomes, report, kw["strict"])
    return int(report["exit_code"])


@contextlib.contextmanager
def _progress(plan, strict: bool, label: str | None = None):
    """The progress bar of a sweep of `plan` (TTY only), closed on the way out."""
    progress = _Progress(len(plan.nodes), label or f"sweep {plan.mode}", strict)
    try:
        yield progress
    finally:
        progress.close()


def progress_sweep(plan, settings: "RunnerSettings", strict: bool, progress_label: str | None = None, spool=None):
    """gpucheck.fleet.sweep.sweep_until_stopped with the progress bar: a SweepRun."""
    from ..fleet.sweep import sweep_until_stopped

    with _progress(plan, strict, progress_label) as progress:
        return sweep_until_stopped(plan, settings, on_node=progress.node, spool=spool)
