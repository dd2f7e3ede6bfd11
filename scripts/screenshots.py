#!/usr/bin/env python3
"""Make the screenshots of the README and docs/ with the test suite's headless Chromium (tests/chromium.py):

    python3 scripts/screenshots.py [--out docs/img]

- grid.png: `gpucheck run` on a snapshot of an 8-GPU node with a lost GPU, as a terminal shows it
  (gpucheck.render.terminal at 80 columns, recorded by rich and exported as HTML);
- report-verdict.png, report-sweep.png, report-pairs.png, report-bisect.png: `gpucheck report`
  pages of the inputs the report tests use (tests/report_inputs.py).
Each page is checked as the tests check it (no console error, no request) before it is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import chromium  # noqa: E402
import report_inputs as ri  # noqa: E402

from gpucheck.cli.main import main  # noqa: E402


def grid_page(folder: Path) -> Path:
    from gpucheck.render.terminal import print_verdict

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["run", "--json", "--no-history", "--snapshot", str(ROOT / "tests/fixtures/snapshots/h100-gpu-lost.json")])
    verdict = json.loads(out.getvalue())
    verdict["source"]["path"] = "h100-gpu-lost.json"
    from gpucheck.render.console import make_console

    console = make_console(io.StringIO(), width=80, color=True, record=True)
    console.print("$ gpucheck run --snapshot h100-gpu-lost.json")
    buf = io.StringIO()  # the run's output with its colours, as a terminal gets it
    from gpucheck.core.verdict import Verdict

    print_verdict(Verdict.from_json(verdict), buf, width=80, color=True)  # the typed verdict (issue 25)
    from rich.text import Text

    for ln in buf.getvalue().splitlines():
        console.print(Text.from_ansi(ln))
    html = console.export_html(inline_styles=True, code_format=(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><style>body{{margin:0;background:#1e1e1e}}"
        "pre{{color:#d4d4d4;background:#1e1e1e;padding:14px 18px;margin:0;font-size:15px;line-height:1.35;"
        "font-family:'DejaVu Sans Mono',monospace}}</style></head><body><pre><code>{code}</code></pre>"
        "<script>window.gpucheckRendered=performance.now()</script></body></html>"))
    page = folder / "grid.html"
    page.write_text(html)
    return page


def cropped(png: bytes, margin: int = 12) -> bytes:
    """The screenshot without the rows of plain background below the text."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    background = img.getpixel((img.width - 1, img.height - 1))
    bottom = img.height
    while bottom > 1 and all(img.getpixel((x, bottom - 1)) == background for x in range(0, img.width, 4)):
        bottom -= 1
    out = io.BytesIO()
    img.crop((0, 0, img.width, min(img.height, bottom + margin))).save(out, format="PNG", optimize=True)
    return out.getvalue()


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = {"verdict": json.dumps(ri.slow_gpu_verdict()), "sweep": ri.sweep_report(24),
                  "pairs": json.dumps(ri.pairs_document(12)), "bisect": json.dumps(ri.bisect_result(64))}
        with chromium.Chromium(width=1100, height=760) as browser:
            page = browser.open(grid_page(folder))
            assert not page.errors, page.errors
            (out / "grid.png").write_bytes(cropped(browser.screenshot()))
            os.chdir(folder)  # the page names its input as given: a short name
            for kind, text in inputs.items():
                src = folder / f"{kind}.json"
                src.write_text(text)
                html = folder / f"{kind}.html"
                assert main(["report", src.name, "-o", str(html)]) == 0
                page = browser.open(html)
                assert not page.errors and not page.requests and page.render_ms is not None, (kind, page.errors)
                (out / f"report-{kind}.png").write_bytes(browser.screenshot(full_page=True, max_height=1500))
                print(f"{out / f'report-{kind}.png'}: rendered in {page.render_ms:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
