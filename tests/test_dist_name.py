"""The distribution name and every install line point at this project (issue 26).

PyPI's project `gpucheck` is someone else's ("pytest for GPU kernels"): `pip install
'gpucheck[hang]'` installed it, not py-spy for `gpucheck hang`. The distribution is
`gpucheck-cluster`; the command and the import package stay `gpucheck`. Every text an operator
reads or pastes (README, docs, the code's hints and errors, CI, scripts, benchmarks) is searched
for an install line that would fetch the other project, and every extra a hint names exists.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = "gpucheck-cluster"
# Where an operator or a developer reads install lines: the docs, the code (its hints and error
# messages), CI, the scripts and the benchmarks. tests/ hold expected messages, checked too.
SEARCHED = ("README.md", "CONTRIBUTING.md", "docs", "gpucheck", "scripts", ".ci", "benchmarks", "tests")
SUFFIXES = {".md", ".py", ".sh", ".toml", ".txt", ".cfg", ""}
# `pip install gpucheck`, `pip install 'gpucheck[x]'`, `gpucheck[x]` anywhere: PyPI's other project.
OTHER_PROJECT = (
    re.compile(r"pip\s+install\s+(?:-\S+\s+)*['\"]?gpucheck(?![-\w])"),
    re.compile(r"(?<![-\w./])gpucheck\[[\w,\s]*\]"),
)
EXTRA = re.compile(rf"{re.escape(DIST)}\[([\w,\s]+)\]")


def searched_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for name in SEARCHED:
        p = root / name
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in SUFFIXES
                         and "fixtures" not in f.parts and "__pycache__" not in f.parts)
    return files


def other_project_lines(texts: dict[str, str]) -> list[str]:
    """`file:line: text` for each line that would install PyPI's other `gpucheck`."""
    found = []
    for name, text in texts.items():
        for n, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in OTHER_PROJECT) and "test_dist_name.py" not in name:
                found.append(f"{name}:{n}: {line.strip()}")
    return found


def _texts() -> dict[str, str]:
    return {str(f.relative_to(ROOT)): f.read_text(errors="replace") for f in searched_files(ROOT)}


def test_the_distribution_is_gpucheck_cluster_and_the_command_stays_gpucheck():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST
    assert project["scripts"] == {"gpucheck": "gpucheck.cli.start:entry"}


def test_no_install_line_or_hint_installs_the_other_pypi_project():
    assert other_project_lines(_texts()) == []


def test_the_search_finds_the_old_lines():
    """The patterns catch what the README, the docs and the hints said before the rename."""
    old = {"README.md": "pip install 'gpucheck[hang]'\npip install gpucheck\n",
           "page.py": "raise ReportError(\"the report needs plotly: pip install 'gpucheck[report]'\")",
           "check.py": "return \"CuPy not installed (pip install 'gpucheck[cupy]'; or --device cpu)\"",
           "ok.md": "pip install 'gpucheck-cluster[hang]'\npip install -e '.[test]'\ngpucheck run\n"}
    assert [x.split(":")[0] for x in other_project_lines(old)] == ["README.md", "README.md", "page.py", "check.py"]


def test_every_extra_a_hint_names_exists():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {e.strip() for text in _texts().values() for m in EXTRA.finditer(text) for e in m.group(1).split(",")}
    assert {"hang", "report", "torch", "cupy"} <= named
    assert named <= extras


def test_nothing_reads_the_version_of_the_old_distribution_name():
    pattern = re.compile(r"""(?:version|metadata|distribution)\(\s*['"]gpucheck['"]""")
    assert [k for k, t in _texts().items() if pattern.search(t)] == []
