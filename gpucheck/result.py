"""Results: what one check says about one subject (a GPU, a link, a node pair, the node).

A result is plain data. Checks build them; the runner collects them; the verdict turns them into
the node-level document. Nothing here prints, exits or touches hardware.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Iterable


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.value


# Order used to fold many statuses into one: a fail outranks everything, then an error (no
# judgement could be made), then warn, pass, and skip last (nothing was judged).
_STATUS_RANK = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


def worst_status(statuses: Iterable[Status]) -> Status:
    statuses = list(statuses)
    if not statuses:
        return Status.SKIP
    return max(statuses, key=_STATUS_RANK.__getitem__)


class Action(str, enum.Enum):
    """Recommended remediation, a fixed vocabulary aligned with NVIDIA's Xid resolution buckets.

    none ~ IGNORE, restart-app ~ RESTART_APP, reset-gpu ~ RESET_GPU, reboot ~ RESTART_BM,
    rma ~ CONTACT_SUPPORT. drain takes the node out of service without a known fix yet;
    investigate asks a person to look (repeats, slow GPUs, unknown events).
    """

    NONE = "none"
    INVESTIGATE = "investigate"
    RESTART_APP = "restart-app"
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"
    DRAIN = "drain"
    RMA = "rma"

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.value


# Strength order for "the strongest recommended action" of a verdict.
ACTION_ORDER = [
    Action.NONE,
    Action.INVESTIGATE,
    Action.RESTART_APP,
    Action.RESET_GPU,
    Action.REBOOT,
    Action.DRAIN,
    Action.RMA,
]
_ACTION_RANK = {a: i for i, a in enumerate(ACTION_ORDER)}


def strongest_action(actions: Iterable[Action]) -> Action:
    return max(actions, key=_ACTION_RANK.__getitem__, default=Action.NONE)


_OPS = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


_ORDERING = (">", ">=", "<", "<=")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float))  # bool included: flags are compared as 0/1


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


@dataclass(frozen=True)
class Threshold:
    """A limit a metric was compared with: the result is `status` when `value <op> limit` holds."""

    metric: str
    op: str
    limit: Any
    status: Status
    unit: str = ""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown threshold operator {self.op!r}")

    def violated_by(self, value: Any) -> bool:
        if value is None or self.unjudgeable(value) is not None:
            return False
        return bool(_OPS[self.op](value, self.limit))

    def unjudgeable(self, value: Any) -> str | None:
        """Why `value` cannot be compared with this threshold (NaN, a non-number against an
        ordering, a NaN limit), or None. None (not supported) is not unjudgeable: it is skipped."""
        if value is None:
            return None
        if _is_nan(self.limit) or (self.op in _ORDERING and not _is_number(self.limit)):
            return f"the limit {self.limit!r} is not a number"
        if _is_nan(value):
            return "the value is not a number (NaN)"
        if self.op in _ORDERING and not _is_number(value):
            return f"the value {value!r} is not a number"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "op": self.op,
            "limit": _json_number(self.limit),
            "unit": self.unit,
            "status": self.status.value,
        }


def _json_number(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


@dataclass
class Result:
    check: str
    status: Status
    summary: str
    gpu: int | None = None
    subject: str | None = None
    action: Action = Action.NONE
    metrics: dict[str, Any] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    thresholds: list[Threshold] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    duration_s: float | None = None
    # A skip that left unexamined something this run was asked to examine (a GPU in use by a job,
    # a compute check asked for with --device cuda where no GPU is usable): never healthy, the
    # run exits 3 ("could not judge") with the skip's reason. See verdict.exit_code_for.
    unexamined: bool = False

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        self.action = Action(self.action)
        if self.subject is None:
            self.subject = f"gpu{self.gpu}" if self.gpu is not None else "node"
        if self.status == Status.SKIP and not self.summary:
            raise ValueError("a skip must say why")
        if self.unexamined and self.status != Status.SKIP:
            raise ValueError("only a skip can be unexamined")

    def metric(self, name: str, value: Any, unit: str = "") -> "Result":
        self.metrics[name] = value
        if unit:
            self.units[name] = unit
        return self

    def to_dict(self) -> dict[str, Any]:
        d = self._base_dict()
        if self.unexamined:  # optional (schema 1.1): present only when true
            d["unexamined"] = True
        return d

    def _base_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "subject": self.subject,
            "gpu": self.gpu,
            "status": self.status.value,
            "summary": self.summary,
            "action": self.action.value,
            "metrics": {
                k: {"value": _json_number(v), "unit": self.units.get(k, "")}
                for k, v in self.metrics.items()
            },
            "thresholds": [t.to_dict() for t in self.thresholds],
            "evidence": list(self.evidence),
            "injected": list(self.injected),
            "duration_s": None if self.duration_s is None else round(self.duration_s, 4),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        return cls(
            check=d["check"],
            status=Status(d["status"]),
            summary=d["summary"],
            gpu=d.get("gpu"),
            subject=d.get("subject"),
            action=Action(d.get("action", "none")),
            metrics={k: m["value"] for k, m in d.get("metrics", {}).items()},
            units={k: m.get("unit", "") for k, m in d.get("metrics", {}).items() if m.get("unit")},
            thresholds=[
                Threshold(t["metric"], t["op"], t["limit"], Status(t["status"]), t.get("unit", ""))
                for t in d.get("thresholds", [])
            ],
            evidence=list(d.get("evidence", [])),
            injected=list(d.get("injected", [])),
            duration_s=d.get("duration_s"),
            unexamined=bool(d.get("unexamined", False)),
        )


def judge(
    check: str,
    thresholds: list[Threshold],
    metrics: dict[str, Any],
    *,
    gpu: int | None = None,
    subject: str | None = None,
    units: dict[str, str] | None = None,
    ok_summary: str = "ok",
    causes: dict[str, str] | None = None,
    actions: dict[str, Action] | None = None,
) -> Result:
    """Compare metrics with thresholds and build one result.

    The status is the worst status of the thresholds that are violated; the summary names every
    violated threshold (its cause from `causes`, else "<metric> <value> <op> <limit>"); the action
    is the strongest action (from `actions`, keyed by metric) among the violations at the final
    status. A metric whose value is None (not supported) never violates anything. A metric that
    cannot be compared (NaN, a non-number; see Threshold.unjudgeable) is never a pass: the result
    is `error` naming it, unless a threshold that could be judged fails.
    """
    units = units or {}
    causes = causes or {}
    actions = actions or {}
    unjudged: dict[str, str] = {}
    for t in thresholds:
        why = t.unjudgeable(metrics.get(t.metric))
        if why is not None and t.metric not in unjudged:
            unjudged[t.metric] = f"could not judge {t.metric}: {why}"
    violated = [t for t in thresholds if t.violated_by(metrics.get(t.metric))]
    status = worst_status([t.status for t in violated]) if violated else Status.PASS
    evidence: list[str] = []
    if violated:
        summary, action = _violations(violated, status, metrics, units, causes, actions)
    else:
        summary, action = ok_summary, Action.NONE
    if unjudged and status == Status.FAIL:
        evidence = list(unjudged.values())
    elif unjudged:
        summary = "; ".join(unjudged.values()) + (f"; {summary}" if violated else "")
        status, action = Status.ERROR, Action.NONE
    return Result(
        check=check,
        status=status,
        summary=summary,
        gpu=gpu,
        subject=subject,
        action=action,
        metrics=dict(metrics),
        units=dict(units),
        thresholds=list(thresholds),
        evidence=evidence,
    )


def _violations(violated: list[Threshold], status: Status, metrics: dict[str, Any], units: dict[str, str],
                causes: dict[str, str], actions: dict[str, Action]) -> tuple[str, Action]:
    """The summary naming every violated threshold (most severe first, each metric once) and the
    strongest action among those at `status`."""
    violated = sorted(violated, key=lambda t: -_STATUS_RANK[t.status])
    seen: set[str] = set()
    parts = []
    for t in violated:
        if t.metric in seen:
            continue
        seen.add(t.metric)
        unit = units.get(t.metric, t.unit)
        u = f" {unit}" if unit and unit != "count" else ""
        cause = causes.get(t.metric)
        detail = f"{t.metric}={metrics[t.metric]}{u} {t.op} {t.limit}{u}"
        parts.append(f"{cause} ({detail})" if cause else detail)
    action = strongest_action(
        actions.get(t.metric, Action.INVESTIGATE) for t in violated if t.status == status
    )
    return "; ".join(parts), action
