"""`gpucheck report INPUT... -o report.html`: one self-contained HTML page (gpucheck.report)."""

from __future__ import annotations

import click

from ..platform.messages import say_error


@click.command("report")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("-o", "--output", "output", metavar="FILE", required=True,
              help="The HTML page to write (atomically; - is standard output).")
def report_command(inputs: tuple[str, ...], output: str) -> int:
    """Turn verdicts, a history file, a sweep report, an `nccl pairs` result or a bisect result
    into one HTML page that opens offline (plotly.js embedded: pip install 'gpucheck-cluster[report]').

    Exit 0 written; 2 an input that cannot be used, an output that cannot be written, or plotly
    missing (one line naming it). The page reports the inputs; it never changes their verdicts.
    """
    from ..report.inputs import ReportError
    from ..report import build_report
    from .outputs import emit, output_refused

    if output_refused("gpucheck report", output):
        return 2
    try:
        page = build_report(list(inputs))
    except ReportError as e:
        say_error(str(e), "gpucheck report")
        return 2
    rc = emit("gpucheck report", output, page)
    if rc is not None:
        return rc
    click.echo(f"wrote {output}: {len(inputs)} input(s), {len(page) // 1024} KiB", err=True)
    return 0
