"""repro.bitwise's judgement on synthetic worker results: reference match and mismatch, a
fingerprint mismatch that never compares, node majority, ties, non-determinism, one GPU alone,
workers that hang or crash, and what `repro record` may write."""

from __future__ import annotations

from gpucheck.repro.fingerprint import fingerprint_key, short_key
from gpucheck.repro.judge import judge_node, plan_record
from gpucheck.core.result import Action, Status
from gpucheck.workers.pool import CANCELLED, CRASHED, HUNG, OK, WorkerJob, WorkerOutcome

FP = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132,
      "driver": "550.54.15", "cuda_runtime": "12.4", "torch": "2.5.1", "cublas": "12.4.5", "blas_backend": "Cublas",
      "workload_version": "gpucheck-repro-1", "preset": "gpu"}
KEY = fingerprint_key(FP)
A, B, C = "a" * 64, "b" * 64, "c" * 64
ID = "repro.bitwise"


def _run(digests):
    return {w: {"digest": d, "parts": {"normal.2048x2048x2048": d[:16], "wide.2048x2048x2048": "0" * 16},
                "outputs": 2, "bytes": 64, "seconds": 0.5} for w, d in digests.items()}


def result(digests, run2=None, fp=FP):
    return {"fingerprint": fp, "key": fingerprint_key(fp), "preset": "gpu", "workloads": list(digests),
            "runs": [_run(digests), _run(run2 or digests)], "settings": {}, "injected": [], "seconds": 2.0}


def oc(g, data=None, kind=OK, error=None):
    return WorkerOutcome(job=WorkerJob(f"gpu{g}", gpu=g, device="cuda"), kind=kind, result=data, error=error)


def refs(*entries):
    return {"kind": "gpucheck.repro-refs", "version": 1, "references": [
        {"fingerprint": fp, "key": fingerprint_key(fp), "workload_version": fp["workload_version"], "digests": d,
         "recorded_at": "2025-01-01T00:00:00Z", "host": "good01"} for fp, d in entries]}


def judge(outcomes, ref=None, **kw):
    res = judge_node(ID, {o.job.gpu: o for o in outcomes}, refs=ref, ref_source="refs.json", **kw)
    gpus = {r.gpu: r for r in res if r.gpu is not None}
    node = [r for r in res if r.subject == "node"]
    return gpus, node


def test_reference_match_passes_and_shows_the_digests():
    gpus, node = judge([oc(0, result({"gemm.bf16": A})), oc(1, result({"gemm.bf16": A}))],
                       refs((FP, {"gemm.bf16": A})))
    for r in gpus.values():
        assert r.status == Status.PASS
        assert f"gemm.bf16 bit-identical to the reference for fingerprint {short_key(KEY)}" in r.summary
        assert r.metrics["digest_gemm.bf16"] == A[:16] and r.metrics["reference_gemm.bf16"] == A[:16]
        assert r.metrics["fingerprint"] == short_key(KEY) and r.metrics["workloads"] == 1
    assert node[0].metrics["digest_sets"] == {KEY: {"gemm.bf16": A}}


def test_reference_mismatch_fails_exactly_that_gpu():
    gpus, _ = judge([oc(0, result({"gemm.bf16": A})), oc(1, result({"gemm.bf16": B})),
                     oc(2, result({"gemm.bf16": A}))], refs((FP, {"gemm.bf16": A})))
    assert [g for g, r in gpus.items() if r.status != Status.PASS] == [1]
    bad = gpus[1]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN
    assert bad.summary == (f"silent data corruption suspected in gemm.bf16: digest differs from the reference "
                           f"for fingerprint {short_key(KEY)}")
    assert any(B in e and A in e and "good01" in e for e in bad.evidence)


def test_the_reference_outranks_the_majority():
    """Every GPU of the node agrees, and every one differs from the reference: all fail."""
    gpus, _ = judge([oc(g, result({"gemm.bf16": B})) for g in range(3)], refs((FP, {"gemm.bf16": A})))
    assert all(r.status == Status.FAIL and "differs from the reference" in r.summary for r in gpus.values())


