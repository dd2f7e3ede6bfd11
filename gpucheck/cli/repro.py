"""`gpucheck repro`: bitwise reproducibility (the repro.bitwise check) and its reference file.

    gpucheck repro check                              # level 1: the fast subset, default reference
    gpucheck repro check --level 2 --reference refs.json
    gpucheck repro check --device cpu --workers 3 --inject bitflip:gpu=1
    gpucheck repro record --out refs.json             # on a known-good node: all workloads (level 2)
    gpucheck repro record --device cpu --workers 2 --out refs.json

`check` goes through the run pipeline (verdict, --json, --output, history, exit codes as for
`gpucheck run`). `record` runs every selected workload twice on every selected GPU and adds the
digests to the reference file under the node's fingerprint, atomically; it refuses (exit 1,
file unchanged) when a GPU is non-deterministic, when the node's GPUs disagree among themselves,
when a digest disagrees with one already recorded for the same fingerprint, and whenever
--inject is given. Exit codes: 0 recorded (or already recorded), 1 refused, 2 usage error,
3 could not run the workloads (no GPU, no CUDA in torch, interrupted). What may be recorded and
the exit codes are gpucheck.repro_record's; this module parses, renders and exits.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..app import UsageError, parse_gpu_list
from ..repro_record import CHECK_ID, RecordRequest, RecordUsageError, record_references
from ..tests_suite.repro_bitwise import ReproOptions, repro_bitwise
from .check_options import check_options, chosen, chosen_options
from .level_option import LEVEL
from .run import WORKER_COUNT, common_run_options, build_request


@click.group("repro")
def repro_group() -> None:
    """Bitwise reproducibility: reference workloads, recorded digests, comparison across GPUs."""


@repro_group.command("check")
@check_options(repro_bitwise, only=("reference",))
@click.option("--level", "-l", type=LEVEL, default="1", show_default=True,
              help="1: the fast subset; 2 and above: every workload.")
@check_options(repro_bitwise, exclude=("reference",))
@common_run_options
def check_command(level: str, **kw: Any) -> int:
    """Run the reference workloads on every GPU and compare their bits with the reference, with
    each other and with a second run (the repro.bitwise check)."""
    from ..app import execute

    req = build_request(level=level, checks=(CHECK_ID,), skips=(), check_options=chosen_options(), **kw)
    return execute(req)


@repro_group.command("record")
@click.option("--out", "out", metavar="FILE",
              help="Reference file to add to (default: the check's `reference` parameter, "
                   "/etc/gpucheck/repro-refs.json). Created when missing.")
@click.option("--level", "-l", type=LEVEL, default="2", show_default=True,
              help="2 and above: every workload; 1: only the fast subset.")
@check_options(repro_bitwise, only=("workloads",))
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="cpu: CPU worker processes stand in for GPUs (their own fingerprint).")
@click.option("--workers", type=WORKER_COUNT, default=2, show_default=True,
              help=f"CPU workers with --device cpu (at most {WORKER_COUNT.max}).")
@click.option("--gpus", "gpus_text", metavar="LIST", help="GPU indices to run on, e.g. 0,3 or 0-3 (default: all).")
@click.option("--config", "config_path", metavar="FILE", help="TOML config (default /etc/gpucheck/config.toml).")
@click.option("--inject", "injections", multiple=True, metavar="SPEC",
              help="Fault injection (demo/test): the run is judged, and nothing is ever written.")
@click.option("--dry-run", is_flag=True, help="Run and judge, but do not write the file.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary alone on stdout.")
@click.option("--force", is_flag=True,
              help="Run on GPUs that a job is using (default: refuse to record, exit 3).")
def record_command(out: str | None, level: str, device: str, workers: int,
                   gpus_text: str | None, config_path: str | None, injections: tuple[str, ...], dry_run: bool,
                   as_json: bool, force: bool) -> int:
    """On a known-good node: run the reference workloads twice on every GPU and record the
    digests under this node's fingerprint."""
    try:
        gpus = parse_gpu_list(gpus_text)
    except UsageError as e:
        raise click.BadParameter(str(e).removeprefix("--gpus: "), param_hint="--gpus") from None

    def say(kind: str, text: str) -> None:
        if kind in ("warning", "error") or not as_json:
            click.echo(text, err=kind != "info")

    workloads = chosen(ReproOptions).workloads
    req = RecordRequest(out=out, level=level, workloads=None if workloads is None else list(workloads), device=device,
                        workers=workers, gpus=gpus, config_path=config_path, injections=list(injections),
                        dry_run=dry_run, force=force)
    try:
        outcome = record_references(req, say)
    except RecordUsageError as e:
        if e.option is None:
            raise click.UsageError(str(e)) from None
        raise click.BadParameter(str(e), param_hint=e.option) from None
    if as_json and outcome.summary is not None:
        click.echo(json.dumps(outcome.summary, indent=2))
    sys.stdout.flush()
    return outcome.exit_code
