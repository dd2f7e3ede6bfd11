"""What the HTML report and the Prometheus file say agrees with what they count (issue 26): the
page said "Nothing failed in this input." beside "1 fail 1 pass"; metrics were rounded to 4
decimals, so every CPU worker's throughput was 0.0001 TFLOP/s and the bars were equal although
one GPU was "56% below the node median" (the same values fed Prometheus)."""

from __future__ import annotations

import json

import report_inputs

from gpucheck.cli.main import main
from gpucheck.core.verdict import Verdict
from gpucheck.render.prom import render
from gpucheck.report.page import Section, headline


def test_the_headline_comes_from_the_counts_the_section_shows():
    assert "Nothing failed" in headline(Section("t", "f", "history", counts={"pass": 2, "skip": 1}))
    text = headline(Section("t", "f", "history", counts={"fail": 1, "pass": 1}, counted="run(s)"))
    assert "Nothing failed" not in text and "Needs attention:</b> 1 fail, 1 pass run(s)" in text
    text = headline(Section("t", "f", "sweep", counts={"pass": 2, "warn": 1}, counted="node(s)"))
    assert "Nothing failed" not in text and "1 warn" in text


def test_a_history_whose_last_run_passed_is_not_nothing_failed(tmp_path):
    """An older run failed, the last one passed: the history's attention names the last run's
    causes only (none), and the page used to say "Nothing failed" beside "1 fail 1 pass"."""
    failed = report_inputs.with_burn(report_inputs.load(report_inputs.ECC_DBE), [700.0] * 8,
                                     time="2025-06-01T10:15:00Z")
    passed = report_inputs.with_burn(report_inputs.load(report_inputs.HEALTHY), [700.0] * 8,
                                     time="2025-06-02T10:15:00Z")
    assert (failed["status"], passed["status"]) == ("fail", "pass")
    history = tmp_path / "history.jsonl"
    history.write_text(json.dumps(failed) + "\n" + json.dumps(passed) + "\n")
    page = tmp_path / "page.html"
    assert main(["report", str(history), "-o", str(page)]) in (0, 1)
    html = page.read_text()
    assert "1 fail" in html and "Nothing failed in this input." not in html
    assert "Needs attention:</b> 1 fail, 1 pass run(s)" in html


def _cpu_burn(tflops: dict[int, float]) -> Verdict:
    """burn.gemm judged by the check's own judge for CPU workers measuring these rates."""
    from gpucheck.core.check import Context
    from gpucheck.core.levels import Level
    from gpucheck.core.verdict import RunFacts, build_verdict
    from gpucheck.tests_suite import burn_gemm as burn_mod
    from gpucheck.workers.pool import OK, WorkerJob, WorkerOutcome

    jobs = [WorkerJob(f"gpu{g}", gpu=g, device="cpu") for g in tflops]
    data = {g: {"device": {"name": "cpu"}, "config": {"size": 256}, "sdc": [], "sdc_count": 0, "skipped": {},
                "dtypes": {"fp32": {"tflops": tf, "iterations": 100, "repeat_checks": 6, "reference_checks": 2,
                                    "reference_max_error": 0.0, "reference_tolerance": 0.008, "sets": 6,
                                    "repeats": 16, "seconds": 10.0, "reference_elements": 100}}}
            for g, tf in tflops.items()}
    outcomes = {j.worker_id: WorkerOutcome(job=j, kind=OK, result=data[j.gpu]) for j in jobs}
    results = burn_mod._judge(Context(), burn_mod._params(Context()), "cpu", 10.0, jobs, outcomes, None,
                              {j.gpu: None for j in jobs}, {}, [], 10.0)
    return build_verdict(results, RunFacts(level=Level.STANDARD, started_at=0.0, duration_s=1.0, checks=(),
                                           software={}, host="n1"))


def test_cpu_throughputs_keep_their_significant_digits_in_the_verdict_and_prometheus():
    v = _cpu_burn({0: 0.000123456789, 1: 0.000281234567, 2: 0.000279876543})
    by_gpu = {r.gpu: r for r in v.results if r.check == "burn.gemm"}
    assert by_gpu[0].metric_value("tflops_fp32") == 0.000123456789  # was 0.0001 (4 decimals)
    assert by_gpu[1].metric_value("tflops_fp32") != by_gpu[2].metric_value("tflops_fp32")
    assert "56% below the node median" in by_gpu[0].summary
    prom = render(v)
    assert 'gpucheck_metric_tflops_fp32_tflop_s{host="n1",check="burn.gemm",subject="gpu0",gpu="0"} 0.000123456789' \
        in prom