def test_a_fingerprint_mismatch_never_compares():
    other = dict(FP, torch="2.6.0", cublas="12.6.1")
    gpus, _ = judge([oc(0, result({"gemm.bf16": A})), oc(1, result({"gemm.bf16": A}))],
                    refs((other, {"gemm.bf16": B})))
    for r in gpus.values():
        assert r.status == Status.PASS
        assert r.summary.startswith(f"no reference for fingerprint {short_key(KEY)}; compared 2 GPUs with each "
                                    "other (all agree); record one with `gpucheck repro record`")
        assert "reference_gemm.bf16" not in r.metrics
        near = [e for e in r.evidence if e.startswith("closest stored fingerprint")]
        assert near and "cublas: '12.4.5' vs '12.6.1'" in near[0] and "torch: '2.5.1' vs '2.6.0'" in near[0]
        assert any(e.startswith("to record it") and '"torch":"2.5.1"' in e for e in r.evidence)


def test_node_majority_without_a_reference():
    gpus, node = judge([oc(0, result({"gemm.bf16": A, "gemm.fp32": C})), oc(1, result({"gemm.bf16": A, "gemm.fp32": C})),
                        oc(2, result({"gemm.bf16": B, "gemm.fp32": C}))])
    assert gpus[0].status == gpus[1].status == Status.PASS
    bad = gpus[2]
    assert (bad.status, bad.action) == (Status.FAIL, Action.DRAIN)
    assert bad.summary == ("silent data corruption suspected in gemm.bf16: digest differs from the node majority "
                           "(2 of 3 GPUs agree)")
    assert any("1 of 2 output(s) differ: normal.2048x2048x2048" in e for e in bad.evidence)
    assert node[0].metrics["digest_sets"] == {KEY: {"gemm.bf16": A, "gemm.fp32": C}}


def test_a_tie_is_a_warning_naming_nobody():
    gpus, node = judge([oc(0, result({"gemm.bf16": A})), oc(1, result({"gemm.bf16": B}))])
    for r in gpus.values():
        assert (r.status, r.action) == (Status.WARN, Action.INVESTIGATE)
        assert r.summary.startswith("no majority for gemm.bf16: the 2 GPUs with this fingerprint give 2 different "
                                    "digests (1 vs 1)")
    assert node[0].metrics["digest_sets"] == {KEY: {}}


def test_non_determinism_is_its_own_finding():
    gpus, _ = judge([oc(0, result({"gemm.bf16": A}, run2={"gemm.bf16": C})), oc(1, result({"gemm.bf16": A})),
                     oc(2, result({"gemm.bf16": A}))])
    r = gpus[0]
    assert (r.status, r.action) == (Status.FAIL, Action.INVESTIGATE)
    assert r.summary == "non-deterministic: two runs of gemm.bf16 on this GPU differ"
    assert gpus[1].status == gpus[2].status == Status.PASS
    # On every GPU: the software stack, not one GPU.
    gpus, _ = judge([oc(g, result({"gemm.bf16": A}, run2={"gemm.bf16": C})) for g in range(2)])
    assert all("on every GPU of this node: likely the software stack" in r.summary for r in gpus.values())


def test_single_gpu_without_a_reference_says_so_plainly():
    gpus, _ = judge([oc(0, result({"gemm.bf16": A}))])
    r = gpus[0]
    assert r.status == Status.PASS
    assert r.summary == (f"no reference for fingerprint {short_key(KEY)} and no other GPU to compare with: only "
                         "checked that two runs give identical bits; record one with `gpucheck repro record`; "
                         "two runs identical")


def test_workloads_missing_from_the_reference_go_to_the_peers():
    both = {"gemm.bf16": A, "transformer.step": C}
    gpus, _ = judge([oc(0, result(both)), oc(1, result(both)), oc(2, result({"gemm.bf16": A, "transformer.step": B}))],
                    refs((FP, {"gemm.bf16": A})))
    assert gpus[0].status == Status.PASS and "transformer.step not in the reference" in gpus[0].summary
    assert gpus[2].status == Status.FAIL and "transformer.step: digest differs from the node majority" in gpus[2].summary


def test_gpus_of_two_kinds_are_compared_within_their_kind():
    fp2 = dict(FP, gpu="NVIDIA A100-SXM4-80GB", compute_capability="8.0", sm_count=108)
    gpus, node = judge([oc(0, result({"gemm.bf16": A})), oc(1, result({"gemm.bf16": A})),
                        oc(2, result({"gemm.bf16": B}, fp=fp2))])
    assert all(r.status == Status.PASS for r in gpus.values())
    assert "compared 2 GPUs with each other" in gpus[0].summary
    assert "no other GPU to compare with" in gpus[2].summary
    assert node[0].metrics["digest_sets"] == {KEY: {"gemm.bf16": A}, fingerprint_key(fp2): {"gemm.bf16": B}}


