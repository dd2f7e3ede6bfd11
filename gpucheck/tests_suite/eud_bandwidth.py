"""eud.bandwidth: host<->device, device-to-device and peer-to-peer copy bandwidth per GPU.

One worker process (gpucheck.workers.pool) runs gpucheck.eud.copybw:copybw_worker, which
measures every GPU in turn (pinned, NUMA-local host memory; medians of timed transfers) and then
every ordered GPU pair. `judge_bandwidth` (pure) turns the numbers into one result per GPU:

- against the SKU table (gpucheck.data.bandwidth) when the device name matches a row: H2D and
  D2H below the row's floors (Azure's health-check floors, e.g. 48 GB/s for H100/H200 SXM, warn
  below 1.05 x), D2D below typical_warn_fraction / typical_fail_fraction of the row's typical
  copy rate, the median of the GPU's peer pairs below the row's P2P floors;
- against the node's other GPUs: a GPU this far below the node median of H2D, D2H, D2D or of
  its peer pairs (peer_warn_fraction / peer_fail_fraction);
- a GPU with low H2D or D2H whose PCIe link runs below its maximum width or generation (NVML,
  read under load by the worker; else the telemetry snapshot) gets that named as the likely
  cause; a slow peer path is related to NVLink links the snapshot shows not active.

Warn -> investigate; fail -> drain (a GPU with half its host bandwidth slows every job that
loads data or checkpoints, and the fix is physical: reseat, riser, cable). A GPU whose own copies
raised an error fails (reset-gpu when CUDA named the error, else investigate); a failed peer copy
fails both GPUs of the pair (reset-gpu), except a GPU whose failed pairs are all with partners
that failed with most of their peers (failed_pair_suspects): it warns and names them. A hung
worker fails the GPU it was measuring.

`--device cpu --workers N` runs the same path with host memcpy standing in for every transfer;
the results say so. `--inject slow:gpu=N,factor=F` scales GPU N's measured bandwidths by F.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, TypedDict

from ..data.bandwidth import BandwidthSku, lookup
from ..sdk import (Action, Basis, Context, Key, Level, Limit, Need, Result, Rule, Slice, Status, define, evaluate,
                   fraction)
from ..sdk.workers import (CRASHED, HUNG, Promise, TORCH_IMPORT_CPU_S, WorkerJob, cut_short, guarded_targets, pool,
                           pool_budget, returned_data, stop_timings)

if TYPE_CHECKING:  # pragma: no cover
    from ..eud.copybw import CopyBwArgs, CopyBwTarget
    from ..platform.telemetry.model import GpuEntry, NvLinkLink, Pcie
    from ..sdk.workers import (CopyBwGpu, CopyBwPair, CopyBwProgress, CopyBwResult, LinkUnderLoad, SetupError,
                               WorkerOutcome, WorkerProgress)

CHECK_ID = "eud.bandwidth"
MiB = 1 << 20


class BandwidthParams(TypedDict):
    """eud.bandwidth's parameters (DEFAULTS, merged with the config's [checks."eud.bandwidth"])."""

    h2d_bytes: int
    d2d_bytes: int
    p2p_bytes: int
    repeats: int
    warmup: int
    cpu_bytes: int
    cpu_repeats: int
    p2p: bool
    numa_affinity: bool
    typical_warn_fraction: float
    typical_fail_fraction: float
    peer_warn_fraction: float
    peer_fail_fraction: float
    work_budget_s: float
    heartbeat_timeout_s: float
    startup_timeout_s: float


DEFAULTS: BandwidthParams = {
    "h2d_bytes": 256 * MiB,  # per host<->device transfer (PCIe Gen5 x16: ~5 ms)
    "d2d_bytes": 1024 * MiB,  # per device-to-device copy (H100: ~0.7 ms)
    "p2p_bytes": 256 * MiB,  # per peer copy (NVLink: ~0.7 ms)
    "repeats": 10,  # timed transfers; the median is reported
    "warmup": 2,  # untimed transfers first
    "cpu_bytes": 16 * MiB,  # --device cpu: every transfer size
    "cpu_repeats": 5,
    "p2p": True,  # measure every ordered GPU pair
    "numa_affinity": True,  # host buffers on the GPU's NUMA node
    "typical_warn_fraction": 0.9,  # SKU rows with a typical value only: warn below this fraction
    "typical_fail_fraction": 0.75,  # ... fail below this one (midway between healthy and half speed)
    "peer_warn_fraction": 0.10,  # warn this far below the node median
    "peer_fail_fraction": 0.25,  # fail this far below (a half-width link is 0.5 below)
    "work_budget_s": 300.0,  # measuring, after start-up (8 GPUs and 56 pairs: well under a minute)
    "heartbeat_timeout_s": 60.0,
    "startup_timeout_s": 120.0,  # spawn + torch import + CUDA init of every GPU
}
# What a setting may be where gpucheck.core.config.conventional_limit is not enough: sizes and counts
# of work are at least 1 (0 would examine nothing).
LIMITS = {k: Limit("int", 1) for k in ("h2d_bytes", "d2d_bytes", "p2p_bytes", "repeats", "cpu_bytes",
                                        "cpu_repeats")}

KINDS = ("h2d", "d2h", "d2d")
LABEL = {"h2d": "host-to-device", "d2h": "device-to-host", "d2d": "device-to-device", "p2p": "peer-to-peer"}


def _params(ctx: Context) -> BandwidthParams:
    return ctx.params(CHECK_ID, DEFAULTS)


def _budget(ctx: Context) -> float:
    p = _params(ctx)
    return float(p["startup_timeout_s"]) + float(p["work_budget_s"]) + 30.0


def _min_slice(ctx: Context) -> Any:
    """One worker (it measures every GPU in turn): at least its torch import."""
    return Slice(TORCH_IMPORT_CPU_S, f"at least {TORCH_IMPORT_CPU_S:g} s to start its worker")


def injection_factors(ctx: Context, gpus: list[int]) -> tuple[dict[int, float], dict[int, list[str]], str | None]:
    """`--inject slow:gpu=N,factor=F`: factor per GPU, texts per GPU, and a usage problem."""
    factors: dict[int, float] = {}
    texts: dict[int, list[str]] = {}
    for inj in ctx.injections_for("slow"):
        try:
            f = fraction(inj, "factor", 0.5)
        except (TypeError, ValueError) as e:
            return {}, {}, f"--inject {inj}: {e}"
        for g in gpus:
            if inj.targets_gpu(g):
                factors[g] = factors.get(g, 1.0) * f
                texts.setdefault(g, []).append(str(inj))
    return factors, texts, None


@define(
    CHECK_ID,
    title="Copy bandwidth: host<->device (pinned), device-to-device, peer-to-peer; SKU table and peers",
    level=Level.STANDARD,
    needs=(Need.TORCH, Need.GPU),
    budget_s=450.0,  # shown by `gpucheck list`; runs use budget_fn (startup + work + slack)
    budget_fn=_budget,
    detects="PCIe links trained below width/generation, slow host paths, slow HBM copies, slow or missing peer paths",
    defaults=DEFAULTS,
    limits=LIMITS,
    injects=("slow",),
    min_slice_fn=_min_slice,
)
def bandwidth(ctx: Context) -> list[Result]:
    p = _params(ctx)
    device = "cpu" if ctx.device == "cpu" else "cuda"
    targets, results, guard = guarded_targets(ctx, device, CHECK_ID, "measured")  # GPUs in use: skipped
    if not targets:
        return results or [Result(CHECK_ID, Status.SKIP, "no GPU selected to measure")]
    factors, texts, problem = injection_factors(ctx, [t["gpu"] for t in targets])
    if problem:
        return [Result(CHECK_ID, Status.ERROR, problem)]
    entries = {int(e["index"]): e for e in ctx.selected_gpu_entries() if e.get("index") is not None}
    gpus: list[CopyBwTarget] = [{"gpu": t["gpu"], "uuid": t["visible"] if device == "cuda" else None,
                                 "bus_id": _bus_id(entries.get(t["gpu"])), "name": t["name"]} for t in targets]
    cpu = device == "cpu"
    args: CopyBwArgs = {"gpus": gpus, "slow": factors, "p2p": bool(p["p2p"]), "numa_affinity": bool(p["numa_affinity"]),
            "h2d_bytes": p["cpu_bytes"] if cpu else p["h2d_bytes"], "d2d_bytes": p["cpu_bytes"] if cpu else p["d2d_bytes"],
            "p2p_bytes": p["cpu_bytes"] if cpu else p["p2p_bytes"],
            "repeats": p["cpu_repeats"] if cpu else p["repeats"], "warmup": p["warmup"]}
    job = WorkerJob("node", gpu=None, device=device, args={**args}, visible_device=None)

    def on_progress(_job: WorkerJob, info: "WorkerProgress") -> None:  # the copy worker's: CopyBwProgress
        cur = info.get("current")
        ctx.report(CHECK_ID, f"gpu{cur}" if cur is not None else "node", {"what": info.get("what")})

    t0 = time.monotonic()
    outcomes: "dict[str, WorkerOutcome[CopyBwResult | SetupError, CopyBwProgress]]" = pool.run_workers(
        "gpucheck.eud.copybw:copybw_worker", [job],
        budget_s=pool_budget(ctx, float(p["work_budget_s"]) + float(p["startup_timeout_s"])),
        heartbeat_timeout_s=float(p["heartbeat_timeout_s"]), startup_timeout_s=float(p["startup_timeout_s"]),
        cancel=ctx.cancel, on_progress=on_progress, **stop_timings(ctx),
    )
    elapsed = time.monotonic() - t0
    out = judge_outcome(outcomes.get("node"), [g["gpu"] for g in gpus], p, device, entries, texts)
    for r in out:
        r.duration_s = elapsed
    results.extend(out)
    return sorted(guard.annotate(results), key=lambda r: (r.gpu is None, r.gpu or 0))


# ---------------------------------------------------------------------------------------------
# judging (pure)


def _bus_id(entry: "GpuEntry | None") -> str | None:
    return entry.get("pci_bus_id") if entry else None


def judge_outcome(oc: "WorkerOutcome[CopyBwResult | SetupError, CopyBwProgress] | None", gpus: list[int],
                  p: BandwidthParams, device: str, entries: "dict[int, GpuEntry]",
                  injected: dict[int, list[str]]) -> list[Result]:
    """Results for every GPU from the node worker's outcome."""
    if oc is None:
        return [Result(CHECK_ID, Status.ERROR, "no outcome from the worker pool")]
    setup_error = oc.result.get("setup_error") if oc.result is not None else None
    if setup_error:
        return [Result(CHECK_ID, Status.ERROR, f"could not measure: {setup_error}", gpu=g,
                       injected=injected.get(g, [])) for g in gpus]
    if oc.result is None:
        return _unfinished(oc, gpus, injected)
    data = returned_data(oc)
    res = judge_bandwidth(data, p, device, entries, injected)
    stopped = data.get("stopped")
    if stopped:
        whole = Promise(0.0, "every run", "host, device and peer copies of every selected GPU")
        for r in res:
            r.evidence.append(f"stopped early ({stopped}): results are partial")
            cut_short(r, whole, oc.duration_s, str(stopped))
    # A GPU the worker never reached (stopped before it) still gets a result: never a silent gap.
    done = {r.gpu for r in res}
    for g in gpus:
        if g not in done:
            why = f"stopped ({stopped}) before this GPU" if stopped else "the worker returned no measurement for it"
            res.append(Result(CHECK_ID, Status.ERROR, f"not measured: {why}", gpu=g, injected=injected.get(g, [])))
    return res


