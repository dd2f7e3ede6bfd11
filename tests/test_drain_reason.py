"""NHC-style drain reasons from the typed verdict (issue 26): `sinfo -R` showed
"gpucheck: clocks gpu5: GPU 5: GPU is lost (fell off the bus ...) (+6 more)"; the reason is now
subject and cause first, the results about one cause merged, the action, at most 60 printable
ASCII characters (gpucheck.core.reason)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.core.levels import Level
from gpucheck.core.reason import REASON_MAX, drain_reason, hook_reason, reason_text
from gpucheck.core.result import Action, Result, Status
from gpucheck.core.verdict import RunFacts, Verdict, build_verdict

SNAPS = Path(__file__).resolve().parent / "fixtures" / "snapshots"


def _snapshot_verdict(capsys, name: str) -> Verdict:
    main(["run", "--json", "--no-history", "--snapshot", str(SNAPS / name)])
    return Verdict.from_json(json.loads(capsys.readouterr().out))


def _verdict(results: list[Result]) -> Verdict:
    return build_verdict(results, RunFacts(level=Level.QUICK, started_at=0.0, duration_s=1.0, checks=(), software={},
                                           host="n1"))


@pytest.mark.parametrize("snapshot, reason", [
    ("h100-gpu-lost.json", "gpucheck: gpu5 lost -> reboot"),  # seven failing results about one lost GPU
    ("h100-ecc-dbe.json", "gpucheck: gpu3 ecc-dbe -> reset-gpu"),
    ("h100-remap-failure.json", "gpucheck: gpu6 remap-failed -> rma"),
    ("v100-retired-pages.json", "gpucheck: gpu1 reset-pending, gpu4 retired-pages -> rma"),
    ("driver-not-loaded.json", "gpucheck: node lost -> reboot"),
])
def test_recorded_faults_give_short_reasons_subject_and_cause_first(capsys, snapshot, reason):
    v = _snapshot_verdict(capsys, snapshot)
    assert drain_reason(v) == reason


def test_one_cause_on_several_gpus_is_merged_and_the_rest_counted_within_60_characters():
    dbe = [Result("ecc", Status.FAIL, "uncorrectable (double-bit) ECC errors", gpu=g, action=Action.RESET_GPU)
           for g in (2, 5)]
    others = [Result(f"check{i}", Status.FAIL, f"something else {i}", gpu=i, action=Action.DRAIN) for i in range(8)]
    reason = drain_reason(_verdict(dbe + others))
    assert reason.startswith("gpucheck: gpu2,5 ecc-dbe, gpu0 check0") and reason.endswith(" -> drain")
    assert len(reason) <= REASON_MAX == 60 and " +" in reason  # the causes that did not fit, counted


def test_text_from_outside_is_printable_ascii():
    hostile = Result("nvlink", Status.FAIL, "link down\x1b[31m\u202e", subject="link\x07\u00e9\nNodeName=n9",
                     action=Action.REBOOT)
    reason = drain_reason(_verdict([hostile]))
    assert reason.isascii() and reason.isprintable() and "\n" not in reason and len(reason) <= REASON_MAX
    assert reason.startswith("gpucheck: link??") and reason.endswith("-> reboot")
    assert reason_text("x\tsay\x00 \u2603" * 20) == reason_text(reason_text("x\tsay\x00 \u2603" * 20))  # idempotent
    assert len(reason_text("word " * 40)) == REASON_MAX and reason_text("word " * 40).endswith("...")


def test_the_hook_reason_for_a_fault_and_for_could_not_judge(capsys):
    v = _snapshot_verdict(capsys, "h100-ecc-dbe.json")
    assert hook_reason(v, "ecc gpu3: uncorrectable ...", judged=True,
                       job_ecc=["gpu3 aggregate_uncorrected +2", "gpu3 volatile_uncorrected +2"]) == \
        "gpucheck: gpu3 ecc-in-job, gpu3 ecc-dbe -> reset-gpu"
    why = hook_reason(None, "gpucheck exited 1 (crashed): Traceback ...", judged=False)
    assert why.startswith("gpucheck: could not judge: gpucheck exited 1") and len(why) <= REASON_MAX
