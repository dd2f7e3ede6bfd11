"""The `nccl.intra` check: intra-node all-reduce, all-gather and all-to-all with verification.

On GPUs: one process per selected GPU with NCCL, sizes 1 MiB to 1 GiB. With `--device cpu`:
`--workers` processes with gloo on 127.0.0.1 and small sizes (no expected-bandwidth table: judged
by data integrity and rank balance). torch is imported only in the rank processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..nccl.bandwidth import align_size, normalize_op, parse_ops, parse_sizes
from ..nccl.intra import CHECK_ID, JudgeParams, baselines_from_history, judge, run_local
from ..sdk import Context, Level, Limit, Need, Result, Status, define
from ..sdk.workers import guard_context

if TYPE_CHECKING:  # pragma: no cover
    from ..sdk.workers import Guard


class IntraParams(JudgeParams):
    """nccl.intra's parameters (DEFAULTS, merged with the config's [checks."nccl.intra"])."""

    ops: str
    sizes: str
    iters: int
    warmup: int
    cpu_sizes: str
    cpu_iters: int
    cpu_warmup: int
    timeout_s: float


@dataclass
class Plan:
    """What this run measures: the ranks' devices (GPUs, or CPU workers), the collectives and sizes."""

    cpu: bool
    devices: list[int]
    ranks: int
    ops: list[str]
    sizes: list[int]
    iters: int
    warmup: int
    timeout_s: float


DEFAULTS: IntraParams = {
    "ops": "all_reduce,all_gather,all_to_all",
    "sizes": "1M-1G",  # GPU sweep (doubling)
    "iters": 10,
    "warmup": 2,
    "cpu_sizes": "64K,1M",  # CPU/gloo sweep
    "cpu_iters": 3,
    "cpu_warmup": 1,
    "timeout_s": 60.0,  # per collective: past it the rank we waited for is named
    "warn_fraction": 0.85,  # of the expected busbw
    "fail_fraction": 0.6,
    "baseline_warn_fraction": 0.85,  # of the node's recorded baseline busbw
    "rank_spread_warn": 1.0,  # (max - min) / median of the ranks' fastest iterations
    "nvls": False,  # judge all-reduce against the NVLS number of the SKU table
    "expected_all_reduce_gbs": 0.0,  # > 0 overrides the SKU table
    "expected_all_gather_gbs": 0.0,
    "expected_all_to_all_gbs": 0.0,
}
# What a setting may be where gpucheck.core.config.conventional_limit is not enough: sizes and counts
# of work are at least 1 (0 would examine nothing).
LIMITS = {k: Limit("int", 1) for k in ("iters", "cpu_iters")}

# Rough worst-case rates used only for the time budget (never for judging).
_BUDGET_BPS = {"cpu": 5e7, "cuda": 5e9}


def _plan(ctx: Context, params: IntraParams) -> Plan:
    on_cpu = ctx.device == "cpu"
    if on_cpu:
        devices = list(range(ctx.workers)) if ctx.gpus is None else list(ctx.gpus)
    else:
        entries = [g for g in ctx.selected_gpu_entries() if g.get("state", "ok") == "ok"]
        devices = sorted(int(g["index"]) for g in entries)
    ranks = len(devices)
    ops = parse_ops(params["ops"])
    sizes = parse_sizes(params["cpu_sizes"] if on_cpu else params["sizes"])
    return Plan(cpu=on_cpu, devices=devices, ranks=ranks, ops=ops, sizes=sizes,
                iters=int(params["cpu_iters"] if on_cpu else params["iters"]),
                warmup=int(params["cpu_warmup"] if on_cpu else params["warmup"]),
                timeout_s=float(params["timeout_s"]))


def _estimate_s(plan: Plan) -> float:
    rate = _BUDGET_BPS["cpu" if plan.cpu else "cuda"]
    per_op = sum((plan.iters + plan.warmup) * (3.0 * s / rate + 0.01) for s in plan.sizes)
    # start-up (torch import, rendezvous) + one collective timeout of slack + the sweep
    return 30.0 + plan.timeout_s + per_op * len(plan.ops)


def _budget(ctx: Context) -> float:
    try:
        return _estimate_s(_plan(ctx, ctx.params(CHECK_ID, DEFAULTS)))
    except (ValueError, KeyError):
        return 120.0


class RankProgress:
    """The ranks' events as words for the live status and the progress lines ('3 of 8 ranks
    joined'), never as internal events (`event=ready rank=1`)."""

    def __init__(self, ctx: Context, ranks: int):
        self.ctx, self.ranks = ctx, ranks
        self.joined: set[int] = set()
        self.finished: set[int] = set()

    def words(self, event: Any) -> str | None:
        kind, rank = event.get("event"), event.get("rank")
        if kind == "listening":
            return f"rank 0 waits for {self.ranks - 1} other rank(s) on port {event.get('port')}"
        if kind == "ready" and isinstance(rank, int):
            self.joined.add(rank)
            return f"{len(self.joined)} of {self.ranks} ranks joined"
        if kind == "warning":
            return f"rank {rank}: {event.get('step')}: {event.get('detail')}"
        if kind == "result" and isinstance(rank, int):
            self.finished.add(rank)
            return f"{len(self.finished)} of {self.ranks} ranks finished"
        return None

    def event(self, event: Any) -> None:
        text = self.words(event)
        if text is not None:
            self.ctx.report(CHECK_ID, "node", {"what": text})


