"""pcie: PCIe link width and generation, and the growth of the PCIe replay counter.

- Width below the maximum the GPU and slot support (x8 on an x16 link) halves host bandwidth and
  is a physical problem (riser, cable, seating, a failing lane): fail.
- Generation below the maximum is only a warning: GPUs lower the link generation when idle to save
  power, so an idle GPU in a prolog often reads Gen1; the copy-bandwidth checks judge it under load.
- Replays are link-level retransmissions. DCGM's health watch warns above 8 replays per minute
  (DCGM_LIMIT_MAX_PCIREPLAY_RATE, "the maximum recommended by RM"). gpucheck applies that rate to
  the counter's growth since the previous run of this check (history in the state directory,
  keyed by GPU UUID), over a window of at least `replay_min_window_s`. Without history it reports
  the count since driver load and says that no delta was available.
"""

from __future__ import annotations

from typing import Any

from ..check import Context, Level, Need, define
from ..config import Limit
from ..result import Action, Result, Status, Threshold, judge
from . import (
    apply_unreadable,
    counter_growth,
    gpu_state_result,
    latest_metrics_by,
    previous_interval,
    selected_gpus_or_skip,
    snapshot_time,
)

ID = "pcie"

DEFAULTS = {
    "replay_rate_warn_per_min": 8,  # DCGM_LIMIT_MAX_PCIREPLAY_RATE
    "replay_min_window_s": 60,  # growth over a shorter interval is judged as if over this long
    "warn_gen_below_max": True,  # false: generation below max is reported but passes
}
# The snapshot fields a GPU's result depends on: the width rule fails (error when unreadable);
# the generation and replay rules warn, and the UUID keys the replay history (warn).
READS = {"pcie.link_width": Status.ERROR, "pcie.link_width_max": Status.ERROR, "pcie": Status.WARN,
         "uuid": Status.WARN}
LIMITS = {"replay_rate_warn_per_min": Limit("real", 0), "replay_min_window_s": Limit("real", 0, above=True)}


def _gpu(g: dict[str, Any], p: dict[str, Any], history: dict[Any, Any], now: float | None) -> Result:
    bad = gpu_state_result(ID, g)
    if bad is not None:
        return bad
    idx = g.get("index")
    pc = g.get("pcie") or {}
    width, width_max = pc.get("link_width"), pc.get("link_width_max")
    gen, gen_max = pc.get("link_gen"), pc.get("link_gen_max")
    replays = pc.get("replay_counter")
    uuid = g.get("uuid")
    prev = history.get(uuid) if uuid else None
    interval, why_no_interval = previous_interval(prev, now)
    growth, why_no_growth = counter_growth(replays, prev[0].get("replay_counter") if prev else None)
    rate = None
    if interval is not None and growth is not None:
        window_min = max(interval, float(p["replay_min_window_s"])) / 60.0
        rate = round(growth / window_min, 3)
    metrics: dict[str, Any] = {
        "uuid": uuid,
        "link_width": width,
        "link_width_max": width_max,
        "link_gen": gen,
        "link_gen_max": gen_max,
        "link_gen_gpu_max": pc.get("link_gen_gpu_max"),
        "replay_counter": replays,
        "snapshot_time": now,
        "replay_growth": growth if rate is not None else None,
        "replay_interval_s": None if interval is None else round(interval, 1),
        "replay_rate_per_min": rate,
    }
    thresholds: list[Threshold] = []
    if width_max is not None:
        thresholds.append(Threshold("link_width", "<", width_max, Status.FAIL, "lanes"))
    if gen_max is not None and p["warn_gen_below_max"]:
        thresholds.append(Threshold("link_gen", "<", gen_max, Status.WARN))
    thresholds.append(Threshold("replay_rate_per_min", ">", p["replay_rate_warn_per_min"], Status.WARN, "1/min"))
    if width is None and gen is None and replays is None:
        r = Result(ID, Status.SKIP, f"GPU {idx}: PCIe link state not supported on this GPU/driver", gpu=idx,
                   metrics=metrics, thresholds=thresholds)
        return apply_unreadable(r, g, READS)
    r = judge(
        ID,
        thresholds,
        metrics,
        gpu=idx,
        units={"link_width": "lanes", "link_width_max": "lanes", "replay_counter": "count", "replay_growth": "count",
               "replay_interval_s": "s", "replay_rate_per_min": "1/min", "snapshot_time": "s"},
        ok_summary=f"GPU {idx}: PCIe Gen{gen} x{width} (max Gen{gen_max} x{width_max})",
        causes={
            "link_width": f"PCIe link width x{width} below the maximum x{width_max}",
            "link_gen": (f"PCIe Gen{gen} below the maximum Gen{gen_max} (GPUs lower the generation when idle "
                         "to save power; judge it under load)"),
            "replay_rate_per_min": f"PCIe replays growing: {growth} since the previous run",
        },
        actions={"link_width": Action.INVESTIGATE, "link_gen": Action.NONE, "replay_rate_per_min": Action.INVESTIGATE},
    )
    if gen is not None and gen_max is not None and gen < gen_max and not p["warn_gen_below_max"]:
        r.evidence.append(f"PCIe Gen{gen} below Gen{gen_max}: not judged (warn_gen_below_max = false)")
    if rate is None and replays is not None:
        why = why_no_growth if interval is not None else why_no_interval
        note = f"replay counter {replays} since driver load; no delta available ({why})"
        r.evidence.append(note)
        if r.status == Status.PASS:
            r.summary += f"; {note}"
    elif rate is not None and r.status == Status.PASS:
        r.summary += f"; {growth} replays in {interval:.0f} s"
    return apply_unreadable(r, g, READS)


@define(
    ID,
    title="PCIe link width/generation vs maximum, replay counter growth",
    level=Level.QUICK,
    needs=(Need.NVML,),
    budget_s=5.0,
    detects="down-trained PCIe links (width), reduced generation, replay storms",
    defaults=DEFAULTS,
    limits=LIMITS,
)
def pcie(ctx: Context) -> list[Result]:
    gpus, skip = selected_gpus_or_skip(ID, ctx)
    if skip:
        return skip
    p = ctx.params(ID, DEFAULTS)
    history = latest_metrics_by(ctx, ID, "uuid")
    now = snapshot_time(ctx)
    return [_gpu(g, p, history, now) for g in gpus]


CHECKS = [pcie]
