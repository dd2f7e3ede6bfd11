"""Every result a judge produces says why it has its status: a pure re-evaluation of the thresholds
it lists, the metrics it reports and what it could not examine gives back its status and action,
or the result names the basis that decided it instead (a lost GPU, a hang, a crash: result.Basis).

The re-evaluation below is written apart from gpucheck.core.result.outcome on purpose: it is the
contract, read from docs/verdict.md and result.Rule, not the engine's code run twice.

`install()` (tests/conftest.py calls it once per session) wraps the entry points of the judges on
the rule engine (ENTRY_POINTS, and the `run` of every check in CHECKS): every result they return
in any test is checked, and a disagreement fails that test (conftest's autouse fixture reads
FOUND). So the results of every path the suite already exercises (fixtures, synthetic
measurements, CPU workers, injected faults) are covered without a list of cases kept apart.
"""

from __future__ import annotations

import functools
import importlib
import math
import operator
from typing import Any, Callable, Iterable

from gpucheck.core.result import Action, Basis, Result, Status

# The checks whose every result must follow its thresholds (the judges on the rule engine).
CHECKS = frozenset({"inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink", "recovery-action", "xid",
                    "burn.gemm", "poet.ortho", "eud.bandwidth", "eud.power", "eud.memtest", "eud.dcgm",
                    "nccl.intra", "repro.bitwise", "pcie.aer", "fabric.nvswitch", "net.ports", "net.flaps",
                    "gdr.peermem"})
# Pure judges that tests call directly: (module, function, modules that imported it by name).
ENTRY_POINTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("gpucheck.core.runner", "run_checks", ()),  # what the runner adds: hangs, checks not run, no time left
    ("gpucheck.tests_suite.eud_bandwidth", "judge_bandwidth", ()),
    ("gpucheck.tests_suite.eud_bandwidth", "judge_outcome", ()),
    ("gpucheck.eud.power_judge", "judge_power", ("gpucheck.tests_suite.eud_power",)),
    ("gpucheck.tests_suite.eud_memtest", "judge_data", ()),
    ("gpucheck.tests_suite.eud_memtest", "judge_outcome", ()),
    ("gpucheck.tests_suite.burn_gemm", "_judge_data", ()),
    ("gpucheck.tests_suite.poet_ortho", "judge_data", ()),
    ("gpucheck.tests_suite.poet_ortho", "judge_outcomes", ()),
    ("gpucheck.eud.dcgm_parse", "map_results", ("gpucheck.tests_suite.eud_dcgm",)),
    ("gpucheck.nccl.intra", "judge", ("gpucheck.tests_suite.nccl_intra",)),
    ("gpucheck.repro.judge", "judge_node", ()),
    ("gpucheck.xid.judge", "judge", ()),
    ("gpucheck.tests_suite.net_ports", "judge_net", ()),
    ("gpucheck.tests_suite.net_flaps", "judge_flaps", ()),
    ("gpucheck.tests_suite.gdr_peermem", "judge_peermem", ()),
)

FOUND: list[str] = []  # disagreements seen since the last reset (conftest fails the test on any)
SEEN: list[int] = [0]  # results checked, all tests together

_RANK = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}
_ACTIONS = [Action.NONE, Action.INVESTIGATE, Action.RESTART_APP, Action.RESET_GPU, Action.REBOOT, Action.DRAIN,
            Action.RMA]
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt,
                                                   "<=": operator.le, "==": operator.eq, "!=": operator.ne}


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _comparable(v: Any, op: str, limit: Any) -> bool:
    if _nan(v) or _nan(limit):
        return False
    ordering = op in (">", ">=", "<", "<=")
    return not ordering or (isinstance(v, (int, float)) and isinstance(limit, (int, float)))


def reevaluate(r: Result) -> tuple[Status, Action]:
    """The status and action r's thresholds, metrics and unjudged make (the contract: worst
    violated status, pass when none; strongest action among the violations at that status; None
    is not supported and violates nothing; a fail stands; else a value that cannot be compared or
    an ERROR that could not be examined is an error with no action, a WARN one makes a pass a warn)."""
    violated = []
    unjudgeable = False
    for t in r.thresholds:
        v = r.metrics.get(t.metric)
        if v is None:
            continue
        if not _comparable(v, t.op, t.limit):
            unjudgeable = True
        elif _COMPARE[t.op](v, t.limit):
            violated.append(t)
    status = max((t.status for t in violated), key=_RANK.__getitem__, default=Status.PASS)
    action = max((t.action for t in violated if t.status == status), key=_ACTIONS.index, default=Action.NONE)
    if status == Status.FAIL:
        return status, action
    if unjudgeable or Status.ERROR in r.unjudged.values():
        return Status.ERROR, Action.NONE
    if r.unjudged and status == Status.PASS:
        return Status.WARN, Action.INVESTIGATE
    return status, action


def disagreement(r: Result) -> str | None:
    """Why r's status or action does not follow from what it lists, or None."""
    status, action = reevaluate(r)
    where = f"{r.check} {r.subject}: {r.status.value}/{r.action.value} ({r.summary[:160]!r})"
    if r.basis is not None:
        if not isinstance(r.basis, Basis):
            return f"{where}: basis {r.basis!r} is not a result.Basis"
        if _RANK[status] > _RANK[r.status]:
            return f"{where}: its thresholds make it {status.value}, worse than its status (basis {r.basis.value})"
        return None
    if r.status == Status.SKIP:
        if (status, action) != (Status.PASS, Action.NONE):
            return f"{where}: a skip whose thresholds and unjudged fields make it {status.value}/{action.value}"
        return None
    if r.status == Status.ERROR and not r.thresholds and not r.unjudged and r.action in (Action.NONE,
                                                                                      Action.INVESTIGATE):
        return None  # could not judge, compared nothing: the summary says why (and may ask for a look)
    if (r.status, r.action) != (status, action):
        return (f"{where}: its thresholds, metrics and unjudged fields make it {status.value}/{action.value}; "
                f"a status from anything else must name its basis (result.Basis)")
    return None


def check_all(results: Iterable[Result]) -> list[Result]:
    """Record the disagreements of `results` in FOUND; return them unchanged."""
    results = list(results)
    for r in results:
        if isinstance(r, Result) and r.check in CHECKS:
            SEEN[0] += 1
            why = disagreement(r)
            if why is not None:
                FOUND.append(why)
    return results


def _checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        check_all(out if isinstance(out, list) else getattr(out, "results", [out]))
        return out

    wrapper.__judge_checked__ = True  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Wrap every entry point (once)."""
    from gpucheck.tests_suite.registry import all_checks

    for mod_name, name, also in ENTRY_POINTS:
        mod = importlib.import_module(mod_name)
        fn = getattr(mod, name)
        if getattr(fn, "__judge_checked__", False):
            continue
        wrapped = _checked(fn)
        setattr(mod, name, wrapped)
        for other in also:
            setattr(importlib.import_module(other), name, wrapped)
    for c in all_checks():
        if c.id in CHECKS and not getattr(c.run, "__judge_checked__", False):
            object.__setattr__(c, "run", _checked(c.run))  # Check is frozen: the registry's own objects
