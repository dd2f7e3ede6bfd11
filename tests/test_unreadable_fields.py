"""A field the level-1 checks read that could not be read, or holds a value its field cannot hold
(NaN, text, a negative or absurd number), is never a pass.

The fields come from the reader itself: the replay backend (gpucheck.platform.telemetry.replay, through
tests/snapshot_nvml.py) answers the snapshot reader's calls from a recorded GPU entry, and every
call the reader makes is failed in turn, so a field the reader learns to read is covered the day it is added. Which results
depend on a field is each check's own declaration (its READS), and every field must be declared
by some level-1 check. Fields NVML does not support (None without an `errors` entry) may still
skip their rule; that is tested with the fixtures in test_nvml_checks.py.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.tests_suite.registry import all_checks
from gpucheck.core.result import Result, Status
from gpucheck.platform.telemetry.fields import judged_view
from gpucheck.platform.telemetry.reader import empty_gpu, read_gpu
from gpucheck.platform.telemetry.snapshot import load_snapshot
from gpucheck.tests_suite import clocks, ecc, fabric_nvswitch, inventory, memory_remap, nvlink, pcie, recovery_action
from gpucheck.sdk import status_if_unreadable

from snapshot_nvml import CallLog, SnapshotNvml

FIXTURES = Path(__file__).parent / "fixtures" / "snapshots"
SNAPSHOTS = ("h100-healthy.json", "v100-retired-pages.json")
GPU = 2  # the GPU whose field is broken; a GPU of each fixture that is healthy
LEVEL1 = [c for c in all_checks() if c.id in {"inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink",
                                               "recovery-action", "fabric.nvswitch"}]

# What each per-GPU result reads: field or group -> the status an unreadable one gives.
PER_GPU_READS: dict[str, Callable[[dict[str, Any]], dict[str, Status]]] = {
    "inventory": lambda g: inventory.gpu_reads(inventory.DEFAULTS),
    "ecc": lambda g: ecc.READS,
    "memory-remap": memory_remap.reads_for,
    "clocks": lambda g: clocks.READS,
    "pcie": lambda g: pcie.READS,
    "nvlink": lambda g: nvlink.READS,
    "recovery-action": lambda g: recovery_action.READS,
    "fabric.nvswitch": lambda g: fabric_nvswitch.READS,
}
# Derived from another field (the check judges that one), and the entry's bookkeeping.
NOT_FIELDS = {"index", "state", "error", "errors", "clocks.throttle_reason_names", "recovery_action_name"}


def snapshot(name: str) -> dict[str, Any]:
    return load_snapshot(FIXTURES / name)


def reader_calls(name: str) -> list[tuple[Any, ...]]:
    """Every NVML call the reader makes for GPU `GPU` of fixture `name`."""
    fake = SnapshotNvml(snapshot(name)["gpus"][GPU])
    read_gpu(fake, GPU)
    return fake.calls


CALLS = [(name, call) for name in SNAPSHOTS for call in reader_calls(name)]


def run_level1(snap: dict[str, Any]) -> dict[tuple[str, str], Result]:
    ctx = Context(level=Level.QUICK, snapshot=snap)
    return {(r.check, r.subject): r for c in LEVEL1 for r in c.run(ctx)}


def dependents(field: str, snap: dict[str, Any]) -> list[tuple[str, str]]:
    """The results (check, subject) that depend on `field` of GPU `GPU`, by the checks' READS."""
    g = judged_view(snap["gpus"][GPU])
    deps = [(cid, f"gpu{GPU}") for cid, reads in PER_GPU_READS.items() if status_if_unreadable(field, reads(g))]
    if status_if_unreadable(field, inventory.node_reads(inventory.DEFAULTS, snap)):
        deps.append(("inventory", "node"))
    return deps


@functools.lru_cache(maxsize=None)
def baseline(name: str) -> dict[tuple[str, str], Status]:
    return {key: r.status for key, r in run_level1(snapshot(name)).items()}


def assert_never_a_pass(name: str, snap: dict[str, Any], fields: list[str], what: str) -> None:
    """Every result that depends on one of `fields` of GPU `GPU` (healthy on the fixture) is a
    warn or an error that names the field; the results of the other GPUs are what they are on the
    intact fixture."""
    results = run_level1(snap)
    for field in fields:
        deps = dependents(field, snap)
        assert deps, f"{field} is read by no level-1 check: declare it in the READS of the check that reads it"
        for key in deps:
            r = results[key]
            # Never a pass, and on a healthy GPU never a fail: gpucheck does not drain for a
            # reading it could not make or trust.
            assert r.status in (Status.WARN, Status.ERROR), f"{what}: {key} is {r.status.value}: {r.summary}"
            named = field in r.summary or any(field in e for e in r.evidence)
            assert named, f"{what}: {key} does not name {field}: {r.summary} / {r.evidence}"
            if r.status in (Status.WARN, Status.ERROR):
                assert field in r.summary or field.split("[")[0] in r.summary, (key, r.summary)
    others = {key: r.status for key, r in results.items() if key[1] not in (f"gpu{GPU}", "node")}
    assert others == {key: st for key, st in baseline(name).items() if key[1] not in (f"gpu{GPU}", "node")}


