"""`gpucheck telemetry`: read the GPUs' telemetry without judging it.

`gpucheck telemetry dump [-o FILE]` writes a snapshot (docs/snapshot.md): everything the level-1
checks judge, as JSON. It works on a broken node too (no driver, a lost GPU): the snapshot then
says so (nvml.ok false, GPU states), which is the point of capturing it.
"""

from __future__ import annotations

from pathlib import Path

import click

from .numbers import FiniteFloat


@click.group("telemetry")
def telemetry_group() -> None:
    """Read GPU telemetry (NVML and sysfs) as plain data."""


@telemetry_group.command("dump")
@click.option("-o", "--output", "output", metavar="FILE", default=None,
              help="Write the snapshot to FILE (atomically; - is standard output) instead of standard output.")
@click.option("--sysfs-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/sys"),
              show_default=True, help="Where sysfs is mounted (for reading a copied tree).")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=0.1), default=60.0, show_default=True,
              help="Give up on a driver that does not answer within this many seconds.")
@click.option("--kernel-log/--no-kernel-log", "kernel_log", default=True, show_default=True,
              help="Record this boot's NVRM/NVSwitch kernel-log lines (judged by the xid check on replay).")
def dump_command(output: str | None, sysfs_root: Path, timeout_s: float, kernel_log: bool) -> int:
    """Capture a telemetry snapshot (JSON) of this node."""
    from ..safeio import check_output, output_problem, write_output
    from ..telemetry.snapshot import collect_snapshot, dump_snapshot

    if output == "-":
        output = None
    if output is not None:
        try:  # refused before anything is collected: a device, an untrusted symlink, no such folder
            check_output(output)
        except OSError as e:
            click.echo(f"gpucheck telemetry dump: cannot write {output}: {output_problem(e, output)}", err=True)
            return 2
    snap = collect_snapshot(sysfs_root=sysfs_root, timeout_s=timeout_s)
    if kernel_log:
        from ..kernlog import capture_for_snapshot

        snap["kernel_log"] = capture_for_snapshot()
    text = dump_snapshot(snap)
    if output is None:
        click.echo(text, nl=False)
        return 0
    try:
        write_output(output, text)
    except OSError as e:
        click.echo(f"gpucheck telemetry dump: cannot write {output}: {output_problem(e, output)}", err=True)
        return 2
    gpus = snap["gpus"]
    nv = snap["nvml"]
    state = "NVML ok" if nv["ok"] else f"NVML unavailable: {nv['error']['kind']}"
    click.echo(f"wrote {output}: {len(gpus)} GPU(s), {state}", err=True)
    return 0
