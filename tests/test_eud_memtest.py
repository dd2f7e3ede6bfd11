"""eud.memtest without a GPU: the pattern definitions, the NumPy path, the error summaries and the
verdict rules, the check through CPU workers and through `gpucheck run` (the CUDA kernels of
gpucheck/kernels/memtest.cu run on the CPU in tests/test_eud_memtest_kernels.py; ECC counters and
the headroom round in tests/test_eud_memtest_ecc.py). Every detector is shown
to fire: an injected bit flip must come back at the right byte offset with the right expected
and actual words and flipped bits, and turn exactly its GPU from pass into fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

from gpucheck.core.check import Context
from gpucheck.core.levels import Level  # noqa: E402
from gpucheck.core.config import Config  # noqa: E402
from gpucheck.tests_suite import eud_memtest as mt  # noqa: E402
from gpucheck.tests_suite.eud_memtest import MemtestOptions  # noqa: E402
from gpucheck.eud import patterns as P  # noqa: E402
from gpucheck.eud.memtest_worker import MemtestConfig, NumpyBackend, run_memtest  # noqa: E402
from gpucheck.core.inject import parse_injection  # noqa: E402
from gpucheck.kernels import splitmix64  # noqa: E402
from gpucheck.core.result import Action, Status  # noqa: E402
from gpucheck.core.runner import run_checks  # noqa: E402
from gpucheck.workers.pool import CRASHED, HUNG, OK, LocalChannel, WorkerJob, WorkerOutcome  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"cpu_bytes": 128 << 10, "cpu_chunk_bytes": 64 << 10, "copy_bytes": 16 << 10, "copy_repeats": 3,
         "startup_timeout_s": 60.0, "heartbeat_timeout_s": 20.0}


def _cfg(**kw):
    base = dict(cpu_bytes=64 << 10, cpu_chunk_bytes=32 << 10, copy_bytes=8 << 10, copy_repeats=2)
    base.update(kw)
    return MemtestConfig(**base)


# -- pattern definitions -------------------------------------------------------------------------
def test_parse_patterns():
    assert P.parse_patterns(None) == list(P.NAMES)
    assert P.parse_patterns("random, walking_ones,random") == ["random", "walking-ones"]
    assert P.parse_patterns(["all"]) == list(P.NAMES)
    assert P.parse_patterns(("walking_ones,random", "ones")) == ["walking-ones", "random", "ones"]
    for bad in ("", "stripes", "zeros,bogus"):
        with pytest.raises(P.PatternError):
            P.parse_patterns(bad)


def test_pattern_values_follow_their_definitions():
    w = np.arange(0, 200, dtype=np.uint64)
    assert (P.word_values(P.KIND_ZEROS, 0, 0, 200) == 0).all()
    assert (P.word_values(P.KIND_ONES, 0, 0, 200) == np.uint64(P.MASK64)).all()
    walk = P.word_values(P.KIND_WALKING_ONES, 0, 0, 200)
    assert all(int(walk[i]) == 1 << (i % 64) for i in range(200))
    assert (P.word_values(P.KIND_WALKING_ZEROS, 0, 0, 200) == ~walk).all()
    cb = P.word_values(P.KIND_CHECKERBOARD, 0, 0, 4)
    assert [int(x) for x in cb] == [0x5555555555555555, 0xAAAAAAAAAAAAAAAA] * 2
    assert (P.word_values(P.KIND_CHECKERBOARD_INV, 0, 0, 200) == ~P.word_values(P.KIND_CHECKERBOARD, 0, 0, 200)).all()
    assert (P.word_values(P.KIND_ADDRESS, 0, 0, 200) == w * np.uint64(8)).all()  # each word holds its byte offset
    assert (P.word_values(P.KIND_RANDOM, 99, 0, 200) == splitmix64(99, w)).all()
    # the NumPy and the scalar definitions agree anywhere in a large region, e.g. past 2**32 words
    for kind in range(8):
        for first in (0, 1023, (1 << 33) + 5):
            vals = P.word_values(kind, 7, first, 70)
            assert [int(v) for v in vals] == [P.word_value(kind, 7, first + i) for i in range(70)], kind


def test_moving_inversions_steps_and_bytes():
    steps = P.steps_for("moving-inversions")
    assert [s.op for s in steps] == ["fill", "check", "check", "check"]
    asc, desc, final = steps[1:]
    assert asc.write and not asc.descending and asc.xor_expect == 0 and asc.xor_write == P.MASK64
    assert desc.write and desc.descending and desc.xor_expect == P.MASK64 and desc.xor_write == 0
    assert not final.write
    assert sum(s.bytes_moved(100) for s in steps) == 100 + 200 + 200 + 100
    assert sum(s.bytes_moved(100) for s in P.steps_for("zeros")) == 200
    # every pass writes new random data; moving inversions' base differs from the random pattern
    assert P.pattern_seed("random", 0, 0) != P.pattern_seed("random", 0, 1)
    assert P.pattern_seed("random", 0, 0) != P.pattern_seed("moving-inversions", 0, 0)


def test_the_address_pattern_stores_every_address_bit_as_0_and_as_1():
    """8 w alone never sets bits 0-2 (the byte offset of a word) nor the bits above the region's
    size; the complement step writes ~(8 w) over every word, so each bit holds both values."""
    steps = P.steps_for("address")
    assert [(s.op, s.write, s.xor_expect, s.xor_write) for s in steps] == [
        ("fill", False, 0, 0), ("check", True, 0, P.MASK64), ("check", False, P.MASK64, 0)]
    for w in (0, 1, 12345, (1 << 34) + 7):
        written = [P.word_value(P.KIND_ADDRESS, 0, w) ^ s.xor_write for s in steps if s.op == "fill" or s.write]
        assert all({(v >> b) & 1 for v in written} == {0, 1} for b in range(64)), w
    # the turnarounds of moving inversions start with an L2 scrub; no other step needs one
    assert [s.scrub_before for s in P.steps_for("moving-inversions")] == [False, False, True, True]
    assert not any(s.scrub_before for name in P.NAMES if name != "moving-inversions" for s in P.steps_for(name))


@pytest.mark.parametrize("bit", [1, 45])
def test_the_address_complement_step_catches_a_bit_stuck_at_0_that_8w_never_sets(bit):
    class StuckAt0(NumpyBackend):  # bit `bit` of word 100 reads 0 whatever was written there
        def fill(self, buf, base, kind, seed, xw):
            super().fill(buf, base, kind, seed, xw)
            self._stick(buf, base)

        def check(self, buf, base, kind, seed, xe, write, xw, desc):
            super().check(buf, base, kind, seed, xe, write, xw, desc)
            if write:
                self._stick(buf, base)

        def _stick(self, buf, base):
            if base <= 100 < base + buf.size:
                buf[100 - base] &= ~np.uint64(1 << bit)

    cfg = _cfg(patterns=["address"])
    e = run_memtest(StuckAt0(cfg), cfg, LocalChannel())["errors"]
    assert e["errors"] == 2 and e["persistent_words"] == 1 and e["first_offset"] == 800  # the run and its rerun
    rec = e["records"][0]
    assert rec["step"] == "verify the complement" and rec["expected"] == P.MASK64 ^ 800
    assert rec["actual"] == P.MASK64 ^ 800 ^ (1 << bit) and e["down"][bit] == 2


def test_accumulate_and_decode_a_known_set_of_errors():
    stats, errs = P.new_stats(), np.zeros(3 * 2, np.uint64)
    words = np.array([40, 7, 9], np.uint64)
    expected = np.array([0, P.MASK64, 0xF0], np.uint64)
    actual = np.array([1 << 3, P.MASK64 ^ (1 << 63) ^ (1 << 3), 0xF0 ^ 0x11], np.uint64)
    P.accumulate_errors(stats, errs, 2, words, expected, actual)
    d = P.decode_step(stats, errs, 2)
    assert d["errors"] == 3 and d["first_word"] == 7 and d["last_word"] == 40
    assert d["up"][3] == 1 and d["down"][3] == 1 and d["down"][63] == 1
    assert d["up"][0] == 1 and d["down"][4] == 1  # 0xF0 ^ 0x11: bit 0 went 0->1, bit 4 went 1->0
    assert d["or_bits"] == (1 << 3) | (1 << 63) | 0x11
    # two records kept (the first two found), sorted by offset
    assert [r["offset"] for r in d["records"]] == [7 * 8, 40 * 8]
    assert d["records"][0]["bits"] == [3, 63]
    assert "offset 0x38: expected 0xffffffffffffffff, read 0x7ffffffffffffff7, bits 3,63 flipped" in \
        P.describe_error(d["records"][0])


def test_error_log_tells_persistent_from_transient():
    log = P.ErrorLog(report_errors=2)

    def ev(word, pattern, pass_index):
        st, er = P.new_stats(), np.zeros(3 * 4, np.uint64)
        P.accumulate_errors(st, er, 4, np.array([word], np.uint64), np.array([0], np.uint64),
                            np.array([4], np.uint64))
        e = P.decode_step(st, er, 4)
        e.update(pattern=pattern, step="verify", **{"pass": pass_index})
        return e

    log.add(ev(10, "zeros", 0), ("zeros", 0, 1, False))
    assert log.confirm("zeros", 0, 1, 0)["reproduced"] is False
    assert log.persistent_words() == []
    log.add(ev(20, "ones", 0), ("ones", 0, 1, False))
    log.add(ev(20, "ones", 0), ("ones", 0, 1, True))
    c = log.confirm("ones", 0, 1, 1)
    assert c["reproduced"] and c["same_words"] == 1
    log.add(ev(10, "random", 1), ("random", 1, 1, False))  # word 10 again, another pattern and pass
    s = log.summary()
    assert s["errors"] == 4 and s["persistent_words"] == 2 and s["persistent_offsets"] == [80, 160]
    assert s["first_offset"] == 80 and s["last_offset"] == 160 and len(s["records"]) == 2
    assert s["patterns"] == ["zeros", "ones", "random"] and s["bits"] == [2]


def test_error_log_tracks_the_exact_lowest_and_highest_error_word():
    """A GPU keeps the first `max_errors` records it finds, in no fixed order: two runs over a region
    full of errors may record different words. The exact lowest/highest error word of each step
    (counted over every error) still shows that the same words failed again."""
    log = P.ErrorLog()

    def ev(recorded, lo, hi):
        return {"errors": 1000, "up": [0] * 64, "down": [0] * 64, "first_word": lo, "last_word": hi,
                "pattern": "zeros", "step": "verify", "pass": 0,
                "records": [{"word": w, "offset": 8 * w, "expected": 0, "actual": 1, "bits": [0]} for w in recorded]}

    log.add(ev([500, 501], 3, 9000), ("zeros", 0, 1, False))
    log.add(ev([700, 702], 3, 9000), ("zeros", 0, 1, True))  # other records, same exact span
    c = log.confirm("zeros", 0, 1000, 1000)
    assert c["reproduced"] and c["same_words"] == 2
    assert log.summary()["persistent_offsets"] == [24, 72000]


# -- the NumPy path ------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", P.NAMES)
def test_numpy_path_finds_an_injected_flip_at_its_offset(pattern):
    offset, bit = 5 * 8 * 1024 + 24, 41  # in the second chunk (chunks of 32 KiB)
    cfg = _cfg(patterns=[pattern], inject={"offset": offset, "bit": bit})
    out = run_memtest(NumpyBackend(cfg), cfg, LocalChannel())
    e = out["errors"]
    assert out["region_bytes"] == 64 << 10 and out["memory"]["chunk_count"] == 2
    assert e["errors"] == 1 and e["first_offset"] == offset
    (rec,) = e["records"]
    seed = P.pattern_seed(pattern, 0, 0)
    want = P.word_value(P.BY_NAME[pattern].kind, seed, offset // 8)
    assert rec["offset"] == offset and rec["expected"] == want and rec["actual"] == want ^ (1 << bit)
    assert rec["bits"] == [bit] and rec["chunk"] == 1 and rec["pattern"] == pattern and rec["pass"] == 0
    was_one = want >> bit & 1
    assert (e["down"] if was_one else e["up"])[bit] == 1 and sum(e["up"]) + sum(e["down"]) == 1
    assert e["confirmations"] == [{"pattern": pattern, "pass": 0, "errors": 1, "errors_again": 0, "same_words": 0,
                                   "reproduced": False}]
    assert len(out["injected"]) == 1 and f"offset {offset:#x}" in out["injected"][0]


def test_numpy_path_clean_run_counts_bytes_and_bandwidth():
    cfg = _cfg(passes=2)
    out = run_memtest(NumpyBackend(cfg), cfg, LocalChannel())
    assert out["errors"]["errors"] == 0 and out["passes"] == 2
    region = 64 << 10
    per_pass = sum(s.bytes_moved(region) for name in P.NAMES for s in P.steps_for(name))
    assert out["bytes_moved"] == 2 * per_pass
    assert out["gbps"] > 0 and out["copy"]["gbps"] > 0 and out["copy"]["bytes"] == 8 << 10
    assert all(v["runs"] == 2 for v in out["per_pattern"].values())


def test_sticky_flip_is_persistent_and_a_stop_request_returns_partial_results():
    cfg = _cfg(patterns=["ones", "random"], inject={"offset": 64, "bit": 0, "sticky": True, "pattern": "ones"})
    out = run_memtest(NumpyBackend(cfg), cfg, LocalChannel())
    e = out["errors"]
    assert e["errors"] == 2 and e["persistent_words"] == 1 and e["persistent_offsets"] == [64]
    assert e["confirmations"][0]["reproduced"] is True
    chan = LocalChannel()
    chan.stop_event.set()
    out = run_memtest(NumpyBackend(_cfg()), _cfg(), chan)
    assert out["stopped"] == "stop" and out["passes"] == 0
    assert all(v["runs"] == 0 for v in out["per_pattern"].values())


def test_injection_outside_the_region_is_reported_not_ignored():
    cfg = _cfg(patterns=["zeros"], inject={"offset": 1 << 40, "bit": 3})
    out = run_memtest(NumpyBackend(cfg), cfg, LocalChannel())
    assert "outside the tested region" in out["inject_problem"] and out["injected"] == []


# -- verdict rules (pure) --------------------------------------------------------------------------
P_DEFAULTS = mt._params(Context())


def _data(**over):
    cfg = _cfg(**{"patterns": ["zeros", "random"], **over})
    return run_memtest(NumpyBackend(cfg), cfg, LocalChannel())


def test_judge_pass_reports_bandwidth_and_ratio_without_judging_it():
    d = _data()
    d["gbps"], d["copy"]["gbps"] = 150.0, 3000.0  # a ratio of 0.05: reported, not a finding
    r = mt.judge_data(0, d, P_DEFAULTS, "cuda", [])
    assert r.status == Status.PASS and r.action == Action.NONE
    assert "no memory errors in 64.0 KiB tested (2 pattern(s) x 1 pass(es))" in r.summary
    assert "= 0.05 of a device-to-device copy (3000 GB/s)" in r.summary
    assert r.metrics["bandwidth_ratio"] == 0.05 and [t.metric for t in r.thresholds] == ["errors"]


def test_judge_transient_error_drains_and_persistent_error_is_rma():
    d = _data(inject={"offset": 4096, "bit": 7})
    r = mt.judge_data(3, d, P_DEFAULTS, "cpu", ["bitflip:gpu=3"])
    assert r.status == Status.FAIL and r.action == Action.DRAIN and r.gpu == 3
    assert r.summary.startswith("memory errors: 1 in 64.0 KiB tested")
    assert "offset 0x1000" in r.summary and "bit 7 flipped" in r.summary and "transient" in r.summary
    assert r.metrics["errors"] == 1 and r.metrics["first_error_offset"] == 4096
    assert r.metrics["flipped_bits"] == {"7": 1} and r.metrics["flipped_bits_0to1"] == {"7": 1}
    assert any(e.startswith("error offset 0x1000") for e in r.evidence) and r.injected == ["bitflip:gpu=3"]
    d = _data(inject={"offset": 4096, "bit": 7, "sticky": True})
    r = mt.judge_data(3, d, P_DEFAULTS, "cpu", [], ecc_enabled=True)
    assert r.status == Status.FAIL and r.action == Action.RMA and "persistent" in r.summary
    assert "ECC is enabled" in r.summary


def test_errors_that_recur_at_other_words_are_rma_and_a_clean_rerun_is_drain():
    """The rerun found errors again, at a different word: two faults in two verify runs is not a
    transient upset (rma), although no single word failed twice."""
    cfg = _cfg(patterns=["zeros"])
    backend = NumpyBackend(cfg)
    real_fill, calls = backend.fill, []

    def fill(buf, base, kind, seed, xw):
        real_fill(buf, base, kind, seed, xw)
        if base == 0:  # first chunk: flip a different word in each run
            calls.append(1)
            buf[100 + 7 * len(calls)] ^= np.uint64(1 << 9)

    backend.fill = fill
    d = run_memtest(backend, cfg, LocalChannel())
    e = d["errors"]
    assert e["errors"] == 2 and e["persistent_words"] == 0 and e["steps_with_errors"] == 2
    assert e["confirmations"] == [{"pattern": "zeros", "pass": 0, "errors": 1, "errors_again": 1, "same_words": 0,
                                   "reproduced": False}]
    r = mt.judge_data(2, d, P_DEFAULTS, "cpu", [])
    assert r.status == Status.FAIL and r.action == Action.RMA and r.gpu == 2
    assert "recurring: 2 verify runs found errors, at different words (the rerun of zeros found 1 again)" in r.summary
    # the same fault once, with a clean rerun: transient, drain
    d = _data(inject={"offset": 808, "bit": 9})
    r = mt.judge_data(2, d, P_DEFAULTS, "cpu", [])
    assert r.action == Action.DRAIN and "transient: the rerun of the pattern was clean" in r.summary
    # without a rerun (confirm off) and one pass, the summary says it was not re-tested
    d = _data(inject={"offset": 808, "bit": 9}, confirm=False, patterns=["zeros"])
    r = mt.judge_data(2, d, P_DEFAULTS, "cpu", [])
    assert r.action == Action.DRAIN and "; not re-tested (errors=1 > 0)" in r.summary


def test_many_errors_are_summarised_not_listed_one_per_line():
    cfg = _cfg(patterns=["zeros"])
    backend = NumpyBackend(cfg)
    real_fill = backend.fill
    backend.fill = lambda buf, base, kind, seed, xw: (real_fill(buf, base, kind, seed, xw), buf.__ixor__(np.uint64(1 << 12)))
    d = run_memtest(backend, cfg, LocalChannel())
    r = mt.judge_data(0, d, P_DEFAULTS, "cpu", [])
    n = 64 << 10 >> 3
    assert r.status == Status.FAIL and r.metrics["errors"] == 2 * n  # the pattern and its confirmation run
    assert r.action == Action.RMA and r.metrics["persistent_error_words"] > 0
    assert len([e for e in r.evidence if e.startswith("error ")]) == P_DEFAULTS["report_errors"]
    assert any(f"{2 * n - 8} more miscompare(s) counted, not listed" in e for e in r.evidence)
    assert f"bit 12: {2 * n} (0->1 {2 * n})" in r.summary


def test_worker_outcomes_hang_crash_ecc_setup():
    job = WorkerJob("gpu1", gpu=1)
    hung = WorkerOutcome(job, HUNG, error="hang: no heartbeat for 61.0 s (limit 60 s)",
                         progress={"pattern": "random", "errors": 0})
    r = mt.judge_outcome(1, hung, P_DEFAULTS, "cuda", [])
    assert r.status == Status.FAIL and r.action == Action.RESET_GPU and r.summary.startswith("hang:")
    ecc = WorkerOutcome(job, CRASHED, error="CUDARuntimeError: cudaErrorECCUncorrectable: uncorrectable ECC error encountered")
    r = mt.judge_outcome(1, ecc, P_DEFAULTS, "cuda", [])
    assert r.status == Status.FAIL and r.action == Action.RESET_GPU and "memory-remap" in r.summary
    setup = WorkerOutcome(job, OK, result={"setup_error": "ModuleNotFoundError: No module named 'cupy'"})
    r = mt.judge_outcome(1, setup, P_DEFAULTS, "cuda", [])
    assert r.status == Status.ERROR and "could not test" in r.summary
    bad = WorkerOutcome(job, OK, result=_data(inject={"offset": 1 << 30, "bit": 1}))
    r = mt.judge_outcome(1, bad, P_DEFAULTS, "cpu", [])
    assert r.status == Status.ERROR and r.summary.startswith("could not inject")


def test_a_step_that_stalled_before_the_hang_is_named_in_the_evidence():
    """A kernel that never returns: the worker reported which step stalled, then stopped
    heartbeating and was killed: a hang (reset-gpu) whose evidence names the step."""
    job = WorkerJob("gpu0", gpu=0)
    hung = WorkerOutcome(job, HUNG, error="hang: no heartbeat for 60.2 s (limit 60 s)",
                         progress={"stalled": "moving-inversions: descending verify ~P, write P", "waited_s": 60.1})
    r = mt.judge_outcome(0, hung, P_DEFAULTS, "cuda", [])
    assert r.status == Status.FAIL and r.action == Action.RESET_GPU and r.summary.startswith("hang:")
    assert any("stalled=moving-inversions: descending verify ~P, write P" in e for e in r.evidence)


def test_xid_during_the_test_warns():
    r = mt.judge_data(0, _data(), P_DEFAULTS, "cuda", [], telemetry={"samples": 5, "xid": [94]})
    assert r.status == Status.WARN and "Xid 94 during the pattern test" in r.summary


# -- plan, options, budget -------------------------------------------------------------------------
def test_plan_by_level_and_options():
    pl = mt.plan(Context(level=Level.STANDARD))
    assert pl == {"fraction": 0.1, "duration_s": None, "passes": 1, "patterns": list(P.NAMES), "headroom_round": False}
    pl = mt.plan(Context(level=Level.EXTENDED))
    assert pl["fraction"] == 1.0 and pl["passes"] == 2 and pl["duration_s"] is None and pl["headroom_round"] is True
    pl = mt.plan(Context(level=Level.BURN_IN))
    assert pl["duration_s"] == 3600.0 and pl["passes"] == 1 and pl["headroom_round"] is True
    pl = mt.plan(Context(level=Level.STANDARD, check_options=[MemtestOptions(fraction=0.5, patterns="random,ones",
                                                                             duration_s=20)]))
    assert pl == {"fraction": 0.5, "duration_s": 20.0, "passes": 1, "patterns": ["random", "ones"],
                  "headroom_round": False}
    with pytest.raises(ValueError):
        mt.plan(Context(check_options=[MemtestOptions(fraction=1.5)]))
    assert mt.memtest.spec.budget(Context(level=Level.STANDARD)) == 120 + 120 + 30
    # levels 3 and 4: one more pass's budget for the headroom round
    assert mt.memtest.spec.budget(Context(level=Level.EXTENDED)) == 120 + 2 * 120 + 120 + 30
    assert mt.memtest.spec.budget(Context(level=Level.BURN_IN)) == 120 + 3600 + 120 + 120 + 30
    over = Context(level=Level.EXTENDED, config=Config(checks={"eud.memtest": {"passes_level3": 5}}))
    assert mt.plan(over)["passes"] == 5


def test_check_modules_import_nothing_heavy():
    code = ("import sys, gpucheck.tests_suite.eud_memtest, gpucheck.eud.patterns; "
            "assert not {'numpy', 'cupy', 'torch'} & set(sys.modules), sorted({'numpy', 'cupy', 'torch'} & set(sys.modules))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


# -- the check through CPU workers, and through `gpucheck run` ------------------------------------
def _ctx(workers=2, injections=(), level=Level.STANDARD, **options):
    return Context(level=level, config=Config(checks={"eud.memtest": dict(SMALL)}), device="cpu", workers=workers,
                   injections=[parse_injection(t) for t in injections], check_options=[MemtestOptions(**options)])


@pytest.mark.slow
def test_check_fails_exactly_the_gpu_with_the_injected_flip():
    ctx = _ctx(workers=3, injections=["bitflip:gpu=1,offset=72000,bit=3"])
    res = {r.gpu: r for r in run_checks([mt.memtest], ctx, install_signal_handlers=False).results}
    assert set(res) == {0, 1, 2}
    for g in (0, 2):
        assert res[g].status == Status.PASS and res[g].injected == [] and res[g].metrics["errors"] == 0
        assert res[g].metrics["bytes_tested"] == 128 << 10 and res[g].metrics["patterns"] == len(P.NAMES)
    bad = res[1]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN
    assert bad.injected == ["bitflip:gpu=1,offset=72000,bit=3"]
    assert bad.metrics["first_error_offset"] == 72000 and bad.metrics["flipped_bits"] == {"3": 1}
    assert "offset 0x11940" in bad.summary and "expected 0x0000000000000000, read 0x0000000000000008" in bad.summary


def test_bad_injection_and_options_are_errors_not_verdicts():
    ctx = _ctx(workers=1, injections=["bitflip:gpu=0,bit=64"])
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.ERROR and "bit must be in 0..63" in r.summary
    ctx = _ctx(workers=1, patterns=["stripes"])
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.ERROR and "unknown pattern 'stripes'" in r.summary


@pytest.mark.slow
def test_level4_loops_for_the_duration():
    ctx = _ctx(workers=1, level=Level.BURN_IN, duration_s=1.0, patterns="zeros,random")
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.PASS and r.metrics["passes"] >= 2 and "2 pattern(s) x" in r.summary


def test_cli_run_json(monkeypatch, tmp_path, capsys):
    from gpucheck import app
    from gpucheck.tests_suite import registry
    from gpucheck.cli.main import main

    monkeypatch.setattr(app, "all_checks", lambda **kw: registry.all_checks(("gpucheck.tests_suite.eud_memtest",)))
    cfg = tmp_path / "gpucheck.toml"
    cfg.write_text('[checks."eud.memtest"]\n' + "".join(f"{k} = {v}\n" for k, v in SMALL.items()))
    rc = main(["run", "--check", "eud.memtest", "--level", "2", "--device", "cpu", "--workers", "2",
               "--inject", "bitflip:gpu=1", "--json", "--config", str(cfg), "--state-dir", str(tmp_path / "s")])
    verdict = json.loads(capsys.readouterr().out)
    assert rc == 1 and verdict["status"] == "fail" and verdict["injected"] == ["bitflip:gpu=1"]
    by = {r["gpu"]: r for r in verdict["results"]}
    assert by[0]["status"] == "pass" and by[0]["metrics"]["errors"]["value"] == 0
    assert by[1]["status"] == "fail" and by[1]["action"] == "drain"
    off = by[1]["metrics"]["first_error_offset"]["value"]
    assert off == 8 * ((128 << 10) // 16 + 1)  # default offset: the word after the middle of the region
    assert by[1]["summary"].startswith("memory errors: 1 in 128.0 KiB tested") and f"offset {off:#x}" in by[1]["summary"]