@pytest.mark.parametrize("name,call", CALLS, ids=[f"{n.split('.')[0]}:{c}" for n, c in CALLS])
def test_every_read_the_reader_makes_failing_is_recorded_and_never_a_pass(name, call):
    snap = snapshot(name)
    broken = json.loads(json.dumps(read_gpu(SnapshotNvml(snap["gpus"][GPU], fail=call), GPU)))
    if not broken["errors"]:  # only where another call gave the same value (SRAM status)
        assert broken == snap["gpus"][GPU], f"the reader recorded nothing when {call} failed"
        return
    snap["gpus"][GPU] = broken
    assert_never_a_pass(name, snap, sorted(broken["errors"]), f"{call} failed")


def test_the_stand_in_nvml_reads_the_fixtures_back_exactly():
    for name in SNAPSHOTS:
        snap = snapshot(name)
        for i, g in enumerate(snap["gpus"]):
            assert json.loads(json.dumps(read_gpu(SnapshotNvml(g), i))) == g
        assert all(st == Status.PASS for (c, s), st in baseline(name).items() if s == f"gpu{GPU}")


# -- values a field cannot hold ---------------------------------------------------------------------
def leaf_paths(g: dict[str, Any]) -> list[str]:
    """Every value of a GPU entry, as field paths (the reader's empty entry, plus the fixture's
    first and last NvLink)."""
    paths = []
    for key, v in empty_gpu(GPU).items():
        if key == "nvlink":
            paths.append("nvlink.supported")
            links = g["nvlink"]["links"]
            for i in sorted({0, len(links) - 1}) if links else []:
                paths.extend(f"nvlink.links[{i}].{k}" for k in links[i] if k != "link")
        elif isinstance(v, dict):
            paths.extend(f"{key}.{k}" for k in v)
        else:
            paths.append(key)
    return [p for p in paths if p not in NOT_FIELDS]


