"""Intra-node collectives: one process per GPU (NCCL) or per CPU worker (gloo) on 127.0.0.1.

`run_local` starts the ranks (gpucheck.nccl.procs) and merges their events; `judge` turns the
merged outcome into results: one per collective (subject node/<op>) judged against the SKU table,
the config and the node's recorded baseline; and one per GPU where a rank is the culprit
(corruption seen on rank N, a hung rank N, a rank much slower than the others).
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable, TypedDict

from ..core.result import Action, Basis, Key, Result, Rule, Status, evaluate, settle
from .bandwidth import format_size, median
from .collective import Failure, NcclEvent, RankSpec, SizeRow
from .expected import expected_busbw
from .report import Outcome, largest, merge

CHECK_ID = "nccl.intra"


class _ExpectedOverrides(TypedDict, total=False):
    # the expected bus bandwidth of each collective, GB/s, where the SKU table has none (config)
    expected_all_reduce_gbs: float
    expected_all_gather_gbs: float
    expected_all_to_all_gbs: float


class JudgeParams(_ExpectedOverrides):
    """The parameters judge reads (nccl.intra's: gpucheck.tests_suite.nccl_intra)."""

    fail_fraction: float  # of the expected busbw
    warn_fraction: float
    baseline_warn_fraction: float  # of the node's recorded baseline
    rank_spread_warn: float
    nvls: bool  # NVLink SHARP: the table's NVLS rows


# A collective's metrics: numbers, the backend, per-rank times and the sweep rows (SweepPoint).
Metric = float | str | None | list[float | None] | list["SweepPoint"]


class SweepPoint(TypedDict):
    """One size of a collective in its result (nccl-tests' columns)."""

    bytes: int
    time_s: float | None
    algbw_gbs: float | None
    busbw_gbs: float | None
    wrong: int  # nccl-tests' #wrong

# A rank's data check found wrong elements: fail, drain, named by the ranks' own summary.
CORRUPTION_RULES: tuple[Rule, ...] = (
    Rule("corrupt_nbad", ">", 0, Status.FAIL, Action.DRAIN, "{corruption}"),
)
# One collective (subject node/<op>), limits by key (None: the rule is off): the bus bandwidth
# against the expected one (SKU table or config; fail and warn fractions of it), against the
# node's recorded baseline, and the spread of the ranks' fastest iterations.
OP_RULES: tuple[Rule, ...] = (
    Rule("busbw_gbs", "<", Key("busbw_fail_gbs"), Status.FAIL, Action.INVESTIGATE,
         "{collective} bus bandwidth below expected {expected} GB/s for {expected_source} ({detail})", "GB/s"),
    Rule("busbw_gbs", "<", Key("busbw_warn_gbs"), Status.WARN, Action.INVESTIGATE,
         "{collective} bus bandwidth below expected {expected} GB/s for {expected_source} ({detail})", "GB/s"),
    Rule("baseline_ratio", "<", Key("baseline_warn_fraction"), Status.WARN, Action.INVESTIGATE,
         "{collective} bus bandwidth below this node's recorded baseline {baseline} GB/s ({detail})"),
    Rule("rank_spread", ">", Key("rank_spread_warn"), Status.WARN, Action.INVESTIGATE,
         "ranks unbalanced in {collective} (rank {outlier} furthest from the others) ({detail})"),
)
# The rank furthest from the median, on its GPU: the same spread rule said of one rank. With the
# fastest iteration t of that rank, min/max/median of all ranks and the warn fraction w,
# (max - min) / median > w is t > min + w * median for a slow rank (t is the max) and
# t < max - w * median for a fast one (t is the min); the other rule is off.
RANK_RULES: tuple[Rule, ...] = (
    Rule("rank_time_s", ">", Key("slow_above_s"), Status.WARN, Action.INVESTIGATE, "{unbalanced}", "s"),
    Rule("rank_time_s", "<", Key("fast_below_s"), Status.WARN, Action.INVESTIGATE, "{unbalanced}", "s"),
)


def run_local(
    *,
    ranks: int,
    ops: list[str],
    sizes: list[int],
    iters: int,
    warmup: int,
    timeout_s: float,
    deadline_s: float,
    backend: str = "auto",
    device: str = "auto",
    devices: list[int] | None = None,
    corrupt: dict[str, Any] | None = None,  # the --inject corrupt parameters (RankSpec.corrupt)
    cancel: threading.Event | None = None,
    on_event: Callable[[NcclEvent], None] | None = None,
) -> Outcome:
    """Run one job of `ranks` local ranks (rank r on CUDA device devices[r]) and merge it."""
    from .procs import run_ranks

    host = socket.gethostname()
    devices = devices if devices is not None else list(range(ranks))
    specs = [
        RankSpec(
            rank=r, world=ranks, ops=list(ops), sizes=list(sizes), local_rank=devices[r],
            master_addr="127.0.0.1", master_port=0 if r == 0 else None, host=host,
            peer_hosts=[host] * ranks, backend=backend, device=device, iters=iters, warmup=warmup,
            timeout_s=timeout_s, corrupt=corrupt,
        )
        for r in range(ranks)
    ]
    reports = run_ranks(specs, deadline_s=deadline_s, cancel=cancel, on_event=on_event)
    return merge(reports, ranks)


def judge(
    outcome: Outcome,
    *,
    ops: list[str],
    params: JudgeParams,
    devices: list[int],
    gpu_name: str | None,
    baselines: dict[str, float] | None = None,
    injected: list[str] | None = None,
) -> list[Result]:
    """Results of one intra-node job. `devices[r]` is the GPU index of rank r (CPU worker index
    on a CPU run); `baselines[op]` the node's recorded busbw at the same size, when one exists."""
    injected = list(injected or [])
    out = _judge_failure(outcome, devices, injected)
    if out is None:  # a broken job has no bandwidth to judge
        return _failure_results(outcome, devices, injected)
    ranks = int(outcome.get("world") or len(devices))
    for op in ops:
        row = largest(outcome.get("results", []), op)
        if row is not None:
            out += _judge_op(op, row, outcome, params=params, ranks=ranks, devices=devices, gpu_name=gpu_name,
                             baseline=(baselines or {}).get(op), injected=injected)
    if not out:
        out.append(Result(CHECK_ID, Status.ERROR, "the collectives produced no measurement", injected=injected))
    return out


def _gpu_of(devices: list[int], rank: Any) -> int | None:
    return devices[int(rank)] if rank is not None and 0 <= int(rank) < len(devices) else None


def _judge_failure(outcome: Outcome, devices: list[int], injected: list[str]) -> list[Result] | None:
    """The results that a failure or an error gives before the bandwidth is judged; None when
    the job failed without data to judge (then _failure_results is all there is)."""
    fail: Failure = outcome.get("failure") or {}
    status = outcome.get("status")
    out: list[Result] = []
    if status == "error":
        out.append(Result(CHECK_ID, Status.ERROR, f"could not run the collectives: {outcome.get('summary')}",
                          evidence=_evidence(fail), injected=injected))
        if not outcome.get("results"):
            return None
    if status == "fail":
        if fail.get("kind") != "corruption":
            return None
        out.append(_corruption_result(outcome, fail, devices, injected))
    return out


def _failure_results(outcome: Outcome, devices: list[int], injected: list[str]) -> list[Result]:
    fail: Failure = outcome.get("failure") or {}
    if outcome.get("status") == "error":
        return [Result(CHECK_ID, Status.ERROR, f"could not run the collectives: {outcome.get('summary')}",
                       evidence=_evidence(fail), injected=injected)]
    # a rank that stopped answering (timeout) or exited during the test: no measurement to compare
    r = Result(CHECK_ID, Status.FAIL, outcome["summary"], gpu=_gpu_of(devices, fail.get("rank")),
               action=Action.RESET_GPU if fail.get("rank") is not None else Action.INVESTIGATE, injected=injected,
               basis=Basis.HANG if fail.get("kind") == "timeout" else Basis.CRASH)
    r.evidence.extend(_evidence(fail))
    return [r]


def _corruption_result(outcome: Outcome, fail: Failure, devices: list[int],
                       injected: list[str]) -> Result:
    """The corruption a rank's data check found (CORRUPTION_RULES), on the GPU of that rank. A
    report without its count of wrong elements (the ranks always send one) is not judged a pass:
    it is an error that says so."""
    given: dict[str, object] = {**fail}  # read by name below, whichever fields it has
    metrics: dict[str, object] = {}
    for k in ("op", "bytes", "rank", "iter", "index", "expected", "got", "nbad", "bad_iters", "src_rank"):
        if given.get(k) is not None:
            metrics[f"corrupt_{k}" if k not in ("op", "bytes") else k] = given[k]
    r = evaluate(CHECK_ID, CORRUPTION_RULES, metrics, facts={"corruption": outcome["summary"]},
                 units={"bytes": "B"} if "bytes" in metrics else {}, gpu=_gpu_of(devices, fail.get("rank")),
                 ok_summary=f"could not judge a corruption report that gives no count of wrong elements: "
                            f"{outcome['summary']}")
    if "corrupt_nbad" not in metrics:
        r.unjudged["corrupt_nbad"] = Status.ERROR
        settle(r)
    r.injected = list(injected)
    r.evidence.extend(_evidence(fail))
    return r


def _judge_op(op: str, row: SizeRow, outcome: Outcome, *, params: JudgeParams, ranks: int,
              devices: list[int], gpu_name: str | None, baseline: float | None, injected: list[str]) -> list[Result]:
    """One collective's result (subject node/<op>, OP_RULES) and, for an unbalanced rank, one on
    its GPU (RANK_RULES)."""
    backend = outcome.get("backend") or "unknown"
    busbw, algbw = row["busbw_gbs"], row["algbw_gbs"]
    if busbw is None or algbw is None:  # (largest: a row with its bandwidths)
        return []
    rank_min = row.get("rank_min_s") or row["rank_time_s"]
    metrics: dict[str, Metric] = {
        "busbw_gbs": busbw, "algbw_gbs": algbw, "time_s": row["time_s"],
        "bytes": row["bytes"], "ranks": ranks, "backend": backend, "rank_time_s": row["rank_time_s"],
        "rank_min_s": rank_min,
        "sweep": [_sweep_point(s) for s in outcome["results"] if s["op"] == op],
    }
    units = {"busbw_gbs": "GB/s", "algbw_gbs": "GB/s", "time_s": "s", "bytes": "B", "rank_time_s": "s",
             "rank_min_s": "s"}
    limits, facts, notes = _bandwidth_limits(op, busbw, metrics, units, params=params, ranks=ranks,
                                             backend=backend, gpu_name=gpu_name, baseline=baseline)
    spread, outlier = rank_spread(rank_min)
    metrics["rank_spread"] = None if spread is None else round(spread, 3)
    spread_warn = limits["rank_spread_warn"] = float(params["rank_spread_warn"])
    facts["outlier"] = outlier
    ok = (f"{op} {busbw:.4g} GB/s busbw ({algbw:.4g} GB/s algbw) at {format_size(row['bytes'])} "
          f"on {ranks} ranks, data verified")
    if metrics.get("expected_busbw_gbs"):
        ok += f", expected {metrics['expected_busbw_gbs']:g} GB/s"
    r = evaluate(CHECK_ID, OP_RULES, metrics, limits=limits, facts=facts, units=units, subject=f"node/{op}",
                 ok_summary=ok)
    if notes:
        r.summary += "; " + "; ".join(notes)
    r.evidence.append("per-rank time at the largest size (median / fastest iteration): " + ", ".join(
        f"rank {i}: {_ms(t)} / {_ms(m)} ms" for i, (t, m) in enumerate(zip(row["rank_time_s"], rank_min))))
    r.injected = list(injected)
    out = [r]
    if spread is not None and spread > spread_warn and outlier is not None:
        rr = _unbalanced_rank(op, rank_min, outlier, spread_warn, devices)
        if rr.status == Status.WARN:  # the same rule as the spread's: only a float's last bit could part them
            rr.injected = list(injected)
            out.append(rr)
    return out


def _ms(t: float | None) -> str:
    """A rank's time in milliseconds (every rank reports one)."""
    return "n/a" if t is None else f"{t * 1e3:.3f}"


def _sweep_point(s: SizeRow) -> SweepPoint:
    return {"bytes": s["bytes"], "time_s": s["time_s"], "algbw_gbs": s["algbw_gbs"], "busbw_gbs": s["busbw_gbs"],
            "wrong": sum(int(e.get("nbad") or 0) for e in s.get("errors") or ())}


def _unbalanced_rank(op: str, rank_min: list[Any], outlier: int, warn: float, devices: list[int]) -> Result:
    """The rank furthest from the median, on its GPU (RANK_RULES)."""
    vals = [t for t in rank_min if t is not None]
    med = median(vals) or 0.0
    t = rank_min[outlier]
    slow = t >= med
    limits = {"slow_above_s": min(vals) + warn * med if slow else None,
              "fast_below_s": None if slow else max(vals) - warn * med}
    text = (f"rank {outlier} unbalanced in {op}: fastest iteration {t * 1e3:.3f} ms vs median {med * 1e3:.3f} ms "
            "of all ranks")
    return evaluate(CHECK_ID, RANK_RULES, {"rank_time_s": t, "median_rank_time_s": med}, limits=limits,
                    facts={"unbalanced": text}, units={"rank_time_s": "s", "median_rank_time_s": "s"},
                    gpu=_gpu_of(devices, outlier), ok_summary=f"rank {outlier} within the spread limit in {op}")


def _bandwidth_limits(op: str, busbw: float, metrics: dict[str, Metric], units: dict[str, str], *,
                      params: JudgeParams, ranks: int, backend: str, gpu_name: str | None,
                      baseline: float | None) -> tuple[dict[str, float | None], dict[str, str | int | None], list[str]]:
    """The limits (None: off) and facts of the expected-bandwidth (SKU table or config) and
    baseline rules for one collective, their metrics (into `metrics`), and notes for the summary."""
    limits: dict[str, float | None] = {"busbw_fail_gbs": None, "busbw_warn_gbs": None, "baseline_warn_fraction": None}
    facts: dict[str, str | int | None] = {"collective": op}
    notes: list[str] = []
    if backend == "nccl":
        exp, exp_src = expected_busbw(op, gpu_name, ranks, nvls=bool(params.get("nvls")), overrides=params)
    else:  # the config's expected_<op>_gbs (> 0) only
        exp, exp_src = expected_busbw(op, None, ranks, overrides=params)
    if exp:
        metrics["expected_busbw_gbs"] = exp
        units["expected_busbw_gbs"] = "GB/s"
        limits["busbw_fail_gbs"] = round(exp * float(params["fail_fraction"]), 3)
        limits["busbw_warn_gbs"] = round(exp * float(params["warn_fraction"]), 3)
        facts.update({"expected": f"{exp:g}", "expected_source": exp_src})
    else:
        sku_key = f"{backend}/{gpu_name or ('cpu' if backend == 'gloo' else 'unknown GPU')}"
        notes.append(f"no expected-bandwidth table for {sku_key}; judged by data integrity and rank balance")
    if baseline:
        metrics["baseline_busbw_gbs"] = baseline
        units["baseline_busbw_gbs"] = "GB/s"
        limits["baseline_warn_fraction"] = float(params["baseline_warn_fraction"])
        metrics["baseline_ratio"] = round(busbw / baseline, 3)
        facts["baseline"] = f"{baseline:.4g}"
    return limits, facts, notes


def rank_spread(times: list[float | None]) -> tuple[float | None, int | None]:
    """(max - min) / median of the per-rank times, and the rank furthest from the median."""
    vals = [t for t in times if t is not None]
    if len(vals) < 2:
        return None, None
    med = median(vals)
    if not med:
        return None, None
    spread = (max(vals) - min(vals)) / med
    present = [(i, t) for i, t in enumerate(times) if t is not None]
    outlier = max(present, key=lambda it: abs(it[1] - med))[0]
    return spread, outlier


def _evidence(fail: Failure) -> list[str]:
    ev = []
    if fail.get("detail"):
        ev.append(str(fail["detail"]))
    if fail.get("kind") == "corruption":
        ev.append(f"op={fail.get('op')} size={fail.get('bytes')} B rank={fail.get('rank')} iter={fail.get('iter')} "
                  f"index={fail.get('index')} expected={fail.get('expected')} got={fail.get('got')} "
                  f"wrong elements={fail.get('nbad')} in {fail.get('bad_iters')} iteration(s)")
    return ev


def baselines_from_history(state: Any, *, ranks: int, backend: str, sizes: dict[str, int],
                           keep: int = 5) -> dict[str, float]:
    """The node's baseline per op: the median busbw of its last `keep` passing nccl.intra results
    with the same ranks, backend and size."""
    if state is None:
        return {}
    seen: dict[str, list[float]] = {}
    try:
        docs = list(state.iter_history())
    except OSError:
        return {}
    for doc in docs:
        for r in doc.get("results", []):
            if r.get("check") != CHECK_ID or r.get("status") not in ("pass", "warn") or r.get("injected"):
                continue
            subj = r.get("subject") or ""
            if not subj.startswith("node/"):
                continue
            op = subj.split("/", 1)[1]
            m = {k: v.get("value") for k, v in r.get("metrics", {}).items()}
            if m.get("ranks") != ranks or m.get("backend") != backend or m.get("bytes") != sizes.get(op):
                continue
            if isinstance(m.get("busbw_gbs"), (int, float)):
                seen.setdefault(op, []).append(float(m["busbw_gbs"]))
    return {op: med for op, v in seen.items() if v and (med := median(v[-keep:])) is not None}