def _unfinished(oc: "WorkerOutcome[CopyBwResult | SetupError, CopyBwProgress]", gpus: list[int],
                injected: dict[int, list[str]]) -> list[Result]:
    """A worker that returned nothing: the GPU it was measuring when it hung or crashed fails, the
    others are not measured (with what the worker had measured of each before)."""
    prog = oc.progress
    cur = prog.get("current") if prog else None
    measured = prog.get("measured") if prog else None
    out = []
    for g in gpus:
        inj = injected.get(g, [])
        if g == cur and oc.kind in (HUNG, CRASHED):
            what = prog.get("what", "copies") if prog else "copies"
            if oc.kind == HUNG:
                r = Result(CHECK_ID, Status.FAIL, f"hang: copies stopped while measuring {what} on this GPU "
                                                  f"({oc.error})", gpu=g, action=Action.RESET_GPU, injected=inj,
                           basis=Basis.HANG)
            else:
                r = Result(CHECK_ID, Status.FAIL, f"copy worker crashed while measuring {what} on this GPU: "
                                                  f"{oc.error}", gpu=g, action=Action.RESET_GPU, injected=inj,
                           basis=Basis.CRASH)
                if oc.traceback:
                    r.evidence.extend(oc.traceback.strip().splitlines()[-8:])
        else:
            why = {HUNG: "the worker hung", CRASHED: "the worker crashed"}.get(oc.kind, f"{oc.kind}: {oc.error}")
            r = Result(CHECK_ID, Status.ERROR, f"not measured: {why}" + (f" on GPU {cur}" if cur is not None else ""),
                       gpu=g, injected=inj)
        part = measured.get(g) if measured else None
        if part:
            for k, v in (("h2d", part.get("h2d")), ("d2h", part.get("d2h")), ("d2d", part.get("d2d"))):
                if v is not None:
                    r.metric(f"{k}_gbps", round(float(v), 3), "GB/s")
        out.append(r)
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _gbps(rec: "CopyBwGpu", kind: str) -> float | None:
    v = rec.get(kind)
    return None if not isinstance(v, dict) or v.get("gbps") is None else float(v["gbps"])