def garbage_for(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [math.nan, -1, [1], ""]
    return [math.nan, math.inf, -1, 1e300, "garbage"] + ([2] if isinstance(value, bool) else [])


def set_path(g: dict[str, Any], path: str, value: Any) -> None:
    if path.startswith("nvlink.links["):
        i, key = path[len("nvlink.links["):].split("].")
        g["nvlink"]["links"][int(i)][key] = value
    elif "." in path:
        group, key = path.split(".")
        g[group][key] = value
    else:
        g[path] = value


def _leaf_cases() -> list[tuple[str, str, Any]]:
    cases = []
    for name in SNAPSHOTS:
        g = snapshot(name)["gpus"][GPU]
        for path in leaf_paths(g):
            sample = _value_at(g, path)
            for bad in garbage_for(sample if sample is not None else 0):
                cases.append((name, path, bad))
    return cases


def _value_at(g: dict[str, Any], path: str) -> Any:
    if path.startswith("nvlink.links["):
        i, key = path[len("nvlink.links["):].split("].")
        return g["nvlink"]["links"][int(i)][key]
    if "." in path:
        group, key = path.split(".")
        return g[group][key]
    return g[path]


LEAVES = _leaf_cases()


@pytest.mark.parametrize("name,path,bad", LEAVES, ids=[f"{n.split('.')[0]}:{p}={b!r}" for n, p, b in LEAVES])
def test_a_value_its_field_cannot_hold_is_never_a_pass(name, path, bad):
    snap = snapshot(name)
    set_path(snap["gpus"][GPU], path, bad)
    assert_never_a_pass(name, snap, [path], f"{path} = {bad!r}")


GROUPS = ["ecc_mode", "mig_mode", "ecc_errors", "remapped_rows", "retired_pages", "temperature", "clocks", "power",
          "pcie", "nvlink", "nvlink.links", "nvlink.links[0]"]


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_that_is_not_an_object_is_never_a_pass(group):
    snap = snapshot("h100-healthy.json")
    g = snap["gpus"][GPU]
    if group == "nvlink.links":
        g["nvlink"]["links"] = "garbage"
    elif group == "nvlink.links[0]":
        g["nvlink"]["links"][0] = "garbage"
    else:
        g[group] = "garbage"
    assert_never_a_pass("h100-healthy.json", snap, [group], f"{group} = 'garbage'")


# -- the cases a tester reproduced, by name -------------------------------------------------------
def test_an_unreadable_ecc_mode_is_not_modes_ok():
    snap = snapshot("h100-healthy.json")
    snap["gpus"][GPU] = read_gpu(SnapshotNvml(snap["gpus"][GPU], fail=("nvmlDeviceGetEccMode",)), GPU)
    r = run_level1(snap)[("inventory", f"gpu{GPU}")]
    assert r.status == Status.ERROR and r.summary == "could not read ecc_mode (other)"


def test_an_unreadable_sram_counter_is_not_no_uncorrectable_errors():
    snap = snapshot("h100-healthy.json")
    call = ("nvmlDeviceGetMemoryErrorCounter", 1, 0, 7)
    g = snap["gpus"][GPU]
    g["ecc_errors"]["sram_threshold_exceeded"] = None  # no SRAM status to fall back on (not root)
    snap["gpus"][GPU] = read_gpu(SnapshotNvml(g, fail=call), GPU)
    r = run_level1(snap)[("ecc", f"gpu{GPU}")]
    assert r.status == Status.ERROR
    assert r.summary == "could not read ecc_errors.sram_volatile_uncorrected (other)"


def test_the_sram_status_fills_a_counter_the_location_call_could_not_read():
    snap = snapshot("h100-healthy.json")
    g = read_gpu(SnapshotNvml(snap["gpus"][GPU], fail=("nvmlDeviceGetMemoryErrorCounter", 1, 0, 7)), GPU)
    assert g["ecc_errors"]["sram_volatile_uncorrected"] == 0 and g["errors"] == {}


def test_nan_temperature_negative_counter_and_absurd_values():
    snap = snapshot("h100-healthy.json")
    g = snap["gpus"][GPU]
    g["temperature"]["gpu_c"] = math.nan
    g["ecc_errors"]["volatile_uncorrected"] = -1
    g["pcie"]["link_width_max"] = 10**9
    res = run_level1(snap)
    assert res[("clocks", f"gpu{GPU}")].status == Status.WARN
    assert "invalid value in temperature.gpu_c (nan)" in res[("clocks", f"gpu{GPU}")].summary
    assert res[("ecc", f"gpu{GPU}")].status == Status.ERROR
    assert res[("ecc", f"gpu{GPU}")].summary == "invalid value in ecc_errors.volatile_uncorrected (-1)"
    assert res[("pcie", f"gpu{GPU}")].status == Status.ERROR


def test_a_garbage_value_that_would_fail_is_not_a_fault():
    """A link state NVML does not have, or a huge float count, is an invalid reading (error), not
    a link down or a double-bit error (fail): gpucheck never drains for what it could not read."""
    snap = snapshot("h100-healthy.json")
    snap["gpus"][GPU]["nvlink"]["links"][3]["state"] = "banana"
    snap["gpus"][GPU]["ecc_errors"]["volatile_uncorrected"] = 1e300
    res = run_level1(snap)
    assert res[("nvlink", f"gpu{GPU}")].status == Status.ERROR
    assert res[("ecc", f"gpu{GPU}")].status == Status.ERROR


def test_an_unexpected_answer_from_nvml_is_a_failed_read_not_a_crash():
    class Garbled(CallLog):
        def answer(self, name, *args):
            return "not-a-number" if name == "nvmlDeviceGetArchitecture" else super().answer(name, *args)

    snap = snapshot("h100-healthy.json")
    g = read_gpu(SnapshotNvml(snap["gpus"][GPU], replay=Garbled), GPU)
    assert g["errors"] == {"architecture": "other"} and g["state"] == "ok"
    assert g["ecc_errors"]["volatile_uncorrected"] == 0  # the sections after it are still read
    snap["gpus"][GPU] = g
    assert run_level1(snap)[("memory-remap", f"gpu{GPU}")].status == Status.WARN


def test_an_unreadable_bus_id_is_an_error_on_the_node_not_a_gpu_missing_from_nvml():
    """Before, the GPU's own bus id showed as an NVIDIA GPU on the PCI bus that NVML does not
    report: a fail with reboot, for a read that failed."""
    snap = snapshot("h100-healthy.json")
    snap["gpus"][GPU] = read_gpu(SnapshotNvml(snap["gpus"][GPU], fail=("nvmlDeviceGetPciInfo",)), GPU)
    node = run_level1(snap)[("inventory", "node")]
    assert node.status == Status.ERROR and node.summary == f"GPU {GPU}: could not read pci_bus_id (other)"
    assert node.metrics["pci_gpus_not_in_nvml"] == 0


def test_not_supported_is_not_unreadable():
    """None without an `errors` entry is "not supported": the rule is skipped, nothing is unread."""
    from gpucheck.sdk import unreadable_fields

    snap = snapshot("h100-healthy.json")
    g = snap["gpus"][GPU]
    g["recovery_action"] = None
    g["ecc_errors"]["sram_threshold_exceeded"] = None
    g["power"]["limit_w"] = None
    assert unreadable_fields(judged_view(g)) == {}
    res = run_level1(snap)
    assert res[("recovery-action", f"gpu{GPU}")].status == Status.PASS
    assert res[("ecc", f"gpu{GPU}")].status == Status.PASS and res[("clocks", f"gpu{GPU}")].status == Status.PASS
