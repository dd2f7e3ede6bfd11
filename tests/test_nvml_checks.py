"""The level-1 NVML checks, judged through the real runner from synthetic snapshot fixtures
(tests/fixtures/snapshots: hand-made, each modelled on real nvidia-smi output of its node type).

Every test asserts the exact set of results that are not `pass` (check, subject, status, action),
so a rule that fires too much is caught as surely as one that does not fire."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpucheck.core.check import Context, Need
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.tests_suite.registry import all_checks
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import Outcome, run_checks
from gpucheck.core.state import State
from gpucheck.platform.telemetry.snapshot import load_snapshot

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"
LEVEL1_IDS = {"inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink", "recovery-action"}
P, W, F, S, E = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR


def snap(name: str) -> dict[str, Any]:
    return load_snapshot(FIXTURES / name)


def run(snapshot: dict[str, Any], *, config: Config | None = None, state: State | None = None,
        gpus: list[int] | None = None, only: set[str] | None = None) -> Outcome:
    checks = [c for c in all_checks() if c.id in (only or LEVEL1_IDS)]
    ctx = Context(level=Level.QUICK, snapshot=snapshot, config=config, state=state, gpus=gpus)
    return run_checks(checks, ctx, install_signal_handlers=False)


def not_pass(out: Outcome) -> set[tuple[str, str, Status, Action]]:
    return {(r.check, r.subject, r.status, r.action) for r in out.results if r.status != Status.PASS}


def by_subject(out: Outcome, check: str) -> dict[str, Any]:
    return {r.subject: r for r in out.results if r.check == check}


EIGHT = Config(node={"expected_gpus": 8, "expected_model": "NVIDIA H100 80GB HBM3"})


def append_verdict(state: State, out: Outcome, time: str) -> None:
    state.append_history({"schema": "gpucheck.verdict", "time": time, "results": [r.to_dict() for r in out.results]})


# -- the registry contract --------------------------------------------------------------------------
def test_level1_checks_are_registered_with_their_contract():
    checks = {c.id: c for c in all_checks()}
    assert LEVEL1_IDS <= set(checks)
    for cid in LEVEL1_IDS:
        spec = checks[cid].spec
        assert spec.level == Level.QUICK and spec.needs == (Need.NVML,)
        assert spec.title and spec.detects


# -- healthy --------------------------------------------------------------------------------------
def test_healthy_h100_node_passes_everything():
    out = run(snap("h100-healthy.json"), config=EIGHT)
    assert not_pass(out) == set()
    counts = {cid: sum(1 for r in out.results if r.check == cid) for cid in LEVEL1_IDS}
    assert counts == {"inventory": 9, "ecc": 8, "memory-remap": 8, "clocks": 8, "pcie": 8, "nvlink": 8,
                      "recovery-action": 8}
    for r in out.results:
        json.dumps(r.to_dict())
        if r.gpu is not None:
            assert r.metrics["uuid"].startswith("GPU-"), (r.check, r.subject)
        if r.check != "recovery-action" or r.gpu is not None:
            assert r.thresholds, (r.check, r.subject)
    node = by_subject(out, "inventory")["node"]
    assert node.metrics["gpu_count"] == 8 and node.metrics["driver_version"] == "550.90.07"
    pcie0 = by_subject(out, "pcie")["gpu0"]
    assert "no delta available" in pcie0.summary and pcie0.metrics["replay_rate_per_min"] is None


# -- one fixture per failure class ----------------------------------------------------------------
@pytest.mark.parametrize(
    "fixture, expected",
    [
        ("h100-ecc-dbe.json", {("ecc", "gpu3", F, Action.RESET_GPU)}),
        ("h100-ecc-sram.json", {("ecc", "gpu5", F, Action.RESET_GPU)}),
        ("h100-remap-pending.json", {("memory-remap", "gpu2", F, Action.RESET_GPU)}),
        ("h100-remap-failure.json", {("memory-remap", "gpu6", F, Action.RMA)}),
        ("h100-hw-slowdown.json", {("clocks", "gpu7", F, Action.INVESTIGATE)}),
        ("h100-thermal-margin.json", {("clocks", "gpu0", W, Action.INVESTIGATE)}),
        ("h100-pcie-width-down.json", {("pcie", "gpu4", F, Action.INVESTIGATE)}),
        ("h100-nvlink-down.json", {("nvlink", "gpu1", F, Action.REBOOT)}),
        ("h100-recovery-reboot.json", {("recovery-action", "gpu3", F, Action.REBOOT)}),
        # without history the replay errors since driver load only warn
        ("h100-nvlink-replay-growth.json", {("nvlink", "gpu2", W, Action.INVESTIGATE)}),
        ("h100-gpu-lost.json", {(c, "gpu5", F, Action.REBOOT) for c in LEVEL1_IDS}),
    ],
)
def test_failure_fixture(fixture, expected):
    assert not_pass(run(snap(fixture), config=EIGHT)) == expected


def test_ecc_dbe_result_carries_metrics_and_thresholds():
    r = by_subject(run(snap("h100-ecc-dbe.json"), only={"ecc"}), "ecc")["gpu3"]
    assert r.gpu == 3 and r.metrics["volatile_uncorrected"] == 2
    assert r.metrics["uuid"] == "GPU-5e1f0c3a-77d2-4b1e-9a3c-000000000003"
    assert ("volatile_uncorrected", ">", 0, F) in {(t.metric, t.op, t.limit, t.status) for t in r.thresholds}
    assert "uncorrectable (double-bit)" in r.summary


def test_sram_threshold_exceeded_is_rma():
    s = snap("h100-ecc-sram.json")
    s["gpus"][5]["ecc_errors"]["sram_threshold_exceeded"] = True
    assert not_pass(run(s, only={"ecc"})) == {("ecc", "gpu5", F, Action.RMA)}


def test_lost_gpu_inventory_names_it_and_keeps_the_node_result_clean():
    out = run(snap("h100-gpu-lost.json"), config=EIGHT, only={"inventory"})
    inv = by_subject(out, "inventory")
    assert inv["node"].status == P and inv["node"].metrics["pci_gpus_not_in_nvml"] == 0
    assert any("0000:ab:00.0" in e for e in inv["node"].evidence)
    assert "lost" in inv["gpu5"].summary and inv["gpu5"].metrics["state"] == "lost"


def test_reset_required_gpu_fails_every_check_with_reset():
    s = snap("h100-gpu-lost.json")
    s["gpus"][5].update(state="reset_required", error={"kind": "reset_required", "message": "GPU requires restart"})
    assert not_pass(run(s)) == {(c, "gpu5", F, Action.RESET_GPU) for c in LEVEL1_IDS}


def test_retired_pages_before_ampere():
    out = run(snap("v100-retired-pages.json"))
    assert not_pass(out) == {
        ("memory-remap", "gpu1", F, Action.RESET_GPU),
        ("memory-remap", "gpu4", F, Action.RMA),
    }
    rec = by_subject(out, "recovery-action")["gpu0"]
    assert rec.status == P and "not supported by this driver" in rec.summary
    assert rec.metrics["recovery_action"] is None


def test_retired_pages_soft_limit_warns_and_ampere_ignores_retired_pages():
    s = snap("v100-retired-pages.json")
    s["gpus"][4]["retired_pages"].update(single_bit=15, double_bit=0)
    got = not_pass(run(s, only={"memory-remap"}))
    assert ("memory-remap", "gpu4", W, Action.INVESTIGATE) in got
    h = snap("h100-healthy.json")
    h["gpus"][0]["retired_pages"] = {"single_bit": 70, "double_bit": 0, "pending": True}
    assert not_pass(run(h, only={"memory-remap"})) == set()


def test_ampere_is_judged_by_row_remapping():
    s = snap("h100-healthy.json")
    s["gpus"][0].update(architecture="ampere", architecture_id=7, name="NVIDIA A100-SXM4-80GB")
    s["gpus"][0]["retired_pages"] = {"single_bit": 70, "double_bit": 3, "pending": True}
    s["gpus"][0]["remapped_rows"]["pending"] = True
    assert not_pass(run(s, only={"memory-remap"})) == {("memory-remap", "gpu0", F, Action.RESET_GPU)}
    assert "row remap pending" in by_subject(run(s, only={"memory-remap"}), "memory-remap")["gpu0"].summary


def test_uncorrectable_remaps_at_the_spare_row_limit_warn():
    s = snap("h100-healthy.json")
    s["gpus"][1]["remapped_rows"]["uncorrectable"] = 512
    assert not_pass(run(s, only={"memory-remap"})) == {("memory-remap", "gpu1", W, Action.INVESTIGATE)}


# -- NVML not usable --------------------------------------------------------------------------------
def test_driver_not_loaded_with_gpus_on_the_pci_bus():
    out = run(snap("driver-not-loaded.json"))
    assert not_pass(out) == {("inventory", "node", F, Action.REBOOT)} | {
        (c, "node", S, Action.NONE) for c in LEVEL1_IDS - {"inventory"}}
    inv = by_subject(out, "inventory")["node"]
    assert "driver not loaded or GPU lost" in inv.summary
    assert sum("0000:" in e for e in inv.evidence) == 8
    skip = by_subject(out, "ecc")["node"]
    assert skip.summary.startswith("NVML unavailable: driver_not_loaded")


def test_no_nvidia_device_skips_and_an_expected_count_fails():
    out = run(snap("no-nvidia-devices.json"))
    assert {(r.check, r.status) for r in out.results} == {(c, S) for c in LEVEL1_IDS}
    assert "no NVIDIA GPU on this machine" in by_subject(out, "inventory")["node"].summary
    out = run(snap("no-nvidia-devices.json"), config=Config(node={"expected_gpus": 4}))
    assert ("inventory", "node", F, Action.REBOOT) in not_pass(out)


def test_nvml_no_permission_is_an_error_not_a_verdict():
    s = snap("driver-not-loaded.json")
    s["nvml"]["error"] = {"kind": "no_permission", "message": "Insufficient Permissions"}
    assert ("inventory", "node", E, Action.NONE) in not_pass(run(s))


# -- inventory --------------------------------------------------------------------------------------
def test_missing_gpu_vs_expected_and_vs_the_pci_bus():
    s = snap("h100-healthy.json")
    del s["gpus"][7]
    out = run(s, config=EIGHT, only={"inventory"})
    assert not_pass(out) == {("inventory", "node", F, Action.REBOOT)}
    node = by_subject(out, "inventory")["node"]
    assert node.metrics["missing_gpus"] == 1 and node.metrics["pci_gpus_not_in_nvml"] == 1
    assert any("0000:db:00.0" in e for e in node.evidence)
    s["pci_nvidia_devices"].pop()  # gone from the bus too: only the expected count catches it
    out = run(s, config=EIGHT, only={"inventory"})
    assert not_pass(out) == {("inventory", "node", F, Action.REBOOT)}
    assert "GPU(s) missing" in by_subject(out, "inventory")["node"].summary


def test_more_gpus_than_expected_warns_and_model_mismatch_fails():
    s = snap("h100-healthy.json")
    assert not_pass(run(s, config=Config(node={"expected_gpus": 4}), only={"inventory"})) == {
        ("inventory", "node", W, Action.INVESTIGATE)}
    assert not_pass(run(s, config=Config(node={"expected_model": "NVIDIA H200"}), only={"inventory"})) == {
        ("inventory", "node", F, Action.INVESTIGATE)}
    s["gpus"][2]["name"] = "NVIDIA H100 PCIe"
    assert not_pass(run(s, only={"inventory"})) == {("inventory", "node", F, Action.INVESTIGATE)}


def test_ecc_and_mig_modes():
    s = snap("h100-healthy.json")
    s["gpus"][0]["ecc_mode"] = {"current": True, "pending": False}
    s["gpus"][1]["ecc_mode"] = {"current": False, "pending": False}
    s["gpus"][1]["ecc_errors"] = {k: None for k in s["gpus"][1]["ecc_errors"]}
    s["gpus"][2]["mig_mode"] = {"current": False, "pending": True}
    s["gpus"][3]["persistence_mode"] = False
    out = run(s, only={"inventory", "ecc"})
    assert not_pass(out) == {
        ("inventory", "gpu0", W, Action.RESET_GPU),
        ("inventory", "gpu1", F, Action.INVESTIGATE),
        ("inventory", "gpu2", W, Action.RESET_GPU),
        ("inventory", "gpu3", W, Action.INVESTIGATE),
        ("ecc", "gpu1", S, Action.NONE),
    }
    assert "reboot/reset pending" in by_subject(out, "inventory")["gpu0"].summary
    cfg = Config(checks={"inventory": {"require_persistence_mode": False}})
    assert ("inventory", "gpu3", W, Action.INVESTIGATE) not in not_pass(run(s, config=cfg, only={"inventory"}))


# -- clocks ---------------------------------------------------------------------------------------
def test_clock_event_reasons():
    s = snap("h100-healthy.json")
    s["gpus"][0]["clocks"]["throttle_reasons"] = 0x20  # SW thermal
    s["gpus"][1]["clocks"]["throttle_reasons"] = 0x80  # HW power brake
    s["gpus"][2]["clocks"]["throttle_reasons"] = 0x1 | 0x4  # idle + SW power cap: fine
    assert not_pass(run(s, only={"clocks"})) == {
        ("clocks", "gpu0", W, Action.INVESTIGATE),
        ("clocks", "gpu1", F, Action.INVESTIGATE),
    }


def test_thermal_margin_is_configurable():
    s = snap("h100-thermal-margin.json")
    assert not_pass(run(s, config=Config(checks={"clocks": {"thermal_margin_c": 5}}), only={"clocks"})) == set()
    r = by_subject(run(s, only={"clocks"}), "clocks")["gpu0"]
    assert r.metrics["thermal_headroom_c"] == 6
    assert ("thermal_headroom_c", "<", 10, W) in {(t.metric, t.op, t.limit, t.status) for t in r.thresholds}


# -- pcie -----------------------------------------------------------------------------------------
def test_pcie_generation_below_max_warns_and_says_why():
    s = snap("h100-healthy.json")
    s["gpus"][6]["pcie"]["link_gen"] = 1
    out = run(s, only={"pcie"})
    assert not_pass(out) == {("pcie", "gpu6", W, Action.NONE)}
    assert "when idle" in by_subject(out, "pcie")["gpu6"].summary
    cfg = Config(checks={"pcie": {"warn_gen_below_max": False}})
    assert not_pass(run(s, config=cfg, only={"pcie"})) == set()


def test_pcie_replay_growth_uses_history_keyed_by_uuid(tmp_path):
    state = State(tmp_path / "state")
    first = snap("h100-healthy.json")
    first["gpus"][0]["pcie"]["replay_counter"] = 10
    first["gpus"][1]["pcie"]["replay_counter"] = 500
    append_verdict(state, run(first, state=state, only={"pcie"}), first["captured_at"])
    later = copy.deepcopy(first)
    later["captured_at"] = "2025-06-02T10:25:00Z"  # ten minutes on
    later["gpus"][0]["pcie"]["replay_counter"] = 200  # 190 in 10 min: 19/min > 8/min
    later["gpus"][1]["pcie"]["replay_counter"] = 520  # 2/min: fine
    later["gpus"][2]["pcie"]["replay_counter"] = 0
    out = run(later, state=state, only={"pcie"})
    assert not_pass(out) == {("pcie", "gpu0", W, Action.INVESTIGATE)}
    r0, r1 = by_subject(out, "pcie")["gpu0"], by_subject(out, "pcie")["gpu1"]
    assert r0.metrics["replay_growth"] == 190 and r0.metrics["replay_interval_s"] == 600.0
    assert r0.metrics["replay_rate_per_min"] == 19.0
    assert r1.metrics["replay_rate_per_min"] == 2.0 and "20 replays in 600 s" in r1.summary
    # growth over less than a minute is judged over a minute (DCGM's rule is per minute)
    soon = copy.deepcopy(first)
    soon["captured_at"] = "2025-06-02T10:15:10Z"
    soon["gpus"][2]["pcie"]["replay_counter"] = 5  # 5 in 10 s: 5/min, not 30/min
    r2 = by_subject(run(soon, state=state, only={"pcie"}), "pcie")["gpu2"]
    assert r2.status == P and r2.metrics["replay_rate_per_min"] == 5.0
    # a counter that went back (driver reloaded) gives no delta and says so
    later["gpus"][1]["pcie"]["replay_counter"] = 3
    later["captured_at"] = "2025-06-02T10:30:00Z"
    append_verdict(state, out, "2025-06-02T10:25:01Z")
    r1 = by_subject(run(later, state=state, only={"pcie"}), "pcie")["gpu1"]
    assert r1.status == P and "went back" in r1.summary


# -- nvlink ---------------------------------------------------------------------------------------
NVLINK_THRESHOLDS_NO_HISTORY = {
    ("links_down", ">", 0, F), ("replay_errors_max_link", ">", 0, W),
    ("recovery_errors_max_link", ">", 0, W), ("crc_errors_max_link", ">", 1000, W),
}
NVLINK_THRESHOLDS_HISTORY = {
    ("links_down", ">", 0, F), ("replay_growth_max_link", ">", 0, F), ("recovery_growth_max_link", ">", 0, F),
    ("crc_rate_per_s_max_link", ">", 100.0, F), ("crc_rate_per_s_max_link", ">", 1.0, W),
}


def thresholds(r) -> set[tuple[str, str, Any, Status]]:
    return {(t.metric, t.op, t.limit, t.status) for t in r.thresholds}


def nvlink_after(tmp_path, change, *, seconds: int = 100, config: Config | None = None, before=None):
    """Run nvlink on the healthy node, record it in a history, then again `seconds` later after
    `change(snapshot)`; the second run's nvlink results by subject."""
    state = State(tmp_path / "state")
    first = snap("h100-healthy.json")
    if before:
        before(first)
    append_verdict(state, run(first, config=config, state=state, only={"nvlink"}), first["captured_at"])
    later = copy.deepcopy(first)
    later["captured_at"] = f"2025-06-02T10:{15 + seconds // 60:02d}:{seconds % 60:02d}Z"
    change(later)
    return by_subject(run(later, config=config, state=state, only={"nvlink"}), "nvlink")