def test_workers_that_did_not_return_digests():
    gpus, _ = judge([
        oc(0, None, kind=HUNG, error="hang: no heartbeat for 60.0 s"),
        oc(1, None, kind=CRASHED, error="RuntimeError: CUDA error: an illegal memory access was encountered"),
        oc(2, None, kind=CRASHED, error="WorkloadError: bitflip element 99999 out of range"),
        oc(3, {"setup_error": "torch 2.13.0+cpu sees no CUDA device"}),
        oc(4, None, kind=CANCELLED),
        oc(5, result({"gemm.bf16": A})),
    ])
    assert (gpus[0].status, gpus[0].action) == (Status.FAIL, Action.RESET_GPU) and "hang" in gpus[0].summary
    assert (gpus[1].status, gpus[1].action) == (Status.FAIL, Action.RESET_GPU)
    assert gpus[2].status == Status.ERROR and "could not run the workloads" in gpus[2].summary
    assert gpus[3].status == Status.ERROR and "sees no CUDA device" in gpus[3].summary
    assert gpus[4].status == Status.ERROR and "interrupted" in gpus[4].summary
    assert gpus[5].status == Status.PASS


def test_partial_results_judge_what_ran_twice():
    data = result({"gemm.bf16": A, "gemm.fp32": C})
    del data["runs"][1]["gemm.fp32"]
    data["stopped"] = "cancelled"
    gpus, _ = judge([oc(0, data)])
    r = gpus[0]
    assert r.status == Status.PASS and "partial: gemm.fp32 not run twice" in r.summary
    assert "digest_gemm.fp32" not in r.metrics


def test_plan_record():
    ok = [oc(0, result({"gemm.bf16": A})), oc(1, result({"gemm.bf16": A}))]
    records, problems, by_key = plan_record(ID, {o.job.gpu: o for o in ok})
    assert problems == [] and records == [(FP, {"gemm.bf16": A})] and by_key == {KEY: [0, 1]}
    split = ok + [oc(2, result({"gemm.bf16": B}))]
    records, problems, _ = plan_record(ID, {o.job.gpu: o for o in split})
    assert records == [] and len(problems) == 1
    status, text = problems[0]
    assert status == Status.FAIL and A in text and B in text and "disagree" in text
    flaky = [oc(0, result({"gemm.bf16": A}, run2={"gemm.bf16": C}))]
    _, problems, _ = plan_record(ID, {0: flaky[0]})
    assert problems[0][0] == Status.FAIL and "non-deterministic" in problems[0][1] and C in problems[0][1]
    _, problems, _ = plan_record(ID, {0: oc(0, {"setup_error": "no CUDA"})})
    assert problems == [(Status.ERROR, "GPU 0: could not run the workloads: no CUDA")]


