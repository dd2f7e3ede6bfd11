"""A Slurm job's nodes, from `scontrol -o show job JOBID` (through an injectable runner:
argv -> (rc, stdout, stderr), so this is tested without a cluster), read by
gpucheck.platform.slurmjob: a job name or path cannot move a field."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

Runner = Callable[[list[str]], tuple[int, str, str]]
_JOB_ID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,9})?")


class JobUsageError(ValueError):
    """The job cannot be examined as asked: unknown, not running, no scontrol (exit 2)."""


class JobLookupError(RuntimeError):
    """Slurm did not answer (exit 3: could not judge)."""


@dataclass
class JobInfo:
    job_id: str
    state: str
    nodes: list[str]
    nodelist: str
    user: str | None


def valid_job_id(text: str) -> str:
    s = (text or "").strip()
    if not _JOB_ID.fullmatch(s):
        raise JobUsageError(f"{text!r} is not a Slurm job id")
    return s


def job_info(job_id: str, *, runner: Runner, scontrol: str) -> JobInfo:
    from ..platform.nodeset import NodeSetError, parse_nodeset
    from ..platform.slurmjob import ShowJobError, parse_show_job

    job_id = valid_job_id(job_id)
    rc, out, err = runner([scontrol, "-o", "show", "job", job_id])
    text = (err or out or "").strip().splitlines()
    last = text[-1] if text else f"exit {rc}"
    if rc == 127:
        raise JobUsageError(f"--job needs Slurm's scontrol: {last}")
    if rc != 0:
        if "Invalid job id" in (err or "") or "Invalid job id" in (out or ""):
            raise JobUsageError(f"job {job_id}: {last}")
        raise JobLookupError(f"scontrol show job {job_id} failed (exit {rc}): {last}")
    try:
        job = parse_show_job(out, job_id)
    except ShowJobError as e:
        raise JobLookupError(str(e)) from None
    state = job.state
    if state != "RUNNING":
        raise JobUsageError(f"job {job_id} is {state}, not RUNNING: it has no process to dump")
    nodelist = job.nodelist
    try:
        nodes = parse_nodeset(nodelist, what=f"job {job_id}'s NodeList")
    except NodeSetError as e:
        raise JobLookupError(str(e)) from None
    return JobInfo(job_id=job_id, state=state, nodes=nodes, nodelist=nodelist,
                   user=job.user)