def set_link(s: dict[str, Any], gpu: int, link: int, **fields: Any) -> None:
    lk = next(lk for lk in s["gpus"][gpu]["nvlink"]["links"] if lk["link"] == link)
    lk.update(fields)


def test_nvlink_is_one_result_per_gpu_with_per_link_counters():
    out = run(snap("h100-healthy.json"), only={"nvlink"})
    res = by_subject(out, "nvlink")
    assert sorted(res) == [f"gpu{i}" for i in range(8)] and len(out.results) == 8
    for i in range(8):
        r = res[f"gpu{i}"]
        assert (r.status, r.action, r.gpu) == (P, Action.NONE, i)
        assert r.summary == (f"GPU {i}: 18/18 NvLinks active; counters since driver load, no previous reading: "
                             "replay 0, recovery 0, CRC 0")
        m = r.metrics
        assert (m["links_total"], m["links_active"], m["links_down"], m["links_unknown"]) == (18, 18, 0, 0)
        assert (m["replay_errors"], m["recovery_errors"], m["crc_errors"]) == (0, 0, 0)
        assert m["replay_growth"] is None and m["window_s"] is None and m["crc_rate_per_s_max_link"] is None
        assert m["links"] == {str(n): {"state": "active", "replay": 0, "recovery": 0, "crc": 0} for n in range(18)}
        assert thresholds(r) == NVLINK_THRESHOLDS_NO_HISTORY
        assert r.evidence == ["counters since driver load, no delta available (no previous reading in the history)"]
        assert len(json.dumps(r.to_dict())) < 4000  # was 18 results of ~1.5 KB each