def test_the_judge_is_its_rule_table_and_keeps_its_wording():
    """repro.bitwise on the rule engine (issue 18): per GPU, the count of each finding is a metric,
    the thresholds listed are RULES, status and action follow from them (tests/judge_consistency.py),
    the summary is the one it always had (per workload, in order; fails before warns); a worker
    that hung or crashed names its basis. Before: findings folded by hand, no count, no threshold,
    no basis."""
    import judge_consistency as jc
    from gpucheck.repro.judge import RULES
    from gpucheck.core.result import Basis

    assert [(r.metric, r.op, r.limit, r.status, r.action) for r in RULES] == [
        ("reference_mismatches", ">", 0, Status.FAIL, Action.DRAIN),
        ("majority_outliers", ">", 0, Status.FAIL, Action.DRAIN),
        ("nondeterministic_workloads", ">", 0, Status.FAIL, Action.INVESTIGATE),
        ("workloads_without_majority", ">", 0, Status.WARN, Action.INVESTIGATE)]
    listed = [rule.resolve({}) for rule in RULES]
    # gemm.bf16 has a reference (A); gemm.fp32 and transformer.step go to the node's vote.
    D = "d" * 64
    rows = [({"gemm.bf16": B, "gemm.fp32": C, "transformer.step": A}, {"gemm.fp32": A}),
            ({"gemm.bf16": A, "gemm.fp32": C, "transformer.step": A}, {}),
            ({"gemm.bf16": A, "gemm.fp32": C, "transformer.step": B}, {}),
            ({"gemm.bf16": A, "gemm.fp32": C, "transformer.step": B}, {}),
            ({"gemm.bf16": A, "gemm.fp32": D, "transformer.step": C}, {})]
    outcomes = [oc(g, result(d1, run2={**d1, **flaky})) for g, (d1, flaky) in enumerate(rows)]
    gpus, node = judge(outcomes + [oc(5, None, kind=HUNG, error="hang: no heartbeat for 60.0 s"),
                                   oc(6, None, kind=CRASHED, error="RuntimeError: CUDA error: illegal address"),
                                   oc(7, None, kind=CRASHED, error="MemoryError")],
                       refs((FP, {"gemm.bf16": A})))
    tie = ("no majority for transformer.step: the 5 GPUs with this fingerprint give 3 different digests "
           "(2 vs 2 vs 1); cannot tell which GPU is wrong")
    counts = ("reference_mismatches", "majority_outliers", "nondeterministic_workloads", "workloads_without_majority")
    want = {
        0: (Status.FAIL, Action.DRAIN, (1, 0, 1, 1),
            f"silent data corruption suspected in gemm.bf16: digest differs from the reference for fingerprint "
            f"{short_key(KEY)}; non-deterministic: two runs of gemm.fp32 on this GPU differ; {tie}"),
        1: (Status.WARN, Action.INVESTIGATE, (0, 0, 0, 1), tie),
        4: (Status.FAIL, Action.DRAIN, (0, 1, 0, 1),
            "silent data corruption suspected in gemm.fp32: digest differs from the node majority (4 of 5 GPUs "
            f"agree); {tie}"),
    }
    for g, (status, action, n, summary) in want.items():
        r = gpus[g]
        assert (r.status, r.action, r.summary) == (status, action, summary)
        assert tuple(r.metrics[c] for c in counts) == n and all(r.units[c] == "count" for c in counts)
        assert r.thresholds == listed and r.basis is None and jc.disagreement(r) is None
    assert (gpus[5].status, gpus[5].action, gpus[5].basis) == (Status.FAIL, Action.RESET_GPU, Basis.HANG)
    assert (gpus[6].status, gpus[6].action, gpus[6].basis) == (Status.FAIL, Action.RESET_GPU, Basis.CRASH)
    assert (gpus[7].status, gpus[7].action, gpus[7].basis) == (Status.FAIL, Action.INVESTIGATE, Basis.CRASH)
    assert all(jc.disagreement(r) is None for r in [*gpus.values(), *node])
    clean, _ = judge([oc(0, result({"gemm.bf16": A})), oc(1, result({"gemm.bf16": A}))], refs((FP, {"gemm.bf16": A})))
    assert all(r.thresholds == listed and (r.status, r.action) == (Status.PASS, Action.NONE)
               and [r.metrics[c] for c in counts] == [0, 0, 0, 0] for r in clean.values())


def test_a_reference_file_others_can_change_warns_by_its_rule(tmp_path, monkeypatch):
    """The reference file's permission problems are a counted metric judged by REFERENCE_RULES
    (before: a warn built by hand that listed no threshold)."""
    import judge_consistency as jc
    from gpucheck.core.check import Context
    from gpucheck.core.levels import Level
    from gpucheck.core.inject import parse_injection
    from gpucheck.repro import store
    from gpucheck.tests_suite.repro_bitwise import REFERENCE_RULES, ReproOptions, repro_bitwise

    path = tmp_path / "refs{0}.json"  # braces in a path name nothing: a fact is not a template
    path.write_text(__import__("json").dumps(refs((FP, {"gemm.bf16": A}))))
    monkeypatch.setattr(store, "permission_problems", lambda p: [f"{p} is writable by group or others"])
    ctx = Context(level=Level.QUICK, device="cpu", workers=1, check_options=[ReproOptions(reference=str(path))],
                  injections=[parse_injection("bitflip:gpu=x")])  # an injection error: no worker is started
    warn = next(r for r in repro_bitwise.run(ctx) if r.subject == "reference")
    assert (warn.status, warn.action) == (Status.WARN, Action.INVESTIGATE)
    assert warn.summary == (f"reference file {path} can be changed by other users: whoever can write it decides "
                            "which digests pass")
    assert warn.metrics == {"reference_permission_problems": 1} and warn.evidence == [f"{path} is writable by group or others"]
    assert warn.thresholds == [rule.resolve({}) for rule in REFERENCE_RULES] and jc.disagreement(warn) is None
