"""`gpucheck run`, `gpucheck list`, `gpucheck schema`."""

from __future__ import annotations

import json
import sys

import click

from ..app import MAX_WORKERS, RunRequest, UsageError, execute, parse_gpu_list
from ..core.check import Context
from ..core.config import limit_of
from ..core.levels import Level
from ..core.options import declared
from ..core.verdict import SCHEMA
from .level_option import LEVEL
from .numbers import DURATION

# --workers: CPU worker processes standing in for GPUs, bounded like --gpus (checked when parsed,
# before a list of that many indices is built or a process started).
WORKER_COUNT = click.IntRange(min=1, max=MAX_WORKERS)


def gpus_option(f):
    return click.option("--gpus", "gpus_text", metavar="LIST",
                        help="GPU indices to test, e.g. 0,3 or 0-3 (default: all).")(f)


def parse_duration(text: str | None) -> float | None:
    """A duration option ('90', '30s', '5m', '1h30m') -> seconds; click.BadParameter otherwise."""
    if text is None:
        return None
    from ..platform.durations import parse_duration as parse

    try:
        return parse(text)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def common_run_options(f):
    """Options shared by `run` and the per-check commands (burn, ...)."""
    opts = [
        click.option("--json", "as_json", is_flag=True, help="Print the verdict JSON alone on stdout."),
        click.option("--verbose", "-v", is_flag=True,
                     help="Print one row per result (the full table) instead of the check x GPU grid."),
        click.option("--output", "-o", metavar="FILE", help="Also write the verdict JSON to FILE (atomically)."),
        click.option("--prom", metavar="FILE", help="Write Prometheus textfile-collector metrics to FILE."),
        click.option("--strict", is_flag=True, default=None, help="Treat warn as unhealthy (exit 1)."),
        click.option("--on-error", type=click.Choice(["pass", "fail"]), default=None,
                     help="Exit code for could-not-judge: pass -> 3 (default), fail -> 1 (fail-closed)."),
        click.option("--config", "config_path", metavar="FILE", help="TOML config (default /etc/gpucheck/config.toml)."),
        click.option("--snapshot", "snapshot_path", metavar="FILE",
                     help="Judge a recorded telemetry snapshot, or an nvidia-smi -q / -q -x capture, instead of "
                          "live NVML (- is standard input)."),
        click.option("--state-dir", metavar="DIR", help="State directory (history, cursors)."),
        click.option("--no-history", is_flag=True, help="Do not read or append the verdict history."),
        click.option("--timeout", "timeout_text", type=DURATION, metavar="DURATION",
                     help="Whole-run time limit (e.g. 15s), hard: the run ends within it (+1 s). What it "
                          "cuts, or a check it cannot hold, makes the verdict partial, exit 3."),
        click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
                     help="Where compute checks run; cpu runs them with small sizes on CPU workers."),
        click.option("--workers", type=WORKER_COUNT, default=2, show_default=True,
                     help=f"CPU workers standing in for GPUs with --device cpu (at most {MAX_WORKERS})."),
        click.option("--inject", "injections", multiple=True, metavar="SPEC",
                     help="Fault injection for tests/demos, e.g. bitflip:gpu=1 (shown in the verdict)."),
        gpus_option,
        click.option("--force", is_flag=True,
                     help="Load GPUs that a job is using (NVML lists its processes) instead of skipping them "
                          "(exit 3); the results say so."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_request(*, level, checks, skips, gpus_text, as_json, output, prom, strict, on_error,
                  config_path, snapshot_path, state_dir, no_history, timeout_text, device, workers,
                  injections, options=None, check_options=(), force=False, verbose=False) -> RunRequest:
    try:
        gpus = parse_gpu_list(gpus_text)
    except UsageError as e:
        raise click.BadParameter(str(e).removeprefix("--gpus: "), param_hint="--gpus") from None
    return RunRequest(
        level=level,
        check_patterns=[c for spec in checks for c in spec.split(",") if c.strip()],
        skip_patterns=[c for spec in skips for c in spec.split(",") if c.strip()],
        gpus=gpus,
        device=device,
        workers=workers,
        injections=list(injections),
        options=dict(options or {}),
        check_options=tuple(check_options),
        json=as_json,
        output=output,
        prom=prom,
        strict=strict,
        on_error=on_error,
        config_path=config_path,
        snapshot_path=snapshot_path,
        state_dir=state_dir,
        timeout_s=parse_duration(timeout_text),
        history=not no_history,
        force=force,
        verbose=verbose,
    )


@click.command("run")
@click.option("--level", "-l", type=LEVEL, metavar="LEVEL",
              help="1|2|3|4 or quick|standard|extended|burn-in (default 1, or the config's run.level).")
@click.option("--check", "-c", "checks", multiple=True, metavar="ID",
              help="Run only these checks (ids or globs like 'burn.*'; repeatable or comma-separated).")
@click.option("--skip", "skips", multiple=True, metavar="ID", help="Skip these checks.")
@click.option("--option", "option_texts", multiple=True, metavar="ID:NAME=VALUE",
              help="A check's own option, as its command spells it (e.g. burn.gemm:duration=5m, "
                   "eud.memtest:pattern=zeros; repeatable). `gpucheck list --json` lists each check's options.")
@common_run_options
def run_command(level, checks, skips, option_texts, **kw) -> int:
    """Run the checks of a level and print a verdict."""
    check_options = ()
    if option_texts:
        from ..tests_suite.registry import find
        from .check_options import options_from_text

        check_options = options_from_text(option_texts, find)
    req = build_request(level=level, checks=checks, skips=skips, check_options=check_options, **kw)
    return execute(req)


def _listed_budget(check) -> float:
    """A check's time budget at its own level with the default settings (budgets that depend on
    the run, a burn's duration, are computed rather than shown as the static default)."""
    try:
        return round(check.spec.budget(Context(level=check.spec.level)), 1)
    except Exception:  # a budget function that needs a live run: the static figure
        return check.spec.budget_s


@click.command("list")
@click.option("--level", "-l", type=LEVEL, metavar="LEVEL", help="Only checks that run at this level.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@click.option("--defaults", is_flag=True,
              help="Every check's thresholds and parameters at their defaults, as TOML that --config accepts.")
def list_command(level, as_json, defaults) -> int:
    """Show every check: id, level, needs, time budget, what it detects."""
    from ..tests_suite.registry import all_checks

    checks = all_checks()
    if level is not None:
        try:
            lv = Level.parse(level)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--level") from None
        checks = [c for c in checks if c.spec.level <= lv]
    rows = [
        {
            "id": c.id,
            "level": int(c.spec.level),
            "level_name": c.spec.level.label,
            "needs": [n.value for n in c.spec.needs],
            "budget_s": _listed_budget(c),
            "title": c.spec.title,
            "detects": c.spec.detects,
            "defaults": c.spec.defaults,
            "ranges": {k: _range_text(limit_of(c.spec, k)) for k in c.spec.defaults},
            "injects": list(c.spec.injects),
            "options": _options_of(c),
        }
        for c in checks
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return 0
    from ..render.check_list import check_table, defaults_toml

    if defaults:  # TOML that --config accepts: `gpucheck list --defaults > config.toml`
        click.echo(defaults_toml(rows), nl=False)
        return 0
    from ..render.console import make_console

    make_console(sys.stdout).print(check_table(rows))
    return 0


def _options_of(check) -> dict[str, str]:
    """A check's own options (gpucheck.core.options): name (as `--option ID:NAME=VALUE` gives it) -> help."""
    if check.spec.options is None:
        return {}
    return {decl.name: decl.help for _, decl in declared(check.spec.options)}


def _range_text(limit) -> str:  # a gpucheck.core.config.Limit
    return limit.describe(limit.kind)


@click.command("schema")
def schema_command() -> int:
    """Print the verdict JSON Schema."""
    click.echo(json.dumps(SCHEMA, indent=2))
    return 0