def link_cause(entry: "GpuEntry | None", under_load: "LinkUnderLoad | None") -> str:
    """Why a GPU's host transfers may be slow, from its PCIe link: '; likely cause: ...', a note
    that the link is at its maximum, or '' when nothing is known."""
    pc: Pcie | dict[str, None] = (entry.get("pcie") if entry else None) or {}
    ul: LinkUnderLoad = under_load or {}
    wmax, gmax = pc.get("link_width_max"), pc.get("link_gen_max")
    width = ul.get("width") if ul.get("width") is not None else pc.get("link_width")
    gen_ul, gen_snap = ul.get("gen"), pc.get("link_gen")
    parts = []
    if width is not None and wmax is not None and width < wmax:
        where = "under load" if ul.get("width") is not None else "in the telemetry snapshot"
        parts.append(f"PCIe link trained at x{width}, below its maximum x{wmax} ({where})")
    if gen_ul is not None and gmax is not None and gen_ul < gmax:
        parts.append(f"PCIe Gen{gen_ul} under load, below its maximum Gen{gmax}")
    elif gen_ul is None and gen_snap is not None and gmax is not None and gen_snap < gmax:
        parts.append(f"PCIe Gen{gen_snap} (max Gen{gmax}) in the telemetry snapshot (read while idle, when GPUs "
                     "lower the generation: confirm under load)")
    if parts:
        return "; likely cause: " + "; ".join(parts)
    if width is not None and (gen_ul or gen_snap) is not None:
        g = gen_ul or gen_snap
        return (f"; the PCIe link is at Gen{g} x{width}" + (" (its maximum)" if (wmax in (None, width)) and
                                                            (gmax in (None, g)) else "")
                + ": look at the host side (NUMA placement, IOMMU, a shared PCIe switch)")
    return ""


