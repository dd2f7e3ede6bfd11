"""`gpucheck report INPUT... -o report.html`: one self-contained HTML page (no CDN, no network)
from gpucheck's JSON documents: a verdict, a history file, a sweep report, an `nccl pairs`
result or a bisect result, detected from their content.

The plots are plotly.js figures (the optional extra `report`: `pip install 'gpucheck-cluster[report]'`),
with plotly.js itself embedded in the page. Every piece of data is escaped for HTML and for
plotly's own text markup: a node name or a log line is shown as it is, never interpreted.

- `inputs.load_input(path)` reads and classifies one file (inputs.ReportError: unusable, exit 2);
- `sections` turn each document into a Section (HTML blocks and figures);
- `page.render_page(sections)` assembles the page.
"""

from __future__ import annotations


def build_report(paths: list[str], *, generated: str | None = None) -> str:
    """The HTML page for the input files, in the order given (ReportError for an input that
    cannot be used, or a missing plotly)."""
    from ..core.verdict import iso_utc
    from .inputs import by_host, display_name, load_input
    from .page import render_page

    import time

    inputs = [load_input(p) for p in paths]
    sections = [section_for(part) for i in inputs for part in by_host(i)]  # a history: one section per host
    return render_page(sections, generated=generated or iso_utc(time.time()),
                       inputs=[display_name(i.path) for i in inputs])


def section_for(inp):  # an inputs.Input -> a page.Section
    from .fleet import bisect_section, pairs_section, sweep_section
    from .node import history_section, verdict_section

    make = {"verdict": verdict_section, "history": history_section, "sweep": sweep_section,
            "pairs": pairs_section, "bisect": bisect_section}[inp.kind]
    return make(inp)
