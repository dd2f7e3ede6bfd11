"""eud.memtest's ECC counters and headroom round, without a GPU.

ECC: with ECC on, a cell that flips one bit is corrected on the way out and the patterns never see
it: only the counters do. They are read (NVML calls checked against the snapshot reader's, through
tests/snapshot_nvml.py) before the first pass and after every pass, and any growth fails the GPU
naming the counter; counters that cannot be read make the result `error`, never a pass; the
`ecc` injection proves the detector fires through CPU workers and `gpucheck run`.

Headroom: the first round keeps max(5 %, 1 GiB) free and never tests it; at levels 3-4 a second
round (first-round chunks partly kept, the rest released) allocates all but a small reserve, so
the headroom's memory is tested too (the stub CuPy's memory accounting shows it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

import fakecupy  # noqa: E402
from snapshot_nvml import SnapshotNvml  # noqa: E402
from test_eud_memtest_fakecupy import (  # noqa: E402,F401 - fixtures and helpers of the CuPy-path tests
    L2,
    SMALL,
    STEP_BYTES,
    _chan,
    _cuda_ctx,
    _in_process_workers,
    ecc_readers,
    fake,
)

from gpucheck.core.check import Context
from gpucheck.core.levels import Level  # noqa: E402
from gpucheck.core.config import Config  # noqa: E402
from gpucheck.tests_suite import eud_memtest as mt  # noqa: E402
from gpucheck.eud import memtest_ecc as E  # noqa: E402
from gpucheck.eud import memtest_worker as mw  # noqa: E402
from gpucheck.eud import patterns as P  # noqa: E402
from gpucheck.core.inject import parse_injection  # noqa: E402
from gpucheck.core.result import Action, Status  # noqa: E402
from gpucheck.core.runner import run_checks  # noqa: E402
from gpucheck.workers import pool  # noqa: E402
from gpucheck.workers.pool import LocalChannel  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "snapshots"
P_DEFAULTS = mt._params(Context())


def _gpu(name: str, index: int) -> dict:
    return json.loads((FIXTURES / name).read_text())["gpus"][index]


def _reads(*counters: dict, labels=None) -> list[dict]:
    labels = labels or ["before pass 0"] + [f"after pass {i}" for i in range(len(counters) - 1)]
    out = []
    for label, c in zip(labels, counters):
        r = E.empty_reading(label)
        r["counters"] = {k: (False if k in E.FLAGS else 0) for k in E.COUNTERS} | c
        out.append(r)
    return out


# -- reading -------------------------------------------------------------------------------------------
def test_the_counters_are_read_with_the_snapshot_readers_nvml_calls():
    g = _gpu("h100-ecc-dbe.json", 3)  # 5 corrected, 2 uncorrected: real values must come through
    nv = SnapshotNvml(g)
    r = E.read_counters(nv, 3, "before pass 0")
    assert r["errors"] == {} and r["counters"] == {
        "volatile_corrected": 5, "volatile_uncorrected": 2, "remapped_correctable": 0, "remapped_uncorrectable": 0,
        "remap_pending": False, "remap_failure": False}
    assert nv.calls == [("nvmlDeviceGetTotalEccErrors", 0, 0), ("nvmlDeviceGetTotalEccErrors", 1, 0),
                        ("nvmlDeviceGetRemappedRows",)]
    r = E.read_counters(SnapshotNvml(_gpu("h100-remap-failure.json", 6)), 6, "after pass 0")
    assert [r["counters"][k] for k in ("remapped_correctable", "remapped_uncorrectable", "remap_pending",
                                       "remap_failure")] == [3, 9, False, True]
    g = _gpu("h100-healthy.json", 0)
    # a failed read is an unread field (with NVML's kind), a not-supported one is None without error
    r = E.read_counters(SnapshotNvml(g, fail=("nvmlDeviceGetRemappedRows",)), 0, "x")
    assert r["errors"] == {c: "other" for c in ("remapped_correctable", "remapped_uncorrectable", "remap_pending",
                                                "remap_failure")}
    g2 = dict(g, ecc_errors=dict(g["ecc_errors"], volatile_corrected=None))
    r = E.read_counters(SnapshotNvml(g2), 0, "x")
    assert r["counters"]["volatile_corrected"] is None and r["errors"] == {}


def test_growth_between_readings():
    reads = _reads({"volatile_corrected": 5}, {"volatile_corrected": 7, "remap_pending": True},
                   {"volatile_corrected": 7, "remap_pending": True})
    g = E.growth(reads)
    assert g["volatile_corrected"] == {"value": 2, "unread": None, "steps": [("before pass 0", "after pass 0", 2)]}
    assert g["remap_pending"]["value"] == 1 and g["remap_failure"]["value"] == 0
    assert g["volatile_uncorrected"]["value"] == 0
    reads[1]["errors"]["volatile_uncorrected"] = "no_permission"
    reads[2]["counters"]["remapped_correctable"] = None  # supported once, then missing
    g = E.growth(reads)
    assert g["volatile_uncorrected"]["unread"] == "no_permission" and g["volatile_uncorrected"]["value"] is None
    assert g["remapped_correctable"]["unread"] == "missing"
    assert E.growth(reads[:1])["volatile_corrected"]["value"] is None  # one reading: nothing to compare
    for bad in ({"corrected": -1}, {"bogus": 1}):
        with pytest.raises(ValueError):
            E.inject_spec(bad)
    assert E.inject_spec({"gpu": 1}) == {"corrected": 1}


# -- judging -------------------------------------------------------------------------------------------
def _data(reads, failure=None, **cfg):
    c = mw.MemtestConfig(cpu_bytes=64 << 10, cpu_chunk_bytes=32 << 10, copy_bytes=8 << 10, copy_repeats=2,
                         patterns=["zeros"], **cfg)
    d = mw.run_memtest(mw.NumpyBackend(c), c, LocalChannel())
    d["ecc"] = {"source": "nvml", "reads": reads, "note": None, "failure": failure, "injected": []}
    return d


def test_ecc_growth_during_the_test_fails_the_gpu_and_names_the_counter():
    d = _data(_reads({"volatile_corrected": 3}, {"volatile_corrected": 5}))
    r = mt.judge_data(2, d, P_DEFAULTS, "cuda", [], ecc_enabled=True)
    assert r.status == Status.FAIL and r.action == Action.DRAIN and r.metrics["errors"] == 0
    assert r.summary.startswith("corrected (single-bit) ECC errors during the pattern test: cells that ECC hid "
                                "from the patterns (before pass 0 -> after pass 0: +2) (ecc_corrected_growth=2 > 0)")
    assert r.metrics["ecc_corrected_growth"] == 2 and r.metrics["ecc_uncorrected_growth"] == 0
    assert {(t.metric, t.limit) for t in r.thresholds} >= {("ecc_corrected_growth", 0), ("remap_failure_new", 0)}
    # uncorrectable errors and new remaps: reset-gpu; a failed remap: rma (the strongest action wins)
    d = _data(_reads({}, {"volatile_uncorrected": 1, "remapped_uncorrectable": 1, "remap_pending": True}))
    r = mt.judge_data(2, d, P_DEFAULTS, "cuda", [])
    assert r.status == Status.FAIL and r.action == Action.RESET_GPU
    assert "uncorrectable ECC errors during the pattern test" in r.summary and "became pending" in r.summary
    d = _data(_reads({}, {"remap_failure": True}))
    assert mt.judge_data(2, d, P_DEFAULTS, "cuda", []).action == Action.RMA
    # the limits are data: a site that tolerates some corrected errors raises the limit
    d = _data(_reads({"volatile_corrected": 3}, {"volatile_corrected": 5}))
    r = mt.judge_data(2, d, {**P_DEFAULTS, "ecc_corrected_growth_max": 2}, "cuda", [])
    assert r.status == Status.PASS and "ECC counters did not grow" in r.summary


def test_counters_that_could_not_be_read_are_could_not_judge_never_a_pass():
    reads = _reads({}, {})
    reads[1]["errors"]["volatile_corrected"] = "no_permission"
    r = mt.judge_data(0, _data(reads), P_DEFAULTS, "cuda", [])
    assert r.status == Status.ERROR and r.summary.startswith(
        "could not judge the ECC counters around the passes: volatile_corrected (no_permission) could not be read")
    r = mt.judge_data(0, _data([], failure="NVML not usable: driver_not_loaded"), P_DEFAULTS, "cuda", [])
    assert r.status == Status.ERROR and "ECC counters (NVML not usable: driver_not_loaded)" in r.summary
    # a memory fault found anyway is still a fail: what was examined failed
    d = _data(reads, inject={"offset": 80, "bit": 1})
    assert mt.judge_data(0, d, P_DEFAULTS, "cuda", []).status == Status.FAIL
    # counters the GPU does not support are not judged, and the result says so
    none = _reads({k: None for k in ("volatile_corrected", "volatile_uncorrected")},
                  {k: None for k in ("volatile_corrected", "volatile_uncorrected")})
    r = mt.judge_data(0, _data(none), P_DEFAULTS, "cuda", [])
    assert r.status == Status.PASS and "not supported on this GPU (not judged): volatile_corrected, " \
                                      "volatile_uncorrected" in " ".join(r.evidence)


@pytest.mark.slow
def test_the_cupy_path_reads_the_counters_around_every_pass(monkeypatch, fake, ecc_readers):
    monkeypatch.setattr(pool, "run_workers", _in_process_workers)
    fake.free = (48 << 10) + STEP_BYTES
    ecc_readers.grow = {1: {"volatile_corrected": 4}}  # GPU 1: 4 more corrected errors at every reading
    ctx = _cuda_ctx()
    ctx.config = Config(checks={"eud.memtest": {**ctx.config.checks["eud.memtest"], "passes_level2": 2}})
    res = {r.gpu: r for r in run_checks([mt.memtest], ctx, install_signal_handlers=False).results}
    assert [r.reads for r in ecc_readers.readers] == [3, 3]  # before pass 0, after pass 0, after pass 1
    assert res[0].status == Status.PASS and res[0].metrics["ecc_corrected_growth"] == 0
    bad = res[1]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN and bad.metrics["errors"] == 0
    assert bad.metrics["ecc_corrected_growth"] == 8
    assert "(before pass 0 -> after pass 0: +4; after pass 0 -> after pass 1: +4)" in bad.summary


def test_nvml_that_cannot_read_the_gpu_is_an_error(monkeypatch, fake):
    def refuse(index, uuid=None):
        raise E.EccReadError("NVML not usable: driver_not_loaded: Driver Not Loaded")

    monkeypatch.setattr(mw, "NvmlEccReader", refuse)
    monkeypatch.setattr(pool, "run_workers", _in_process_workers)
    fake.free = (48 << 10) + STEP_BYTES
    ctx = _cuda_ctx()
    ctx.gpus = [0]
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.ERROR and "driver_not_loaded" in r.summary and r.metrics["errors"] == 0


# -- the injection, through CPU workers and the CLI --------------------------------------------------------
CPU = {"cpu_bytes": 64 << 10, "cpu_chunk_bytes": 32 << 10, "copy_bytes": 8 << 10, "copy_repeats": 2,
       "startup_timeout_s": 60.0, "heartbeat_timeout_s": 20.0, "patterns": ["zeros", "random"]}


def _cpu_ctx(injections, level=Level.STANDARD, workers=2, **checks):
    return Context(level=level, config=Config(checks={"eud.memtest": {**CPU, **checks}}), device="cpu",
                   workers=workers, injections=[parse_injection(t) for t in injections])


def test_an_ecc_injection_fails_exactly_its_gpu():
    ctx = _cpu_ctx(["ecc:gpu=1,corrected=3"])
    res = {r.gpu: r for r in run_checks([mt.memtest], ctx, install_signal_handlers=False).results}
    assert res[0].status == Status.PASS and res[0].injected == [] and "ecc_corrected_growth" not in res[0].metrics
    assert "no ECC counters: a CPU worker stands in for the GPU" in res[0].evidence
    bad = res[1]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN and bad.injected == ["ecc:gpu=1,corrected=3"]
    assert bad.metrics["ecc_corrected_growth"] == 3 and bad.metrics["errors"] == 0
    assert "(before pass 0 -> after pass 0: +3)" in bad.summary
    assert "injected ecc: volatile_corrected +3 in the readings from after pass 0 on" in bad.evidence
    assert any(x.startswith("ECC counters (synthetic (injection on a CPU stand-in)) read 2 times") for x in bad.evidence)
    ctx = _cpu_ctx(["ecc:gpu=0,bogus=1"], workers=1)
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.ERROR and "unknown parameter(s) bogus" in r.summary


def test_cli_ecc_injection(monkeypatch, tmp_path, capsys):
    from gpucheck import app
    from gpucheck.tests_suite import registry
    from gpucheck.cli.main import main

    monkeypatch.setattr(app, "all_checks", lambda **kw: registry.all_checks(("gpucheck.tests_suite.eud_memtest",)))
    cfg = tmp_path / "gpucheck.toml"
    cfg.write_text('[checks."eud.memtest"]\n' + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in CPU.items()))
    rc = main(["run", "--check", "eud.memtest", "--level", "2", "--device", "cpu", "--workers", "1",
               "--inject", "ecc:gpu=0,uncorrected=1", "--json", "--config", str(cfg), "--state-dir", str(tmp_path / "s")])
    verdict = json.loads(capsys.readouterr().out)
    (r,) = verdict["results"]
    assert rc == 1 and r["status"] == "fail" and r["action"] == "reset-gpu"
    assert r["metrics"]["ecc_uncorrected_growth"]["value"] == 1


# -- the headroom round --------------------------------------------------------------------------------------
def test_the_headroom_round_on_the_numpy_path():
    cfg = mw.MemtestConfig(cpu_bytes=64 << 10, cpu_chunk_bytes=16 << 10, copy_bytes=8 << 10, copy_repeats=2,
                           headroom_round=True)
    out = mw.run_memtest(mw.NumpyBackend(cfg), cfg, LocalChannel())
    h = out["headroom_round"]
    # the CPU stand-in's headroom is one chunk: one chunk released, three kept, then that chunk's
    # size plus a chunk of new memory tested
    assert (h["released_bytes"], h["held_bytes"], h["region_bytes"], h["passes"]) == (16 << 10, 48 << 10, 32 << 10, 1)
    assert h["errors"]["errors"] == 0 and all(v["runs"] == 2 for v in out["per_pattern"].values())
    assert mt.judge_data(0, out, P_DEFAULTS, "cpu", []).summary.startswith(
        "no memory errors in 96.0 KiB tested (9 pattern(s) x 1 pass(es) + a headroom round)")


def test_the_headroom_round_tests_all_memory_but_the_reserve(fake, ecc_readers):
    """Round 1 keeps the headroom free; round 2 keeps most of round 1 allocated, releases at least
    the headroom's size and allocates everything then free but the reserve: the first round's
    untouched headroom is in it."""
    fake.free = (64 << 10) + STEP_BYTES
    cfg = mw.MemtestConfig.from_args({**SMALL, "headroom_min_bytes": 16 << 10, "round2_reserve_bytes": 4 << 10,
                                      "headroom_round": True, "patterns": ["random"]})
    be = mw.CupyBackend.create(_chan(), cfg)
    free0 = fake.free  # after the backend's own buffers
    lowest = []
    real_alloc = be.alloc
    be.alloc = lambda words: (real_alloc(words), lowest.append(fake.free))[0]
    out = mw.run_memtest(be, cfg, _chan(), ecc=mw.EccMonitor())
    h = out["headroom_round"]
    assert out["region_bytes"] == free0 - (16 << 10)  # round 1: all but the headroom
    assert h["released_bytes"] == 16 << 10 and h["held_bytes"] == out["region_bytes"] - (16 << 10)
    assert h["region_bytes"] == free0 - h["held_bytes"] - (4 << 10)  # round 2: all that was free but the reserve
    assert min(lowest) == 4 << 10  # at its peak the test held every byte but the reserve
    assert h["passes"] == 1 and h["errors"]["errors"] == 0 and fake.live_bytes() == STEP_BYTES


def test_errors_found_only_in_the_headroom_round_fail_the_gpu():
    class BadHeadroom(mw.NumpyBackend):  # the second round's first chunk has a stuck bit
        rounds = 0

        def alloc(self, words):
            buf = super().alloc(words)
            self.rounds += 1
            self.bad = buf if self.rounds == 5 else getattr(self, "bad", None)
            return buf

        def fill(self, buf, base, kind, seed, xw):
            super().fill(buf, base, kind, seed, xw)
            if buf is self.bad:
                buf[3] |= np.uint64(1 << 7)

    cfg = mw.MemtestConfig(cpu_bytes=64 << 10, cpu_chunk_bytes=16 << 10, copy_bytes=8 << 10, copy_repeats=2,
                           headroom_round=True, patterns=["zeros"])
    out = mw.run_memtest(BadHeadroom(cfg), cfg, LocalChannel())
    assert out["errors"]["errors"] == 0 and out["headroom_round"]["errors"]["errors"] == 2  # run + rerun
    r = mt.judge_data(0, out, P_DEFAULTS, "cpu", [])
    assert r.status == Status.FAIL and r.action == Action.RMA
    assert r.summary.startswith("memory errors: 2 (2 in the headroom round) in 96.0 KiB tested")
    assert "[headroom round, pattern zeros, verify, pass 0]" in r.summary
    assert r.metrics["headroom_errors"] == 2 and r.metrics["headroom_bytes_tested"] == 32 << 10


def test_a_headroom_round_that_could_not_allocate_is_an_error():
    class NoRoom(mw.NumpyBackend):
        def second_round_target(self, released):
            return 0, {"free_bytes": 0, "reserve_bytes": 0}

    cfg = mw.MemtestConfig(cpu_bytes=64 << 10, cpu_chunk_bytes=16 << 10, copy_bytes=8 << 10, copy_repeats=2,
                           headroom_round=True, patterns=["zeros"])
    out = mw.run_memtest(NoRoom(cfg), cfg, LocalChannel())
    r = mt.judge_data(0, out, P_DEFAULTS, "cpu", [])
    assert r.status == Status.ERROR and r.summary.startswith("could not test the headroom")


def test_level3_runs_the_headroom_round_through_cpu_workers():
    ctx = _cpu_ctx([], level=Level.EXTENDED, workers=1, passes_level3=1)
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.PASS and r.metrics["headroom_bytes_tested"] == 64 << 10
    assert "+ a headroom round" in r.summary
    assert any(x.startswith("headroom round: released 32.0 KiB of the first round") for x in r.evidence)
