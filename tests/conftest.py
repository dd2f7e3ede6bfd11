"""Suite-wide pytest hooks.

GPUCHECK_NO_SKIP=1 (set by .ci/run): a test that skips fails instead, with its skip reason. CI runs
as root on a machine that .ci/run provisioned with everything the suite needs (namespaces, sshd,
Slurm, NVRTC, py-spy, mount rights), so a skip there means a guard or detector went untested:
it must fail loudly rather than pass quietly. GPU-marked tests are deselected by the default
`-m 'not gpu'`, never skipped, so they do not trip this.

Every result of the judges on the rule engine, in every test, must follow from the thresholds it
lists or name its basis (tests/judge_consistency.py): a test that produces one that does not fails.

The CUDA emulator (tests/cudaemu.py) runs the blocks of every grid in an order shuffled by
GPUCHECK_EMU_SEED (a random one per session unless set): the header names it, and so does every
failed test once an emulated kernel has run, so that GPUCHECK_EMU_SEED=<seed> repeats the orders.
"""

from __future__ import annotations

import os

import pytest

import cudaemu
import judge_consistency


def pytest_configure(config):
    judge_consistency.install()


@pytest.fixture(autouse=True)
def _results_follow_their_thresholds():
    judge_consistency.FOUND.clear()
    yield
    found = list(judge_consistency.FOUND)
    judge_consistency.FOUND.clear()
    if found:
        pytest.fail("results whose status or action do not follow from their thresholds:\n" + "\n".join(found[:10]),
                    pytrace=False)


def pytest_report_header(config):
    return f"cudaemu: blocks run in the order of {cudaemu.SEED_ENV}={cudaemu.block_order_seed()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and cudaemu.LAUNCHES:
        seed = os.environ.get(cudaemu.SEED_ENV, "")
        report.sections.append(("cudaemu block order", f"emulated kernels ran their blocks in the order of "
                                                        f"{cudaemu.SEED_ENV}={seed}; set it to repeat them"))
    if not os.environ.get("GPUCHECK_NO_SKIP") or not report.skipped:
        return
    if hasattr(report, "wasxfail"):  # an expected failure is not a skipped test
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"GPUCHECK_NO_SKIP is set (CI): this test skipped instead of running: {reason}"
