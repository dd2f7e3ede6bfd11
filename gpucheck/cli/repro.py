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
3 could not run the workloads (no GPU, no CUDA in torch, interrupted).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import click

from .run import WORKER_COUNT, common_run_options, build_request

CHECK_ID = "repro.bitwise"


def _workloads(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str] | None:
    if not value:
        return None
    from ..repro.workloads import WORKLOADS

    names = [n.strip() for v in value for n in v.split(",") if n.strip()]
    bad = [n for n in names if n != "all" and n not in WORKLOADS]
    if bad:
        raise click.BadParameter(f"unknown workload {bad[0]!r} (known: {', '.join(WORKLOADS)}, all)")
    return names


def _workload_option(f):
    return click.option("--workload", "workloads", multiple=True, callback=_workloads, metavar="NAME",
                        help="Workloads to run (comma list or repeated; default by level: "
                             "gemm.bf16,gemm.fp32 at 1, all at 2).")(f)


@click.group("repro")
def repro_group() -> None:
    """Bitwise reproducibility: reference workloads, recorded digests, comparison across GPUs."""


@repro_group.command("check")
@click.option("--reference", metavar="FILE",
              help="Reference file (default: the check's `reference` parameter, /etc/gpucheck/repro-refs.json; "
                   "a missing default file means no reference).")
@click.option("--level", "-l", default="1", show_default=True,
              help="1: the fast subset; 2 and above: every workload.")
@_workload_option
@common_run_options
def check_command(reference: str | None, level: str, workloads: list[str] | None, **kw: Any) -> int:
    """Run the reference workloads on every GPU and compare their bits with the reference, with
    each other and with a second run (the repro.bitwise check)."""
    from ..repro import store

    options: dict[str, Any] = {}
    if reference:
        try:
            store.load(reference)
        except store.RefFileError as e:
            raise click.BadParameter(str(e), param_hint="--reference") from None
        options["reference"] = reference
    if workloads:
        options["workloads"] = workloads
    from ..app import execute

    req = build_request(level=level, checks=(CHECK_ID,), skips=(), options=options, **kw)
    return execute(req)


def _check_out(path: str) -> None:
    """A usage error (exit 2) when `repro record` could not write `path` (store.check_writable)."""
    from ..repro import store

    try:
        store.check_writable(path)
    except store.RefFileError as e:
        raise click.BadParameter(str(e), param_hint="--out") from None


@repro_group.command("record")
@click.option("--out", "out", metavar="FILE",
              help="Reference file to add to (default: the check's `reference` parameter, "
                   "/etc/gpucheck/repro-refs.json). Created when missing.")
@click.option("--level", "-l", default="2", show_default=True,
              help="2 and above: every workload; 1: only the fast subset.")
