"""Results, verdict exit codes, config, state history, injections, Prometheus output."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from gpucheck.core.levels import Level
from gpucheck.core.check import define
from gpucheck.core.config import ConfigError, load_config
from gpucheck.core.inject import InjectionError, parse_injection
from gpucheck.render.prom import render
from gpucheck.core.selection import SelectionError, select
from gpucheck.core.result import (Action, Result, ResultEntry, Status, Threshold, judge, strongest_action,
                                  worst_status)
from gpucheck.core.state import State
from gpucheck.core.verdict import SCHEMA, CheckEntry, RunFacts, Verdict, build_verdict, exit_code_for


# -- results ---------------------------------------------------------------------------------
def test_worst_status_order():
    assert worst_status([]) is Status.SKIP
    assert worst_status([Status.PASS, Status.SKIP]) is Status.PASS
    assert worst_status([Status.WARN, Status.ERROR]) is Status.ERROR
    assert worst_status([Status.ERROR, Status.FAIL, Status.PASS]) is Status.FAIL


def test_strongest_action():
    assert strongest_action([]) is Action.NONE
    assert strongest_action([Action.RESET_GPU, Action.REBOOT, Action.INVESTIGATE]) is Action.REBOOT
    assert strongest_action([Action.DRAIN, Action.RMA]) is Action.RMA


def test_judge_names_violations_and_actions():
    th = [
        Threshold("dbe", ">", 0, Status.FAIL),
        Threshold("sbe", ">", 100, Status.WARN),
    ]
    r = judge("ecc", th, {"dbe": 2, "sbe": 500}, gpu=3, causes={"dbe": "uncorrectable ECC"},
              actions={"dbe": Action.RESET_GPU, "sbe": Action.INVESTIGATE})
    assert r.status is Status.FAIL and r.action is Action.RESET_GPU and r.subject == "gpu3"
    assert r.summary.startswith("uncorrectable ECC (dbe=2 > 0)")
    assert "sbe=500 > 100" in r.summary
    ok = judge("ecc", th, {"dbe": 0, "sbe": None})
    assert ok.status is Status.PASS and ok.action is Action.NONE  # None never violates
    with pytest.raises(ValueError):
        Threshold("x", "=>", 1, Status.FAIL)


def test_result_roundtrip():
    r = judge("ecc", [Threshold("dbe", ">", 0, Status.FAIL, "count")], {"dbe": 1}, gpu=0)
    r.evidence.append("line")
    r.injected.append("bitflip:gpu=0")
    again = Verdict.from_json(_verdict([r]).to_json()).results[0]  # its JSON, read back
    assert again == ResultEntry.of(r) and again.to_json() == r.to_dict()


# -- verdict ---------------------------------------------------------------------------------
def _r(status, action=Action.NONE):
    return Result("c", status, "s", action=action)


def _verdict(results, **facts) -> Verdict:
    """The verdict of `results` (a level-1 run of node n1 at time 0, unless `facts` say otherwise)."""
    run = dict(level=Level.QUICK, started_at=0.0, duration_s=1.0, checks=(), host="n1",
               software={k: None for k in SCHEMA["properties"]["software"]["required"]})
    return build_verdict(results, RunFacts(**{**run, **facts}))


@pytest.mark.parametrize(
    "statuses,strict,on_error,partial,code",
    [
        ([Status.PASS, Status.SKIP], False, "pass", False, 0),
        ([Status.WARN], False, "pass", False, 0),
        ([Status.WARN], True, "pass", False, 1),
        ([Status.FAIL, Status.ERROR], False, "pass", False, 1),
        ([Status.ERROR, Status.PASS], False, "pass", False, 3),
        ([Status.ERROR], False, "fail", False, 1),
        ([Status.PASS], False, "pass", True, 3),
        ([Status.PASS], False, "fail", True, 1),
        ([Status.SKIP], False, "pass", False, 0),
    ],
)
def test_exit_codes(statuses, strict, on_error, partial, code):
    assert exit_code_for([_r(s) for s in statuses], strict=strict, on_error=on_error, partial=partial) == code


def test_verdict_validates_and_folds():
    jsonschema = pytest.importorskip("jsonschema")
    results = [_r(Status.PASS), _r(Status.WARN, Action.INVESTIGATE), _r(Status.FAIL, Action.REBOOT)]
    v = _verdict(results, checks=(CheckEntry.of("c", 1, Status.FAIL, 0.1),)).to_json()
    jsonschema.Draft202012Validator(SCHEMA).validate(v)
    assert v["status"] == "fail" and v["action"] == "reboot" and v["exit_code"] == 1
    assert v["counts"] == {"pass": 1, "warn": 1, "fail": 1, "skip": 0, "error": 0}
    assert v["time"] == "1970-01-01T00:00:00Z"


# -- config ----------------------------------------------------------------------------------
def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[node]\nexpected_gpus = 'eight'\n", "node.expected_gpus: expected an integer"),
        ("[node]\ngpus = 8\n", "node.gpus: unknown key"),
        ("[nodes]\n", "nodes: unknown key"),
        ("[run]\non_error = 'maybe'\n", "run.on_error"),
        ("[run]\nlevel = 9\n", "run.level: unknown level"),
        ("[node\n", "not valid TOML"),
        ("[checks]\necc = 3\n", "[checks] must hold one table per check"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path, text, needle):
    p = _cfg(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert needle in str(e.value) and str(p) in str(e.value)


def test_config_check_overrides_validated(tmp_path):
    spec = define("ecc", title="t", level=1, defaults={"limit": 10, "on": True})(lambda c: []).spec
    cfg = load_config(_cfg(tmp_path, "[checks.ecc]\nlimit = 5\n"))
    cfg.validate_checks([spec])
    assert cfg.check_overrides("ecc") == {"limit": 5}
    with pytest.raises(ConfigError, match="checks.ecc.limitt: unknown key"):
        load_config(_cfg(tmp_path, "[checks.ecc]\nlimitt = 5\n")).validate_checks([spec])
    with pytest.raises(ConfigError, match="checks.ecc.on: expected true or false"):
        load_config(_cfg(tmp_path, "[checks.ecc]\non = 1\n")).validate_checks([spec])
    with pytest.raises(ConfigError, match=r"\[checks.nope\]: unknown check"):
        load_config(_cfg(tmp_path, "[checks.nope]\nx = 1\n")).validate_checks([spec])


def test_missing_explicit_config(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


# -- selection -------------------------------------------------------------------------------
def test_select_levels_globs_and_unknown_ids():
    mk = lambda i, lv: define(i, title=i, level=lv)(lambda c: [])  # noqa: E731
    checks = [mk("ecc", 1), mk("burn.gemm", 2), mk("burn.mem", 3)]
    assert [c.id for c in select(checks, Level.QUICK)] == ["ecc"]
    assert [c.id for c in select(checks, Level.EXTENDED, skip=["burn.gemm"])] == ["ecc", "burn.mem"]
    assert [c.id for c in select(checks, Level.QUICK, include=["burn.*"])] == ["burn.gemm", "burn.mem"]
    with pytest.raises(SelectionError, match="unknown check id 'nope'"):
        select(checks, Level.QUICK, include=["nope"])


def test_level_parse():
    assert Level.parse("burn-in") is Level.BURN_IN and Level.parse(2) is Level.STANDARD
    with pytest.raises(ValueError):
        Level.parse("5")


# -- injections ------------------------------------------------------------------------------
def test_parse_injection():
    inj = parse_injection("slow:gpu=2,factor=0.7")
    assert inj.kind == "slow" and inj.params == {"gpu": 2, "factor": 0.7}
    assert inj.targets_gpu(2) and not inj.targets_gpu(1)
    assert parse_injection("hang").targets_gpu(5)
    for bad in ("", "slow:gpu", "slow:=2", "sl ow:gpu=1"):
        with pytest.raises(InjectionError):
            parse_injection(bad)


# -- state -----------------------------------------------------------------------------------
def _append_many(root: str, who: int, n: int) -> None:
    st = State(root)
    pad = "x" * 20000  # lines far larger than PIPE_BUF still arrive whole
    for i in range(n):
        st.append_history({"schema": "gpucheck.verdict", "who": who, "i": i, "pad": pad, "results": []})


@pytest.mark.slow
def test_history_appends_are_atomic_across_processes(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = (tmp_path / "history.jsonl").read_bytes().splitlines()
    assert len(lines) == 200
    docs = [json.loads(line) for line in lines]  # every line parses: nothing interleaved
    assert sorted((d["who"], d["i"]) for d in docs) == sorted((w, i) for w in range(4) for i in range(50))


def test_history_skips_torn_lines_and_finds_previous_metrics(tmp_path):
    st = State(tmp_path)
    r = Result("nvlink", Status.PASS, "ok", gpu=0).metric("uuid", "GPU-a").metric("replay", 5)
    st.append_history({"schema": "gpucheck.verdict", "time": "t1", "results": [r.to_dict()]})
    with open(st.history_path, "ab") as f:
        f.write(b'{"schema": "gpucheck.verdict", "torn')
    assert st.previous_metrics("nvlink", "uuid", "GPU-a") == ({"uuid": "GPU-a", "replay": 5}, "t1")
    assert st.previous_metrics("nvlink", "uuid", "GPU-b") is None
    st.write_cursor("last-pass", {"epoch": 1.5})
    assert st.read_cursor("last-pass") == {"epoch": 1.5}
    assert st.read_cursor("other") is None
    with pytest.raises(ValueError):
        st.write_cursor("../evil", 1)


# -- prometheus ------------------------------------------------------------------------------
def test_prom_render():
    r = Result("ecc", Status.FAIL, "dbe", gpu=1, action=Action.RESET_GPU)
    r.metric("volatile_dbe", 3, "count").metric("temp", 81.5, "C").metric("uuid", "GPU-x").metric("flag", True)
    v = _verdict([r], host='n"1', started_at=1767225600.0, duration_s=2.0)  # 2026-01-01T00:00:00Z
    assert (v.action, v.status) == (Action.RESET_GPU, Status.FAIL)
    text = render(v)
    assert 'gpucheck_verdict_status{host="n\\"1",level="1",action="reset-gpu"} 2' in text
    assert 'gpucheck_check_status{host="n\\"1",check="ecc",subject="gpu1",gpu="1",action="reset-gpu"} 2' in text
    assert 'gpucheck_metric_volatile_dbe{host="n\\"1",check="ecc",subject="gpu1",gpu="1"} 3' in text
    assert "gpucheck_metric_temp_c{" in text and "} 81.5" in text
    assert "gpucheck_metric_flag{" in text
    assert "uuid" not in text.split("gpucheck_metric_")[-1] or "GPU-x" not in text
    assert "gpucheck_verdict_timestamp_seconds" in text and "1767225602.000" in text
    # every sample line is name{labels} value
    for line in text.splitlines():
        if not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            float(value)
            assert name.endswith("}")


def _append_rotating(root: str, who: int, n: int) -> None:
    st = State(root, history_max_bytes=60_000)
    for i in range(n):
        st.append_history({"schema": "gpucheck.verdict", "who": who, "i": i, "pad": "y" * 1000, "results": []})


def _doc(i: int) -> dict:
    return {"schema": "gpucheck.verdict", "i": i, "pad": "x" * 60}


def test_a_writer_holding_the_old_generation_does_not_rotate_it_away(tmp_path, monkeypatch):
    """The race the concurrent test below hit once in CI: writer B opened history.jsonl and waited
    on its lock while writer A rotated it. B then holds a lock on the full old generation; judging
    that file's size, it used to rotate again and rename the fresh file over the old generation."""
    import fcntl

    line = len(json.dumps(_doc(0), separators=(",", ":"), sort_keys=True)) + 1
    st = State(tmp_path, history_max_bytes=4 * line)
    for i in range(4):  # the fourth fills the file
        st.append_history(_doc(i))
    st.append_history(_doc(4))  # writer A rotates
    old = st.rotated_path.read_bytes()
    assert len(old.splitlines()) == 4

    stale = os.open(st.rotated_path, os.O_WRONLY | os.O_APPEND)  # what B opened before the rename
    fcntl.flock(stale, fcntl.LOCK_EX)
    real = State._open_locked
    calls = []

    def first_open_is_stale(self):
        calls.append(1)
        return stale if len(calls) == 1 else real(self)

    monkeypatch.setattr(State, "_open_locked", first_open_is_stale)
    st.append_history(_doc(5))  # writer B
    assert st.rotated_path.read_bytes() == old  # the old generation is intact
    assert [d["i"] for d in st.iter_history()] == [0, 1, 2, 3, 4, 5]


def test_history_rotates_without_losing_or_tearing_lines(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_rotating, args=(str(tmp_path), w, 40)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    st = State(tmp_path)
    assert st.rotated_path.exists()
    assert st.history_path.stat().st_size <= 60_000 and st.rotated_path.stat().st_size <= 60_000
    for path in (st.rotated_path, st.history_path):
        for line in path.read_bytes().splitlines():
            json.loads(line)  # nothing torn
    docs = list(st.iter_history())
    # only one older generation is kept: the newest lines survive, each writer's in order, and
    # the very last line written is some writer's last one
    assert len(docs) >= 50
    last = {}
    for d in docs:
        assert d["i"] > last.get(d["who"], -1)
        last[d["who"]] = d["i"]
    assert docs[-1]["i"] == 39