def test_nvlink_down_links_fail_the_gpu_and_are_named():
    out = run(snap("h100-nvlink-down.json"), only={"nvlink"})
    assert not_pass(out) == {("nvlink", "gpu1", F, Action.REBOOT)}
    r = by_subject(out, "nvlink")["gpu1"]
    assert r.gpu == 1 and r.summary == "GPU 1: NvLink 7 down (inactive)"
    assert (r.metrics["links_total"], r.metrics["links_active"], r.metrics["links_down"]) == (18, 17, 1)
    assert r.metrics["links"]["7"] == {"state": "inactive", "replay": 0, "recovery": 0, "crc": 0}
    assert r.evidence[0] == "NvLink 7: inactive, replay 0, recovery 0, CRC 0 since driver load"
    # two links down, and replay errors on a third (no history: a warn, reported after the fail)
    s = snap("h100-nvlink-down.json")
    set_link(s, 1, 3, state="active_traffic_disabled")
    set_link(s, 1, 5, replay_errors=4)
    r = by_subject(run(s, only={"nvlink"}), "nvlink")["gpu1"]
    assert (r.status, r.action) == (F, Action.REBOOT)
    assert r.summary == ("GPU 1: NvLink 3, 7 down (active_traffic_disabled, inactive); "
                         "NvLink 5 replay errors 4 since driver load (no previous reading)")
    assert r.metrics["links_down"] == 2 and r.metrics["replay_errors_max_link"] == 4
    assert [e.split(":")[0] for e in r.evidence[:3]] == ["NvLink 3", "NvLink 5", "NvLink 7"]


