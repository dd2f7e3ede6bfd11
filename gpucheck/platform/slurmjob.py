"""`scontrol -o show job JOBID` -> the job's fields, where no text the job controls can move one.

scontrol prints `JobId=N JobName=<name> UserId=... JobState=... StartTime=... NodeList=...`, and
later the free texts (Command, WorkDir, Comment, StdOut, ...). The name and those texts are the
job's own: they may hold spaces, newlines and `Key=value` words (`sbatch -J 'train NodeList=n4'`
prints `JobName=train NodeList=n4`), so the first `NodeList=` of the line can be the job's text.
Slurm 22.05's scontrol has no `--json` (`scontrol: unrecognized option '--json'`), and `squeue
--json` there ignores `-j` (it answers every job of the cluster), so this reads the text by
position:

- `JobId=` and the keys before `JobName=` (array and het job ids) are Slurm's, with no spaces;
- the job's fields are one *chain*: from a `UserId=` on, words `Key=value` (a value without
  white space) separated by white space, each key once, through `JobState=`, `StartTime=` and
  `NodeList=`: the chain of fixed keys that follows the name;
- the name is whatever lies between `JobName=` and the chain.

A chain can be forged inside the name or a later free text; the real one is always there too.
Every start of a chain is tried: when the chains found disagree on a field, the field is
unknown (`ShowJobError`), never taken from the job's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The keys read here; UserId starts the chain and NodeList ends it (Slurm prints them in this order).
CHAIN_START, CHAIN_END = "UserId", "NodeList"
NEEDED = ("UserId", "JobState", "StartTime", "NodeList")
_HEAD_RE = re.compile(r"\s*JobId=(\S+)((?: [A-Za-z][A-Za-z0-9_]*=\S*)*) JobName=")
_WORD_RE = re.compile(r"\s+([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")
_CHAIN_START_RE = re.compile(rf"\s{CHAIN_START}=")


class ShowJobError(ValueError):
    """The output is not one job's `scontrol -o show job`, or its fields cannot be told from the
    job's own text."""


@dataclass(frozen=True)
class ShowJob:
    """The fields of one job that gpucheck reads: all Slurm's, none the job's text."""

    job_id: str
    name: str  # the job's own text: shown, never parsed
    user: str  # UserId: "alice(1000)"
    state: str  # JobState: RUNNING, COMPLETING, PENDING, ...
    start_time: str  # StartTime: "2026-11-27T15:12:23", "Unknown"
    nodelist: str  # NodeList: "n[1-2]", "" while pending


def _chain_at(text: str, pos: int) -> dict[str, str] | None:
    """The chain of `Key=value` words from `pos` (white space, then UserId=) through NodeList=,
    or None when a word there is no `Key=value`, a key repeats, or a needed key is missing."""
    fields: dict[str, str] = {}
    while True:
        m = _WORD_RE.match(text, pos)
        if m is None or m.group(1) in fields:
            return None
        fields[m.group(1)] = m.group(2)
        pos = m.end()
        if m.group(1) == CHAIN_END:
            return fields if all(k in fields for k in NEEDED) else None


def _ids_of(job_id: str, keys: str) -> set[str]:
    """The ids a job answers to: JobId, and ArrayJobId_ArrayTaskId or HetJobId+HetJobOffset."""
    k = dict(w.split("=", 1) for w in keys.split())
    ids = {job_id}
    if "ArrayJobId" in k and "ArrayTaskId" in k:
        ids.add(f"{k['ArrayJobId']}_{k['ArrayTaskId']}")
    if "HetJobId" in k and "HetJobOffset" in k:
        ids.add(f"{k['HetJobId']}+{k['HetJobOffset']}")
    return ids


def parse_show_job(text: str, job_id: str) -> ShowJob:
    """One job's fields from `scontrol -o show job JOB_ID` (also the multi-line form). Raises
    ShowJobError when the text is not that job's, or when chains found in it disagree."""
    head = _HEAD_RE.match(text)
    if head is None:
        raise ShowJobError(f"not the output of scontrol show job: {text.strip()[:120]!r}")
    if job_id not in _ids_of(head.group(1), head.group(2)):
        raise ShowJobError(f"scontrol answered for job {head.group(1)!r}, not {job_id!r}")
    text = text.split("\nJobId=", 1)[0]  # the first record (a job array prints one per task)
    start = head.end() - 1  # the chain may start right after an empty name
    chains = [(m.start(), c) for m in _CHAIN_START_RE.finditer(text, start)
              if (c := _chain_at(text, m.start())) is not None]
    if not chains:
        raise ShowJobError(f"job {job_id}: no {', '.join(NEEDED)} in scontrol's answer")
    first_pos, first = chains[0]
    for key in NEEDED:
        values = {c[key] for _, c in chains}
        if len(values) > 1:
            raise ShowJobError(f"job {job_id}: its own text (name, comment, paths) holds a second {key}= "
                               f"({', '.join(sorted(values))}): cannot tell Slurm's from the job's")
    name = text[head.end():first_pos]  # the name ends where the first chain starts
    return ShowJob(job_id=job_id, name=name, user=first["UserId"], state=first["JobState"],
                   start_time=first["StartTime"], nodelist=first["NodeList"])