def _nvlink_down(entry: "GpuEntry | None") -> str:
    nvlink = entry.get("nvlink") if entry else None
    links: list[NvLinkLink] = (nvlink.get("links") if nvlink else None) or []
    down = [lk.get("link") for lk in links if lk.get("state") not in (None, "active")]
    if not links or not down:
        return ""
    return f"; NVLink: {len(down)} of {len(links)} links not active in the snapshot (links {down})"


def failed_pair_suspects(pairs: "list[CopyBwPair]") -> tuple[set[int], dict[int, set[int]]]:
    """GPUs whose peer copies failed with at least two partners and with at least half of the
    partners they were tried with (the common factor of the failures), and per GPU the partners it
    failed with. Pairs without peer access were not tried and do not count."""
    partners: dict[int, set[int]] = {}
    failed_with: dict[int, set[int]] = {}
    for pr in pairs:
        if pr.get("gbps") is None and not pr.get("error"):
            continue
        s, d = int(pr["src"]), int(pr["dst"])
        partners.setdefault(s, set()).add(d)
        partners.setdefault(d, set()).add(s)
        if pr.get("error"):
            failed_with.setdefault(s, set()).add(d)
            failed_with.setdefault(d, set()).add(s)
    suspects = {g for g, f in failed_with.items() if len(f) >= 2 and 2 * len(f) >= len(partners.get(g, ()))}
    return suspects, failed_with


