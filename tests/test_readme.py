"""The README is a way in, and the docs behind it hold together (issue 25).

- README.md is at most 250 lines, and no cell of its tables holds more than 40 words: the
  details live in docs/, one page per command or area;
- every `gpucheck` command (the click group, walked down to its leaves) is reachable from the
  README in one link: the README names it in a heading, or links a page that names it in one;
- every relative link and image in README.md and docs/*.md points at a file that exists, and at a
  heading of that file when it names an anchor;
- the README's promise that gpucheck never changes a GPU holds for the code: no NVML setter, no
  nvidia-smi that changes settings;
- the fast subset the README gives (`-m "not slow and not root"`) starts no daemon and no
  browser: every test file that uses the network-namespace, sshd or Slurm harness is marked
  `root`, and the one that drives Chromium is marked `slow`.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_LINES = 250
MAX_CELL_WORDS = 40

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


# -- reading markdown ---------------------------------------------------------------------------
def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a code block is no heading)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def without_code_spans(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def headings(text: str) -> list[str]:
    return [ln.lstrip("#").strip() for ln in prose_lines(text) if re.match(r"#{1,6}\s", ln)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without markup, lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(text):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def links(text: str) -> list[str]:
    return [m.group(1) for ln in prose_lines(text) for m in LINK.finditer(without_code_spans(ln))]


def table_cells(text: str) -> list[str]:
    cells = []
    for ln in prose_lines(text):
        if not ln.lstrip().startswith("|"):
            continue
        row = re.split(r"(?<!\\)\|", ln.strip().strip("|"))
        cells += [c.strip() for c in row if not re.fullmatch(r"\s*:?-+:?\s*", c)]
    return cells


def relative_target(page: Path, target: str) -> tuple[Path, str] | None:
    """(file, anchor) of a relative link; None for a URL."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):
        return None
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# -- the gpucheck commands ----------------------------------------------------------------------
def command_paths() -> list[str]:
    """Every leaf command of the click group: 'run', 'nccl pairs', 'slurm prolog', ..."""
    from gpucheck.cli.main import cli

    from cli_commands import leaf_commands

    return [" ".join(path) for path, _ in leaf_commands(cli)]


def names_in_a_heading(text: str, command: str) -> bool:
    pattern = re.compile(r"gpucheck " + re.escape(command) + r"(?![\w-])")
    return any(pattern.search(h) for h in headings(text))


# -- the tests ------------------------------------------------------------------------------------
def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move details to docs/"


def test_no_readme_table_cell_is_a_paragraph():
    long = [(len(c.split()), c[:80]) for c in table_cells(README.read_text()) if len(c.split()) > MAX_CELL_WORDS]
    assert not long, f"table cells over {MAX_CELL_WORDS} words: {long}"


def test_the_cell_counter_sees_cells():
    text = "| a | b |\n|---|---|\n| " + "w " * 41 + "| `x \\| y` |\n```\n| in | code |\n```\n"
    cells = table_cells(text)
    assert cells == ["a", "b", ("w " * 41).strip(), "`x \\| y`"]


def test_there_are_commands_to_find():
    paths = command_paths()
    assert {"run", "list", "schema", "sweep", "bisect", "hang", "report"} <= set(paths)
    assert {"nccl run", "nccl pairs", "slurm prolog", "slurm epilog", "slurm resume", "repro record",
            "repro check", "telemetry dump", "telemetry show", "telemetry import"} <= set(paths)


def test_every_command_is_one_link_from_the_readme():
    readme = README.read_text()
    linked = {t for t in (relative_target(README, link) for link in links(readme)) if t}
    linked_pages = {p.read_text() for p, _ in linked if p.suffix == ".md" and p.is_file()}
    missing = [c for c in command_paths()
               if not names_in_a_heading(readme, c) and not any(names_in_a_heading(t, c) for t in linked_pages)]
    assert not missing, ("commands no page linked from README.md names in a heading "
                         f"(`gpucheck <command>`): {missing}")


