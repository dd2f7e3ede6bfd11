"""The plan of the house (CONTRIBUTING.md, issue 25): gpucheck's modules import each other in no
circle, counting every import (at module level, inside a function, under TYPE_CHECKING), and the
import-linter contracts of pyproject.toml (the layers, checks independent of each other, a check
importing the SDK) hold. Both are proved able to fail on a small package made for it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpucheck"


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at `root`, by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, wherever the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = name.split(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == top:
                out.update(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == top)
    return {m for m in out if m in known and m != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_gpucheck_imports_itself_around_a_circle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 150 and sum(map(len, graph.values())) > 400  # the walk sees the whole package
    found = circles(graph)
    assert not found, "import circles (break them: CONTRIBUTING.md, 'The layers'):\n" + "\n".join(map(str, found))


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return tmp_path / "pkg"


def test_the_walk_finds_a_circle_through_a_function_level_import(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def later():\n    from .sub.c import x\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import y\nx = 1\n",
        "pkg/d.py": "import pkg.a\n",
    })
    assert import_graph(root)["pkg.b"] == {"pkg.sub.c"}
    assert circles(import_graph(root)) == [["pkg.a", "pkg.b", "pkg.sub.c"]]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """import-linter over the package in `cwd` with the contracts of its pyproject.toml."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_import_contracts_hold():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in r.stdout


def test_the_layers_contract_refuses_an_import_up_from_inside_a_function(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/top.py": "from . import low\n",
        "pkg/low.py": "def later():\n    from . import top\n",
        "pyproject.toml": """
            [tool.importlinter]
            root_package = "pkg"

            [[tool.importlinter.contracts]]
            name = "layers"
            type = "layers"
            layers = ["pkg.top", "pkg.low"]
        """,
    })
    r = lint_imports(root.parent)
    assert r.returncode == 1 and "pkg.low is not allowed to import pkg.top" in r.stdout, r.stdout + r.stderr