def _kind_rules(k: str) -> tuple[Rule, ...]:
    """H2D, D2H or D2D against the SKU floors and against the node median."""
    link = f"{{{k}_link}}" if k in ("h2d", "d2h") else ""
    floor = (f"slow {LABEL[k]} copies: {{{k}_text}} GB/s, below the {{sku}} floor ({{{k}_fail_text}} fail / "
             f"{{{k}_warn_text}} warn){link} ({{detail}})")
    peers = (f"slow {LABEL[k]} copies: {{{k}_text}} GB/s, {{{k}_deficit_text}}% below the node median of "
             f"{{{k}_median_text}} GB/s{link} ({{detail}})")
    m, d = f"{k}_gbps", f"{k}_peer_deficit_pct"
    return (Rule(m, "<", Key(f"{k}_warn_gbps"), Status.WARN, Action.INVESTIGATE, floor, "GB/s"),
            Rule(m, "<", Key(f"{k}_fail_gbps"), Status.FAIL, Action.DRAIN, floor, "GB/s"),
            Rule(d, ">", Key(f"{k}_peer_warn_pct"), Status.WARN, Action.INVESTIGATE, peers, "%"),
            Rule(d, ">", Key(f"{k}_peer_fail_pct"), Status.FAIL, Action.DRAIN, peers, "%"))


_P2P_FLOOR = ("slow peer-to-peer copies: median of its pairs {p2p_median_text} GB/s ({slowest}), below the {sku} "
              "floor ({p2p_fail_text} fail / {p2p_warn_text} warn){nvlink_down} ({detail})")
_P2P_PEERS = ("slow peer-to-peer copies: median of its pairs {p2p_median_text} GB/s, {p2p_deficit_text}% below the "
              "median over the node's GPUs of {pair_median_text} GB/s ({slowest}){nvlink_down} ({detail})")
_P2P_FAILED = "peer-to-peer copies failed: {failed_pairs}"
# Limits by key (see _limits): SKU floors, the peer fractions where the node has a median to compare
# with, and which of the two failed-pair rules applies. Warn -> investigate; fail -> drain (half the
# host bandwidth slows every job that loads data or checkpoints, and the fix is physical), except
# failed peer copies (reset-gpu). The P2P floor is on the median of the GPU's pairs, not the
# slowest pair: one bad GPU slows a pair of every other GPU, and must not fail them all.
RULES: tuple[Rule, ...] = (
    *(rule for k in KINDS for rule in _kind_rules(k)),
    Rule("p2p_median_gbps", "<", Key("p2p_warn_gbps"), Status.WARN, Action.INVESTIGATE, _P2P_FLOOR, "GB/s"),
    Rule("p2p_median_gbps", "<", Key("p2p_fail_gbps"), Status.FAIL, Action.DRAIN, _P2P_FLOOR, "GB/s"),
    Rule("p2p_peer_deficit_pct", ">", Key("p2p_peer_warn_pct"), Status.WARN, Action.INVESTIGATE, _P2P_PEERS, "%"),
    Rule("p2p_peer_deficit_pct", ">", Key("p2p_peer_fail_pct"), Status.FAIL, Action.DRAIN, _P2P_PEERS, "%"),
    Rule("p2p_pairs_without_access", ">", Key("no_access_limit"), Status.WARN, Action.INVESTIGATE,
         "no peer access for {p2p_pairs_without_access} pair(s) on a {sku} node, where every pair should have "
         "it{nvlink_down} ({detail})", "count"),
    Rule("p2p_pairs_failed", ">", Key("failed_fail_limit"), Status.FAIL, Action.RESET_GPU, _P2P_FAILED + " ({detail})",
         "count"),
    # Failed pairs all explained by partners that failed with most of their peers: those partners are
    # the likely cause, and this GPU only warns (one bad GPU must not fail every GPU it was paired with).
    Rule("p2p_pairs_failed", ">", Key("failed_warn_limit"), Status.WARN, Action.INVESTIGATE,
         _P2P_FAILED + "; only with {bystander_of}, whose copies failed with most of their peers: the likely cause "
         "({detail})", "count"),
)