def test_nvlink_replay_growth_with_a_history_file(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    shutil.copy(FIXTURES / "h100-nvlink-replay-growth.history.jsonl", state_dir / "history.jsonl")
    out = run(snap("h100-nvlink-replay-growth.json"), config=EIGHT, state=State(state_dir))
    assert not_pass(out) == {("nvlink", "gpu2", F, Action.INVESTIGATE)}
    res = by_subject(out, "nvlink")
    r = res["gpu2"]
    assert r.gpu == 2 and r.summary == "GPU 2: NvLink 11 replay errors +44 since 2025-06-02T09:15:00Z (3600 s)"
    m = r.metrics
    assert m["uuid"] == "GPU-5e1f0c3a-77d2-4b1e-9a3c-000000000002"
    assert (m["replay_errors"], m["replay_growth"], m["replay_growth_max_link"]) == (47, 44, 44)
    assert (m["recovery_growth"], m["crc_growth"], m["window_s"]) == (0, 12, 3600.0)
    assert m["crc_rate_per_s_max_link"] == round(12 / 3600, 3)
    assert m["links"]["11"] == {"state": "active", "replay": 47, "recovery": 0, "crc": 12}
    assert thresholds(r) == NVLINK_THRESHOLDS_HISTORY
    assert r.evidence == ["NvLink 11: active, replay 47 (+44), recovery 0 (+0), CRC 12 (+12, 0.003/s) "
                          "since 2025-06-02T09:15:00Z (3600 s)"]
    # no history for GPU 3: judged on its counts since driver load
    assert res["gpu3"].status == P and "no previous reading" in res["gpu3"].summary
    assert res["gpu3"].metrics["window_s"] is None


@pytest.mark.parametrize(
    "config, grow, expected",
    [
        (None, {}, P),
        (None, {0: 1}, F),  # DCGM: a replay error is one too many
        ({"replay_growth_fail": 5}, {4: 5}, P),  # at the limit
        ({"replay_growth_fail": 5}, {4: 6}, F),  # above it
        ({"replay_growth_fail": 5}, {4: 3, 9: 3}, P),  # the limit applies per link, not to the GPU's sum
        ({"replay_growth_fail": 5}, {4: 3, 9: 6}, F),
    ],
)
def test_nvlink_replay_growth_limit_is_per_link(tmp_path, config, grow, expected):
    cfg = Config(checks={"nvlink": config}) if config else None

    def before(s):
        for n in range(18):
            set_link(s, 3, n, replay_errors=7)  # the same errors before: no growth, no warn either

    def change(s):
        for n, g in grow.items():
            set_link(s, 3, n, replay_errors=7 + g)

    res = nvlink_after(tmp_path, change, config=cfg, before=before)
    assert {k: r.status for k, r in res.items() if r.status != P} == ({} if expected == P else {"gpu3": expected})
    r = res["gpu3"]
    assert r.metrics["replay_growth"] == sum(grow.values())
    assert r.metrics["replay_growth_max_link"] == max(grow.values(), default=0)
    assert r.metrics["replay_errors"] == 18 * 7 + sum(grow.values())
    if expected == F:
        assert r.action == Action.INVESTIGATE
        bad = [n for n, g in grow.items() if g > (config or {}).get("replay_growth_fail", 0)]
        assert r.summary.startswith(f"GPU 3: NvLink {', '.join(map(str, bad))} replay errors +")
    elif grow:
        assert r.summary == (f"GPU 3: 18/18 NvLinks active; replay errors +{sum(grow.values())} "
                             f"(at most +{max(grow.values())} on a link) since 2025-06-02T10:15:00Z (100 s), "
                             "within the limits")
    else:
        assert r.summary == "GPU 3: 18/18 NvLinks active; no replay/recovery errors since 2025-06-02T10:15:00Z (100 s)"


def test_nvlink_crc_rates_and_recovery_growth(tmp_path):
    def change(s):
        set_link(s, 0, 0, crc_flit_errors=100)  # 1.00/s: at the warn limit, passes
        set_link(s, 1, 0, crc_flit_errors=101)  # 1.01/s: warn
        set_link(s, 2, 1, crc_data_errors=10000)  # 100/s: at the fail limit, warns
        set_link(s, 3, 1, crc_data_errors=10001)  # 100.01/s: fail
        set_link(s, 4, 0, crc_flit_errors=500)  # 5/s: warn ...
        set_link(s, 4, 1, crc_data_errors=20000)  # ... and 200/s: fail, on the same GPU
        for n in range(18):  # 90/s on every link: 1620/s for the GPU, but no link reaches 100/s
            set_link(s, 5, n, crc_flit_errors=9000)
        set_link(s, 6, 2, recovery_errors=1)

    res = nvlink_after(tmp_path, change)
    assert {(k, r.status, r.action) for k, r in res.items() if r.status != P} == {
        ("gpu1", W, Action.INVESTIGATE), ("gpu2", W, Action.INVESTIGATE), ("gpu3", F, Action.INVESTIGATE),
        ("gpu4", F, Action.INVESTIGATE), ("gpu5", W, Action.INVESTIGATE), ("gpu6", F, Action.INVESTIGATE),
    }
    since = "since 2025-06-02T10:15:00Z (100 s)"
    assert res["gpu0"].metrics["crc_rate_per_s_max_link"] == 1.0
    assert res["gpu0"].summary == f"GPU 0: 18/18 NvLinks active; no replay/recovery errors {since}; " \
                                  "CRC errors +100 (at most 1/s on a link)"
    assert res["gpu1"].metrics["crc_rate_per_s_max_link"] == 1.01
    assert res["gpu1"].summary == f"GPU 1: NvLink 0 CRC errors 1.01/s {since} (> 1/s)"
    assert res["gpu3"].summary == f"GPU 3: NvLink 1 CRC errors 100.01/s {since} (> 100/s)"
    r4 = res["gpu4"]
    assert r4.summary == f"GPU 4: NvLink 1 CRC errors 200/s {since} (> 100/s); NvLink 0 CRC errors 5/s {since} (> 1/s)"
    assert (r4.metrics["crc_growth"], r4.metrics["crc_rate_per_s_max_link"], r4.metrics["window_s"]) == (20500, 200.0, 100.0)
    assert r4.evidence == [f"NvLink 0: active, replay 0 (+0), recovery 0 (+0), CRC 500 (+500, 5/s) {since}",
                           f"NvLink 1: active, replay 0 (+0), recovery 0 (+0), CRC 20000 (+20000, 200/s) {since}"]
    r5 = res["gpu5"]
    assert r5.summary == f"GPU 5: NvLink {', '.join(map(str, range(18)))} CRC errors {', '.join(['90/s'] * 18)} {since} (> 1/s)"
    assert r5.metrics["crc_rate_per_s_max_link"] == 90.0 and len(r5.evidence) == 18
    r6 = res["gpu6"]
    assert r6.summary == f"GPU 6: NvLink 2 recovery errors +1 {since}"
    assert (r6.metrics["recovery_growth"], r6.metrics["recovery_growth_max_link"]) == (1, 1)


def test_nvlink_down_and_growth_on_one_gpu_and_the_next_run_uses_this_one(tmp_path):
    def change(s):
        set_link(s, 0, 3, state="inactive")
        set_link(s, 0, 5, replay_errors=12)

    res = nvlink_after(tmp_path, change)
    r = res["gpu0"]
    assert (r.status, r.action, r.gpu) == (F, Action.REBOOT, 0)
    assert r.summary == "GPU 0: NvLink 3 down (inactive); NvLink 5 replay errors +12 since 2025-06-02T10:15:00Z (100 s)"
    assert len(r.evidence) == 2
    # a third run compares with the second one (its `links` metric), not with the first
    state = State(tmp_path / "state")
    second = snap("h100-healthy.json")
    second["captured_at"] = "2025-06-02T10:16:40Z"
    change(second)
    append_verdict(state, run(second, state=state, only={"nvlink"}), second["captured_at"])
    third = copy.deepcopy(second)
    third["captured_at"] = "2025-06-02T10:18:20Z"
    set_link(third, 0, 5, replay_errors=13)
    r = by_subject(run(third, state=state, only={"nvlink"}), "nvlink")["gpu0"]
    assert r.summary == "GPU 0: NvLink 3 down (inactive); NvLink 5 replay errors +1 since 2025-06-02T10:16:40Z (100 s)"
    assert (r.metrics["replay_growth"], r.metrics["replay_errors"]) == (1, 13)


def test_nvlink_history_is_read_once_per_run(tmp_path, monkeypatch):
    state = State(tmp_path / "state")
    s = snap("h100-healthy.json")
    append_verdict(state, run(s, state=state, only={"nvlink"}), s["captured_at"])
    calls = []
    real = State.iter_history
    monkeypatch.setattr(State, "iter_history", lambda self: (calls.append(1), real(self))[1])
    run(s, state=state, only={"nvlink"})
    assert len(calls) == 1


def test_nvlink_counter_that_went_back_and_a_link_new_since_the_previous_reading(tmp_path):
    def before(s):
        set_link(s, 0, 0, replay_errors=5)
        s["gpus"][1]["nvlink"]["links"].pop()  # link 17 of GPU 1 was not listed

    def change(s):
        set_link(s, 0, 0, replay_errors=2)  # driver reloaded since: no delta, no judgement
        s["gpus"][1]["nvlink"]["links"].append({"link": 17, "state": "active", "replay_errors": 2,
                                                "recovery_errors": 0, "crc_flit_errors": 0, "crc_data_errors": 0})

    res = nvlink_after(tmp_path, change, before=before)
    r0, r1 = res["gpu0"], res["gpu1"]
    assert r0.status == P and r0.summary.endswith("; no delta for NvLink 0 (see evidence)")
    assert r0.metrics["replay_growth"] == 0  # the other 17 links
    assert any("went back from 5 to 2" in e for e in r0.evidence)
    assert (r1.status, r1.action) == (W, Action.INVESTIGATE)
    assert r1.summary == "GPU 1: NvLink 17 replay errors 2 since driver load (no previous reading)"
    assert thresholds(r1) == NVLINK_THRESHOLDS_HISTORY | NVLINK_THRESHOLDS_NO_HISTORY


def test_nvlink_reads_a_history_of_one_result_per_link(tmp_path):
    """Results written before one result per GPU (subject gpu<i>/nvlink<n>, metric link_key)."""
    uuid = "GPU-5e1f0c3a-77d2-4b1e-9a3c-000000000002"
    results = [{"check": "nvlink", "subject": f"gpu2/nvlink{n}", "status": "pass", "metrics": {
        k: {"value": v, "unit": ""} for k, v in {
            "uuid": uuid, "link_key": f"{uuid}/nvlink{n}", "link": n, "state": "active", "snapshot_time": 1748855700.0,
            "replay_errors": 3 if n == 11 else 0, "recovery_errors": 0, "crc_errors": 0}.items()}} for n in range(18)]
    state = State(tmp_path / "state")
    state.append_history({"schema": "gpucheck.verdict", "time": "2025-06-02T09:15:03Z", "results": results})
    r = by_subject(run(snap("h100-nvlink-replay-growth.json"), state=state, only={"nvlink"}), "nvlink")["gpu2"]
    assert (r.status, r.metrics["replay_growth"], r.metrics["window_s"]) == (F, 44, 3600.0)


def test_nvlink_link_read_failures():
    s = snap("h100-healthy.json")
    set_link(s, 0, 4, state=None)
    s["gpus"][0]["errors"] = {"nvlink.links[4].state": "other"}
    set_link(s, 1, 4, state=None)
    set_link(s, 1, 7, state="inactive")
    s["gpus"][1]["errors"] = {"nvlink.links[4].state": "other"}
    set_link(s, 2, 3, replay_errors=None)
    s["gpus"][2]["errors"] = {"nvlink.links[3].replay_errors": "no_permission"}  # the growth rule needs it
    for lk in s["gpus"][3]["nvlink"]["links"]:
        lk["state"] = None  # not supported, not a failure
    out = run(s, only={"nvlink"})
    assert not_pass(out) == {("nvlink", "gpu0", E, Action.NONE), ("nvlink", "gpu1", F, Action.REBOOT),
                             ("nvlink", "gpu2", E, Action.NONE), ("nvlink", "gpu3", S, Action.NONE)}
    res = by_subject(out, "nvlink")
    assert res["gpu0"].summary == "could not read nvlink.links[4].state (other)"
    assert res["gpu1"].summary == "GPU 1: NvLink 7 down (inactive)"
    assert "could not read nvlink.links[4].state (other)" in res["gpu1"].evidence
    assert res["gpu2"].summary == "could not read nvlink.links[3].replay_errors (no_permission)"
    assert res["gpu3"].summary == "GPU 3: the state of its 18 NvLinks is not supported"


def test_nvlink_absolute_limit_is_configurable_and_sleeping_links_are_up():
    s = snap("h100-nvlink-replay-growth.json")
    s["gpus"][4]["nvlink"]["links"][0]["state"] = "sleep"
    out = run(s, config=Config(checks={"nvlink": {"replay_abs_warn": 100}}), only={"nvlink"})
    assert not_pass(out) == set()
    res = by_subject(out, "nvlink")
    assert res["gpu4"].summary.startswith("GPU 4: 18/18 NvLinks up (17 active, 1 in sleep); ")
    assert res["gpu4"].metrics["links_active"] == 18
    assert res["gpu2"].summary.endswith("no previous reading: replay 47, recovery 0, CRC 12")
    assert ("replay_errors_max_link", ">", 100, W) in thresholds(res["gpu2"])


def test_gpu_without_nvlink_is_a_skip_not_a_fail():
    s = snap("h100-healthy.json")
    s["gpus"][0]["nvlink"] = {"supported": False, "links": []}
    out = run(s, only={"nvlink"})
    assert not_pass(out) == {("nvlink", "gpu0", S, Action.NONE)}
    assert len(out.results) == 8
    assert by_subject(out, "nvlink")["gpu0"].summary == "GPU 0: no NvLink on this GPU (not supported)"


# -- recovery action ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, action, words",
    [
        (1, Action.RESET_GPU, "GPU reset"),
        (2, Action.REBOOT, "node reboot"),
        (3, Action.DRAIN, "drain peer-to-peer"),
        (4, Action.DRAIN, "then reset the GPU"),
        (6, Action.RESET_GPU, "bus reset"),
        (7, Action.REBOOT, "system reboot"),
        (42, Action.INVESTIGATE, "unknown to gpucheck"),
    ],
)
def test_recovery_action_values(value, action, words):
    s = snap("h100-healthy.json")
    s["gpus"][4]["recovery_action"] = value
    out = run(s, only={"recovery-action"})
    assert not_pass(out) == {("recovery-action", "gpu4", F, action)}
    assert words in by_subject(out, "recovery-action")["gpu4"].summary


