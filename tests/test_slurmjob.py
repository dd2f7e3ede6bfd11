"""`scontrol -o show job` read by position (gpucheck.platform.slurmjob), on real answers of Slurm
22.05.8 (tests/fixtures/slurm, recorded from tests/slurm_harness.py's cluster, see each .source)
for jobs whose name, working directory or comment hold `Key=value` words and newlines: no text
of the job moves a field, and where the job's text holds a whole second chain of fields the
answer is refused, never guessed. The same jobs in a running Slurm: tests/test_fleet_slurm.py,
tests/test_hang_slurm.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_captures import capture, show_job  # noqa: E402

from gpucheck.platform.slurmjob import ShowJobError, parse_show_job  # noqa: E402


def _first(key: str, text: str) -> str:
    """What the old reader took: the first `Key=` of the line (gpucheck <= issue 25)."""
    m = re.search(rf"(?:^|\s){key}=(\S*)", text)
    assert m
    return m.group(1)


@pytest.mark.parametrize("name, job_id, nodelist, start, user, state", [
    ("plain", "3", "n[1-2]", "2026-11-27T15:13:32", "root(0)", "RUNNING"),
    ("name-nodelist", "10", "n1", None, "root(0)", "RUNNING"),
    ("name-starttime", "5", "n1", None, "root(0)", "RUNNING"),
    ("name-newlines", "11", "n2", None, "root(0)", "RUNNING"),
    ("completed", "12", "n2", None, "root(0)", "COMPLETED"),
    ("pending", "9", "", "2026-11-27T16:13:56", "root(0)", "PENDING"),
])
def test_a_job_name_cannot_move_a_field(name, job_id, nodelist, start, user, state):
    text = capture(name)
    job = parse_show_job(text, job_id)
    assert (job.nodelist, job.user, job.state) == (nodelist, user, state)
    assert "2030" not in job.start_time and (start is None or job.start_time == start)
    if name.startswith("name-") or name == "completed":
        # the old first-match reader took the job's own words
        assert _first("NodeList", text) == "n4" or _first("StartTime", text).startswith("2030")
        assert job.name.startswith("train") or job.name.startswith("c ")


def test_the_name_is_what_lies_before_slurms_fields():
    job = parse_show_job(capture("name-starttime"), "5")
    assert job.name == "train StartTime=2030-01-01T00:00:00 JobState=COMPLETED UserId=evil(7)"
    assert parse_show_job(capture("name-newlines"), "11").name == (
        "train\n   NodeList=n4\n   StartTime=2030-01-01T00:00:00")


@pytest.mark.parametrize("name, job_id", [("name-forged-chain", "7"), ("workdir-comment-newlines", "8")])
def test_a_second_chain_in_the_jobs_text_is_refused_not_guessed(name, job_id):
    text = capture(name)
    with pytest.raises(ShowJobError, match="cannot tell Slurm's from the job's"):
        parse_show_job(text, job_id)


def test_another_jobs_answer_or_no_answer_is_refused():
    with pytest.raises(ShowJobError, match="not '4'"):
        parse_show_job(capture("plain"), "4")
    with pytest.raises(ShowJobError, match="not the output of scontrol show job"):
        parse_show_job((Path(__file__).parent / "fixtures" / "slurm" / "show-job-invalid.stderr").read_text(), "99999")
    with pytest.raises(ShowJobError, match="no UserId, JobState, StartTime, NodeList"):
        parse_show_job("JobId=3 JobName=x UserId=root(0) NodeList=n1", "3")


def test_array_and_het_ids_answer_for_their_job():
    text = show_job("6").replace("JobId=6 ", "JobId=6 ArrayJobId=5 ArrayTaskId=1 ", 1)
    assert parse_show_job(text, "5_1").job_id == "5_1" and parse_show_job(text, "6").nodelist == "n[1-2]"
    assert parse_show_job(show_job("9", nodelist="gpu[001-002]"), "9").nodelist == "gpu[001-002]"


def test_only_the_first_record_of_an_array_is_read():
    one = show_job("6", nodelist="n1").replace("JobId=6 ", "JobId=6 ArrayJobId=5 ArrayTaskId=1 ", 1)
    two = show_job("7", nodelist="n2").replace("JobId=7 ", "JobId=7 ArrayJobId=5 ArrayTaskId=2 ", 1)
    assert parse_show_job(one + two, "5_1").nodelist == "n1"
