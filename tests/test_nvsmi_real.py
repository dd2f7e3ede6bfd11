"""Real nvidia-smi captures (tests/fixtures/nvsmi, provenance in each .source) judged by the level-1
checks through the same code as any snapshot: `load_snapshot` (which converts them) and the runner,
and end to end through `gpucheck run --snapshot` and `gpucheck telemetry import`.

Every test asserts the exact set of results that are not `pass` (check, subject, status, action).
What the capture's format cannot carry (nvidia-smi -q never prints NVLink state; drivers before
R565 print no GPU Recovery Action: gpucheck.platform.telemetry.formatgaps) is a plain skip naming
what to add. What a capture could hold but does not (a half-pasted or cut capture) is "not in this
capture": an error where a fail rule needs the field, a warning where only an advisory rule does.
Never a pass.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.cli.main import main
from gpucheck.tests_suite.registry import all_checks
from gpucheck.core.runner import run_checks
from gpucheck.platform.telemetry.snapshot import load_snapshot

FIX = Path(__file__).parent / "fixtures" / "nvsmi"
LEVEL1 = {"inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink", "recovery-action"}
E, W, F, S = "error", "warn", "fail", "skip"


def not_pass(name: str) -> set[tuple[str, str, str, str]]:
    snap = load_snapshot(FIX / name)
    out = run_checks([c for c in all_checks() if c.id in LEVEL1], Context(level=Level.QUICK, snapshot=snap),
                     install_signal_handlers=False)
    return {(r.check, r.subject, r.status.value, r.action.value) for r in out.results if r.status.value != "pass"}


def per_gpu(check: str, gpus, status: str = E, action: str = "none") -> set[tuple[str, str, str, str]]:
    return {(check, f"gpu{i}", status, action) for i in gpus}


def test_h100_x8_r565_healthy_only_nvlink_is_not_in_the_format():
    assert not_pass("h100-x8-565-healthy.txt") == per_gpu("nvlink", range(8), S)


@pytest.mark.parametrize("name,gpus", [("h200-550-healthy.txt", [0]), ("h100nvl-x2-550-healthy.txt", [0, 1])])
def test_r550_healthy_captures_skip_nvlink_and_the_recovery_action(name, gpus):
    assert not_pass(name) == per_gpu("nvlink", gpus, S) | per_gpu("recovery-action", gpus, S)


def test_gh200_with_a_lifetime_dbe_warns():
    """Aggregate DRAM Uncorrectable 1 (and one uncorrectable-error row remapped, nothing pending):
    nothing to reset now, worth a look."""
    assert not_pass("gh200-550-ecc-lifetime-dbe.txt") == (
        {("ecc", "gpu0", W, "investigate")} | per_gpu("nvlink", [0], S) | per_gpu("recovery-action", [0], S))


def test_a100_mig_r510_xml():
    """Remapped rows are N/A with MIG instances active (not supported: skip); R510 predates the SRAM
    threshold flag (ecc: skip naming the driver) and the device PCIe maximum (pcie: a pass with the
    note); persistence off and MIG on (inventory: warn)."""
    assert not_pass("a100-mig-510-netdata.xml") == {
        ("ecc", "gpu0", S, "none"), ("inventory", "gpu0", W, "investigate"), ("memory-remap", "gpu0", S, "none")} \
        | per_gpu("nvlink", [0], S) | per_gpu("recovery-action", [0], S)


def test_a100_xml_holding_one_of_four_attached_gpus():
    got = not_pass("a100-mig-535-telegraf-1of4.xml")
    missing = set().union(*(per_gpu(c, [1, 2, 3]) for c in
                            ("clocks", "ecc", "inventory", "memory-remap", "pcie", "nvlink", "recovery-action")))
    assert got == missing | {("inventory", "node", E, "none"), ("ecc", "gpu0", S, "none"),
                             ("inventory", "gpu0", W, "investigate"), ("memory-remap", "gpu0", S, "none"),
                             ("nvlink", "gpu0", S, "none"), ("recovery-action", "gpu0", S, "none")}


def test_half_pasted_remap_pending_fails_on_what_it_holds():
    """Four lines of one GPU: the pending remap is judged (fail, reset); everything the paste could
    have held is not in the capture (error), so nothing passes; NVLink state is in no nvidia-smi -q
    (skip). No driver version: no field counts as one the driver predates."""
    assert not_pass("remap-pending-excerpt-gpud80.txt") == {("memory-remap", "gpu0", F, "reset-gpu"),
                                                             ("inventory", "node", E, "none"),
                                                             ("nvlink", "gpu0", S, "none")} | \
        set().union(*(per_gpu(c, [0]) for c in ("clocks", "ecc", "inventory", "pcie", "recovery-action")))


def test_half_pasted_redacted_a100_judges_nothing_as_healthy():
    got = not_pass("a100-535-half-pasted-redacted-dcgm152.txt")
    assert got == {("inventory", "node", E, "none"), ("nvlink", "gpu0", S, "none")} | set().union(
        *(per_gpu(c, [0]) for c in ("clocks", "ecc", "inventory", "memory-remap", "pcie", "recovery-action")))


def test_h100_class_capture_with_a_pending_remap_exits_1():
    """Labelled synthetic (two lines of the real healthy H100 capture edited): GPU 3 has a remap
    pending; every other GPU passes but for the NVLink skip."""
    assert not_pass("h100-x8-565-synthetic-remap-pending-gpu3.txt") == (
        {("memory-remap", "gpu3", F, "reset-gpu")} | per_gpu("nvlink", range(8), S))


R535_GAPS = ("nvlink", "recovery-action")


@pytest.mark.parametrize("name,expected", [
    ("gpud-a10-535.129.03-remap-pending.txt",
     {("memory-remap", "gpu0", F, "reset-gpu"), ("ecc", "gpu0", S, "none")}
     | per_gpu("nvlink", [0], S) | per_gpu("recovery-action", [0], S)),
    ("gpud-h100-x8-535.161.08-power-brake-active-all.txt",
     per_gpu("clocks", range(8), F, "investigate") | per_gpu("nvlink", range(8), S)
     | per_gpu("recovery-action", range(8), S)),
    ("gpud-h100-x8-535.183.01-power-brake-active-one.txt",  # 0000:75:00.0 is GPU 2
     {("clocks", "gpu2", F, "investigate")} | per_gpu("nvlink", range(8), S) | per_gpu("recovery-action", range(8), S)),
    ("gpud-rtx4090-x8-535.154.05-ecc-disabled.txt",  # ECC off is a GeForce's default: no inventory fail
     per_gpu("ecc", range(8), S) | per_gpu("pcie", range(8), W) | per_gpu("nvlink", range(8), S)
     | per_gpu("recovery-action", range(8), S)),
    ("gpud-titanv-560.35.03-fabric-na.txt",
     {("ecc", "gpu0", S, "none"), ("inventory", "gpu0", W, "investigate"), ("memory-remap", "gpu0", S, "none"),
      ("pcie", "gpu0", W, "none"), ("nvlink", "gpu0", S, "none"), ("recovery-action", "gpu0", S, "none")}),
    ("azhpc-diagnostics-a100-x8-460-azure-healthy.txt",
     per_gpu("ecc", range(8), S) | per_gpu("inventory", range(8), W, "investigate") | per_gpu("nvlink", range(8), S)
     | per_gpu("recovery-action", range(8), S)),
])
def test_new_real_captures(name, expected):
    assert not_pass(name) == expected


def test_a_format_gap_names_what_to_add():
    snap = load_snapshot(FIX / "h200-550-healthy.txt")
    out = run_checks([c for c in all_checks() if c.id in ("nvlink", "recovery-action")],
                     Context(level=Level.QUICK, snapshot=snap), install_signal_handlers=False)
    summaries = {r.check: r.summary for r in out.results}
    assert summaries["nvlink"] == "GPU 0: capture has no NVLink state: add `nvidia-smi nvlink -s`"
    assert summaries["recovery-action"] == ("GPU 0: capture has no GPU Recovery Action: driver 550.90.12 predates "
                                            "it (printed from R565: NVML field 230)")


def test_ecc_disabled_on_a_geforce_is_a_note_on_a_datacenter_gpu_a_fail():
    snap = load_snapshot(FIX / "gpud-rtx4090-x8-535.154.05-ecc-disabled.txt")
    inv = [c for c in all_checks() if c.id == "inventory"]
    out = run_checks(inv, Context(level=Level.QUICK, snapshot=snap), install_signal_handlers=False)
    gpu0 = next(r for r in out.results if r.subject == "gpu0")
    assert gpu0.status.value == "pass" and "ECC disabled: the default of a GeForce consumer GPU" in gpu0.summary
    h100 = load_snapshot(FIX / "h100-x8-565-healthy.txt")
    for g in h100["gpus"]:
        g["ecc_mode"] = {"current": False, "pending": False}
    out = run_checks(inv, Context(level=Level.QUICK, snapshot=h100), install_signal_handlers=False)
    assert {(r.subject, r.status.value) for r in out.results if r.subject == "gpu0"} == {("gpu0", "fail")}


# -- end to end -------------------------------------------------------------------------------------
def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_snapshot_on_a_capture_end_to_end(capsys):
    rc, out, err = run(capsys, "run", "--json", "--no-history", "--snapshot", str(FIX / "h100-x8-565-healthy.txt"))
    v = json.loads(out)
    assert rc == 0 and v["status"] == "pass" and v["source"]["kind"] == "snapshot" and not v["source"]["synthetic"]
    assert len(v["gpus"]) == 8 and v["software"]["driver"] == "565.57.01"
    # nvidia-smi -q never prints NVLink state: a skip naming what to add, never an error
    assert {r["summary"].split(": ", 1)[1] for r in v["results"] if r["check"] == "nvlink"} == {
        "capture has no NVLink state: add `nvidia-smi nvlink -s`"}
    assert not [r for r in v["results"] if r["status"] not in ("pass", "skip")]


@pytest.mark.parametrize("name,rc_expected,action", [
    ("h200-550-healthy.txt", 0, "none"), ("h100nvl-x2-550-healthy.txt", 0, "none"),
    ("h100-x8-565-synthetic-remap-pending-gpu3.txt", 1, "reset-gpu"),
    ("gpud-h100-x8-535.161.08-power-brake-active-all.txt", 1, "investigate"),
    ("gpud-a10-535.129.03-remap-pending.txt", 1, "reset-gpu"),
    ("gpud-rtx4090-x8-535.154.05-ecc-disabled.txt", 0, "none")])
def test_a_pending_remap_or_a_power_brake_exits_1_a_healthy_capture_0(capsys, name, rc_expected, action):
    rc, out, _ = run(capsys, "run", "--json", "--no-history", "--snapshot", str(FIX / name))
    assert rc == rc_expected and json.loads(out)["action"] == action


def test_run_snapshot_from_stdin_with_the_warnings(capsys, monkeypatch):
    data = (FIX / "a100-mig-535-telegraf-1of4.xml").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    rc, out, err = run(capsys, "run", "--json", "--no-history", "--snapshot", "-")
    assert rc == 3 and json.loads(out)["status"] == "error"  # GPUs 1-3 are not in the capture
    assert "gpucheck: WARNING: standard input: the capture holds 1 of the 4 attached GPUs" in err


def test_a_pending_remap_in_a_pasted_excerpt_exits_1(capsys):
    rc, out, err = run(capsys, "run", "--json", "--no-history", "--snapshot", str(FIX / "remap-pending-excerpt-gpud80.txt"))
    assert rc == 1 and json.loads(out)["action"] == "reset-gpu"
    assert "starts inside a GPU section" in err


def test_telemetry_import_writes_a_snapshot_that_judges_the_same(capsys, tmp_path):
    out_file = tmp_path / "snap.json"
    rc, _, err = run(capsys, "telemetry", "import", str(FIX / "gh200-550-ecc-lifetime-dbe.txt"), "-o", str(out_file))
    assert rc == 0 and "wrote" in err
    doc = json.loads(out_file.read_text())
    assert doc["kind"] == "gpucheck.snapshot" and doc["capture"]["format"] == "nvidia-smi -q"
    assert doc["gpus"][0]["errors"] == {"recovery_action": "not_in_format", "nvlink": "not_in_format"}
    assert "add `nvidia-smi nvlink -s`" in doc["gpus"][0]["capture"]["not_carried"]["nvlink"]
    rc1, out1, _ = run(capsys, "run", "--json", "--no-history", "--snapshot", str(out_file))
    rc2, out2, _ = run(capsys, "run", "--json", "--no-history", "--snapshot", str(FIX / "gh200-550-ecc-lifetime-dbe.txt"))
    res = [[(r["check"], r["subject"], r["status"], r["summary"]) for r in json.loads(o)["results"]] for o in (out1, out2)]
    assert rc1 == rc2 == 0 and res[0] == res[1]  # ecc warns (a lifetime DBE): exit 0


def test_telemetry_import_usage_errors(capsys, tmp_path):
    rc, _, err = run(capsys, "telemetry", "import", str(tmp_path / "missing.txt"))
    assert rc == 2 and "no such file" in err
    junk = tmp_path / "junk.txt"
    junk.write_text("not a capture\n")
    rc, _, err = run(capsys, "telemetry", "import", str(junk))
    assert rc == 2 and "not an nvidia-smi -q capture" in err and err.count("\n") == 1
    rc, _, err = run(capsys, "telemetry", "import", str(FIX / "h200-550-healthy.txt"), "-o", str(tmp_path))
    assert rc == 2 and "cannot write" in err
