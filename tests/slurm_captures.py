"""`scontrol -o show job` answers of the real Slurm 22.05.8 of tests/slurm_harness.py
(tests/fixtures/slurm/, each with its .source), and one of them with other values in Slurm's
own fields, for tests whose fake scontrol must answer for another job: every key and the order
stay those of the real answer (a fake never has a member the real thing lacks)."""

from __future__ import annotations

import re
from pathlib import Path

CAPTURES = Path(__file__).resolve().parent / "fixtures" / "slurm"


def capture(name: str) -> str:
    return (CAPTURES / f"show-job-{name}.txt").read_text()


def show_job(job_id: str, *, state: str = "RUNNING", start: str = "2026-11-27T15:12:23", nodelist: str = "n[1-2]",
             user: str = "root(0)", name: str = "train") -> str:
    """The real answer for a plain running job (show-job-plain.txt) with these values in its
    fields: JobId, JobName, UserId, JobState, StartTime, NodeList."""
    text = capture("plain")
    values = {"JobId": job_id, "UserId": user, "JobState": state, "StartTime": start, "NodeList": nodelist}
    for key, value in values.items():
        text, n = re.subn(rf"(?<=\s){key}=\S*|^{key}=\S*", lambda m, k=key, v=value: f"{k}={v}", text, count=1)
        assert n == 1, key
    return text.replace(" JobName=train ", f" JobName={name} ", 1)
