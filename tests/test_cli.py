"""The CLI end to end: `gpucheck run` in-process on recorded/synthetic snapshots (whole parsed
JSON, exit codes), bad input (exit 2, one line, nothing half-written), outputs, history, and the
promise that a level-1 run imports neither torch nor rich."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.core.state import State
from gpucheck.core.verdict import SCHEMA

import golden as golden_files

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
GOLDEN = ROOT / "tests" / "fixtures" / "verdicts"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    rc, out, err = run_cli(capsys, "run", "--json", "--no-history", *argv)
    assert out, err
    verdict = json.loads(out)
    validate(verdict)
    assert verdict["exit_code"] == rc
    return rc, verdict


def validate(verdict: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(SCHEMA).validate(verdict)


def normalise(v: dict) -> dict:
    """Blank out what legitimately changes between runs and machines."""
    v = json.loads(json.dumps(v))
    v["time"] = "<time>"
    v["duration_s"] = 0
    v["gpucheck_version"] = "<version>"
    v["software"] = {k: ("<local>" if k in ("python", "kernel", "torch", "cuda_runtime", "cublas", "cudnn",
                                           "nccl", "cupy") else val) for k, val in v["software"].items()}
    v["source"]["path"] = Path(v["source"]["path"]).name if v["source"]["path"] else None
    for c in v["checks"]:
        c["duration_s"] = 0
    for r in v["results"]:
        r["duration_s"] = 0
    return v


@pytest.mark.parametrize("name", ["h100-healthy", "h100-ecc-dbe"])
def test_whole_verdict_matches_golden(capsys, name):
    """The golden files are reviewed values (tests/golden.py): GPUCHECK_REGEN_GOLDEN=1 rewrites one
    from the code under test, and this test then fails until a person accepts the change."""
    rc, verdict = run_json(capsys, "--level", "1", "--snapshot", str(SNAPS / f"{name}.json"))
    got = normalise(verdict)
    golden = GOLDEN / f"{name}.level1.json"
    if os.environ.get("GPUCHECK_REGEN_GOLDEN"):
        golden.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert golden_files.accepted().get(golden.name) == golden_files.digest(golden), (
        f"{golden} is not the accepted value: review it (git diff {golden.parent}), then "
        f"python3 tests/golden.py --accept {golden.name}")
    assert got == json.loads(golden.read_text())


def test_every_golden_file_is_accepted_and_every_acceptance_has_its_file():
    assert golden_files.not_accepted() == []


def test_a_regenerated_golden_file_fails_until_it_is_accepted(tmp_path):
    (tmp_path / "a.level1.json").write_text('{"status": "pass"}\n')
    golden_files.accept([], tmp_path)
    assert golden_files.not_accepted(tmp_path) == []
    (tmp_path / "a.level1.json").write_text('{"status": "fail"}\n')  # what GPUCHECK_REGEN_GOLDEN does
    (tmp_path / "b.level1.json").write_text("{}\n")
    assert golden_files.not_accepted(tmp_path) == ["a.level1.json: changed since it was accepted",
                                                   "b.level1.json: never accepted"]
    golden_files.accept(["a.level1.json"], tmp_path)
    assert golden_files.not_accepted(tmp_path) == ["b.level1.json: never accepted"]
    (tmp_path / "b.level1.json").unlink()
    (tmp_path / "a.level1.json").unlink()
    assert golden_files.not_accepted(tmp_path) == ["a.level1.json: accepted but no longer there"]


# fixture -> (exit code, overall status, overall action)
CASES = {
    "h100-healthy": (0, "pass", "none"),
    "h100-ecc-dbe": (1, "fail", "reset-gpu"),
    "h100-ecc-sram": (1, "fail", "reset-gpu"),
    "h100-remap-pending": (1, "fail", "reset-gpu"),
    "h100-remap-failure": (1, "fail", "rma"),
    "v100-retired-pages": (1, "fail", "rma"),
    "h100-hw-slowdown": (1, "fail", "investigate"),
    "h100-thermal-margin": (0, "warn", "investigate"),
    "h100-pcie-width-down": (1, "fail", "investigate"),
    "h100-nvlink-down": (1, "fail", "reboot"),
    "h100-recovery-reboot": (1, "fail", "reboot"),
    "h100-gpu-lost": (1, "fail", "reboot"),
    "driver-not-loaded": (1, "fail", "reboot"),
    "no-nvidia-devices": (0, "skip", "none"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_snapshot_exit_codes(capsys, name):
    rc, verdict = run_json(capsys, "--snapshot", str(SNAPS / f"{name}.json"))
    assert (rc, verdict["status"], verdict["action"]) == CASES[name]
    assert verdict["source"] == {"kind": "snapshot", "path": str(SNAPS / f"{name}.json"), "synthetic": True}
    assert {c["id"] for c in verdict["checks"]} >= {"inventory", "ecc", "memory-remap", "clocks", "pcie",
                                                   "nvlink", "recovery-action", "xid"}


def test_strict_turns_warn_into_1(capsys):
    rc, v = run_json(capsys, "--strict", "--snapshot", str(SNAPS / "h100-thermal-margin.json"))
    assert v["status"] == "warn" and rc == 1


def test_gpu_selection_limits_results(capsys):
    rc, v = run_json(capsys, "--gpus", "1,2", "--check", "ecc", "--snapshot", str(SNAPS / "h100-ecc-dbe.json"))
    assert {r["gpu"] for r in v["results"]} == {1, 2}
    assert rc == 0  # the DBE is on another GPU of that fixture
    rc, v = run_json(capsys, "--check", "ecc", "--snapshot", str(SNAPS / "h100-ecc-dbe.json"))
    assert rc == 1
    bad = [r for r in v["results"] if r["status"] == "fail"]
    assert bad and {r["gpu"] for r in bad}.isdisjoint({1, 2})


def test_timeout_partial_and_on_error(capsys):
    snap = str(SNAPS / "h100-healthy.json")
    rc, v = run_json(capsys, "--timeout", "1ms", "--snapshot", snap)
    assert rc == 3 and v["partial"] and v["interrupted"] == "timeout" and v["status"] == "error"
    rc, v = run_json(capsys, "--timeout", "1ms", "--on-error", "fail", "--snapshot", snap)
    assert rc == 1 and v["exit_code"] == 1


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--check", "nope"], "unknown check id 'nope'"),
        (["--skip", "nope"], "unknown check id 'nope'"),
        (["--level", "7"], "unknown level '7'"),
        (["--level", "turbo"], "unknown level 'turbo'"),
        (["--gpus", "9"], "--gpus: no GPU 9 on this node (GPUs: 0,1,2,3,4,5,6,7)"),
        (["--gpus", "x"], "bad GPU list 'x'"),
        (["--inject", "bitflip:gpu=1", "--check", "ecc"], "no selected check honours 'bitflip'"),
        (["--inject", "bitflip:gpu"], "bad --inject parameter"),
        (["--timeout", "soon"], "bad duration 'soon'"),
        (["--output", "/nonexistent-dir/x.json"], "folder /nonexistent-dir does not exist"),
        (["--prom", "/etc/hostname/x.prom"], "does not exist"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, argv, needle):
    rc, out, err = run_cli(capsys, "run", "--no-history", "--snapshot", str(SNAPS / "h100-healthy.json"), *argv)
    assert rc == 2
    assert out == ""
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_bad_snapshot_files(capsys, tmp_path):
    cases = {
        "garbage.json": "not json at all",
        "wrong-kind.json": json.dumps({"kind": "something.else", "version": 1}),
        "verdict.json": json.dumps({"schema": "gpucheck.verdict"}),
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        rc, out, err = run_cli(capsys, "run", "--no-history", "--snapshot", str(p))
        assert rc == 2 and out == "" and str(p) in err, (name, err)
    rc, out, err = run_cli(capsys, "run", "--no-history", "--snapshot", str(tmp_path / "missing.json"))
    assert rc == 2 and "missing.json" in err


def test_bad_config_exit_2(capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[checks.ecc]\nvolatile_uncorrected_fail = 'zero'\n")
    rc, out, err = run_cli(capsys, "run", "--config", str(cfg), "--snapshot", str(SNAPS / "h100-healthy.json"))
    assert rc == 2 and f"{cfg}: checks.ecc.volatile_uncorrected_fail: expected an integer" in err
    cfg.write_text("[checks.ecc]\nvolatile_uncorrected_fail = 0\n[node]\nexpected_gpus = 9\n")
    rc, v = run_json(capsys, "--config", str(cfg), "--snapshot", str(SNAPS / "h100-healthy.json"))
    assert rc == 1 and any(r["check"] == "inventory" and r["status"] == "fail" for r in v["results"])


def test_config_threshold_override_changes_the_verdict(capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[checks.clocks]\nthermal_margin_c = 1\n")
    rc, v = run_json(capsys, "--check", "clocks", "--snapshot", str(SNAPS / "h100-thermal-margin.json"))
    assert v["status"] == "warn"
    rc, v = run_json(capsys, "--config", str(cfg), "--check", "clocks", "--snapshot",
                     str(SNAPS / "h100-thermal-margin.json"))
    assert v["status"] == "pass"
    margins = {t["limit"] for r in v["results"] for t in r["thresholds"] if "headroom" in t["metric"]}
    assert margins == {1}, margins  # the threshold shown is the configured one


def test_outputs_history_and_prom(capsys, tmp_path):
    out_file, prom, state = tmp_path / "v.json", tmp_path / "g.prom", tmp_path / "state"
    rc, out, err = run_cli(capsys, "run", "--json", "--snapshot", str(SNAPS / "h100-ecc-dbe.json"),
                           "--output", str(out_file), "--prom", str(prom), "--state-dir", str(state))
    assert rc == 1
    assert json.loads(out_file.read_text()) == json.loads(out)
    text = prom.read_text()
    assert 'gpucheck_verdict_status{host=' in text and "} 2\n" in text
    assert 'check="ecc"' in text
    lines = (state / "history.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["status"] == "fail"
    # a replayed snapshot never moves the last-pass cursor of this node
    assert not list(state.glob("cursor-last-pass*.json"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


def test_table_output(capsys):
    rc, out, err = run_cli(capsys, "run", "--no-history", "--snapshot", str(SNAPS / "h100-ecc-dbe.json"))
    assert rc == 1
    assert "FAIL" in out and "ecc" in out and "reset-gpu" in out and "exit code 1" in out


def test_list_and_schema(capsys):
    rc, out, _ = run_cli(capsys, "list", "--json")
    rows = json.loads(out)
    ids = {r["id"] for r in rows}
    assert {"inventory", "ecc", "memory-remap", "clocks", "pcie", "nvlink", "recovery-action", "xid"} <= ids
    assert all(r["level"] in (1, 2, 3, 4) and r["detects"] for r in rows)
    rc, out, _ = run_cli(capsys, "list", "--level", "1")
    assert rc == 0 and "ecc" in out
    rc, out, _ = run_cli(capsys, "schema")
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(json.loads(out))


def test_level1_imports_neither_torch_nor_rich():
    code = (
        "import sys, io, contextlib\n"
        "from gpucheck.cli.main import main\n"
        f"rc = main(['run', '--level', '1', '--json', '--no-history', '--snapshot', {str(SNAPS / 'h100-healthy.json')!r}])\n"
        "assert rc == 0, rc\n"
        "bad = [m for m in ('torch', 'rich', 'cupy', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr


def test_live_run_on_this_machine(capsys, tmp_path):
    """No NVIDIA driver here: inventory skips with the reason, nothing is judged healthy by
    accident, the verdict is valid, and the last-pass cursor is written after a passing run."""
    rc, out, err = run_cli(capsys, "run", "--json", "--level", "1", "--state-dir", str(tmp_path))
    v = json.loads(out)
    validate(v)
    inv = [r for r in v["results"] if r["check"] == "inventory"]
    assert inv and inv[0]["status"] in ("skip", "fail")
    nvml_checks = [r for r in v["results"] if r["check"] in ("ecc", "pcie", "nvlink")]
    assert all(r["status"] != "pass" for r in nvml_checks)
    if rc == 0 and any(c["id"] == "xid" and c["status"] == "pass" for c in v["checks"]):
        assert State(tmp_path, host=v["host"]).read_cursor("last-pass")["time"] == v["time"]


@pytest.mark.slow
def test_sigterm_to_a_real_process_prints_a_partial_verdict_and_leaves_no_workers():
    """What a Slurm prolog timeout does: SIGTERM to gpucheck while GPU workers run."""
    import signal
    import time

    psutil = pytest.importorskip("psutil")
    p = subprocess.Popen(
        [sys.executable, "-m", "gpucheck", "burn", "--device", "cpu", "--workers", "2", "--size", "64",
         "--duration", "120s", "--dtype", "fp32", "--json", "--no-history"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True,
    )
    try:
        # wait until both workers are computing (their processes exist) and have computed for a
        # while: torch imported (~2 s of CPU) plus a few 1 s windows (the two busiest children:
        # multiprocessing also starts an idle resource tracker). Work done, not time passed: a loaded
        # machine once reached the old 60 s limit first and the signal came before any window
        # (issue 26); the limit now only catches a burn that never computes (its duration is 120 s).
        deadline = time.monotonic() + 110
        while time.monotonic() < deadline and len(psutil.Process(p.pid).children(recursive=True)) < 2:
            time.sleep(0.2)
        workers = psutil.Process(p.pid).children(recursive=True)
        assert len(workers) >= 2
        while time.monotonic() < deadline and sorted(w.cpu_times().user for w in workers)[-2] < 5:
            time.sleep(0.2)
        assert sorted(w.cpu_times().user for w in workers)[-2] >= 5, "the workers did not compute in 110 s"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 3, err
    v = json.loads(out)
    validate(v)
    assert v["partial"] and v["interrupted"] == "SIGTERM" and v["exit_code"] == 3
    burned = [r for r in v["results"] if r["check"] == "burn.gemm" and r["gpu"] is not None]
    assert {r["gpu"] for r in burned} == {0, 1}
    assert all(r["metrics"]["tflops_fp32"]["value"] for r in burned)  # partial measurements kept
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, alive