def _node_yardsticks(data: "CopyBwResult") -> tuple[dict[str, float], float | None, int]:
    """The node medians of H2D, D2H and D2D over the GPUs measured (two at least), the median
    over GPUs of each GPU's pair median (three at least: one bad GPU slows every pair it is in,
    but moves only its own pair median far), and how many GPUs were measured."""
    gpus = {int(k): v for k, v in data.get("gpus", {}).items()}
    pairs = [pr for pr in data.get("pairs", []) if pr.get("gbps") is not None]
    measured = [r for r in gpus.values() if not r.get("error")]
    medians: dict[str, float] = {}
    for k in KINDS:
        vals = [v for v in (_gbps(r, k) for r in measured) if v is not None]
        if len(vals) >= 2:
            medians[k] = statistics.median(vals)
    per_gpu = [statistics.median([_measured(pr) for pr in pairs if g in (pr["src"], pr["dst"])])
               for g in gpus if any(g in (pr["src"], pr["dst"]) for pr in pairs)]
    return medians, (statistics.median(per_gpu) if len(per_gpu) >= 3 else None), len(measured)


def _measured(pr: "CopyBwPair") -> float:
    """The bandwidth of a pair that was measured (gbps not None)."""
    gbps = pr["gbps"]
    if gbps is None:
        raise ValueError(f"pair gpu{pr['src']}->gpu{pr['dst']} was not measured")
    return float(gbps)


def _deficit(value: float, median: float) -> float:
    return max(0.0, (median - value) / median * 100.0) if median > 0 else 0.0


def _host_copies(rec: "CopyBwGpu", sku: BandwidthSku | None, p: BandwidthParams, medians: dict[str, float],
                 link: str) -> tuple[dict[str, float | None], dict[str, float | None], dict[str, str | None]]:
    """Metrics, limits and facts of H2D, D2H and D2D for one GPU."""
    tw, tf = float(p["typical_warn_fraction"]), float(p["typical_fail_fraction"])
    metrics: dict[str, float | None] = {}
    limits: dict[str, float | None] = {}
    facts: dict[str, str | None] = {}
    for k in KINDS:
        v = _gbps(rec, k)
        metrics[f"{k}_gbps"] = None if v is None else round(v, 3)
        fail_at = warn_at = None
        if sku is not None and k in ("h2d", "d2h"):
            fail_at, warn_at = sku.h2d_fail_gbps, sku.h2d_warn_gbps
            if fail_at is None and sku.h2d_typical_gbps is not None:
                fail_at, warn_at = round(sku.h2d_typical_gbps * tf, 2), round(sku.h2d_typical_gbps * tw, 2)
        elif sku is not None and sku.d2d_typical_gbps is not None:
            fail_at, warn_at = round(sku.d2d_typical_gbps * tf, 1), round(sku.d2d_typical_gbps * tw, 1)
        peer = v is not None and k in medians
        limits.update({f"{k}_warn_gbps": None if v is None else warn_at, f"{k}_fail_gbps": None if v is None else fail_at,
                       f"{k}_peer_warn_pct": 100.0 * float(p["peer_warn_fraction"]) if peer else None,
                       f"{k}_peer_fail_pct": 100.0 * float(p["peer_fail_fraction"]) if peer else None})
        facts.update({f"{k}_text": _fmt(v), f"{k}_fail_text": _fmt(fail_at), f"{k}_warn_text": _fmt(warn_at),
                      f"{k}_link": link})
        if peer:
            deficit = _deficit(float(v), medians[k])  # type: ignore[arg-type]
            metrics[f"{k}_peer_deficit_pct"] = round(deficit, 1)
            facts.update({f"{k}_deficit_text": f"{deficit:.0f}", f"{k}_median_text": _fmt(medians[k])})
    return metrics, limits, facts


