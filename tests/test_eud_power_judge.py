"""eud.power judging on SYNTHETIC sample series (hand-made, modelled on NvmlSession.sample output):
each failure class turns its GPU from pass to the right verdict while healthy peers stay pass."""

from __future__ import annotations

import pytest

from gpucheck.tests_suite import eud_power as power_mod
from gpucheck.eud.power_judge import gpu_stats, hw_fail_bar, judge_power, load_window
from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.core.inject import parse_injection
from gpucheck.core.result import Action, Status

P = dict(power_mod.DEFAULTS)
LIMIT = 700.0


def series(n=60, *, power=690.0, clock=1755, temp=66.0, reasons=("sw_power_cap",), hw=None, hw_every=None,
           t0=1000.0):
    """Synthetic 1 Hz samples of a loaded GPU. `hw` (a reason name) is set in every `hw_every`-th
    sample (or in all when hw_every is None), with the clock halved as NVML documents."""
    out = []
    for i in range(n):
        names = list(reasons)
        c = clock
        if hw and (hw_every is None or i % hw_every == 0):
            names.append(hw)
            c = clock // 2
        out.append({"time": t0 + i, "sm_clock_mhz": c, "temperature_c": temp, "power_w": power,
                    "throttle_reasons": 0, "throttle_reason_names": names, "error": None})
    return out


def loads(**per_gpu):
    out = {}
    for key, samples in per_gpu.items():
        g = int(key[1:])
        out[g] = {"samples": samples, "limit_w": LIMIT, "limit_source": "synthetic", "injected": [], "evidence": [],
                  "load": "synthetic load", "sdc_events": 0, "xid": []}
    return out


def by_gpu(results):
    return {r.gpu: r for r in results}


def test_healthy_node_passes_and_power_cap_is_not_a_fault():
    res = by_gpu(judge_power(loads(g0=series(), g1=series(temp=68), g2=series(temp=64)), P))
    for r in res.values():
        assert r.status == Status.PASS and r.action == Action.NONE
        assert "sw_power_cap seen (normal under a GEMM)" in r.summary
        assert r.metrics["power_fraction_of_limit"] == pytest.approx(690 / 700, abs=1e-3)
        assert r.metrics["hw_slowdown_samples"] == 0
    assert res[1].metrics["temperature_over_peers_c"] == 3.0