# -- selection, read failures, config -------------------------------------------------------------
def test_gpu_selection_is_honoured():
    out = run(snap("h100-ecc-dbe.json"), gpus=[3], only={"ecc", "nvlink"})
    assert {r.subject for r in out.results if r.check == "ecc"} == {"gpu3"}
    assert {r.gpu for r in out.results if r.check == "nvlink"} == {3}
    assert not_pass(out) == {("ecc", "gpu3", F, Action.RESET_GPU)}
    assert not_pass(run(snap("h100-ecc-dbe.json"), gpus=[0, 1], only={"ecc"})) == set()


def test_a_failed_read_is_an_error_unless_something_else_fails():
    s = snap("h100-healthy.json")
    s["gpus"][0]["ecc_errors"]["volatile_uncorrected"] = None
    s["gpus"][0]["errors"] = {"ecc_errors.volatile_uncorrected": "no_permission"}
    s["gpus"][1]["ecc_errors"]["aggregate_corrected"] = None
    s["gpus"][1]["errors"] = {"ecc_errors.aggregate_corrected": "other"}  # an advisory limit needs it: warn
    s["gpus"][2]["ecc_errors"]["sram_volatile_uncorrected"] = 1
    s["gpus"][2]["errors"] = {"ecc_errors.volatile_uncorrected": "other"}
    s["gpus"][2]["ecc_errors"]["volatile_uncorrected"] = None
    out = run(s, only={"ecc"})
    assert not_pass(out) == {("ecc", "gpu0", E, Action.NONE), ("ecc", "gpu1", W, Action.INVESTIGATE),
                             ("ecc", "gpu2", F, Action.RESET_GPU)}
    r0 = by_subject(out, "ecc")["gpu0"]
    assert "could not read ecc_errors.volatile_uncorrected (no_permission)" in r0.summary
    assert "could not read ecc_errors.aggregate_corrected (other)" in by_subject(out, "ecc")["gpu1"].summary
    assert "could not read ecc_errors.volatile_uncorrected (other)" in by_subject(out, "ecc")["gpu2"].evidence


