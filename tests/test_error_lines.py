"""One form for every command's errors: `gpucheck <command>: error: <what>` (issue 26).

Before, the prefix depended on the command and on who found the error: `gpucheck: error:` from
the run pipeline (a bad --config of `run`, `burn`, the hooks), `gpucheck report: <what>`,
`gpucheck telemetry show: <what>`, `gpucheck hang: could not judge: ...`, `gpucheck xid` writing
`gpucheck: error:`. Each command below gets a bad input; the one line on stderr names it in the
one form. And no code spells a prefix by hand (gpucheck.platform.messages makes every line).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.platform.messages import error_line, error_text

ROOT = Path(__file__).resolve().parents[1]
MISSING = "/nonexistent-gpucheck-input"

# (arguments, the command path the error line starts with, exit code)
CASES = [
    (["run", "--config", MISSING], "gpucheck run", 2),
    (["run", "--check", "no-such-check"], "gpucheck run", 2),
    (["burn", "--device", "cpu", "--config", MISSING], "gpucheck burn", 2),
    (["poet", "--rows", "-1"], "gpucheck poet", 2),
    (["eud", "--config", MISSING], "gpucheck eud", 2),
    (["xid", "--no-nvml", "--since", "garbage", "--file", MISSING], "gpucheck xid", 2),
    (["telemetry", "show", MISSING], "gpucheck telemetry show", 2),
    (["telemetry", "import", MISSING], "gpucheck telemetry import", 2),
    (["telemetry", "dump", "-o", MISSING + "/x.json"], "gpucheck telemetry dump", 2),
    (["repro", "check", "--reference", MISSING], "gpucheck repro check", 2),
    (["repro", "record", "--config", MISSING], "gpucheck repro record", 2),
    (["sweep"], "gpucheck sweep", 2),
    (["slurm", "resume", "n[1-"], "gpucheck slurm resume", 2),
    (["bisect", "n[1-2]"], "gpucheck bisect", 2),
    (["nccl", "run", "--nnodes", "x"], "gpucheck nccl run", 2),
    (["nccl", "pairs", "n["], "gpucheck nccl pairs", 2),
    (["hang"], "gpucheck hang", 2),
    (["report", MISSING, "-o", MISSING + "/r.html"], "gpucheck report", 2),
    (["report", str(ROOT / "pyproject.toml")], "gpucheck report", 2),
    (["list", "--level", "9"], "gpucheck list", 2),
    (["schema", "--bogus"], "gpucheck schema", 2),
    (["no-such-command"], "gpucheck", 2),
]


@pytest.mark.parametrize("args,path,code", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_every_command_says_its_error_in_one_form(capsys, args, path, code):
    rc = main(args)
    err = capsys.readouterr().err
    first = err.splitlines()[0] if err else ""
    assert rc == code, err
    assert first.startswith(f"{path}: error: "), err
    assert error_text(first) == first[len(f"{path}: error: "):].strip()


def test_gpucheck_s_own_failure_is_an_error_line_that_says_could_not_judge(capsys, monkeypatch):
    import gpucheck.cli.run as run_cli

    def boom(*_a, **_k):
        raise RuntimeError("boom")

    monkeypatch.setattr(run_cli, "execute", boom)
    assert main(["run", "--snapshot", str(ROOT / "tests/fixtures/snapshots/h100-healthy.json")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("gpucheck run: error: could not judge: internal error: RuntimeError: boom")


def test_error_text_reads_any_command_s_line_and_nothing_else():
    assert error_text("gpucheck slurm prolog: error: /x: config file not found") == "/x: config file not found"
    assert error_text("gpucheck: error: No such command 'x'.") == "No such command 'x'."
    assert error_text(error_line("boom", "gpucheck nccl run")) == "boom"
    for other in ("gpucheck: WARNING: x", "gpucheck run: note: error: x", "something: error: x", "error: x"):
        assert error_text(other) is None


def _code_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """The string literals of a module's code (an f-string's literal parts joined), docstrings left out."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    docstrings |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}  # parts
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
    return out


def test_no_code_spells_an_error_prefix_by_hand():
    """Every error line comes from gpucheck.platform.messages; a literal `...: error: ` or
    `gpucheck ...: could not judge` elsewhere would bring a second form back."""
    pattern = re.compile(r"^(?:gpucheck[^:]*: (?:error|could not judge)\b|\{\}: error: )")
    found = []
    for path in sorted((ROOT / "gpucheck").rglob("*.py")):
        if path.name == "messages.py" and path.parent.name == "platform":
            continue
        for n, text in _code_strings(ast.parse(path.read_text())):
            if pattern.search(text):
                found.append(f"{path.relative_to(ROOT)}:{n}: {text}")
    assert found == []


def test_the_scan_finds_the_old_prefixes():
    old = ast.parse('''
def f(e, prog, msg):
    click.echo(f"gpucheck report: error: {e}", err=True)
    print(f"gpucheck: error: {e}", file=sys.stderr)
    click.echo(f"gpucheck hang: could not judge: {e}", err=True)
    click.echo(f"{prog}: error: {msg}", err=True)
    click.echo(f"wrote {msg}: 1 GPU", err=True)
''')
    pattern = re.compile(r"^(?:gpucheck[^:]*: (?:error|could not judge)\b|\{\}: error: )")
    assert [n for n, s in _code_strings(old) if pattern.search(s)] == [3, 4, 5, 6]
