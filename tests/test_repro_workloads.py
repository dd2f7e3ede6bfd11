"""The reference workloads in this process: exact inputs, stable digests, the digest format,
bit flips, the transformer step, the fingerprint. No worker processes here (see
test_repro_cli.py for digests across processes)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.repro import workloads as W
from gpucheck.repro.fingerprint import CPU_FIELDS, describe, differences, fingerprint_key
from gpucheck.workers.pool import LocalChannel, WorkerJob

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cpu():
    """One CPU thread and the determinism settings, as in a worker; the process's own settings
    come back afterwards."""
    from gpucheck.workers.pool import torch_device

    threads = torch.get_num_threads()
    chan = LocalChannel(WorkerJob("local", gpu=0, device="cpu", args={"threads": 1}))
    dev = torch_device(chan)
    with W.determinism(torch):
        yield dev, chan
    torch.set_num_threads(threads)


def test_determinism_settings_are_restored():
    before = (torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision())
    with W.determinism(torch) as s:
        assert s["deterministic_algorithms"] and torch.are_deterministic_algorithms_enabled()
        assert torch.get_float32_matmul_precision() == "highest"
    assert (torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision()) == before


def test_workload_selection():
    assert W.workloads_for("gpu") == list(W.WORKLOADS)
    assert "gemm.tf32" not in W.workloads_for("cpu")
    ws, skipped = W.select_workloads(["all"], "cpu")
    assert ws == ["gemm.fp32", "gemm.bf16", "gemm.fp16", "transformer.step"]
    assert "TF32" in skipped["gemm.tf32"]
    assert W.select_workloads(["gemm.bf16", "gemm.fp32"], "gpu") == (["gemm.fp32", "gemm.bf16"], {})
    with pytest.raises(W.WorkloadError, match="unknown workload 'gemm.fp8'"):
        W.select_workloads(["gemm.fp8"], "gpu")
    with pytest.raises(W.WorkloadError):
        W.select_workloads([], "gpu")


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("dist", W.DISTRIBUTIONS)
def test_operands_are_exact_in_their_dtype(dtype, dist):
    """Every generated value is representable in its dtype (materialize raises otherwise), the
    "wide" operands span many binades, and the draws depend only on the seed."""
    tdt = getattr(torch, W._TORCH_DTYPE[dtype])
    a = W.gemm_operand(torch, dtype, dist, (40, 72), 0, "test", dist, "A").materialize(torch, "cpu", tdt)
    b = W.gemm_operand(torch, dtype, dist, (40, 72), 0, "test", dist, "A").materialize(torch, "cpu", tdt)
    assert a.dtype == tdt and torch.equal(a.view(-1).float(), b.view(-1).float())
    nz = a.float().abs()[a.float() != 0]
    assert nz.numel() > 0.8 * a.numel() or dist == "mixed"
    if dist == "wide":
        spread = torch.log2(nz.max() / nz.min()).item()
        assert spread > (6 if dtype == "fp16" else 20), spread
    c = W.gemm_operand(torch, dtype, dist, (40, 72), 0, "test", dist, "B").materialize(torch, "cpu", tdt)
    assert not torch.equal(a.float(), c.float())  # another seed, other values


def test_exact_cast_refuses_rounding():
    x = torch.tensor([1.0 + 2.0**-10], dtype=torch.float32)
    with pytest.raises(W.WorkloadError, match="not exact"):
        W.exact_cast(torch, x, torch.bfloat16)
    assert W.exact_cast(torch, x, torch.float16).item() == 1.0 + 2.0**-10
    e = torch.tensor([-126, -1, 0, 127], dtype=torch.int32)
    assert W.pow2(torch, e).tolist() == [2.0**-126, 0.5, 1.0, 2.0**127]


def test_digest_is_stable_and_follows_the_documented_format(cpu):
    dev, chan = cpu
    pre = W.preset_for("cpu")
    out1 = W.run_workload(torch, dev, "gemm.bf16", pre, chan.heartbeat)
    out2 = W.run_workload(torch, dev, "gemm.bf16", pre)
    d1, parts1, n1 = W.digest(torch, "gemm.bf16", out1)
    d2, parts2, _ = W.digest(torch, "gemm.bf16", out2)
    assert d1 == d2 and parts1 == parts2
    assert len(out1) == len(pre.gemm_shapes) * len(W.DISTRIBUTIONS)
    assert chan.heartbeats >= len(out1)
    # Recompute from the documented manifest with numpy's bytes, independently of tensor_bytes.
    lines = [f"gpucheck.repro {W.WORKLOAD_VERSION} gemm.bf16\n"]
    total = 0
    for label, t in out1:
        raw = t.contiguous().view(torch.int16).numpy().tobytes()
        total += len(raw)
        lines.append(f"{label} bfloat16 {','.join(map(str, t.shape))} {hashlib.sha256(raw).hexdigest()}\n")
    assert hashlib.sha256("".join(lines).encode()).hexdigest() == d1 and total == n1
    # Other workloads, other digests.
    d32, _, _ = W.digest(torch, "gemm.fp32", W.run_workload(torch, dev, "gemm.fp32", pre))
    assert d32 != d1


def test_tensor_bytes_of_views():
    x = torch.arange(10, dtype=torch.float32)[3:7]
    _, mv = W.tensor_bytes(torch, x)
    assert bytes(mv) == x.numpy().tobytes()
    y = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # not contiguous
    _, mv = W.tensor_bytes(torch, y)
    assert bytes(mv) == y.contiguous().numpy().tobytes()


@pytest.mark.parametrize("dtype,bit", [(torch.float32, 0), (torch.float32, 31), (torch.bfloat16, 15),
                                       (torch.float16, 3)])
def test_flip_bit_changes_exactly_one_bit(dtype, bit):
    t = torch.linspace(-3, 3, 64).to(dtype)
    before = t.clone()
    idx, b = W.flip_bit(torch, t, None, bit)
    assert (idx, b) == (32, bit)
    width = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
    x = (t.view(width) ^ before.view(width))
    assert int((x != 0).sum()) == 1
    assert int(x[32].item()) & ((1 << (8 * t.element_size())) - 1) == 1 << bit
    with pytest.raises(W.WorkloadError, match="out of range"):
        W.flip_bit(torch, t, 64, 0)
    with pytest.raises(W.WorkloadError, match="bit 40 out of range"):
        W.flip_bit(torch, t, 0, 40)


@pytest.mark.slow
def test_transformer_training_step(cpu):
    dev, chan = cpu
    pre = W.preset_for("cpu")
    cfg = pre.transformer
    assert cfg.width == 512 and W.PRESET_DEFS["gpu"].transformer.width == 512
    out = W.run_workload(torch, dev, "transformer.step", pre, chan.heartbeat)
    labels = [label for label, _ in out]
    names = list(W.param_shapes(cfg))
    assert labels == ["loss", "logits", *(f"grad.{n}" for n in names), *(f"param.{n}" for n in names)]
    loss = out[0][1]
    assert torch.isfinite(loss) and 4.0 < loss.item() < 7.0  # about ln(256) for near-uniform logits
    by = dict(out)
    init = W.init_params(torch, cfg, "cpu")
    for n in names:
        assert by[f"grad.{n}"].abs().sum() > 0, n  # every parameter takes part
        assert by[f"param.{n}"].dtype == torch.bfloat16
    assert not torch.equal(by["param.embed"], init["embed"])  # the optimizer stepped
    d1, _, _ = W.digest(torch, "transformer.step", out)
    d2, _, _ = W.digest(torch, "transformer.step", W.run_workload(torch, dev, "transformer.step", pre))
    assert d1 == d2
    assert torch.are_deterministic_algorithms_enabled()


def test_cpu_fingerprint_fields(cpu):
    from gpucheck.repro.fingerprint import cpu_fingerprint

    fp = cpu_fingerprint(torch, preset="cpu")
    assert tuple(fp) == CPU_FIELDS
    assert fp["threads"] == 1 and fp["workload_version"] == W.WORKLOAD_VERSION and fp["torch"] == torch.__version__
    key = fingerprint_key(fp)
    assert len(key) == 64 and key == fingerprint_key(json.loads(json.dumps(fp)))
    other = dict(fp, threads=2)
    assert fingerprint_key(other) != key and differences(fp, other) == ["threads: 1 vs 2"]
    assert "1 thread(s)" in describe(fp)


def test_modules_import_nothing_heavy():
    code = ("import sys\n"
            "import gpucheck.repro.majority, gpucheck.repro.store, gpucheck.repro.fingerprint, "
            "gpucheck.repro.workloads, gpucheck.repro.worker, gpucheck.repro.judge, gpucheck.tests_suite.repro_bitwise, "
            "gpucheck.cli.repro\n"
            "bad = [m for m in ('torch', 'numpy', 'cupy') if m in sys.modules]\n"
            "assert not bad, bad\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