def _peer_copies(g: int, data: "CopyBwResult", sku: BandwidthSku | None, p: BandwidthParams,
                 pair_median: float | None, suspects: set[int], failed_with: dict[int, set[int]],
                 entry: "GpuEntry | None") -> tuple[dict[str, float | None], dict[str, float | None], dict[str, str | None]]:
    """Metrics, limits and facts of one GPU's peer copies."""
    mine = [pr for pr in data.get("pairs", []) if g in (pr["src"], pr["dst"]) and pr.get("gbps") is not None]
    no_access = [pr for pr in data.get("pairs", []) if g in (pr["src"], pr["dst"]) and pr.get("note")]
    failed = [pr for pr in data.get("pairs", []) if g in (pr["src"], pr["dst"]) and pr.get("error")]
    floors = sku is not None and sku.p2p_fail_gbps is not None
    metrics: dict[str, float | None] = {}
    limits: dict[str, float | None] = dict.fromkeys(("p2p_warn_gbps", "p2p_fail_gbps", "p2p_peer_warn_pct",
                                                      "p2p_peer_fail_pct"))
    facts: dict[str, str | None] = {"nvlink_down": _nvlink_down(entry)}
    if mine:
        vals = [_measured(pr) for pr in mine]
        slowest = min(mine, key=_measured)
        med = statistics.median(vals)
        metrics.update(p2p_min_gbps=round(min(vals), 3), p2p_median_gbps=round(med, 3))
        facts.update(slowest=f"slowest gpu{slowest['src']}->gpu{slowest['dst']} {_fmt(slowest['gbps'])} GB/s",
                     p2p_median_text=_fmt(med))
        if floors:
            limits.update(p2p_warn_gbps=sku.p2p_warn_gbps, p2p_fail_gbps=sku.p2p_fail_gbps)  # type: ignore[union-attr]
            facts.update(p2p_fail_text=_fmt(sku.p2p_fail_gbps), p2p_warn_text=_fmt(sku.p2p_warn_gbps))  # type: ignore[union-attr]
        if pair_median is not None:
            deficit = _deficit(med, pair_median)
            metrics["p2p_peer_deficit_pct"] = round(deficit, 1)
            limits.update(p2p_peer_warn_pct=100.0 * float(p["peer_warn_fraction"]),
                          p2p_peer_fail_pct=100.0 * float(p["peer_fail_fraction"]))
            facts.update(p2p_deficit_text=f"{deficit:.0f}", pair_median_text=_fmt(pair_median))
    metrics["p2p_pairs_without_access"] = len(no_access)
    metrics["p2p_pairs_failed"] = len(failed)
    mine_failed = failed_with.get(g, set())
    bystander = bool(mine_failed) and g not in suspects and mine_failed <= suspects
    limits.update(no_access_limit=0 if no_access and floors else None, failed_fail_limit=None if bystander else 0,
                  failed_warn_limit=0 if bystander else None)
    facts.update(failed_pairs="; ".join(f"gpu{pr['src']}->gpu{pr['dst']}: {pr['error']}" for pr in failed[:3]),
                 bystander_of=", ".join(f"gpu{x}" for x in sorted(mine_failed)))
    return metrics, limits, facts


def judge_bandwidth(data: "CopyBwResult", p: BandwidthParams, device: str, entries: "dict[int, GpuEntry]",
                    injected: dict[int, list[str]]) -> list[Result]:
    """One result per measured GPU from the worker's data (see the module doc and RULES)."""
    gpus: dict[int, CopyBwGpu] = {int(k): v for k, v in data.get("gpus", {}).items()}
    medians, pair_median, n_measured = _node_yardsticks(data)
    suspects, failed_with = failed_pair_suspects(data.get("pairs", []))
    cpu = device == "cpu"
    out: list[Result] = []
    for g in sorted(gpus):
        rec, entry = gpus[g], entries.get(g)
        if rec.get("error"):
            err = rec["error"]
            out.append(Result(CHECK_ID, Status.FAIL, f"copies failed on this GPU: {err}", gpu=g,
                              action=Action.RESET_GPU if "cuda" in err.lower() else Action.INVESTIGATE,
                              injected=injected.get(g, []), basis=Basis.DEVICE_ERROR))
            continue
        name = rec.get("name") or (entry.get("name") if entry else None)
        sku: BandwidthSku | None = None if cpu else lookup(name)
        hm, hl, hf = _host_copies(rec, sku, p, medians, link_cause(entry, rec.get("link_under_load")) if not cpu else "")
        pm, pl, pf = _peer_copies(g, data, sku, p, pair_median, suspects, failed_with, entry)
        metrics = {**hm, **pm}
        units = {k: ("%" if k.endswith("_pct") else "count" if k.startswith("p2p_pairs") else
                     "GB/s (read + write)" if k == "d2d_gbps" else "GB/s") for k in metrics}
        res = evaluate(CHECK_ID, RULES, metrics, limits={**hl, **pl}, facts={**hf, **pf, "sku": sku.name if sku else None},
                       units=units, ok_summary=_ok_summary(g, data, rec, metrics, name, sku, cpu, n_measured), gpu=g)
        res.evidence = _evidence(g, data, rec, name, sku, cpu)
        res.injected = list(injected.get(g, []))
        out.append(res)
    return out