def test_ecc_corrected_limits_come_from_config():
    s = snap("h100-healthy.json")
    s["gpus"][0]["ecc_errors"]["volatile_corrected"] = 1500
    assert not_pass(run(s, only={"ecc"})) == {("ecc", "gpu0", W, Action.INVESTIGATE)}
    cfg = Config(checks={"ecc": {"corrected_volatile_warn": 5000}})
    assert not_pass(run(s, config=cfg, only={"ecc"})) == set()


def test_config_overrides_are_validated_against_the_defaults():
    from gpucheck.core.config import ConfigError

    specs = [c.spec for c in all_checks()]
    Config(checks={"nvlink": {"crc_rate_fail_per_s": 50}}).validate_checks(specs)
    with pytest.raises(ConfigError, match="unknown key"):
        Config(checks={"pcie": {"replay_rate": 3}}).validate_checks(specs)


def test_a_previous_reading_whose_time_is_not_a_number_gives_no_delta(tmp_path):
    """A tampered history time (NaN) made every rate NaN, and a NaN rate passed every limit."""
    state = State(tmp_path / "state")
    first = snap("h100-healthy.json")
    doc = {"schema": "gpucheck.verdict", "time": first["captured_at"],
           "results": [r.to_dict() for r in run(first, only={"nvlink", "pcie"}).results]}
    for r in doc["results"]:
        r["metrics"]["snapshot_time"]["value"] = float("nan")
    state.append_history(doc)
    later = copy.deepcopy(first)
    later["captured_at"] = "2025-06-02T10:16:40Z"
    set_link(later, 0, 0, crc_flit_errors=5000)  # 50/s over the 100 s, if the time could be trusted
    later["gpus"][1]["pcie"]["replay_counter"] = 10000
    out = run(later, state=state, only={"nvlink", "pcie"})
    assert not_pass(out) == {("nvlink", "gpu0", W, Action.INVESTIGATE)}
    r = by_subject(out, "nvlink")["gpu0"]
    assert r.summary == "GPU 0: NvLink 0 CRC errors 5000 since driver load (no previous reading)"
    assert "no delta available (the previous reading has no usable time)" in " ".join(r.evidence)
    assert "no delta available (the previous reading has no usable time)" in by_subject(out, "pcie")["gpu1"].summary
