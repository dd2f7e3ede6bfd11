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

from typing import TYPE_CHECKING, Any, TypedDict

from ..sdk import (Action, Context, Key, Level, Limit, Need, Result, Rule, Status, apply_unreadable, counter_growth,
                   define, each_gpu, evaluate, latest_metrics_by, previous_interval, snapshot_time)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import JudgedGpu, Pcie

ID = "pcie"


class PcieParams(TypedDict):
    """pcie's parameters (DEFAULTS, merged with the config's [checks.pcie])."""

    replay_rate_warn_per_min: float
    replay_min_window_s: float
    warn_gen_below_max: bool


class PcieMetrics(TypedDict):
    """What a GPU's result records (None: not read, or no delta)."""

    uuid: str | None
    link_width: int | None
    link_width_max: int | None
    link_gen: int | None
    link_gen_max: int | None
    link_gen_gpu_max: int | None
    replay_counter: int | None
    snapshot_time: float | None
    replay_growth: int | None
    replay_interval_s: float | None
    replay_rate_per_min: float | None


DEFAULTS: PcieParams = {
    "replay_rate_warn_per_min": 8,  # DCGM_LIMIT_MAX_PCIREPLAY_RATE
    "replay_min_window_s": 60,  # growth over a shorter interval is judged as if over this long
    "warn_gen_below_max": True,  # false: generation below max is reported but passes
}
# The snapshot fields a GPU's result depends on: the width rule fails (error when unreadable);
# the generation and replay rules warn, and the UUID keys the replay history (warn).
READS = {"pcie.link_width": Status.ERROR, "pcie.link_width_max": Status.ERROR, "pcie": Status.WARN,
         "uuid": Status.WARN}
LIMITS = {"replay_rate_warn_per_min": Limit("real", 0), "replay_min_window_s": Limit("real", 0, above=True)}


RULES = (
    Rule("link_width", "<", Key("link_width_max"), Status.FAIL, Action.INVESTIGATE,
         "PCIe link width x{link_width} below the maximum x{link_width_max} ({detail})", "lanes"),
    Rule("link_gen", "<", Key("link_gen_max"), Status.WARN, Action.NONE,
         "PCIe Gen{link_gen} below the maximum Gen{link_gen_max} (GPUs lower the generation when idle to save "
         "power; judge it under load) ({detail})"),
    Rule("replay_rate_per_min", ">", Key("replay_rate_warn_per_min"), Status.WARN, Action.INVESTIGATE,
         "PCIe replays growing: {replay_growth} since the previous run ({detail})", "1/min"),
)


def _replay_rate(p: PcieParams, prev: Any, now: float | None, replays: Any
                 ) -> tuple[float | None, float | None, int | None, str | None]:
    """(replays per minute since the previous reading, the interval, the growth, why no rate)."""
    interval, why_no_interval = previous_interval(prev, now)
    growth, why_no_growth = counter_growth(replays, prev[0].get("replay_counter") if prev else None)
    if interval is None or growth is None:
        return None, interval, growth, why_no_growth if interval is not None else why_no_interval
    window_min = max(interval, float(p["replay_min_window_s"])) / 60.0
    return round(growth / window_min, 3), interval, growth, None


def _gpu(g: "JudgedGpu", p: PcieParams, history: dict[Any, Any], now: float | None) -> Result:
    idx = g.get("index")
    pc: Pcie | dict[str, None] = g.get("pcie") or {}
    width, width_max = pc.get("link_width"), pc.get("link_width_max")
    gen, gen_max = pc.get("link_gen"), pc.get("link_gen_max")
    replays = pc.get("replay_counter")
    uuid = g.get("uuid")
    rate, interval, growth, why_no_rate = _replay_rate(p, history.get(uuid) if uuid else None, now, replays)
    metrics: PcieMetrics = {
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
    # The limits of this GPU: its own maxima (a rule is off where one is not reported).
    limits: dict[str, float | None] = {"replay_rate_warn_per_min": p["replay_rate_warn_per_min"],
                                       "link_width_max": width_max,
                                       "link_gen_max": gen_max if p["warn_gen_below_max"] else None}
    r = evaluate(ID, RULES, dict(metrics), limits=limits, gpu=idx,
                 units={"link_width": "lanes", "link_width_max": "lanes", "replay_counter": "count",
                        "replay_growth": "count", "replay_interval_s": "s", "replay_rate_per_min": "1/min",
                        "snapshot_time": "s"},
                 ok_summary=f"GPU {idx}: PCIe Gen{gen} x{width} (max Gen{gen_max} x{width_max})",
                 skip=(f"GPU {idx}: PCIe link state not supported on this GPU/driver"
                       if width is None and gen is None and replays is None else None))
    if r.status != Status.SKIP:
        _notes(r, p, metrics, interval, why_no_rate)
    return apply_unreadable(r, g, READS)


def _notes(r: Result, p: PcieParams, m: PcieMetrics, interval: float | None, why_no_rate: str | None) -> None:
    """What the rules did not judge: a generation below its maximum (when not judged), replays
    without a delta; and the replays counted since the previous reading."""
    gen, gen_max, replays = m["link_gen"], m["link_gen_max"], m["replay_counter"]
    if gen is not None and gen_max is not None and gen < gen_max and not p["warn_gen_below_max"]:
        r.evidence.append(f"PCIe Gen{gen} below Gen{gen_max}: not judged (warn_gen_below_max = false)")
    if m["replay_rate_per_min"] is None and replays is not None:
        note = f"replay counter {replays} since driver load; no delta available ({why_no_rate})"
        r.evidence.append(note)
        if r.status == Status.PASS:
            r.summary += f"; {note}"
    elif m["replay_rate_per_min"] is not None and interval is not None and r.status == Status.PASS:
        r.summary += f"; {m['replay_growth']} replays in {interval:.0f} s"


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
    return each_gpu(ID, ctx, DEFAULTS, _gpu, lambda c: (latest_metrics_by(c, ID, "uuid"), snapshot_time(c)))


CHECKS = [pcie]
