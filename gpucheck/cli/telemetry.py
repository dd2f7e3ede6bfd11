"""`gpucheck telemetry`: read the GPUs' telemetry without judging it.

`gpucheck telemetry dump [-o FILE]` writes a snapshot (docs/snapshot.md): everything the level-1
checks judge, as JSON. It works on a broken node too (no driver, a lost GPU): the snapshot then
says so (nvml.ok false, GPU states), which is the point of capturing it.
`gpucheck telemetry import CAPTURE [-o FILE]` converts an `nvidia-smi -q` (or `-q -x`) capture
into the same snapshot format (gpucheck.platform.telemetry.nvsmi).

`gpucheck telemetry show [SNAPSHOT]` prints a snapshot (or this node's live telemetry) as one
line per GPU for people (gpucheck.render.telemetry_view), without judging it.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..platform.messages import say_error
from .numbers import MAX_DURATION_S, FiniteFloat


@click.group("telemetry")
def telemetry_group() -> None:
    """Read GPU telemetry (NVML and sysfs) as plain data."""


@telemetry_group.command("dump")
@click.option("-o", "--output", "output", metavar="FILE", default=None,
              help="Write the snapshot to FILE (atomically; - is standard output) instead of standard output.")
@click.option("--sysfs-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/sys"),
              show_default=True, help="Where sysfs is mounted (for reading a copied tree).")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=0.1, max=MAX_DURATION_S), default=60.0, show_default=True,
              help="Give up on a driver that does not answer within this many seconds.")
@click.option("--kernel-log/--no-kernel-log", "kernel_log", default=True, show_default=True,
              help="Record this boot's NVRM/NVSwitch/PCIe AER kernel-log lines (judged by xid and pcie.aer on replay).")
def dump_command(output: str | None, sysfs_root: Path, timeout_s: float, kernel_log: bool) -> int:
    """Capture a telemetry snapshot (JSON) of this node."""
    from ..platform.telemetry.snapshot import collect_snapshot, dump_snapshot
    from .outputs import emit, output_refused

    if output_refused("gpucheck telemetry dump", output):  # before anything is collected
        return 2
    snap = collect_snapshot(sysfs_root=sysfs_root, timeout_s=timeout_s)
    from ..platform.fabric.aer import read_pcie_aer
    from ..platform.fabric.fabricmanager import read_fabric_manager

    snap["pcie_aer"] = read_pcie_aer(sysfs_root)  # judged by pcie.aer on replay
    snap["fabric_manager"] = read_fabric_manager(sysfs_root)  # judged by fabric.nvswitch on replay
    if kernel_log:
        from ..platform.kernlog import capture_for_snapshot

        snap["kernel_log"] = capture_for_snapshot()
    rc = emit("gpucheck telemetry dump", output, dump_snapshot(snap))
    if rc is not None:
        return rc
    gpus = snap["gpus"]
    nv = snap["nvml"]
    state = "NVML ok" if nv["ok"] else f"NVML unavailable: {nv['error']['kind']}"
    click.echo(f"wrote {output}: {len(gpus)} GPU(s), {state}", err=True)
    return 0


@telemetry_group.command("import")
@click.argument("capture", metavar="FILE")
@click.option("-o", "--output", "output", metavar="FILE", default=None,
              help="Write the snapshot to FILE (atomically; - is standard output) instead of standard output.")
def import_command(capture: str, output: str | None) -> int:
    """Convert an nvidia-smi -q (or -q -x) capture FILE (- is standard input) into a snapshot.

    Every field the capture does not hold is recorded as "not in this capture" (never judged as
    healthy); what was missing or cut short is printed as warnings. Exit 0 when written, 2 when
    FILE is not a capture or cannot be read, or the output cannot be written.
    """
    from ..platform.safeio import describe_error
    from ..platform.telemetry import nvsmi
    from ..platform.telemetry.snapshot import SnapshotError, dump_snapshot, validate_snapshot
    from .outputs import emit, output_refused

    where = "standard input" if capture == "-" else capture
    if output_refused("gpucheck telemetry import", output):  # before anything is read
        return 2
    try:
        text = nvsmi.read_text(capture)
    except (OSError, UnicodeDecodeError) as e:
        why = "no such file" if isinstance(e, FileNotFoundError) else describe_error(e, capture)
        say_error(f"{where}: cannot read: {why}", "gpucheck telemetry import")
        return 2
    try:
        snap = nvsmi.convert(text, where)
        validate_snapshot(snap, where)
    except (nvsmi.CaptureError, SnapshotError) as e:
        say_error(str(e), "gpucheck telemetry import")
        return 2
    for warning in snap["capture"]["warnings"]:
        click.echo(f"gpucheck telemetry import: warning: {where}: {warning}", err=True)
    rc = emit("gpucheck telemetry import", output, dump_snapshot(snap))
    if rc is not None:
        return rc
    click.echo(f"wrote {output}: {len(snap['gpus'])} GPU(s) from {snap['capture']['format']}", err=True)
    return 0


@telemetry_group.command("show")
@click.argument("snapshot", required=False, metavar="[SNAPSHOT]")
@click.option("--sysfs-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/sys"),
              show_default=True, help="Where sysfs is mounted (live read only).")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=0.1, max=MAX_DURATION_S), default=60.0, show_default=True,
              help="Give up on a driver that does not answer within this many seconds (live read only).")
def show_command(snapshot: str | None, sysfs_root: Path, timeout_s: float) -> int:
    """Print a snapshot file (or, without one, this node's live telemetry) per GPU, unjudged.

    Exit 0 printed, 2 a SNAPSHOT that cannot be used (named with the reason).
    """
    from ..render.telemetry_view import print_snapshot
    from ..platform.telemetry.snapshot import SnapshotError, collect_snapshot, load_snapshot

    if snapshot is None:
        snap = collect_snapshot(sysfs_root=sysfs_root, timeout_s=timeout_s)
    else:
        try:
            snap = load_snapshot(snapshot)
        except SnapshotError as e:
            say_error(str(e), "gpucheck telemetry show")
            return 2
    print_snapshot(snap, snapshot)
    return 0
