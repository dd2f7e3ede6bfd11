"""Output that is not a terminal is never wrapped, and `list --defaults` is TOML (issue 26).

Under cron, ssh or in a Slurm log rich laid text out at 80 columns: the nccl-tests table broke,
`gpucheck list` was 129 lines with words broken mid-word, `list --defaults` 665 lines with keys
split, and its values were Python (`True`, `['gemm.bf16']`). Now a console on a file or a pipe
is as wide as its longest line (COLUMNS, when set, still gives a width), and `list --defaults`
prints a TOML document that `--config` accepts.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpucheck.core.config import load_config
from gpucheck.render.check_list import toml_key, toml_value
from gpucheck.tests_suite.registry import all_checks

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")} | {"PYTHONPATH": str(ROOT)}


def piped(*args: str) -> subprocess.CompletedProcess:
    """`gpucheck ARGS` with its stdout on a pipe, as under cron or ssh (no COLUMNS)."""
    return subprocess.run([sys.executable, "-m", "gpucheck", *args], capture_output=True, text=True, env=ENV,
                          cwd=ROOT, timeout=120)


@pytest.mark.slow
def test_list_on_a_pipe_is_one_line_per_check():
    p = piped("list")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    checks = all_checks()
    assert len(lines) == len(checks) + 4  # the top rule, the header, the rule under it, the bottom rule
    for c in checks:
        row = next(ln for ln in lines if ln.startswith(f"│ {c.id} "))
        assert (c.spec.detects or c.spec.title) in row, row
        assert row.count("│") == 6


@pytest.mark.slow
def test_list_defaults_on_a_pipe_is_toml_that_a_config_accepts(tmp_path):
    p = piped("list", "--defaults")
    assert p.returncode == 0, p.stderr
    doc = tomllib.loads(p.stdout)  # the old output (`key=True (true or false)` in a table) is no TOML
    expected = {c.id: dict(c.spec.defaults) for c in all_checks() if c.spec.defaults}
    assert doc == {"checks": expected}
    for ln in p.stdout.splitlines():  # every line whole: a comment, a table, a key = value
        assert ln == "" or ln.startswith("# ") or ln.startswith("[checks.") or " = " in ln, ln
    f = tmp_path / "config.toml"
    f.write_text(p.stdout)
    config = load_config(f)
    config.validate_checks([c.spec for c in all_checks()])  # every key known, every value in range
    assert config.check_overrides("burn.gemm") == expected["burn.gemm"]


@pytest.mark.slow
def test_a_run_takes_the_listed_defaults_as_its_config(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text(piped("list", "--defaults").stdout)
    p = piped("run", "--config", str(f), "--no-history", "--snapshot", str(SNAPS / "h100-healthy.json"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_toml_values_and_keys():
    assert [toml_value(v) for v in (True, False, 3, 0.25, 1e-05, "a\"b\\c", ["gemm.bf16", "x"], [])] == [
        "true", "false", "3", "0.25", "1e-05", '"a\\"b\\\\c"', '["gemm.bf16", "x"]', "[]"]
    odd = "é\U0001F600\n\t\x01"
    assert tomllib.loads("x = " + toml_value(odd)) == {"x": odd}
    assert (toml_key("burn.gemm"), toml_key("memory-remap"), toml_key("ecc")) == ('"burn.gemm"', "memory-remap", "ecc")
    for bad in (float("nan"), float("inf"), None, {"a": 1}):
        with pytest.raises(ValueError):
            toml_value(bad)


def test_a_console_on_a_file_never_wraps_and_columns_still_gives_a_width(monkeypatch):
    from gpucheck.render.console import UNWRAPPED_WIDTH, make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console(io.StringIO()).width == UNWRAPPED_WIDTH
    assert make_console(io.StringIO(), width=90).width == 90
    monkeypatch.setenv("COLUMNS", "80")
    assert make_console(io.StringIO()).width == 80


def test_the_nccl_tests_table_of_a_verdict_is_whole_in_a_log(monkeypatch):
    """A row of nccl-tests' table is 82 columns: at the old 80 it broke in two."""
    from gpucheck.core.verdict import Verdict
    from gpucheck.render.terminal import print_verdict

    sys.path.insert(0, str(ROOT / "tests"))
    from test_render_terminal import RESULT_ROWS, verdict_of

    v = verdict_of("h100-healthy.json")
    sweep = [{k: r[k] for k in ("bytes", "time_s", "algbw_gbs", "busbw_gbs")} | {"wrong": 0} for r in RESULT_ROWS]
    v["results"].append({"check": "nccl.intra", "subject": "node/all_reduce", "gpu": None, "status": "pass",
                         "summary": "all_reduce 38.06 GB/s busbw", "action": "none", "thresholds": [], "evidence": [],
                         "injected": [], "duration_s": 1.0,
                         "metrics": {"ranks": {"value": 8, "unit": ""}, "backend": {"value": "nccl", "unit": ""},
                                     "sweep": {"value": sweep, "unit": ""}}})
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    print_verdict(Verdict.from_json(v), file=buf)
    lines = buf.getvalue().splitlines()
    rows = [ln.split() for ln in lines if ln.strip().startswith(("65536 ", "1048576 "))]
    assert rows == [["65536", "16384", "float", "sum", "9.50", "6.90", "12.07", "0"],
                    ["1048576", "262144", "float", "sum", "48.21", "21.75", "38.06", "0"]]
    assert not any(ln.strip() in ("0", "") for ln in lines)  # no '#wrong' cell left alone on a line
