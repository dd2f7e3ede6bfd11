"""`gpucheck sweep`: `gpucheck run --json` on many nodes, compared and classified; and the
options shared with `gpucheck slurm resume` (how to run gpucheck on the nodes).

See docs/fleet.md. The logic lives in gpucheck.fleet; this module parses options, shows progress
and tables, and maps outcomes to exit codes (0 healthy, 1 bad nodes found, 2 usage error,
3 could not judge).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from .run import parse_duration

DEFAULT_NODE_TIMEOUT = "10m"


def _nodes(text: str, param: str = "NODESET") -> list[str]:
    from ..fleet.nodeset import NodeSetError, parse_nodeset

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
        click.option("--level", "-l", metavar="LEVEL",
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
        click.option("--fanout", type=click.IntRange(min=1), default=None,
                     help="Nodes at once (default: clush.conf's fanout, else 64)."),
        click.option("--timeout", "timeout_text", default=DEFAULT_NODE_TIMEOUT, show_default=True, metavar="DURATION",
                     help="Per-node time limit; a node past it is 'timeout'."),
        click.option("--srun", "use_srun", is_flag=True, help="Run with srun (inside an allocation) instead of ssh."),
        click.option("--srun-arg", "srun_args", multiple=True, metavar="ARG", help="Extra srun argument (repeatable)."),
        click.option("--ssh-options", metavar="OPTS",
                     help="Extra ssh options (before clush.conf's ssh_options, so they win)."),
        click.option("--ssh-user", metavar="USER", help="ssh user (default: clush.conf's, else ssh's)."),
        click.option("--connect-timeout", "connect_timeout_text", metavar="DURATION",
                     help="ssh connect timeout (default: clush.conf's connect_timeout)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_plan(nodes: list[str], *, subset: list[str] | None = None, level, checks, skips, snapshot_path,
               injections, device, strict, run_args, node_args, remote_cmd, fanout, timeout_text, use_srun,
               force=False, **_ignored):
    from ..fleet.nodeset import NodeSetError, parse_node_map
    from ..fleet.sweep import SweepPlan, remote_command

    args: list[str] = []
    if level:
        args += ["--level", str(level)]
    for c in checks:
        args += ["--check", c]
    for s in skips:
        args += ["--skip", s]
    if snapshot_path:
        args += ["--snapshot", snapshot_path]
    for i in injections:
        args += ["--inject", i]
    if device:
        args += ["--device", device]
    if strict:
        args.append("--strict")
    if force:
        args.append("--force")
    args += list(run_args)
    try:
        per_node = parse_node_map(node_args, nodes, what="--node-args")
    except NodeSetError as e:
        raise click.BadParameter(str(e), param_hint="--node-args") from None
    for node, extra in per_node.items():
        try:
            remote_command(remote_cmd, args, extra)
        except ValueError as e:
            raise click.BadParameter(f"{node}: {extra!r}: {e}", param_hint="--node-args") from None
    if subset is not None:  # run on these nodes only (the node arguments were checked against all)
        nodes = [n for n in nodes if n in set(subset)]
        per_node = {n: a for n, a in per_node.items() if n in set(subset)}
    return SweepPlan(nodes=nodes, remote_cmd=remote_cmd, run_args=args, node_args=per_node,
                     mode="srun" if use_srun else "ssh", fanout=fanout,
                     timeout_s=_duration(timeout_text, "--timeout"))


def runner_settings(*, srun_args, ssh_options, ssh_user, connect_timeout_text, **_ignored) -> dict[str, Any]:
    from ..fleet.fanout import SrunSettings, SshSettings

    return {
        "ssh": SshSettings(ssh_options=ssh_options, ssh_user=ssh_user,
                           connect_timeout_s=_duration(connect_timeout_text, "--connect-timeout")),
        "srun": SrunSettings(extra_args=list(srun_args)),
    }


class _Progress:
    """A live progress bar on stderr (TTY only): nodes done / bad."""

    def __init__(self, total: int, label: str, strict: bool = False):
        self.total, self.done, self.bad, self.strict = total, 0, 0, strict
        self.progress = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("[red]{task.fields[bad]} bad"), TimeElapsedColumn(),
                                     console=Console(file=sys.stderr), transient=True)
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


_STYLE = {"pass": "green", "warn": "yellow", "skip": "dim", "fail": "bold red", "error": "magenta",
          "unreachable": "bold magenta", "timeout": "bold magenta"}


def _print_sweep(outcomes, report: dict[str, Any], strict: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..fleet.sweep import failing_text

    console = Console(file=sys.stdout, highlight=False, soft_wrap=False)
    table = Table(header_style="bold")
    for col in ("node", "status", "failing checks", "cause", "action"):
        table.add_column(col, overflow="fold")
    order = {"fail": 0, "unreachable": 1, "timeout": 2, "error": 3, "warn": 4, "pass": 5, "skip": 6}
    for o in sorted(outcomes, key=lambda o: (order.get(o.status, 9), o.node)):
        failing = failing_text(o.failing)
        if o.fleet:
            failing = ", ".join(x for x in (failing, "fleet") if x)
        cause = "; ".join(x for x in (o.reason, *o.fleet) if x)
        table.add_row(escape(o.node), f"[{_STYLE.get(o.status, '')}]{o.status.upper()}[/]",
                      escape(failing or "-"), escape(cause or "-"), o.action if o.action != "none" else "")
    console.print(table)
    counts = ", ".join(f"{n} {s}" for s, n in report["counts"].items() if n)
    # Plain lines from here: a folded node set must never be wrapped (it is pasted into scontrol).
    click.echo(f"{len(outcomes)} node(s) in {report['duration_s']:.1f} s: {counts}")
    bitwise = report["fleet"].get("bitwise", {})
    if not bitwise.get("compared", False):
        click.echo(f"bitwise comparison: {bitwise.get('why', 'unavailable')}")
    if report["bad"]:
        click.echo(f"bad nodes: {report['bad']}")
        for status, ns in report["by_status"].items():
            if status not in ("pass", "skip") and (status != "warn" or strict):
                click.echo(f"  {status}: {ns}")
    elif not report.get("interrupted"):
        click.echo("all nodes healthy")
    if report.get("interrupted"):
        click.echo(f"interrupted by {report['interrupted']}: {len(outcomes)} of {report['planned']} node(s) "
                   f"answered; not answered: {report['unanswered'] or 'none'}")


@click.command("sweep")
@click.argument("nodeset")
@remote_options
@click.option("--report", "report_path", metavar="FILE", help="Write the whole report (JSON) to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print the report JSON on stdout instead of the table.")
@click.option("--mad-z", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Robust z-score for throughput outliers (default 3.5).")
@click.option("--rel-floor", type=click.FloatRange(min=0), default=None,
              help="A throughput outlier is also at least this fraction below the median (default 0.05).")
def sweep_command(nodeset, report_path, as_json, mad_z, rel_floor, **kw) -> int:
    """Run `gpucheck run --json` on every node of NODESET, compare them, list the bad ones.

    NODESET uses Slurm/ClusterShell syntax, e.g. gpu[001-128,130]. Exit 0 when every node is
    healthy, 1 when any node fails, cannot be reached, times out or gives no verdict, 3 when
    SIGTERM/SIGINT stopped it (the nodes that answered are reported).
    """
    import contextlib
    import os

    from ..app import _check_writable, UsageError
    from ..fleet import compare
    from ..fleet.sweep import VerdictSpool, apply_fleet, build_report
    from ..processes import stop_on_signals

    nodes = _nodes(nodeset)
    plan = build_plan(nodes, **kw)
    settings = runner_settings(**kw)
    if report_path:
        try:
            _check_writable(report_path, "--report")
        except UsageError as e:
            raise click.BadParameter(str(e).removeprefix("--report "), param_hint="--report") from None
    thresholds = {k: v for k, v in (("mad_z", mad_z), ("rel_floor", rel_floor)) if v is not None}

    started = time.time()
    # SIGTERM/SIGINT: stop the clients, report the nodes that answered, exit 3
    with stop_on_signals(), contextlib.ExitStack() as stack:
        spool = None
        if report_path or as_json:  # the verdicts wait on disk for the report
            try:
                spool = stack.enter_context(VerdictSpool(_spool_folder(report_path)))
            except OSError as e:
                click.echo(f"gpucheck sweep: error: cannot create a temporary file: {e.strerror or e}", err=True)
                return 3
        outcomes, duration, interrupted = sweep_until_stopped(plan, settings, kw["strict"], spool=spool)
        comparison = compare.compare_inputs({o.node: o.inputs for o in outcomes if o.inputs is not None},
                                            **thresholds)
        apply_fleet(outcomes, compare.findings_by_node(comparison))
        report = build_report(outcomes, comparison, plan=plan, started_at=started, duration_s=duration,
                              strict=kw["strict"])
        if interrupted:
            mark_interrupted(report, plan, outcomes, interrupted)
        _emit_report(report, spool, report_path, as_json)
        if not as_json:
            _print_sweep(outcomes, report, kw["strict"])
    return int(report["exit_code"])


def _spool_folder(report_path: str | None) -> str | None:
    """Where the verdicts wait for the report: next to a report that is (or will be) a regular
    file, so a big fleet does not fill the temporary folder; else (no report, or a FIFO, a
    terminal, /dev/null as the report) the temporary folder."""
    import os
    import stat

    if not report_path:
        return None
    try:
        st = os.stat(report_path)
    except FileNotFoundError:
        return os.path.dirname(os.path.abspath(report_path))
    except OSError:
        return None
    return os.path.dirname(os.path.abspath(report_path)) if stat.S_ISREG(st.st_mode) else None


def _emit_report(report: dict[str, Any], spool, report_path: str | None, as_json: bool) -> None:
    """--report and --json. The sweep's result (its exit code) never depends on them: a report
    that cannot be written, or verdicts the spool could not keep (a full disk), are warnings."""
    from ..fleet.sweep import report_chunks
    from ..safeio import output_problem

    stands = f"the sweep's result stands (exit {report['exit_code']})"
    if spool is not None and spool.error:
        click.echo(f"gpucheck sweep: WARNING: {spool.error}: the report lacks those verdicts"
                   + ("; --report not written" if report_path else "") + f"; {stands}", err=True)
        report_path = None  # never replace a good old report with an incomplete one
    if report_path:
        try:
            write_report(report_path, report_chunks(report, spool))
        except OSError as e:  # found after the sweep: a loud warning, never a masked result
            click.echo(f"gpucheck sweep: WARNING: --report {report_path} was not written: "
                       f"{output_problem(e, report_path)}; {stands}", err=True)
    if as_json:
        for chunk in report_chunks(report, spool):
            sys.stdout.write(chunk)


def sweep_until_stopped(plan, settings: dict[str, Any], strict: bool, progress_label: str | None = None,
                        spool=None):
    """run_sweep with the fan-out; on a stop (processes.Interrupted) the outcomes of the nodes
    that answered before it. Returns (outcomes in node order, wall time, the signal or None)."""
    from ..fleet.fanout import run_nodes
    from ..fleet.sweep import run_sweep
    from ..processes import Interrupted

    t0 = time.monotonic()
    answered = {}
    progress = _Progress(len(plan.nodes), progress_label or f"sweep {plan.mode}", strict)

    def on_node(outcome) -> None:
        answered[outcome.node] = outcome
        progress.node(outcome)

    try:
        outcomes, duration = run_sweep(plan, runner=run_nodes, on_node=on_node, spool=spool, **settings)
        return outcomes, duration, None
    except Interrupted as e:
        return [answered[n] for n in plan.nodes if n in answered], time.monotonic() - t0, e.signame
    finally:
        progress.close()


def mark_interrupted(report: dict[str, Any], plan, outcomes, signame: str) -> None:
    """A sweep report cut short: it covers only the nodes that answered, names the others, and
    its exit code is 3 (could not judge the node set)."""
    from ..fleet.nodeset import fold

    seen = {o.node for o in outcomes}
    report["interrupted"] = signame
    report["unanswered"] = fold(n for n in plan.nodes if n not in seen)
    report["planned"] = len(plan.nodes)
    report["exit_code"] = 3


def write_report(path: str, chunks) -> None:
    """Write the report's text chunks to `path` (gpucheck.safeio: a regular file replaced by an
    atomic rename, or written into a FIFO, /dev/null or a terminal; a device or an untrusted
    symlink is refused, never replaced). The report is one line: the indented encoder is ten
    times slower on a big fleet."""
    from ..safeio import write_output

    write_output(path, chunks)
