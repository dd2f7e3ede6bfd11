"""Results: what one check says about one subject (a GPU, a link, a node pair, the node).

A result is plain data. Checks build them; the runner collects them; the verdict lists each as a
ResultEntry (frozen, its values as JSON holds them) in the node-level document. Nothing here
prints, exits or touches hardware.
"""

from __future__ import annotations

import enum
import math
import string
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from .jsonvalue import JsonValue


class _Word(str, enum.Enum):
    """An enum of words: each member is its value as text."""

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.value


class Status(_Word):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"


# Order used to fold many statuses into one: a fail outranks everything, then an error (no
# judgement could be made), then warn, pass, and skip last (nothing was judged).
_STATUS_RANK = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


def worst_status(statuses: Iterable[Status]) -> Status:
    statuses = list(statuses)
    if not statuses:
        return Status.SKIP
    return max(statuses, key=_STATUS_RANK.__getitem__)


class Action(_Word):
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
    """A limit a metric was compared with: the result is `status` when `value <op> limit` holds,
    and recommends `action` then. The verdict lists metric, op, limit, unit and status; the action
    stays in memory (schema 1.1 has no field for it) so that a result can be re-evaluated from its
    thresholds (see `outcome`)."""

    metric: str
    op: str
    limit: Any
    status: Status
    unit: str = ""
    action: Action = field(default=Action.INVESTIGATE, compare=False)

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

