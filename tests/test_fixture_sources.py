"""Every file under tests/fixtures says where it came from (issue 15): a `<file>.source` next to it
whose `kind:` is a real capture (with where it was published, what was edited, the verdict it
should get), synthetic (with why), recorded from gpucheck's own test job, generated, or
documentation."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def fields(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith(" "):
            out[key.strip()] = value.strip()
    return out


def test_every_fixture_has_a_source_that_says_what_it_is():
    files = [p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix != ".source"]
    assert len(files) > 40
    for p in files:
        src = p.with_name(p.name + ".source")
        assert src.is_file(), f"{p.relative_to(FIXTURES)} has no .source"
        f = fields(src)
        kind = f.get("kind", "")
        assert kind.split(" ")[0] in {"real", "synthetic", "recorded", "generated", "documentation"}, (src, kind)
        if kind.startswith("real"):
            assert ("source" in f or "url" in f) and "edits" in f and "verdict" in f and "tested by" in f, src
            assert "github.com" in (f.get("source", "") + f.get("url", "")), src
        elif kind.startswith("synthetic"):
            assert "why" in f, src


def test_no_source_file_is_orphaned():
    for src in FIXTURES.rglob("*.source"):
        assert src.with_name(src.name[: -len(".source")]).is_file(), src
