"""repro.bitwise end to end on CPU workers standing in for GPUs (real spawned worker processes):
digests agree across processes, an injected bit flip fails exactly its worker, record / check /
tamper / conflict through the CLI, usage errors. No timed assertions."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.repro import store
from gpucheck.repro import workloads as W
from gpucheck.repro.fingerprint import fingerprint_key
from gpucheck.repro.worker import run_all
from gpucheck.core.verdict import SCHEMA
from gpucheck.workers.pool import LocalChannel, WorkerJob, torch_device

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
torch = pytest.importorskip("torch")


def cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def verdict_of(out):
    v = json.loads(out)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(SCHEMA).validate(v)
    return v


@pytest.fixture(scope="module")
def local():
    """The workloads in this process (a third process beside the workers), one thread."""
    threads = torch.get_num_threads()
    chan = LocalChannel(WorkerJob("local", gpu=0, device="cpu", args={"threads": 1}))
    dev = torch_device(chan)
    yield run_all(torch, dev, chan, ["gemm.fp32", "gemm.bf16"], "cpu", {})
    torch.set_num_threads(threads)


def config_with_reference(tmp_path, ref):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[checks."repro.bitwise"]\nreference = "{ref}"\n')
    return cfg


# -- in this process ------------------------------------------------------------------------------
def test_run_all_twice_and_a_flip_in_one_run_only(local):
    runs = local["runs"]
    assert runs[0]["gemm.fp32"]["digest"] == runs[1]["gemm.fp32"]["digest"]
    assert local["settings"]["deterministic_algorithms"] and local["settings"]["threads"] == 1
    assert local["key"] == fingerprint_key(local["fingerprint"]) and local["fingerprint"]["threads"] == 1
    chan = LocalChannel(WorkerJob("local", gpu=0, device="cpu"))
    flip = {"workload": "gemm.fp32", "output": 2, "element": 5, "bit": 0, "runs": [2]}
    out = run_all(torch, torch.device("cpu"), chan, ["gemm.fp32"], "cpu", {"bitflip": flip})
    r1, r2 = out["runs"][0]["gemm.fp32"], out["runs"][1]["gemm.fp32"]
    assert r1["digest"] == runs[0]["gemm.fp32"]["digest"] != r2["digest"]
    label = list(r1["parts"])[2]
    assert [k for k in r1["parts"] if r1["parts"][k] != r2["parts"][k]] == [label]
    assert out["injected"] == [f"bitflip: bit 0 of element 5 of output {label!r} of gemm.fp32, run 2"]


def test_a_stop_request_returns_what_ran():
    stop = threading.Event()
    stop.set()
    chan = LocalChannel(WorkerJob("local", gpu=0, device="cpu"), stop=stop)
    out = run_all(torch, torch.device("cpu"), chan, ["gemm.fp32", "gemm.bf16"], "cpu", {})
    assert out["stopped"] == "stop" and out["runs"] == [{}, {}]


# -- worker processes -------------------------------------------------------------------------------
@pytest.mark.slow
def test_injected_flip_fails_exactly_that_worker_and_digests_agree_across_processes(capsys, tmp_path, local):
    # A reference file for another fingerprint only, world-writable: never compared, and warned about.
    fp = dict(local["fingerprint"], torch="0.0.0-other")
    ref = tmp_path / "refs.json"
    store.record(ref, [(fp, {"gemm.fp32": "0" * 64})], host="elsewhere")
    os.chmod(ref, 0o666)
    cfg = config_with_reference(tmp_path, ref)
    rc, out, err = cli(capsys, "repro", "check", "--device", "cpu", "--workers", "3", "--json", "--no-history",
                       "--config", str(cfg), "--inject", "bitflip:gpu=1")
    v = verdict_of(out)
    assert rc == 1 == v["exit_code"] and v["status"] == "fail" and v["action"] == "drain"
    assert v["injected"] == ["bitflip:gpu=1"]
    by = {r["subject"]: r for r in v["results"]}
    bad = by["gpu1"]
    assert bad["status"] == "fail" and bad["action"] == "drain" and bad["injected"] == ["bitflip:gpu=1"]
    assert bad["summary"] == ("silent data corruption suspected in gemm.fp32: digest differs from the node majority "
                              "(2 of 3 GPUs agree)")
    want = {w: local["runs"][0][w]["digest"] for w in ("gemm.fp32", "gemm.bf16")}
    for g in ("gpu0", "gpu2"):
        r = by[g]
        assert r["status"] == "pass" and r["injected"] == []
        assert "no reference for fingerprint" in r["summary"] and "compared 3 GPUs with each other (all agree)" in r["summary"]
        # two worker processes and this one: the same bits
        assert {w: r["metrics"][f"digest_{w}"]["value"] for w in want} == {w: d[:16] for w, d in want.items()}
        assert any(e.startswith("closest stored fingerprint") and "torch" in e for e in r["evidence"])
    assert bad["metrics"]["digest_gemm.bf16"]["value"] == want["gemm.bf16"][:16]  # only gemm.fp32 was flipped
    assert by["node"]["metrics"]["digest_sets"]["value"] == {local["key"]: want}
    if os.geteuid() == 0:
        assert by["reference"]["status"] == "warn" and "can be changed by other users" in by["reference"]["summary"]


@pytest.mark.slow
def test_record_check_tamper_conflict(capsys, tmp_path, local):
    ref = tmp_path / "refs.json"
    rc, out, err = cli(capsys, "repro", "record", "--device", "cpu", "--workers", "2",
                       "--workload", "gemm.fp32,gemm.bf16", "--out", str(ref))
    assert rc == 0, err
    doc = store.load(ref)
    (e,) = doc["references"]
    assert e["key"] == local["key"] and e["fingerprint"] == local["fingerprint"]
    assert e["digests"] == {w: local["runs"][0][w]["digest"] for w in ("gemm.bf16", "gemm.fp32")}
    assert "recorded 2 digest(s)" in out

    # Tamper with one digest (as corruption on the recording node would have): that workload fails.
    e["digests"]["gemm.bf16"] = "f" * 64
    ref.write_text(store.dumps(doc))
    os.chmod(ref, 0o644)
    rc, out, err = cli(capsys, "repro", "check", "--reference", str(ref), "--device", "cpu", "--workers", "1",
                       "--workload", "gemm.fp32,gemm.bf16", "--json", "--no-history")
    v = verdict_of(out)
    assert rc == 1
    (r,) = [x for x in v["results"] if x["subject"] == "gpu0"]
    assert r["status"] == "fail" and r["action"] == "drain"
    assert r["summary"] == ("silent data corruption suspected in gemm.bf16: digest differs from the reference for "
                            f"fingerprint {local['key'][:12]}")
    assert r["metrics"]["reference_gemm.fp32"]["value"] == r["metrics"]["digest_gemm.fp32"]["value"]
    assert r["metrics"]["reference_gemm.bf16"]["value"] == "f" * 16

    # Recording over a disagreeing digest is refused, showing both; the file is unchanged.
    before = ref.read_bytes()
    rc, out, err = cli(capsys, "repro", "record", "--device", "cpu", "--workers", "1",
                       "--workload", "gemm.bf16", "--out", str(ref))
    assert rc == 1
    assert "f" * 64 in err and local["runs"][0]["gemm.bf16"]["digest"] in err and "file unchanged" in err
    assert ref.read_bytes() == before


@pytest.mark.slow
def test_record_refuses_injected_faults(capsys, tmp_path):
    ref = tmp_path / "refs.json"
    rc, out, err = cli(capsys, "repro", "record", "--device", "cpu", "--workers", "1", "--workload", "gemm.fp32",
                       "--inject", "bitflip:gpu=0,run=2", "--out", str(ref), "--json")
    assert rc == 1 and not ref.exists()
    s = json.loads(out)
    assert s["written"] is False
    assert any("non-deterministic: two runs of gemm.fp32 differ" in p for p in s["problems"])


# -- no workers -------------------------------------------------------------------------------------
def test_reference_usage_errors(capsys, tmp_path):
    rc, out, err = cli(capsys, "repro", "check", "--reference", str(tmp_path / "none.json"), "--device", "cpu")
    assert rc == 2 and "reference file not found" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "gpucheck.repro-refs", "version": 1, "references": [{}]}')
    rc, out, err = cli(capsys, "repro", "check", "--reference", str(bad), "--device", "cpu")
    assert rc == 2 and str(bad) in err and "references[0]: missing" in err
    rc, out, err = cli(capsys, "repro", "record", "--out", str(tmp_path / "no-dir" / "r.json"), "--device", "cpu")
    assert rc == 2 and "does not exist" in err
    rc, out, err = cli(capsys, "repro", "record", "--out", str(bad), "--device", "cpu")
    assert rc == 2 and "references[0]: missing" in err
    rc, out, err = cli(capsys, "repro", "check", "--workload", "gemm.fp8", "--device", "cpu")
    assert rc == 2 and "unknown workload 'gemm.fp8'" in err


def test_a_malformed_default_reference_is_an_error_result(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    cfg = config_with_reference(tmp_path, bad)
    rc, out, err = cli(capsys, "repro", "check", "--config", str(cfg), "--device", "cpu", "--json", "--no-history")
    v = verdict_of(out)
    assert rc == 3
    (r,) = v["results"]
    assert r["status"] == "error" and str(bad) in r["summary"] and "not valid JSON" in r["summary"]


def test_injections_that_touch_nothing_are_errors():
    from gpucheck.core.check import Context
    from gpucheck.core.levels import Level
    from gpucheck.core.inject import parse_injection
    from gpucheck.tests_suite.repro_bitwise import repro_bitwise

    ctx = Context(level=Level.QUICK, device="cpu", workers=2, injections=[parse_injection("bitflip:gpu=x")])
    (r,) = repro_bitwise.run(ctx)
    assert r.status.value == "error" and "gpu must be an index" in r.summary
    ctx = Context(level=Level.QUICK, device="cpu", workers=2, gpus=[],
                  injections=[parse_injection("bitflip:gpu=5,workload=gemm.bf16")])
    (r,) = repro_bitwise.run(ctx)
    assert r.status.value == "error" and "no CPU worker 5 is tested here" in r.summary
    assert r.injected == ["bitflip:gpu=5,workload=gemm.bf16"]


def test_replayed_snapshot_is_not_this_node(capsys):
    rc, out, err = cli(capsys, "run", "--check", "repro.bitwise", "--json", "--no-history",
                       "--snapshot", str(SNAPS / "h100-healthy.json"))
    v = verdict_of(out)
    # Named with --check, it was asked for and could not run here: a skip that says why, and the
    # run could not judge what it was asked (exit 3), never a healthy 0.
    assert rc == 3 and v["status"] == "error"
    (r,) = v["results"]
    assert r["status"] == "skip" and "recorded snapshot" in r["summary"] and r["unexamined"] is True


def test_record_without_a_gpu_cannot_record(capsys, tmp_path):
    rc, out, err = cli(capsys, "repro", "record", "--out", str(tmp_path / "r.json"))
    if rc == 0:
        pytest.skip("this machine has a usable GPU")
    assert rc == 3 and ("cannot record: no usable GPU" in err or "cannot record: PyTorch is a CPU-only build" in err) and not (tmp_path / "r.json").exists()


def test_listed_at_level_1_with_bitflip(capsys):
    rc, out, err = cli(capsys, "list", "--json")
    (row,) = [r for r in json.loads(out) if r["id"] == "repro.bitwise"]
    assert row["level"] == 1 and row["injects"] == ["bitflip"] and row["needs"] == ["torch", "gpu"]
    assert row["defaults"]["workloads_level1"] == ["gemm.bf16", "gemm.fp32"]
    assert set(W.select_workloads(row["defaults"]["workloads_level2"], "gpu")[0]) == set(W.WORKLOADS)