def _ok_summary(g: int, data: "CopyBwResult", rec: "CopyBwGpu", metrics: dict[str, float | None], name: Any,
                sku: BandwidthSku | None, cpu: bool, n_measured: int) -> str:
    ok_parts = [f"{k.upper()} {_fmt(_gbps(rec, k))}" for k in KINDS if _gbps(rec, k) is not None]
    ok = ", ".join(ok_parts) + " GB/s" + (" (D2D counts read + write)" if _gbps(rec, "d2d") is not None else "")
    if "p2p_min_gbps" in metrics:
        mine = [pr for pr in data.get("pairs", []) if g in (pr["src"], pr["dst"]) and pr.get("gbps") is not None]
        ok += f"; P2P min {_fmt(metrics['p2p_min_gbps'])} GB/s over {len(mine)} pair(s)"
    if cpu:
        ok = "CPU stand-in (host memcpy, not a GPU): " + ok
    elif sku is None:
        ok += f"; {name!r} not in the bandwidth table: judged by peers only"
    if n_measured < 2:
        ok += "; no peers to compare"
    return ok


def _evidence(g: int, data: "CopyBwResult", rec: "CopyBwGpu", name: Any, sku: BandwidthSku | None,
              cpu: bool) -> list[str]:
    pairs = [pr for pr in data.get("pairs", []) if g in (pr["src"], pr["dst"])]
    mine = [pr for pr in pairs if pr.get("gbps") is not None]
    no_access = [pr for pr in pairs if pr.get("note")]
    if cpu:
        evidence = [f"CPU worker {g} standing in for a GPU: host memcpy bandwidth"]
    else:
        evidence = [f"device {name!r}: " + (f"{sku.name}, host link {sku.host_link} ({sku.source})"
                                             if sku else "not in the bandwidth table, judged by peers only")]
    if mine:
        evidence.append("p2p: " + ", ".join(f"gpu{pr['src']}->gpu{pr['dst']} {_fmt(pr['gbps'])}" for pr in mine)
                        + " GB/s")
    if no_access:
        evidence.append("no peer access: " + ", ".join(f"gpu{pr['src']}->gpu{pr['dst']}" for pr in no_access))
    for k in KINDS:
        r = rec.get(k)
        if isinstance(r, dict) and r.get("gbps") is not None:
            evidence.append(f"{k}: median of {r['repeats']} x {r['bytes'] // MiB} MiB = {_fmt(r['gbps'])} GB/s "
                            f"(spread {_fmt(r.get('spread'))})" + (f"; {r['counted']}" if r.get("counted") else ""))
    ul = rec.get("link_under_load")
    if ul:
        evidence.append("PCIe link under load (NVML): " + (f"Gen{ul.get('gen')} x{ul.get('width')}"
                                                           if "error" not in ul else ul["error"]))
    numa = rec.get("numa") or {}
    if numa and not cpu:
        evidence.append(f"host buffer: NUMA node {numa.get('node')}, CPU affinity {numa.get('affinity', 'not set')}, "
                        f"{numa.get('pinned')}")
    if not mine and not no_access:
        evidence.append(data.get("p2p_note") or "peer-to-peer copies not measured")
    evidence.extend(data.get("notes", []))
    evidence.extend(f"injected {x}" for x in data.get("injected", []) if f"GPU {g}'" in x)
    return evidence


CHECKS = [bandwidth]