def test_a_command_named_only_in_prose_is_not_documented():
    assert names_in_a_heading("# `gpucheck nccl pairs NODESET`\n", "nccl pairs")
    assert not names_in_a_heading("## Pairs\n`gpucheck nccl pairs` runs ...\n", "nccl pairs")
    assert not names_in_a_heading("```\n# gpucheck hang\n```\n", "hang")
    assert not names_in_a_heading("## `gpucheck slurm prolog|epilog`\n", "slurm epilog")


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in links(page.read_text()):
        target = relative_target(page, link)
        if target is None:
            continue
        path, anchor = target
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            broken.append(f"{link}: no heading #{anchor} in {path.name}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_anchors_follow_githubs_rules():
    text = "# `gpucheck run`: the node verdict\n## The time limit (`--timeout`)\n## Tests\n## Tests\n```\n# no\n```\n"
    assert anchors(text) == {"gpucheck-run-the-node-verdict", "the-time-limit---timeout", "tests", "tests-1"}
    assert slug("`--inject` and the verdict's level") == "--inject-and-the-verdicts-level"


# -- the README's promise: gpucheck never changes a GPU -----------------------------------------
SETTER = re.compile(r"nvml(?:Device|GpuInstance|ComputeInstance|Unit|Vgpu\w*)?(?:Set|Reset|Clear|Create|Destroy)\w*")
SMI_FLAG = re.compile(r"^-(?:r|pm|pl|ac|rac|lgc|rgc|lmc|rmc|c|mig|e|am|caa)$|^--(?:gpu-reset|persistence-mode|power-limit)")


def _runs_smi_with_a_setting(words: list[str]) -> bool:
    return bool(words) and words[0].endswith("nvidia-smi") and any(SMI_FLAG.match(w) for w in words[1:])


def gpu_setting_calls(source: str) -> list[int]:
    """Lines of `source` (Python) that name an NVML setter (an attribute, a name, or a string as
    getattr(nvml, "...") takes it) or run nvidia-smi with a flag that changes a setting (an argv
    whose first word is nvidia-smi, or one shell string). Comments and docstrings only describe."""
    import ast

    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            hit = bool(SETTER.search(node.attr))
        elif isinstance(node, ast.Name):
            hit = bool(SETTER.search(node.id))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            hit = bool(SETTER.search(node.value)) or _runs_smi_with_a_setting(node.value.split())
        elif isinstance(node, (ast.List, ast.Tuple)):
            hit = _runs_smi_with_a_setting([e.value for e in node.elts
                                            if isinstance(e, ast.Constant) and isinstance(e.value, str)])
        else:
            hit = False
        if hit:
            lines.append(node.lineno)
    return sorted(set(lines))


def test_gpucheck_never_changes_a_gpu_setting():
    """README: "it never changes clocks, power limits, persistence, compute mode or MIG, and never
    resets a GPU": no NVML call that sets, resets, clears or creates, and no nvidia-smi run with a
    flag that does."""
    found = []
    for path in sorted((ROOT / "gpucheck").rglob("*.py")):
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}:{n}: {text.splitlines()[n - 1].strip()}" for n in gpu_setting_calls(text)]
    assert not found, "gpucheck must never change a GPU's settings:\n" + "\n".join(found)


def test_the_setting_guard_sees_setters_and_not_descriptions():
    assert gpu_setting_calls("import pynvml\npynvml.nvmlDeviceSetPowerManagementLimit(h, 300000)\n") == [2]
    assert gpu_setting_calls('f = getattr(nv, "nvmlDeviceResetGpuLockedClocks")\n') == [1]
    assert gpu_setting_calls("from pynvml import nvmlDeviceClearEccErrorCounts as c\nnvmlDeviceClearEccErrorCounts(h, 0)\n") == [2]
    assert gpu_setting_calls('subprocess.run(["nvidia-smi", "-pl", "300"])\n') == [1]
    assert gpu_setting_calls('os.system("nvidia-smi -r -i 0")\n') == [1]
    assert gpu_setting_calls('subprocess.run(["/usr/bin/nvidia-smi", "--persistence-mode=1"])\n') == [1]
    quiet = ('"""Resets: the driver wants nvidia-smi -r."""\n# nvmlDeviceSetPersistenceMode is never called\n'
             'nvmlEventSetCreate()\nnvmlDeviceGetPersistenceMode(h)\nTEXT = "nvidia-smi -q -x"\n'
             'subprocess.run(["nvidia-smi", "-q"])\n')
    assert gpu_setting_calls(quiet) == []


# -- the fast subset ------------------------------------------------------------------------------
DAEMON_HARNESSES = ("netns", "sshd_harness", "slurm_harness")


def _uses(text: str, module: str) -> bool:
    return re.search(rf"^\s*(?:import {module}\b|from {module} import)", text, re.M) is not None


@pytest.mark.parametrize("path", sorted((ROOT / "tests").glob("test_*.py")), ids=lambda p: p.name)
def test_tests_that_start_daemons_or_a_browser_stay_out_of_the_fast_subset(path):
    text = path.read_text()
    if any(_uses(text, m) for m in DAEMON_HARNESSES):
        assert "pytest.mark.root" in text, f"{path.name} starts daemons or namespaces: mark it root"
    if _uses(text, "chromium"):
        assert re.search(r"pytestmark\s*=.*pytest\.mark\.slow", text, re.S), f"{path.name} drives Chromium: mark it slow"
