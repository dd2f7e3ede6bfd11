"""The reference file: schema, validation of malformed files, recording (new, added, idempotent,
conflicting), atomic and locked writes, and the permission warning."""

from __future__ import annotations

import json
import os
import threading

import pytest

from gpucheck.repro import store
from gpucheck.repro.fingerprint import fingerprint_key

FP = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132,
      "driver": "550.54.15", "cuda_runtime": "12.4", "torch": "2.5.1", "cublas": "12.4.5", "blas_backend": "Cublas",
      "workload_version": "gpucheck-repro-1", "preset": "gpu"}
A, B, C = "a" * 64, "b" * 64, "c" * 64


def doc_with(*entries):
    return {"kind": store.KIND, "version": store.VERSION, "references": list(entries)}


def entry(fp=FP, digests=None, **kw):
    e = {"fingerprint": fp, "key": fingerprint_key(fp), "workload_version": fp["workload_version"],
         "digests": digests or {"gemm.bf16": A}, "recorded_at": "2025-01-01T00:00:00Z", "host": "good01"}
    e.update(kw)
    return e


def test_schema_accepts_what_record_writes(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(store.SCHEMA)
    path = tmp_path / "refs.json"
    store.record(path, [(FP, {"gemm.bf16": A, "gemm.fp32": B})], host="good01", now="2025-01-01T00:00:00Z")
    store.record(path, [(FP, {"transformer.step": C})], host="good02", now="2025-01-02T00:00:00Z")
    doc = json.loads(path.read_text())
    jsonschema.Draft202012Validator(store.SCHEMA).validate(doc)
    assert store.validate(doc) is doc
    (e,) = doc["references"]
    assert e["digests"] == {"gemm.bf16": A, "gemm.fp32": B, "transformer.step": C}
    assert (e["host"], e["recorded_at"], e["updated_host"]) == ("good01", "2025-01-01T00:00:00Z", "good02")
    assert e["key"] == fingerprint_key(FP)


BAD = {
    "not json": ("{oops", "not valid JSON"),
    "a list": ("[]", "top level is not an object"),
    "other kind": (json.dumps({"kind": "gpucheck.verdict", "version": 1, "references": []}), "not a gpucheck reference file"),
    "newer": (json.dumps({"kind": store.KIND, "version": 2, "references": []}), "written by a newer gpucheck"),
    "extra top": (json.dumps({**doc_with(), "x": 1}), "unknown field(s) x"),
    "refs not list": (json.dumps({"kind": store.KIND, "version": 1, "references": {}}), "references: must be a list"),
    "missing digests": (json.dumps(doc_with({k: v for k, v in entry().items() if k != "digests"})), "missing digests"),
    "edited fingerprint": (json.dumps(doc_with(entry() | {"fingerprint": dict(FP, torch="2.6.0")})),
                           "does not match its fingerprint"),
    "duplicate": (json.dumps(doc_with(entry(), entry())), "appears twice"),
    "short digest": (json.dumps(doc_with(entry(digests={"gemm.bf16": "abc"}))), "digests.gemm.bf16"),
    "upper hex": (json.dumps(doc_with(entry(digests={"gemm.bf16": "A" * 64}))), "64 lowercase hex"),
    "version mismatch": (json.dumps(doc_with(entry(workload_version="gpucheck-repro-0"))), "differs from the fingerprint"),
    "bad device": (json.dumps(doc_with(entry(fp=dict(FP, device="tpu")))), "must be cuda or cpu"),
    "unknown entry field": (json.dumps(doc_with(entry(note="hi"))), "unknown field(s) note"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_files_are_clear_errors(tmp_path, name):
    text, needle = BAD[name]
    p = tmp_path / "refs.json"
    p.write_text(text)
    with pytest.raises(store.RefFileError) as ei:
        store.load(p)
    assert needle in str(ei.value) and str(p) in str(ei.value)
    # record refuses to touch a malformed file
    with pytest.raises(store.RefFileError):
        store.record(p, [(FP, {"gemm.bf16": A})], host="x")
    assert p.read_text() == text


def test_missing_file(tmp_path):
    assert store.load(tmp_path / "none.json", missing_ok=True) is None
    with pytest.raises(store.RefFileError, match="reference file not found"):
        store.load(tmp_path / "none.json")
    with pytest.raises(store.RefFileError, match="is a directory"):
        store.load(tmp_path)


def test_conflicting_record_is_refused_and_shows_both(tmp_path):
    path = tmp_path / "refs.json"
    store.record(path, [(FP, {"gemm.bf16": A})], host="good01", now="2025-01-01T00:00:00Z")
    before = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    with pytest.raises(store.RecordConflict) as ei:
        # one new workload and one conflicting: all or nothing
        store.record(path, [(FP, {"gemm.bf16": B, "gemm.fp32": C})], host="bad07")
    msg = str(ei.value)
    assert A in msg and B in msg and "good01" in msg and str(path) in msg
    (c,) = ei.value.conflicts
    assert (c.workload, c.stored, c.new) == ("gemm.bf16", A, B)
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime


def test_idempotent_and_other_fingerprints_are_separate(tmp_path):
    path = tmp_path / "refs.json"
    out = store.record(path, [(FP, {"gemm.bf16": A})], host="h")
    assert out.written and out.new_keys == [fingerprint_key(FP)]
    mtime = path.stat().st_mtime_ns
    out = store.record(path, [(FP, {"gemm.bf16": A})], host="h")
    assert not out.written and out.unchanged == {fingerprint_key(FP): ["gemm.bf16"]}
    assert path.stat().st_mtime_ns == mtime
    # Another fingerprint (another torch): its own entry, even with a different digest.
    fp2 = dict(FP, torch="2.6.0")
    out = store.record(path, [(fp2, {"gemm.bf16": B})], host="h")
    assert out.written and out.new_keys == [fingerprint_key(fp2)]
    doc = store.load(path)
    assert store.find(doc, fingerprint_key(FP))["digests"] == {"gemm.bf16": A}
    assert store.find(doc, fingerprint_key(fp2))["digests"] == {"gemm.bf16": B}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".refs.json.lock", "refs.json"]  # no temp file left


def test_concurrent_records_lose_nothing(tmp_path):
    path = tmp_path / "refs.json"
    fps = [dict(FP, sm_count=100 + i) for i in range(8)]
    errors = []

    def rec(fp):
        try:
            store.record(path, [(fp, {"gemm.bf16": A})], host="h")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=rec, args=(fp,)) for fp in fps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    keys = set(store.entries(store.load(path)))
    assert keys == {fingerprint_key(fp) for fp in fps}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_permission_problems(tmp_path):
    os.chmod(tmp_path, 0o755)
    p = tmp_path / "refs.json"
    store.record(p, [(FP, {"gemm.bf16": A})], host="h")
    os.chmod(p, 0o644)
    if os.geteuid() == 0:
        assert store.permission_problems(p) == []
    assert store.permission_problems(p, euid=1000) == []  # only root needs to worry
    os.chmod(p, 0o666)
    probs = store.permission_problems(p, euid=0)
    assert any("writable by every user (mode 0666)" in x for x in probs)
    os.chmod(p, 0o644)
    os.chmod(tmp_path, 0o777)
    probs = store.permission_problems(p, euid=0)
    assert any("lets other users replace it" in x for x in probs)
    os.chmod(tmp_path, 0o1777)  # sticky: others cannot replace root's file
    assert not any("replace" in x for x in store.permission_problems(p, euid=0))
    os.chmod(tmp_path, 0o755)
    if os.geteuid() == 0:
        os.chown(p, 1000, 1000)
        assert any("owned by uid 1000" in x for x in store.permission_problems(p, euid=0))
    assert store.permission_problems(tmp_path / "missing.json", euid=0) == []


def test_record_keeps_the_files_mode(tmp_path):
    p = tmp_path / "refs.json"
    store.record(p, [(FP, {"gemm.bf16": A})], host="h")
    assert (p.stat().st_mode & 0o777) == 0o644
    os.chmod(p, 0o600)
    store.record(p, [(FP, {"gemm.fp32": B})], host="h")
    assert (p.stat().st_mode & 0o777) == 0o600
