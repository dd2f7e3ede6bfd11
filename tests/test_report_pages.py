"""`gpucheck report` pages opened in a real headless Chromium (Debian's chromium, installed by
.ci/run): for each kind of input the page loads without a console error and without asking the
network for anything, every plot renders, the screenshot is not blank, and the failing GPU or
node of the input is named in the page. Hostile strings in the inputs stay text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpucheck.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import chromium  # noqa: E402
import report_inputs as ri  # noqa: E402

pytestmark = [pytest.mark.slow,  # a browser per module: out of the fast subset (-m "not slow and not root")
              pytest.mark.skipif(not chromium.available(), reason=f"no chromium at {chromium.CHROMIUM} "
                                 "(apt-get install chromium; .ci/run installs it)")]


@pytest.fixture(scope="module")
def browser():
    with chromium.Chromium(width=1280, height=900) as b:
        yield b


def write_inputs(tmp_path: Path) -> dict[str, Path]:
    files = {"verdict": tmp_path / "verdict.json", "history": tmp_path / "history.jsonl",
             "sweep": tmp_path / "sweep.json", "pairs": tmp_path / "pairs.json", "bisect": tmp_path / "bisect.json"}
    files["verdict"].write_text(json.dumps(ri.slow_gpu_verdict()))
    files["history"].write_text(ri.history_lines())
    files["sweep"].write_text(ri.sweep_report(12))
    files["pairs"].write_text(json.dumps(ri.pairs_document()))
    files["bisect"].write_text(json.dumps(ri.bisect_result()))
    return files


# kind -> what the page must name: the failing GPU / node of that input, with its check or cause
NAMED = {
    "verdict": ["FAIL gpu6 burn.gemm: slow GPU: bf16 40% below the node median", "Needs attention"],
    "history": ["FAIL gpu3 ecc: uncorrectable (double-bit) ECC errors", "FAIL gpu6 burn.gemm"],
    "sweep": ["bad nodes: gpu[0005,0007,0012]", "FAIL gpu0005: fleet: slow burn.gemm.tflops_bf16 gpu3", "FAIL gpu0007: ecc gpu3",
              "UNREACHABLE gpu0012: ssh: connect to host gpu0012 port 22: Connection refused"],
    "pairs": ["bad node node05: round 1 with node04: data corruption in all_reduce"],
    "bisect": ["bad node n037 (confirmed)"],
}
PLOTS = {"verdict": 1, "history": 2, "sweep": 2, "pairs": 1, "bisect": 1}


def open_report(browser, inputs: list[Path], out: Path) -> chromium.Page:
    assert main(["report", *map(str, inputs), "-o", str(out)]) == 0
    return browser.open(out)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(NAMED))
def test_each_kind_of_report_opens_offline_without_errors(kind, browser, tmp_path):
    files = write_inputs(tmp_path)
    page = open_report(browser, [files[kind]], tmp_path / f"{kind}.html")
    assert page.render_ms is not None, "the plots never finished rendering"
    assert page.errors == [] and page.requests == []
    plots = browser._eval("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0 ? "
                          "document.querySelectorAll('.js-plotly-plot').length : 0")
    assert plots == PLOTS[kind]
    for text in NAMED[kind]:
        assert text in page.text, (text, page.text[:2000])
    png = browser.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and chromium.distinct_colours(png) > 30


@pytest.mark.slow
def test_all_inputs_in_one_page(browser, tmp_path):
    files = write_inputs(tmp_path)
    page = open_report(browser, list(files.values()), tmp_path / "all.html")
    assert page.errors == [] and page.requests == [] and page.render_ms is not None
    assert browser._eval("document.querySelectorAll('section').length") == 5
    for texts in NAMED.values():
        assert all(t in page.text for t in texts)
    full = browser.screenshot(full_page=True, max_height=4000)
    assert chromium.distinct_colours(full) > 50


HOSTILE = ['<img src=x onerror="window.pwned=1">', "</script><script>window.pwned=2</script>",
           '<a href="javascript:window.pwned=3">click</a>', "<b>bold</b> &amp; :ab: [red]x[/red]"]


@pytest.mark.slow
def test_hostile_strings_stay_text(browser, tmp_path):
    """Node names, hosts, summaries and evidence with HTML, script ends and plotly's own markup
    are shown as typed: nothing runs, no element is made of them."""
    v = ri.slow_gpu_verdict(host=HOSTILE[0])
    for r in v["results"]:
        if r["check"] == "burn.gemm" and r["gpu"] == 6:
            r["summary"] = " ".join(HOSTILE)
            r["evidence"] = HOSTILE
    sweep = json.loads(ri.sweep_report(6))
    sweep["nodes"][3]["node"] = HOSTILE[2]
    sweep["nodes"][3]["reason"] = HOSTILE[1]
    pairs = ri.pairs_document(4)
    pairs["nodes"][0] = HOSTILE[3]
    pairs["pairs"][0]["nodes"][0] = HOSTILE[3]
    pairs["bad"] = [HOSTILE[3]]
    files = [tmp_path / "v.json", tmp_path / "s.json", tmp_path / "p.json"]
    for f, doc in zip(files, (v, sweep, pairs)):
        f.write_text(json.dumps(doc))
    page = open_report(browser, files, tmp_path / "hostile.html")
    assert page.errors == [] and page.requests == [] and page.render_ms is not None
    assert browser._eval("String(window.pwned)") == "undefined"
    assert browser._eval("document.querySelectorAll('img, main script, a[href^=\"javascript\"], svg a').length") == 0
    for text in HOSTILE:
        assert text in page.text
    ticks = browser._eval("Array.from(document.querySelectorAll('.xtick text, .ytick text')).map(t => t.textContent)")
    assert HOSTILE[2] in ticks and HOSTILE[3] in ticks  # plotly shows them as text, not as a link or bold