def json_number(v: Any) -> Any:
    """`v` as JSON holds it: a float that is not finite (NaN, infinity) is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class Basis(_Word):
    """What decided a result's status and action when its thresholds did not (a result with a
    basis may list thresholds, but none of them claims a worse status than it has)."""

    GPU_STATE = "gpu-state"  # NVML reports the GPU lost, needing a reset, or not answering
    HANG = "hang"  # the work stopped answering and was killed
    CRASH = "crash"  # the worker died with an error (CUDA, an uncorrectable ECC error)
    DEVICE_ERROR = "device-error"  # an operation on the device raised an error (a failed copy)


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
    # In memory only (the verdict's schema 1.1 has no field for them; see `outcome`). basis: what
    # decided the status when the thresholds did not (a lost GPU, a hang, a crash), None when the
    # thresholds, the metrics and `unjudged` decide it. unjudged: what the result depends on that
    # could not be examined (a field that could not be read, a run cut short), each with what it
    # makes the result: ERROR, or WARN where only advice needs it.
    basis: Basis | None = field(default=None, compare=False)
    unjudged: dict[str, Status] = field(default_factory=dict, compare=False)

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

    def to_dict(self) -> dict[str, JsonValue]:
        """The result as the verdict lists it (ResultEntry's JSON)."""
        return ResultEntry.of(self).to_json()


# ---------------------------------------------------------------------------------------------
# A result as the verdict lists it: frozen, every value as JSON holds it (a float that is not
# finite is null, the duration rounded to 0.1 ms), what stays in memory (each threshold's
# action, basis, unjudged) left out. Built from a check's Result (`ResultEntry.of`) or read from
# a verdict document (gpucheck.core.verdict.Verdict.from_json); `to_json` is its JSON. They are
# NamedTuples: immutable, and built several times faster than frozen dataclasses, which matters
# because a verdict holds hundreds of them (an 8-GPU node: about 70 results, 600 metrics, 260
# thresholds) and a sweep or a report reads one verdict per node.


class MetricEntry(NamedTuple):
    value: JsonValue  # null where the hardware does not support it (never read as zero)
    unit: str

    def to_json(self) -> dict[str, JsonValue]:
        return {"value": self.value, "unit": self.unit}


class ThresholdEntry(NamedTuple):
    """"The result is `status` when `metric op limit`" (Threshold without its action)."""

    metric: str
    op: str
    limit: float | str | bool | None  # null: a limit that is not a finite number
    unit: str
    status: Status

    @classmethod
    def of(cls, t: Threshold) -> "ThresholdEntry":
        return cls(t.metric, t.op, json_number(t.limit), t.unit, t.status)

    def to_json(self) -> dict[str, JsonValue]:
        return {"metric": self.metric, "op": self.op, "limit": self.limit, "unit": self.unit,
                "status": self.status.value}


class ResultEntry(NamedTuple):
    check: str
    subject: str  # gpu<N>, node, or a link/pair name
    gpu: int | None
    status: Status
    summary: str
    action: Action
    metrics: Mapping[str, MetricEntry]
    thresholds: tuple[ThresholdEntry, ...] = ()
    evidence: tuple[str, ...] = ()
    injected: tuple[str, ...] = ()
    duration_s: float | None = None
    unexamined: bool = False  # (schema 1.1) a skip that left unexamined what the run was to examine

    @classmethod
    def of(cls, r: Result) -> "ResultEntry":
        return cls(
            check=r.check, subject=r.subject or "node", gpu=r.gpu, status=r.status, summary=r.summary,
            action=r.action, metrics={k: MetricEntry(json_number(v), r.units.get(k, "")) for k, v in r.metrics.items()},
            thresholds=tuple(ThresholdEntry.of(t) for t in r.thresholds), evidence=tuple(r.evidence),
            injected=tuple(r.injected), duration_s=None if r.duration_s is None else round(r.duration_s, 4),
            unexamined=r.unexamined,
        )

    def metric_value(self, name: str) -> JsonValue:
        """The value of metric `name` (None where there is no such metric)."""
        entry = self.metrics.get(name)
        return None if entry is None else entry.value

    def to_json(self) -> dict[str, JsonValue]:
        doc: dict[str, JsonValue] = {
            "check": self.check,
            "subject": self.subject,
            "gpu": self.gpu,
            "status": self.status.value,
            "summary": self.summary,
            "action": self.action.value,
            "metrics": {k: m.to_json() for k, m in self.metrics.items()},
            "thresholds": [t.to_json() for t in self.thresholds],
            "evidence": list(self.evidence),
            "injected": list(self.injected),
            "duration_s": self.duration_s,
        }
        if self.unexamined:  # optional (schema 1.1): present only when true
            doc["unexamined"] = True
        return doc


# ---------------------------------------------------------------------------------------------
# Rules and the one engine that evaluates them.
#
# A check declares its rules as data (a metric, a comparison, a limit from its parameters or a
# literal, the status when violated, the action, a cause template) and computes only metrics and
# evidence; `evaluate` compares, picks status and action, and writes the summary.


@dataclass(frozen=True)
class Key:
    """A value a rule takes by name from the mapping the check passes to `evaluate` (`limits`):
    its parameters (defaults merged with the config) and any limit it derived from them (a SKU
    floor). A limit whose value is None turns its rule off (no SKU row: no floor to compare)."""

    name: str


@dataclass(frozen=True)
class Rule:
    """`metric op limit` makes the result `status` and recommends `action`.

    `limit` and `action` are literals or `Key`s. `cause` is a str.format template naming the
    finding; it may use {value}, {limit}, {unit}, {metric}, {op}, {detail} ("metric=value op
    limit" with units), any metric by name and any fact the check passes. The violated rules of
    one `finding` (default: the metric; tiers of one limit) are named once, by the most severe; a
    cause that uses a fact that is None (nothing to name: no link in its band) is not named."""

    metric: str
    op: str
    limit: Any
    status: Status
    action: Action | Key = Action.INVESTIGATE
    cause: str = "{detail}"
    unit: str = ""
    finding: str = ""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown rule operator {self.op!r}")

    def resolve(self, limits: Mapping[str, Any]) -> Threshold | None:
        """The threshold this rule is with the check's `limits`, or None when its limit is None
        (the rule is off)."""
        limit = _resolved(self.limit, limits)
        if limit is None:
            return None
        return Threshold(self.metric, self.op, limit, self.status, self.unit, Action(_resolved(self.action, limits)))


def _resolved(v: Any, limits: Mapping[str, Any]) -> Any:
    return limits[v.name] if isinstance(v, Key) else v


def outcome(thresholds: Iterable[Threshold], metrics: Mapping[str, Any],
            unjudged: Mapping[str, Status] | None = None) -> tuple[Status, Action]:
    """The status and action that thresholds, metrics and what could not be examined make.

    Status: the worst violated threshold (pass when none). Action: the strongest among the
    violated thresholds at that status (none on a pass). A metric of None (not supported) violates
    nothing. A fail stands whatever else could not be judged; otherwise a metric that cannot be
    compared (NaN, text against an ordering) or an `unjudged` ERROR makes it error (action none),
    and an `unjudged` WARN makes a pass a warn (investigate)."""
    thresholds = list(thresholds)
    violated = [t for t in thresholds if t.violated_by(metrics.get(t.metric))]
    status = worst_status(t.status for t in violated) if violated else Status.PASS
    action = strongest_action(t.action for t in violated if t.status == status)
    if status == Status.FAIL:
        return status, action
    marks = set((unjudged or {}).values())
    if Status.ERROR in marks or any(t.unjudgeable(metrics.get(t.metric)) for t in thresholds):
        return Status.ERROR, Action.NONE
    if marks and status == Status.PASS:
        return Status.WARN, Action.INVESTIGATE
    return status, action


def settle(r: Result) -> Result:
    """Set `r`'s status and action from its thresholds, metrics and `unjudged` (after something
    it depends on was found unexamined). A result with a basis, or a skip nothing made worse,
    keeps its own."""
    if r.basis is not None:
        return r
    status, action = outcome(r.thresholds, r.metrics, r.unjudged)
    if not (r.status == Status.SKIP and status == Status.PASS):
        r.status, r.action = status, action
    return r


def evaluate(
    check: str,
    rules: Iterable[Rule],
    metrics: dict[str, Any],
    *,
    limits: Mapping[str, Any] | None = None,
    facts: Mapping[str, Any] | None = None,
    units: dict[str, str] | None = None,
    ok_summary: str = "ok",
    prefix: str = "",
    skip: str | None = None,
    gpu: int | None = None,
    subject: str | None = None,
) -> Result:
    """One result from the rules that apply (see Rule and outcome): the thresholds listed are
    exactly the rules evaluated (a rule whose limit is None is off); the summary is `prefix` and
    every violated finding's cause, most severe first, or `ok_summary`; a metric that cannot be
    compared is named first, and only as evidence under a fail. `skip`: the result is a skip
    saying so when the metric of every rule is None (nothing it judges is supported)."""
    limits = limits or {}
    units = units or {}
    applied = [(rule, t) for rule in rules for t in [rule.resolve(limits)] if t is not None]
    thresholds = [t for _, t in applied]
    status, action = outcome(thresholds, metrics)
    violated = [(rule, t) for rule, t in applied if t.violated_by(metrics.get(t.metric))]
    summary = prefix + _causes(violated, metrics, units, facts or {}) if violated else ok_summary
    unjudgeable: dict[str, str] = {}
    for t in thresholds:
        why = t.unjudgeable(metrics.get(t.metric))
        if why is not None:
            unjudgeable.setdefault(t.metric, f"could not judge {t.metric}: {why}")
    evidence: list[str] = []
    if unjudgeable and status == Status.FAIL:
        evidence = list(unjudgeable.values())
    elif unjudgeable:
        summary = "; ".join(unjudgeable.values()) + (f"; {summary}" if violated else "")
    elif skip is not None and all(metrics.get(t.metric) is None for t in thresholds):
        status, summary = Status.SKIP, skip
    return Result(check=check, status=status, summary=summary, gpu=gpu, subject=subject, action=action,
                  metrics=dict(metrics), units=dict(units), thresholds=thresholds, evidence=evidence)


def _causes(violated: list[tuple[Rule, Threshold]], metrics: Mapping[str, Any], units: Mapping[str, str],
            facts: Mapping[str, Any]) -> str:
    """Every violated finding named once, by its most severe rule, most severe first."""
    seen: set[str] = set()
    parts: list[str] = []
    for rule, t in sorted(violated, key=lambda rt: -_STATUS_RANK[rt[1].status]):
        finding = rule.finding or rule.metric
        if finding in seen:
            continue
        seen.add(finding)
        value = metrics[t.metric]
        unit = units.get(t.metric, t.unit)
        u = f" {unit}" if unit and unit != "count" else ""
        if any(facts[name] is None for name in _fields_of(rule.cause) if name in facts):
            continue  # it would name nothing (no link in its band)
        fields = {**metrics, **facts, "value": value, "limit": t.limit, "unit": unit, "metric": t.metric,
                  "op": t.op, "detail": f"{t.metric}={value}{u} {t.op} {t.limit}{u}"}
        text = rule.cause.format_map(fields)
        if text and text not in parts:
            parts.append(text)
    return "; ".join(parts) or "; ".join(f"{t.metric}={metrics[t.metric]} {t.op} {t.limit}" for _, t in violated)


def _fields_of(template: str) -> set[str]:
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


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
    """`evaluate` for thresholds built at run time: each threshold is a rule whose cause is
    `causes[metric]` followed by "(metric=value op limit)" (the detail alone where there is no
    cause) and whose action is `actions[metric]` (investigate where there is none)."""
    causes = causes or {}
    actions = actions or {}

    def cause(metric: str) -> str:
        text = causes.get(metric)
        return "{detail}" if text is None else text.replace("{", "{{").replace("}", "}}") + " ({detail})"

    rules = [Rule(t.metric, t.op, t.limit, t.status, actions.get(t.metric, Action.INVESTIGATE), cause(t.metric),
                  t.unit) for t in thresholds]
    return evaluate(check, rules, metrics, gpu=gpu, subject=subject, units=units, ok_summary=ok_summary)
