"""`gpucheck report` without a browser: inputs classified by content, unusable inputs and
outputs refused with one line (exit 2), a missing plotly named, every figure valid for plotly,
and the page self-contained (plotly.js embedded, no URL to fetch)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from gpucheck.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import report_inputs as ri  # noqa: E402


def test_inputs_are_classified_by_content(tmp_path):
    from gpucheck.report.inputs import load_input

    docs = {"verdict": json.dumps(ri.slow_gpu_verdict()), "history": ri.history_lines(3),
            "sweep": ri.sweep_report(5), "pairs": json.dumps(ri.pairs_document(4)),
            "bisect": json.dumps(ri.bisect_result(16, ("n005",)))}
    for kind, text in docs.items():
        f = tmp_path / f"{kind}.anything"
        f.write_text(text)
        got = load_input(str(f))
        assert got.kind == kind
    torn = tmp_path / "torn.jsonl"
    torn.write_text(ri.history_lines(2) + '{"schema": "gpucheck.verdict", "resu\n' + "not json\n")
    got = load_input(str(torn))
    assert got.kind == "history" and len(got.verdicts) == 2 and got.skipped_lines == 2


@pytest.mark.parametrize("text, message", [
    ('{"schema": "gpucheck.snapshot"}', "not a verdict, history, sweep report, nccl pairs or bisect result "
                                        "(schema 'gpucheck.snapshot')"),
    ("[1, 2]", "not a verdict, history, sweep report, nccl pairs or bisect result (a JSON list)"),
    ("garbage\nmore garbage\n", "not a gpucheck document (not JSON: "),
    ('{"schema": "gpucheck.sweep", "nodes": 3, "counts": {}}', "a sweep document without a list 'nodes'"),
    ("[" * 100 + "]" * 100, "nested deeper than 64 levels"),
    (b"\xff\xfe{}", "not UTF-8 text"),
])
def test_unusable_inputs_are_exit_2_with_one_line(tmp_path, capsys, text, message):
    f = tmp_path / "in.json"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out.html"
    assert main(["report", str(f), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpucheck report: error: {f}: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_special_files_and_bad_outputs_are_refused(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    good = tmp_path / "v.json"
    good.write_text(json.dumps(ri.slow_gpu_verdict()))
    assert main(["report", str(fifo), "-o", str(tmp_path / "o.html")]) == 2  # never waits on a FIFO
    assert "not a regular file (it is a FIFO)" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "o.html")]) == 2
    assert main(["report", str(good), "-o", str(tmp_path)]) == 2  # a directory is never replaced
    assert "gpucheck report: error: cannot write" in capsys.readouterr().err
    assert main(["report", str(good), "-o", str(tmp_path / "no" / "such" / "dir.html")]) == 2
    assert main(["report", "-o", str(tmp_path / "o.html")]) == 2  # no input: usage error


def test_missing_plotly_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    f = tmp_path / "v.json"
    f.write_text(json.dumps(ri.slow_gpu_verdict()))
    assert main(["report", str(f), "-o", str(tmp_path / "o.html")]) == 2
    assert capsys.readouterr().err == "gpucheck report: error: the report needs plotly: pip install 'gpucheck-cluster[report]'\n"


def test_the_page_is_self_contained_and_written_atomically(tmp_path, capsys):
    f = tmp_path / "v.json"
    f.write_text(json.dumps(ri.slow_gpu_verdict()))
    out = tmp_path / "r.html"
    out.write_text("old")
    assert main(["report", str(f), str(f), "-o", str(out)]) == 0
    page = out.read_text()
    from plotly.offline import get_plotlyjs

    assert get_plotlyjs() in page  # plotly.js itself, not a <script src=...>
    without_js = page.replace(get_plotlyjs(), "")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", without_js)
    assert "cdn" not in without_js.lower() and without_js.count("<section") == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert main(["report", str(f), "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith("<!DOCTYPE html>")


def test_every_figure_is_valid_for_plotly(tmp_path):
    """plotly's own schema validates each figure dict (a misspelt attribute raises)."""
    import plotly.graph_objects as go

    from gpucheck.report import section_for
    from gpucheck.report.inputs import load_input
    from gpucheck.report.page import Figure, densify

    docs = {"v.json": json.dumps(ri.slow_gpu_verdict()), "h.jsonl": ri.history_lines(4), "s.json": ri.sweep_report(8),
            "p.json": json.dumps(ri.pairs_document(6)), "b.json": json.dumps(ri.bisect_result(32, ("n007",)))}
    count = 0
    for name, text in docs.items():
        (tmp_path / name).write_text(text)
        for block in section_for(load_input(str(tmp_path / name))).blocks:
            if isinstance(block, Figure):
                go.Figure(data=densify(block.data), layout=block.layout)
                count += 1
    assert count >= 7


def test_sparse_matrices_expand_to_the_full_matrix():
    from gpucheck.report.page import densify, sparse_matrix

    got = densify([{"type": "heatmap", "z": sparse_matrix(3, [(0, 1, 5.0), (1, 0, 5.0)]), "x": [1]}])
    assert got == [{"type": "heatmap", "z": [[None, 5.0, None], [5.0, None, None], [None, None, None]], "x": [1]}]


def test_script_json_cannot_end_the_script():
    from gpucheck.report.page import script_json

    text = script_json({"a": "</script><!-- \u2028 & >", "n": float("nan")})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"a": "</script><!-- \u2028 & >", "n": None}
