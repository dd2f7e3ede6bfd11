"""`gpucheck judge CAPTURE...`: judge captures of one node offline (gpucheck.judge, docs/judge.md).

    gpucheck judge nvsmi.txt                     an nvidia-smi -q (or -q -x) capture
    gpucheck judge nvsmi.txt dmesg.txt dcgm.json  several captures of one node: they add up
    gpucheck judge t0.txt t1.txt t2.txt          a time series of one kind: judged for changes
"""

from __future__ import annotations

import click


@click.command("judge")
@click.argument("captures", nargs=-1, required=True, metavar="CAPTURE...")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict JSON alone on stdout.")
@click.option("--verbose", "-v", is_flag=True, help="Print one row per result instead of the check x GPU grid.")
@click.option("--output", "-o", metavar="FILE", help="Also write the verdict JSON to FILE (atomically).")
@click.option("--strict", is_flag=True, default=None, help="Treat warn as unhealthy (exit 1).")
@click.option("--on-error", type=click.Choice(["pass", "fail"]), default=None,
              help="Exit code for could-not-judge: pass -> 3 (default), fail -> 1 (fail-closed).")
@click.option("--config", "config_path", metavar="FILE", help="TOML config (default /etc/gpucheck/config.toml).")
@click.option("--check", "-c", "checks", multiple=True, metavar="ID", help="Judge only these checks (ids or globs).")
@click.option("--skip", "skips", multiple=True, metavar="ID", help="Skip these checks.")
def judge_command(captures, as_json, verbose, output, strict, on_error, config_path, checks, skips) -> int:
    """Judge captures of one node (nvidia-smi -q, a snapshot, kernel logs, DCGM diag JSON, ...)."""
    from ..judge import JudgeRequest, judge

    return judge(JudgeRequest(
        paths=list(captures), json=as_json, verbose=verbose, output=output, strict=strict, on_error=on_error,
        config_path=config_path, check_patterns=[c for spec in checks for c in spec.split(",") if c.strip()],
        skip_patterns=[c for spec in skips for c in spec.split(",") if c.strip()]))