@pytest.mark.parametrize("reason", ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"])
def test_clock_cut_by_hardware_fails_only_that_gpu(reason):
    res = by_gpu(judge_power(loads(g0=series(), g1=series(hw=reason, hw_every=4), g2=series()), P))
    bad = res[1]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN
    assert bad.summary.startswith(f"clock cut by hardware under load: {reason} in 15 of 60 load samples")
    assert "SM clock median 877 MHz in those samples vs 1755 MHz otherwise" in bad.summary
    t = [t for t in bad.thresholds if t.metric == "hw_slowdown_samples" and t.status == Status.FAIL][0]
    assert t.op == ">=" and t.limit == hw_fail_bar(60, P) == 3
    assert res[0].status == Status.PASS and res[2].status == Status.PASS


def test_one_glitch_is_a_warn_not_a_fail():
    s = series()
    s[30]["throttle_reason_names"] = ["sw_power_cap", "hw_slowdown"]
    r = by_gpu(judge_power(loads(g0=s, g1=series()), P))[0]
    assert r.status == Status.WARN and r.action == Action.INVESTIGATE
    assert "hw_slowdown in 1 of 60 load samples, below the fail bar of 3" in r.summary


def test_fail_bar_scales_with_the_load():
    assert hw_fail_bar(20, P) == 3  # the floor
    assert hw_fail_bar(110, P) == 6  # 5% of a level-3 load (120 s at 1 Hz, minus warm-up)
    assert hw_fail_bar(890, P) == 45


def test_sw_thermal_and_power_cap_clock_drops_are_evidence_not_a_fail():
    s = series(clock=1400, reasons=("sw_power_cap", "sw_thermal_slowdown"))
    r = by_gpu(judge_power(loads(g0=s, g1=series()), P))[0]
    assert r.status == Status.PASS
    assert "sw_power_cap/sw_thermal_slowdown seen" in r.summary
    assert any("sw_thermal_slowdown 60" in e for e in r.evidence)


def test_gpu_that_cannot_reach_its_power_limit_fails():
    res = by_gpu(judge_power(loads(g0=series(power=380.0, reasons=()), g1=series()), P))
    r = res[0]
    assert r.status == Status.FAIL and r.action == Action.DRAIN
    assert r.summary.startswith("cannot reach its power limit under load: top 20% of samples average 380 W of the "
                                "700 W enforced limit")
    assert "(power_fraction_of_limit=0.543 < 0.6)" in r.summary
    assert res[1].status == Status.PASS


def test_power_fraction_uses_the_top_samples_not_the_mean():
    # A load that reaches the limit only in bursts (e.g. between host syncs) is not a power fault.
    s = series(power=300.0)
    for i in range(0, 60, 4):
        s[i]["power_w"] = 695.0
    st = gpu_stats(s, LIMIT, P)
    assert st["power_top_mean_w"] == 695.0 and st["power_mean_w"] < 420
    assert by_gpu(judge_power(loads(g0=s), P))[0].status == Status.PASS


def test_clocks_held_down_by_the_site_make_low_power_a_warn():
    s = series(power=380.0, reasons=("applications_clocks_setting",))
    r = by_gpu(judge_power(loads(g0=s, g1=series()), P))[0]
    assert r.status == Status.WARN and r.action == Action.INVESTIGATE
    assert "clocks set by the site hold the power down" in r.summary


def test_hot_gpu_warns_against_the_peers_median():
    res = by_gpu(judge_power(loads(g0=series(temp=66), g1=series(temp=67), g2=series(temp=80), g3=series(temp=65)),
                             P))
    hot = res[2]
    assert hot.status == Status.WARN and hot.action == Action.INVESTIGATE
    assert hot.metrics["temperature_over_peers_c"] == 14.0
    assert "hotter than its peers under the same load: median 80 C vs 66 C on the other GPUs" in hot.summary
    assert all(res[g].status == Status.PASS for g in (0, 1, 3))
    # 10 C over is not "more than 10 C over"
    edge = by_gpu(judge_power(loads(g0=series(temp=66), g1=series(temp=76)), P))[1]
    assert edge.status == Status.PASS and edge.metrics["temperature_over_peers_c"] == 10.0


def test_single_gpu_has_no_peer_comparison():
    r = judge_power(loads(g0=series(temp=90)), P)[0]
    assert r.status == Status.PASS and "no peer GPU to compare temperatures with" in r.summary


def test_warmup_samples_are_outside_the_load_window():
    s = series(n=40, t0=0.0)
    for x in s[:10]:  # the ramp: hardware slowdown while the power controller settles
        x["throttle_reason_names"] = ["hw_slowdown"]
    window = load_window(s, 10.0, 39.0)
    assert len(window) == 30
    assert judge_power(loads(g0=window), P)[0].status == Status.PASS
    assert judge_power(loads(g0=load_window(s, 0.0, 39.0)), P)[0].status == Status.FAIL


def test_too_few_samples_or_no_telemetry_is_could_not_judge():
    r = judge_power(loads(g0=series(n=5)), P)[0]
    assert r.status == Status.ERROR and "fewer than min_load_samples 10" in r.summary
    blank = [{"time": float(i), "sm_clock_mhz": None, "temperature_c": None, "power_w": None,
              "throttle_reasons": None, "throttle_reason_names": None} for i in range(30)]
    r = judge_power(loads(g0=blank), P)[0]
    assert r.status == Status.ERROR and "no power, SM clock or clock-event reading" in r.summary


def test_unknown_power_limit_is_said_not_passed_silently():
    d = loads(g0=series(power=100.0))
    d[0]["limit_w"] = None
    d[0]["limit_source"] = "not in the telemetry snapshot"
    r = judge_power(d, P)[0]
    assert r.status == Status.PASS
    assert "enforced power limit not read (not in the telemetry snapshot): power reach not judged" in r.summary


def test_sdc_and_xid_during_the_load():
    d = loads(g0=series(), g1=series())
    d[0].update(sdc_events=1, sdc_detail="bf16 set 3: 1 element(s) off the float64 reference")
    d[1]["xid"] = [79]
    res = by_gpu(judge_power(d, P))
    assert res[0].status == Status.FAIL and res[0].action == Action.DRAIN
    assert res[0].summary.startswith("silent data corruption during the power load: bf16 set 3")
    assert res[1].status == Status.WARN and "Xid 79 during the load" in res[1].summary


def test_thresholds_are_data():
    p = dict(P, power_fail_fraction=0.5, temp_peer_warn_c=20.0)
    res = by_gpu(judge_power(loads(g0=series(power=380.0, reasons=()), g1=series(temp=80), g2=series()), p))
    assert res[0].status == Status.PASS  # 0.54 >= 0.5
    assert res[1].status == Status.PASS  # 14 C <= 20 C


# -- injections on telemetry (pure) ------------------------------------------------------------------
def test_injection_specs_and_application():
    ctx = Context(level=Level.EXTENDED, injections=[parse_injection("throttle:gpu=1,reason=hw_thermal_slowdown"),
                                                    parse_injection("hot:gpu=2,delta=20"),
                                                    parse_injection("lowpower:gpu=2,factor=0.5")])
    assert power_mod.injection_specs(ctx, 0) == ({}, [], None)
    spec, texts, problem = power_mod.injection_specs(ctx, 1)
    assert spec == {"throttle": ("hw_thermal_slowdown", 0.5)} and problem is None
    s = power_mod.apply_injections(series(n=2), spec)
    assert s[0]["throttle_reason_names"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert s[0]["throttle_reasons"] & 0x40 and s[0]["sm_clock_mhz"] == 878
    spec2, texts2, _ = power_mod.injection_specs(ctx, 2)
    s2 = power_mod.apply_injections(series(n=1), spec2)
    assert s2[0]["temperature_c"] == 86.0 and s2[0]["power_w"] == 345.0
    assert texts2 == ["hot:gpu=2,delta=20", "lowpower:gpu=2,factor=0.5"]
    for bad in ("throttle:gpu=0,reason=sw_power_cap", "throttle:gpu=0,factor=2", "hot:gpu=0,delta=-1",
                "lowpower:gpu=0,factor=0"):
        _, _, problem = power_mod.injection_specs(Context(injections=[parse_injection(bad)]), 0)
        assert problem and problem.startswith(f"--inject {bad}:")


def test_defaults_level_durations_and_spec():
    assert power_mod.power_duration(Context(level=Level.EXTENDED)) == 120.0
    assert power_mod.power_duration(Context(level=Level.BURN_IN)) == 900.0
    assert power_mod.power_duration(Context(level=Level.EXTENDED,
                                            check_options=[power_mod.PowerOptions(duration_s=7)])) == 7.0
    over = Context(level=Level.EXTENDED, config=Config(checks={"eud.power": {"duration_s_level3": 30.0}}))
    assert power_mod.power_duration(over) == 30.0
    spec = power_mod.power_check.spec
    assert spec.id == "eud.power" and spec.level == Level.EXTENDED
    assert spec.injects == ("throttle", "hot", "lowpower")
    assert spec.budget(Context(level=Level.EXTENDED)) == 120.0 + 10.0 + 120.0 + 30.0
