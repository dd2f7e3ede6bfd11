"""The code's shape (issue 18): no function in gpucheck/ is longer than about 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpucheck"
MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int) -> list[str]:
    """Every def (its `def` line to its last line, nested ones included) longer than `limit`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return out


@pytest.mark.slow
def test_no_function_over_80_lines():
    offenders = long_functions(PACKAGE, MAX_FUNCTION_LINES)
    assert not offenders, "functions over 80 lines (split them along their seams):\n" + "\n".join(offenders)


def test_the_walk_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    (tmp_path / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n", encoding="utf-8")
    assert long_functions(tmp_path, MAX_FUNCTION_LINES) == [f"{tmp_path.name}/m.py:5 long (91 lines)"]