@define(
    CHECK_ID,
    title="Intra-node collectives (all-reduce, all-gather, all-to-all): bandwidth and data verification",
    level=Level.STANDARD,
    needs=(Need.TORCH, Need.GPU, Need.MULTI_GPU),
    budget_s=120.0,
    budget_fn=_budget,
    detects="NVLink/PCIe bandwidth below the SKU table or the node's baseline, corrupted collective data, "
            "a hung or unbalanced GPU rank",
    defaults=DEFAULTS,
    limits=LIMITS,
    injects=("corrupt",),
)
def intra_check(ctx: Context) -> list[Result]:
    params = ctx.params(CHECK_ID, DEFAULTS)
    try:
        plan = _plan(ctx, params)
    except ValueError as e:
        return [Result(CHECK_ID, Status.ERROR, f"bad nccl.intra parameters: {e}")]
    guard = _without_busy_gpus(ctx, plan)
    if plan.ranks < 2:
        unit = "CPU workers" if plan.cpu else "GPUs"
        free = " and not in use" if guard.skipped else ""
        return guard.skipped + [Result(CHECK_ID, Status.SKIP, f"needs at least 2 {unit}, {plan.ranks} selected"
                                                              f"{free}")]
    injections = ctx.injections_for("corrupt")
    corrupt: dict[str, Any] | None = None  # the --inject corrupt parameters a rank gets (RankSpec.corrupt)
    injected: list[str] = []
    if injections:
        inj = injections[0]
        rank = inj.get("rank")
        if rank is None and inj.get("gpu") is not None:
            gpu = int(inj.get("gpu"))
            if gpu not in plan.devices:
                return [Result(CHECK_ID, Status.ERROR, f"--inject {inj.text}: GPU {gpu} is not tested")]
            rank = plan.devices.index(gpu)
        rank = int(rank if rank is not None else 0)
        if not 0 <= rank < plan.ranks:
            return [Result(CHECK_ID, Status.ERROR, f"--inject {inj.text}: no rank {rank} "
                                                   f"(ranks 0-{plan.ranks - 1})")]
        corrupt = {"rank": rank, "text": inj.text}
        for key in ("op", "iter", "index"):
            if inj.get(key) is not None:
                corrupt[key] = inj.get(key)
        if "op" in corrupt:
            try:
                corrupt["op"] = normalize_op(str(corrupt["op"]))
            except ValueError as e:
                return [Result(CHECK_ID, Status.ERROR, f"--inject {inj.text}: {e}")]
            if corrupt["op"] not in plan.ops:
                return [Result(CHECK_ID, Status.ERROR, f"--inject {inj.text}: {corrupt['op']} is not run "
                                                       f"(ops: {', '.join(plan.ops)})")]
        if int(corrupt.get("iter", 0)) not in range(plan.iters):
            return [Result(CHECK_ID, Status.ERROR, f"--inject {inj.text}: iter must be 0-{plan.iters - 1}")]
        injected = [inj.text]
    backend = "gloo" if plan.cpu else "nccl"
    estimate = _estimate_s(plan)
    outcome = run_local(
        ranks=plan.ranks, ops=plan.ops, sizes=plan.sizes, iters=plan.iters,
        warmup=plan.warmup, timeout_s=plan.timeout_s, deadline_s=estimate,
        backend=backend, device="cpu" if plan.cpu else "cuda", devices=plan.devices,
        corrupt=corrupt, cancel=ctx.cancel,
        on_event=RankProgress(ctx, plan.ranks).event,
    )
    gpu_name = outcome.get("gpu_name") or _snapshot_name(ctx)
    largest_size = align_size(max(plan.sizes), plan.ranks)
    baselines = baselines_from_history(ctx.state, ranks=plan.ranks, backend=backend,
                                       sizes={op: largest_size for op in plan.ops})
    results = judge(outcome, ops=plan.ops, params=params, devices=plan.devices, gpu_name=gpu_name,
                    baselines=baselines, injected=injected)
    return guard.skipped + guard.annotate(results)


def _without_busy_gpus(ctx: Context, plan: Plan) -> "Guard":
    """The load-test guard (gpucheck.workers.busy): GPUs a job is using get no rank (plan updated); their
    skips are in the returned guard."""
    guard = guard_context(ctx, "cpu" if plan.cpu else "cuda", CHECK_ID, plan.devices)
    plan.devices = list(guard.loaded)
    plan.ranks = len(plan.devices)
    return guard


def _snapshot_name(ctx: Context) -> str | None:
    for g in ctx.selected_gpu_entries():
        if g.get("name"):
            return str(g["name"])
    return None


CHECKS = [intra_check]
