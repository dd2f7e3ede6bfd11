"""`gpucheck sweep`, `gpucheck slurm prolog|epilog|resume`, `gpucheck bisect`: fleet commands.

See docs/fleet.md. The logic lives in gpucheck.fleet; this module parses options, shows progress
and tables, and maps outcomes to exit codes (0 healthy, 1 bad nodes found, 2 usage error,
3 could not judge). `slurm prolog|epilog` are the exception: 0 (go) or 42 (judged unhealthy),
and a usage error in their arguments is one more could-not-judge outcome (gpucheck.fleet.slurm).
"""

from __future__ import annotations

import json
import os
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


# -- slurm ------------------------------------------------------------------------------------

@click.group("slurm")
def slurm_group() -> None:
    """Slurm hooks (Prolog=/Epilog=) that drain unhealthy nodes, and resuming them.

    See docs/fleet.md for the slurm.conf lines and the wrapper scripts in scripts/slurm/.
    """


def hook_options(kind: str):
    def deco(f):
        budget_default = "15s" if kind == "prolog" else "60s"
        opts = [
            click.option("--level", "-l", metavar="LEVEL",
                         help="Level to run (prolog default 1; epilog: the config's, for the checks below)."),
            click.option("--check", "-c", "checks", multiple=True, metavar="ID",
                         help="Checks to run" + (" (default: xid, ecc, memory-remap)." if kind == "epilog" else ".")),
            click.option("--skip", "skips", multiple=True, metavar="ID", help="Skip these checks."),
            click.option("--budget", "budget_text", default=budget_default, show_default=True, metavar="DURATION",
                         help="Time budget of the run; past it the verdict is partial (could not judge)."),
            click.option("--on-error", type=click.Choice(["pass", "fail"]), default=None,
                         help="Could not judge: pass (log, do not drain) or fail (drain, exit 42). Default: "
                              "$GPUCHECK_ON_ERROR, else the config's run.on_error, else pass."),
            click.option("--strict", is_flag=True, default=None, help="Treat warn as unhealthy."),
            click.option("--snapshot", metavar="FILE",
                         help="Judge a recorded snapshot instead of live NVML ({node} is replaced by the node name)."),
            click.option("--state-dir", metavar="DIR",
                         help="State directory for the history ({node} is replaced; default /var/lib/gpucheck)."),
            click.option("--config", "config_path", metavar="FILE", help="TOML config."),
            click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True),
            click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True),
            click.option("--no-drain", is_flag=True, help="Judge and exit 1 when unhealthy, but do not drain."),
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
                click.option("--failed-budget", "failed_budget_text", default="10m", show_default=True,
                             metavar="DURATION", help="Time budget after a failed job."),
                click.option("--failed-check", "failed_checks", multiple=True, metavar="ID",
                             help="Only these checks after a failed job (default: all of --failed-level)."),
            ]
        for o in reversed(opts):
            f = o(f)
        return f
    return deco


def _hook(kind: str, kw: dict[str, Any]) -> int:
    from ..fleet.slurm import HookOptions, run_hook

    opts = HookOptions(
        kind=kind, level=kw["level"], checks=[c for s in kw["checks"] for c in s.split(",") if c.strip()],
        skips=[c for s in kw["skips"] for c in s.split(",") if c.strip()],
        budget_s=_duration(kw["budget_text"], "--budget"),
        failed_level=kw.get("failed_level"),
        failed_budget_s=_duration(kw.get("failed_budget_text"), "--failed-budget"),
        failed_checks=[c for s in kw.get("failed_checks", ()) for c in s.split(",") if c.strip()],
        on_error=kw["on_error"], strict=kw["strict"], snapshot=kw["snapshot"], state_dir=kw["state_dir"],
        config_path=kw["config_path"], device=kw["device"], workers=kw["workers"], drain=not kw["no_drain"],
        scontrol=kw["scontrol"], as_json=kw["as_json"], all_gpus=kw["all_gpus"], force=kw["force"],
    )
    return _hook_exit(run_hook(opts, os.environ))


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