@_workload_option
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
def record_command(out: str | None, level: str, workloads: list[str] | None, device: str, workers: int,
                   gpus_text: str | None, config_path: str | None, injections: tuple[str, ...], dry_run: bool,
                   as_json: bool, force: bool) -> int:
    """On a known-good node: run the reference workloads twice on every GPU and record the
    digests under this node's fingerprint."""
    from ..app import RunRequest, UsageError, parse_gpu_list, prepare
    from ..check import missing_need
    from ..repro import store
    from ..repro.fingerprint import describe, short_key
    from ..repro.judge import plan_record
    from ..repro.workloads import WorkloadError
    from ..result import Status
    from ..tests_suite.repro import collect, reference_path

    try:
        gpus = parse_gpu_list(gpus_text)
    except UsageError as e:
        raise click.BadParameter(str(e).removeprefix("--gpus: "), param_hint="--gpus") from None
    req = RunRequest(level=level, check_patterns=[CHECK_ID], gpus=gpus, device=device, workers=workers,
                     injections=list(injections), options={"workloads": workloads} if workloads else {},
                     config_path=config_path, history=False, force=force)
    try:
        prep = prepare(req)
    except UsageError as e:
        raise click.UsageError(str(e)) from None
    ctx = prep.ctx
    check = prep.checks[0]
    p = ctx.params(check)
    path = out or reference_path(ctx, p)[0]
    _check_out(path)
    try:
        store.load(path, missing_ok=True)
    except store.RefFileError as e:
        raise click.BadParameter(str(e), param_hint="--out") from None
    for need in check.spec.needs:
        why = missing_need(need, ctx)
        if why:
            click.echo(f"gpucheck repro record: cannot record: {why}", err=True)
            return 3
    for problem in store.permission_problems(path):
        click.echo(f"gpucheck repro record: warning: {problem}", err=True)

    try:
        col = collect(ctx, p)
    except WorkloadError as e:
        raise click.BadParameter(str(e), param_hint="--workload") from None
    records, problems, by_key = plan_record(CHECK_ID, col.outcomes)
    problems = [(Status.ERROR if r.status == Status.SKIP else r.status, f"{r.subject}: {r.summary}")
                for r in col.results] + problems
    if not col.outcomes and not problems:
        problems.append((Status.ERROR, "no GPU selected to record"))
    fps = {key: col.outcomes[gs[0]].result["fingerprint"] for key, gs in by_key.items()}
    summary: dict[str, Any] = {
        "path": path, "written": False, "device": col.device, "workloads": col.workloads,
        "not_run": col.not_run,
        "fingerprints": [{"key": k, "fingerprint": fps[k], "gpus": gs} for k, gs in by_key.items()],
        "problems": [t for _, t in problems], "conflicts": [], "added": {}, "unchanged": {},
    }
    if injections and not problems:
        problems.append((Status.FAIL, "--inject was given: injected digests are never recorded"))
        summary["problems"] = [t for _, t in problems]

    def emit_text(lines: list[str], err: bool = False) -> None:
        if not as_json:
            for line in lines:
                click.echo(line, err=err)

    for key, gs in by_key.items():
        emit_text([f"fingerprint {short_key(key)} ({len(gs)} {'CPU worker' if col.device == 'cpu' else 'GPU'}(s) "
                   f"{', '.join(map(str, gs))}): {describe(fps[key])}"])
    if problems:
        emit_text(["refusing to record (nothing written):"] + [f"  {t}" for _, t in problems], err=True)
        if as_json:
            click.echo(json.dumps(summary, indent=2))
        return 1 if any(s == Status.FAIL for s, _ in problems) else 3
    for fp, digests in records:
        for w, d in digests.items():
            emit_text([f"  {w:18s} {d}"])
    if dry_run:
        emit_text([f"dry run: nothing written to {path}"])
        if as_json:
            click.echo(json.dumps(summary, indent=2))
        return 0
    try:
        res = store.record(path, records, host=socket.gethostname())
    except store.RecordConflict as e:
        summary["conflicts"] = [c.describe() for c in e.conflicts]
        emit_text([f"refusing to record: digests disagree with the reference already in {path} "
                   "(file unchanged):"] + [f"  {c.describe()}" for c in e.conflicts], err=True)
        if as_json:
            click.echo(json.dumps(summary, indent=2))
        return 1
    except store.RefFileError as e:
        raise click.BadParameter(str(e), param_hint="--out") from None
    except OSError as e:
        from ..safeio import describe_error

        click.echo(f"gpucheck repro record: error: {path}: {describe_error(e, path)}", err=True)
        return 2
    summary.update(written=res.written, added=res.added, unchanged=res.unchanged)
    if res.written:
        n = sum(len(v) for v in res.added.values())
        emit_text([f"recorded {n} digest(s) in {path}"
                   + (f" ({sum(len(v) for v in res.unchanged.values())} already recorded)" if res.unchanged else "")])
    else:
        emit_text([f"already recorded in {path}: nothing to add"])
    for w, why in col.not_run.items():
        emit_text([f"  {w} not run on this device: {why}"])
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    sys.stdout.flush()
    return 0
