"""The drain reason: what `sinfo -R` shows of an unhealthy node, NHC-style.

`drain_reason(verdict)` -> "gpucheck: gpu5 lost -> reboot": the subject and the cause first, the
results about the same cause merged (a lost GPU makes clocks, ecc, inventory, nvlink, pcie ... all
fail: one "gpu5 lost"; the same cause on several GPUs: "gpu2,5 ecc-dbe"), the verdict's action
last, at most REASON_MAX characters of printable ASCII (node, GPU and link names and summaries
come from outside: anything else becomes "?"). The full cause goes to the log, not here.

The cause word of a result is the first CAUSE_WORDS pattern its summary matches (a rule table:
data), else its check id. `reason_text(text)` is the same shape for a free-text cause (no verdict:
a hook that could not judge), and is idempotent: a finished reason passes through unchanged.
"""

from __future__ import annotations

import re
from typing import Iterable

from .result import Action, ResultEntry, Status
from .verdict import Verdict

REASON_PREFIX = "gpucheck:"
REASON_MAX = 60  # sinfo -R shows 20 characters by default; a reason past 60 is read by nobody
MORE = "+{n}"  # causes left out for the length

# (pattern on a result's summary, the cause word): the first match names the cause.
CAUSE_WORDS: tuple[tuple[str, str], ...] = (
    (r"\bGPU is lost\b|fell off the bus|driver not loaded", "lost"),
    (r"\bXid (\d+)", "xid{0}"),
    (r"silent data corruption|digests? differ|differs from the fleet majority|wrong result", "sdc"),
    (r"\bhang\b|\bhung\b|stopped answering", "hang"),
    (r"row remap(ping)? failed|no spare rows", "remap-failed"),
    (r"uncorrectable|double-bit|\bDBE\b", "ecc-dbe"),
    (r"row remap pending|retirement pending|takes effect at the next GPU reset", "reset-pending"),
    (r"retired pages", "retired-pages"),
    (r"asks for a node reboot", "reboot-asked"),
    (r"NvLink \d+ down|nvlink", "nvlink"),
    (r"PCIe", "pcie"),
    (r"\bcrashed\b", "crash"),
    (r"slowdown|throttl", "throttled"),
    (r"\bslow\b|below the", "slow"),
    (r"\bempty\b|could not|cannot|not finished|no verdict", "unjudged"),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), word) for p, word in CAUSE_WORDS)
_UNSAFE = re.compile(r"[^\x21-\x7e]")  # not printable ASCII (a space is handled by the split)


def safe(text: str) -> str:
    """`text` as one line of printable ASCII: whitespace runs are one space, the rest "?"."""
    return " ".join(_UNSAFE.sub("?", word) for word in str(text).split())


def cause_word(r: ResultEntry) -> str:
    """The cause of a result in one word (CAUSE_WORDS), else its check id."""
    for pattern, word in _COMPILED:
        m = pattern.search(r.summary)
        if m:
            return word.format(*m.groups())
    return r.check


def _subject(r: ResultEntry) -> str:
    return f"gpu{r.gpu}" if r.gpu is not None else (r.subject.split("/")[0] if r.subject else "node")


def merged_causes(results: Iterable[ResultEntry]) -> list[str]:
    """"<subjects> <cause>" per cause, in the results' order (worst first), the subjects of one
    cause merged: gpu2 and gpu5 -> "gpu2,5"."""
    by_cause: dict[str, list[str]] = {}
    for r in results:
        subjects = by_cause.setdefault(cause_word(r), [])
        if _subject(r) not in subjects:
            subjects.append(_subject(r))
    out = []
    for word, subjects in by_cause.items():
        gpus = [s[3:] for s in subjects if s.startswith("gpu") and s[3:].isdigit()]
        others = [s for s in subjects if not (s.startswith("gpu") and s[3:].isdigit())]
        names = (["gpu" + ",".join(gpus)] if gpus else []) + others
        out.append(f"{','.join(names)} {word}")
    return out


def _fit(items: list[str], tail: str) -> str:
    """REASON_PREFIX, as many items as fit with "+N" for the rest, then `tail`, in REASON_MAX."""
    for keep in range(len(items), 0, -1):
        more = f" {MORE.format(n=len(items) - keep)}" if keep < len(items) else ""
        text = f"{REASON_PREFIX} {', '.join(items[:keep])}{more}{tail}"
        if len(text) <= REASON_MAX:
            return text
    return reason_text(f"{items[0]}{tail}") if items else reason_text(tail)


def drain_reason(verdict: Verdict, *, first: Iterable[str] = ()) -> str:
    """The drain reason of a verdict: its failing (else could-not-judge) results' causes merged,
    most severe first, `first` (news that comes before them, such as ECC errors during the job)
    ahead of them, then "-> <action>"."""
    bad = [r for r in verdict.results if r.status is Status.FAIL] or \
          [r for r in verdict.results if r.status is Status.ERROR or r.unexamined]
    items = list(dict.fromkeys(safe(x) for x in (*first, *merged_causes(bad)) if safe(x)))
    if not items:
        items = [safe(verdict.status.value)]
    action = verdict.action if verdict.action is not Action.NONE else Action.INVESTIGATE
    return _fit(items, f" -> {action.value}")


def reason_text(cause: str) -> str:
    """A free-text cause as a drain reason: printable ASCII, REASON_PREFIX first, at most
    REASON_MAX characters (cut with "..."). Idempotent."""
    text = safe(cause)
    if not text.startswith(REASON_PREFIX):
        text = f"{REASON_PREFIX} {text}" if text else REASON_PREFIX
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def hook_reason(verdict: Verdict | None, cause: str, *, judged: bool, job_ecc: Iterable[str] = ()) -> str:
    """The reason a Slurm hook drains with: a judged fault's drain_reason (the GPUs whose ECC
    counters grew during the job first: `job_ecc` holds "gpu3 volatile_uncorrected +2"), or,
    could not judge (or no verdict), "could not judge: <cause>" cut to REASON_MAX."""
    if judged and verdict is not None:
        return drain_reason(verdict, first=[f"{change.split()[0]} ecc-in-job" for change in job_ecc if change.split()])
    return reason_text(cause if judged else f"could not judge: {cause}")