def _option_value(args: list[str], name: str) -> str | None:
    """The last value of `name` in raw arguments (`--name V` or `--name=V`), for a hook whose
    arguments could not be parsed."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


def _hook_failed(kind: str, args: list[str], cause: str) -> int:
    """The hook could not run (a usage error in its settings, a crash before the pipeline): a
    could-not-judge outcome like any other, logged, recorded and on-error, with what can be read
    from its arguments."""
    from ..fleet.slurm import HookOptions, hook_failed

    on_error = _option_value(args, "--on-error")
    opts = HookOptions(kind=kind, on_error=on_error if on_error in ("pass", "fail") else None,
                       state_dir=_option_value(args, "--state-dir"), config_path=_option_value(args, "--config"),
                       scontrol=_option_value(args, "--scontrol"), drain="--no-drain" not in args)
    return _hook_exit(hook_failed(opts, os.environ, cause))


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

    def invoke(self, ctx: click.Context) -> Any:
        args = ctx.meta.get("gpucheck.hook_args", [])
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
    from ..fleet.nodeset import fold
    from ..fleet.slurm import default_runner, find_scontrol, resume_nodes
    from ..processes import Interrupted, stop_on_signals

    nodes = _nodes(nodeset)
    build_plan(nodes, **kw)  # validate the options before touching anything
    settings = runner_settings(**kw)

    def test(candidates: list[str]):
        plan = build_plan(nodes, subset=candidates, **kw)
        outcomes, _, interrupted = sweep_until_stopped(plan, settings, kw["strict"], "resume: sweep")
        judged = {o.node: (not o.is_bad(kw["strict"]), f"{o.status}" + (f": {o.reason}" if o.reason else ""))
                  for o in outcomes}
        if interrupted:
            raise Interrupted(interrupted, partial=judged)
        return judged

    with stop_on_signals():  # SIGTERM/SIGINT: stop the sweep, resume nothing more, report, exit 3
        try:
            decisions = resume_nodes(nodes, test=test, scontrol=find_scontrol(scontrol), runner=default_runner,
                                     dry_run=dry_run)
        except RuntimeError as e:
            click.echo(f"gpucheck slurm resume: {e}", err=True)
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
    if any(d.decision == "interrupted" for d in decisions):
        return 3
    return 1 if any(d.decision == "still-bad" for d in decisions) else 0



# -- bisect -----------------------------------------------------------------------------------
# Parse, call, render, exit: the bisection is gpucheck.fleet.bisect (the built-in test and its
# reference pairs: gpucheck.fleet.bisect.builtin).

def bisect_options(f):
    opts = [
        click.option("--test", "test_cmd", metavar="'COMMAND {nodes}'",
                     help="Group test: a shell command that exits 0 when the group is healthy; {nodes} is the "
                          "group as a node set ({nodes_comma}: comma list, {count}: size)."),
        click.option("--builtin", type=click.Choice(["allreduce"]), default=None,
                     help="Built-in group test: collectives (--ops) with data verification, bandwidth judged "
                          "on reference pairs, plus the bitwise check."),
        click.option("--strategy", type=click.Choice(["binary", "grid"]), default="binary", show_default=True,
                     help="binary: the whole set, then split (fewest rounds; with --parallel 1 fewest tests); "
                          "grid: rows then columns."),
        click.option("--group-size", type=click.IntRange(min=1), default=None,
                     help="Nodes one replay needs (grid rows, confirm groups); default sqrt(N) for the grid."),
        click.option("--max-bad", type=click.IntRange(min=1), default=None, help="At most this many bad nodes (if known)."),
        click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Re-test each suspect this many times (and vote), for flaky tests."),
        click.option("--flake-rate", type=click.FloatRange(0.0, 0.5, max_open=True), default=0.05, show_default=True,
                     help="Assumed rate of wrong test results, for the confidence figure."),
        click.option("--parallel", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Most tests at once (0: every disjoint group of a round; 1: one test a round, "
                          "generalized binary splitting)."),
        click.option("--test-timeout", "test_timeout_text", default="30m", show_default=True, metavar="DURATION",
                     help="Per-test time limit; a test past it fails (every test past it: the test is broken)."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (rounds go to stderr)."),
        click.option("--dry-run", is_flag=True, help="Show the plan; run nothing."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def builtin_options(f):
    opts = [
        click.option("--launcher", default=None, metavar="TEMPLATE",
                     help="builtin: how to start a rank on a host ({host}, {addr}, {cmd}/{qcmd}; default ssh; 'srun')."),
        click.option("--addr", "addrs", multiple=True, metavar="HOST=ADDR", help="builtin: a host's rendezvous address."),
        click.option("--program", default="gpucheck", show_default=True, help="builtin: how hosts start gpucheck."),
        click.option("--ops", default="all_gather,all_reduce", show_default=True,
                     help="builtin: collectives, each verified and judged by its busbw."),
        click.option("--sizes", "sizes_text", default="16M", show_default=True, help="builtin: message sizes."),
        click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True),
        click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True),
        click.option("--timeout", "coll_timeout_text", default="30s", show_default=True, metavar="DURATION",
                     help="builtin: per-collective timeout (a hang past it fails the group)."),
        click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True),
        click.option("--ifname", default=None, metavar="IFACE",
                     help="builtin: network interface (default: the one that routes to the other hosts)."),
        click.option("--slow-limit", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.5, show_default=True,
                     help="builtin: a pair below this fraction of its round's reference busbw is slow."),
        click.option("--min-busbw", type=click.FloatRange(min=0.0, min_open=True), default=None,
                     help="builtin: every measurement below this bus bandwidth (GB/s) fails."),
        click.option("--bitwise/--no-bitwise", default=True, show_default=True,
                     help="builtin: also run the bitwise reproducibility check on every node."),
        click.option("--bitwise-arg", "bitwise_args", multiple=True, metavar="ARG",
                     help="builtin: extra `gpucheck run` argument for the bitwise check (e.g. --device)."),
        click.option("--force", is_flag=True,
                     help="builtin: load GPUs that a job is using (passed to `nccl run` and the bitwise check)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command("bisect")
@click.argument("nodeset")
@bisect_options
@builtin_options
def bisect_command(nodeset, test_cmd, builtin, strategy, group_size, max_bad, repeats, flake_rate, parallel,
                   test_timeout_text, as_json, dry_run, **builtin_kw) -> int:
    """Find the bad node(s) of a failing job's NODESET with group tests.

    Exit 0 when no bad node is found, 1 when some are (printed as a node set), 2 on usage
    errors, 3 when the tests could not localize a fault (the test is broken, no single bad node
    explains the failure, a node's bandwidth had no reference) or SIGTERM/SIGINT stopped them.
    """
    from ..fleet import bisect as B
    from ..processes import stop_on_signals

    nodes = _nodes(nodeset)
    if bool(test_cmd) == bool(builtin):
        raise click.UsageError("give exactly one of --test 'COMMAND {nodes}' and --builtin allreduce")
    min_group = 2 if builtin else 1
    deadline = _duration(test_timeout_text, "--test-timeout")
    if test_cmd:
        try:
            test = B.CommandTest(test_cmd, timeout_s=deadline)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--test") from None
        screen, command = None, test_cmd
    else:
        test, screen = _builtin_test(nodes, deadline=deadline, repeats=repeats, flake_rate=flake_rate, **builtin_kw)
        command = test.command(nodes[:2])
    if dry_run:
        for line in B.plan_text(nodes, strategy=strategy, group_size=group_size, min_group=min_group,
                                repeats=repeats, max_bad=max_bad, parallel=parallel, pairs_first=bool(builtin)):
            click.echo(line)
        return 0
    out = sys.stderr if as_json else sys.stdout
    with stop_on_signals():  # SIGTERM/SIGINT: stop the running tests, print the rounds so far, exit 3
        try:
            result = B.bisect(nodes, test, strategy=strategy, group_size=group_size, min_group=min_group,
                              max_bad=max_bad, repeats=repeats, flake_rate=flake_rate, parallel=parallel,
                              on_round=lambda n, recs: _print_round(n, recs, out), screen=screen, command=command)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        return _print_bisect(result, as_json)


def _print_round(number: int, records, out) -> None:
    failed = [r for r in records if not r.healthy]
    shown = failed + [r for r in records if r.healthy][: max(0, 12 - len(failed))]
    print(f"round {number} ({records[0].phase}): {len(records)} test(s), {len(failed)} failed", file=out, flush=True)
    for r in shown:
        subject = f" [{r.subject}]" if r.subject else ""
        state = "ok  " if r.healthy else "FAIL"
        phase = f" ({r.phase})" if r.phase != records[0].phase else ""
        print(f"  {state} {r.label}{subject}{phase} ({r.duration_s:.1f} s)" + (f": {r.detail}" if r.detail else ""),
              file=out, flush=True)
    if len(shown) < len(records):
        print(f"  ... {len(records) - len(shown)} more passed", file=out, flush=True)


def _print_bisect(result, as_json: bool) -> int:
    from ..fleet.nodeset import fold

    doc = result.to_dict()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return doc["exit_code"]
    _print_bandwidth(result.bandwidth)
    for s in result.bad:
        click.echo(f"BAD {s.node}: {s.failures}/{s.runs} re-tests failed, confidence {s.confidence:.3f}")
        for line in s.evidence:
            click.echo(f"    {line}")
    for s in result.cleared:
        click.echo(f"cleared {s.node}: {s.failures}/{s.runs} re-tests failed (a wrong or flaky result in the search)")
    for note in result.notes:
        click.echo(f"note: {note}")
    click.echo(f"{result.tests} test(s) in {result.rounds} round(s) ({result.search_tests} test(s) in "
               f"{result.search_rounds} round(s) to search, the rest to confirm), {result.duration_s:.1f} s")
    if result.interrupted:
        click.echo(f"interrupted by {result.interrupted}: the bisection did not finish, no node was judged")
    elif result.broken:
        click.echo(f"the group test is broken: {result.broken}")
        click.echo(f"command: {result.command}")
        click.echo("no node was judged")
    elif not result.verified:
        found = f" (found failing: {fold(result.bad_nodes)})" if result.bad else ""
        click.echo(f"no single bad node explains the failure: the nodes not reported bad do not pass together"
                   f"{found}; could not localize the fault")
    elif result.bad:
        click.echo(f"bad nodes: {fold(result.bad_nodes)}")
    elif result.unjudged:
        click.echo(f"bandwidth not judged for {fold(result.unjudged)}: no reference pair (give --min-busbw)")
    else:
        click.echo("no bad node: the group test passes")
    return doc["exit_code"]


def _print_bandwidth(bw) -> None:
    """The reference the pairs were judged against (the first round's, per collective)."""
    if not bw:
        return
    first: dict[str, dict] = {}
    for r in bw["references"]:
        first.setdefault(r["op"], r)
    for op, r in first.items():
        value = "none" if r["busbw_gbs"] is None else f"{r['busbw_gbs']:.4g} GB/s busbw"
        click.echo(f"bandwidth reference {op}: {value} ({r['how']})")
    if first:
        click.echo(f"pairs are compared only with pairs measured as many at once; a pair below "
                   f"{bw['slow_limit']:g} x the reference is slow")


def _builtin_test(nodes, *, deadline, repeats, flake_rate, launcher, addrs, program, ops, sizes_text, iters, warmup,
                  coll_timeout_text, backend, ifname, slow_limit, min_busbw, bitwise, bitwise_args, force):
    from ..fleet.bisect.builtin import make_builtin
    from ..nccl.bandwidth import parse_ops, parse_sizes
    from .nccl import launcher_of

    try:
        sizes = parse_sizes(sizes_text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sizes") from None
    try:
        op_list = parse_ops(ops)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--ops") from None
    lau = launcher_of(nodes, launcher, addrs, program)
    return make_builtin(lau, ops=op_list, sizes=sizes, iters=iters, warmup=warmup,
                        timeout_s=_duration(coll_timeout_text, "--timeout"), backend=backend, ifname=ifname,
                        deadline_s=deadline, slow_limit=slow_limit, min_busbw=min_busbw, bitwise=bitwise,
                        bitwise_args=list(bitwise_args), force=force, repeats=repeats, flake_rate=flake_rate)
