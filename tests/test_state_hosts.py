"""History keyed by host (issue 26): a shared default state directory mixed hosts, and a report
of one node showed "History of n1, vm". Every verdict names its host; a node's run reads only its
own host's verdicts (gpucheck.core.state.State(host=...)), and `gpucheck report` draws one history
section per host."""

from __future__ import annotations

import json
from pathlib import Path

from gpucheck.cli.main import main
from gpucheck.core.state import State

SNAPS = Path(__file__).resolve().parent / "fixtures" / "snapshots"


def _replay(capsys, state_dir: Path, snapshot: str) -> dict:
    main(["run", "--json", "--snapshot", str(SNAPS / snapshot), "--state-dir", str(state_dir)])
    return json.loads(capsys.readouterr().out)


def test_a_shared_state_directory_is_read_per_host(tmp_path, capsys, monkeypatch):
    from gpucheck import app

    seen: list[str | None] = []

    class Spy(State):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen.append(self.host)

    monkeypatch.setattr(app, "State", Spy)
    v100 = _replay(capsys, tmp_path, "v100-retired-pages.json")
    h100 = _replay(capsys, tmp_path, "h100-healthy.json")
    assert (v100["host"], h100["host"]) == ("gpu-v100-003", "gpu-h100-017")
    assert seen == ["gpu-v100-003", "gpu-h100-017"]  # each run reads as its own host
    with open(tmp_path / "history.jsonl", "a") as f:  # an old line without a host stays readable
        f.write(json.dumps({**h100, "host": None}) + "\n")
    mine = State(tmp_path, host="gpu-h100-017")
    assert [v["host"] for v in mine.iter_history()] == ["gpu-h100-017", None] and mine.other_hosts == 1
    assert [v["host"] for v in State(tmp_path).iter_history()] == ["gpu-v100-003", "gpu-h100-017", None]


def test_a_history_of_several_hosts_is_one_report_section_per_host(tmp_path, capsys):
    _replay(capsys, tmp_path, "v100-retired-pages.json")
    _replay(capsys, tmp_path, "h100-healthy.json")
    _replay(capsys, tmp_path, "h100-ecc-dbe.json")
    page = tmp_path / "page.html"
    assert main(["report", str(tmp_path / "history.jsonl"), "-o", str(page)]) == 0
    html = page.read_text()
    assert "History of gpu-v100-003: 1 run(s)" in html and "History of gpu-h100-017: 2 run(s)" in html
    assert "History of gpu-h100-017, gpu-v100-003" not in html and html.count("History of ") == 2


def test_cursors_are_per_host_and_an_old_shared_cursor_is_still_read(tmp_path):
    """The Xid last-pass mark of one node must never hide another node's Xids in a shared state
    directory: with a host, a cursor is that host's file (cursor-NAME@HOST.json)."""
    State(tmp_path).write_cursor("last-pass", {"epoch": 1.0})  # written before cursors were per host
    n1, n2 = State(tmp_path, host="n1"), State(tmp_path, host="n2\n/../x")
    assert n1.read_cursor("last-pass") == {"epoch": 1.0}  # the old file stays readable
    n1.update_cursor("last-pass", lambda _old: {"epoch": 5.0})
    assert n1.read_cursor("last-pass") == {"epoch": 5.0} and n2.read_cursor("last-pass") == {"epoch": 1.0}
    n2.write_cursor("last-pass", {"epoch": 7.0})
    assert (n1.read_cursor("last-pass"), n2.read_cursor("last-pass")) == ({"epoch": 5.0}, {"epoch": 7.0})
    assert sorted(p.name for p in tmp_path.glob("cursor-last-pass*.json")) == [
        "cursor-last-pass.json", "cursor-last-pass@n1.json", "cursor-last-pass@n2__.._x.json"]
