"""poet.ortho on a real GPU (run on the GPU machine: python3 -m pytest -m gpu tests/test_poet_gpu.py).

The CUDA kernels through CuPy against the float64 / torch references for every dtype and block
size, every invariant on the device, healthy seeds, injected faults, a kernel fault surfacing as
KernelError, and `gpucheck poet` end to end on the node's GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpucheck.poet.bounds import STORE_ROUNDOFF, U32, acc_coeff, cnp_theta, stage_floor
from gpucheck.poet.invariants import INJECT_OPS, INVARIANTS, VerifyConfig, check_problem

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu():
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from gpucheck.poet.cupy_ops import CupyOps
    from gpucheck.poet.ortho import QPool, TorchOps, set_precision

    set_precision(torch)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    return torch, dev, CupyOps(torch, dev), TorchOps(torch, dev), QPool(torch, dev, seed=0)


def _problem(gpu, dtype, b, seed, n=1024, m=512, chain=3, index=None):
    from gpucheck.poet.ortho import make_problem

    torch, dev, _, _, pool = gpu
    return make_problem(torch, dev, pool, index=seed if index is None else index, seed=seed, dtype=dtype, b=b, n=n,
                        m=m, rho_min=0.1, rho_max=0.5, chain_steps=chain)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64, 128, 256])
def test_cupy_kernels_match_the_references(gpu, dtype, b):
    from gpucheck.poet.ortho import bd_torch, cnp_torch

    torch, dev, cops, tops, _ = gpu
    f64 = torch.float64
    p = _problem(gpu, dtype, b, seed=b, n=2048, m=1000)
    u = STORE_ROUNDOFF[dtype]
    # (2) Cayley-Neumann
    G = cops.cnp(p.t_in.Q, dtype)
    Q64 = p.t_in.Q.to(f64)
    Gx = cnp_torch(torch, Q64, acc=f64)
    P = cnp_torch(torch, Q64.abs(), acc=f64)
    beta = u * Gx.abs() + (1 + u) * (cnp_theta(b) + 2.0**-50) * P + stage_floor(dtype, 4 * b)
    assert bool(((G.to(f64) - Gx).abs() <= beta).all())
    assert bool(((G.to(f64) - tops.cnp(p.t_in.Q, dtype).to(f64)).abs() <= 2 * beta).all())
    # (1) block-diagonal apply in every mode
    X, perm, inv = p.x, p.t_in.perm, p.t_in.inv
    for src, kw in ((X, dict(in_idx=perm)), (X, dict(transpose=True, out_idx=perm)),
                    (X, dict(in_idx=perm, out_idx=inv)), (p.W, dict(x_t=True, y_t=True, out_idx=inv))):
        Y = cops.bd(src, G, **kw)
        ref = bd_torch(torch, src.to(f64), G.to(f64), acc=f64, **kw)
        absr = bd_torch(torch, src.to(f64).abs(), G.to(f64).abs(), acc=f64, **kw)
        bound = u * ref.abs() + (1 + u) * acc_coeff(b, U32) * absr + stage_floor(dtype, b)
        assert bool(((Y.to(f64) - ref).abs() <= bound).all()), kw
        Yt = tops.bd(src, G, **kw)
        assert bool(((Y.to(f64) - Yt.to(f64)).abs() <= 2 * bound).all()), kw


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64, 128, 256])
def test_every_invariant_holds_on_the_device(gpu, dtype, b):
    torch, dev, cops, _, _ = gpu
    out = check_problem(torch, cops, _problem(gpu, dtype, b, seed=100 + b, n=2048, m=1024), VerifyConfig())
    assert out["violations"] == [], out["violations"][:2]
    assert set(out["ratios"]) == set(INVARIANTS) and max(out["ratios"].values()) <= 1.0
    assert out["launches"] == 6 * 3 + 9  # 6 CNP constructions of 3 launches, 9 block-diagonal applies


def test_healthy_device_problems_never_fail_over_many_seeds(gpu):
    torch, dev, cops, _, _ = gpu
    for dtype in ("fp32", "bf16", "fp16"):
        for s in range(24):
            b = (32, 64, 128, 256)[s % 4]
            out = check_problem(torch, cops, _problem(gpu, dtype, b, seed=5000 + s, n=512, m=256, chain=2),
                                VerifyConfig())
            assert out["violations"] == [], (dtype, s, out["violations"][:1])


def test_the_torch_backend_on_the_device_is_clean_too(gpu):
    torch, dev, _, tops, _ = gpu
    for dtype in ("fp32", "bf16", "fp16"):
        out = check_problem(torch, tops, _problem(gpu, dtype, 128, seed=7, n=2048, m=1024), VerifyConfig())
        assert out["violations"] == [], out["violations"][:1]


@pytest.mark.parametrize("op", INJECT_OPS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_flipped_bit_in_a_kernel_output_is_caught_on_the_device(gpu, op, dtype):
    torch, dev, cops, _, _ = gpu
    p = _problem(gpu, dtype, 64, seed=3, index=0)
    out = check_problem(torch, cops, p, VerifyConfig(), inject={"op": op})
    fired = {v["invariant"] for v in out["violations"]}
    assert ("cnp_reference" if op == "cnp" else "kernel_reference") in fired, fired
    assert len(out["injected"]) == 1


def test_a_faulting_kernel_is_a_kernel_error_naming_the_launch():
    """A launch on a bad address must surface as KernelError at that launch (sync=True), not as a
    later, unrelated failure. In a subprocess: the fault poisons that process's CUDA context."""
    pytest.importorskip("cupy")
    code = textwrap.dedent("""
        import torch
        from gpucheck.kernels.cupy_module import KernelError
        from gpucheck.poet.cupy_ops import CupyOps
        dev = torch.device("cuda", 0)
        ops = CupyOps(torch, dev)
        Y = torch.empty(256, 64, device=dev)
        G = torch.zeros(2, 32, 32, device=dev)
        args = [("ptr", None), ("i64", 64), ("i64", 1), ("ptr", G), ("ptr", Y), ("i64", 64), ("i64", 1),
                ("ptr", None), ("ptr", None), ("i32", 256), ("i32", 32), ("i32", 2), ("i32", 0)]
        try:
            ops._run("poet_bd_apply_f32", (2, 2, 1), args)
        except KernelError as e:
            print("KERNELERROR", e)
        else:
            print("NO ERROR")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "KERNELERROR CUDA kernel poet:poet_bd_apply_f32 grid=(2, 2, 1) block=(256, 1, 1)" in proc.stdout, \
        proc.stdout + proc.stderr


def _gpucheck(tmp_path, *args):
    proc = subprocess.run([sys.executable, "-m", "gpucheck", "poet", "--json", "--state-dir", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_gpucheck_poet_end_to_end_on_the_gpus(tmp_path):
    pytest.importorskip("cupy")
    rc, verdict, err = _gpucheck(tmp_path, "--duration", "20s", "--block", "32,256", "--dtype", "bf16,fp32")
    assert rc == 0, (verdict, err)
    for r in verdict["results"]:
        assert r["status"] == "pass" and r["metrics"]["cuda_kernels"]["value"] == 1, r
        assert r["metrics"]["problems"]["value"] >= 4 and "on the CUDA kernels" in r["summary"]
    rc, verdict, err = _gpucheck(tmp_path, "--duration", "10s", "--block", "64", "--dtype", "bf16",
                                 "--gpus", "0", "--inject", "bitflip:gpu=0")
    assert rc == 1, (verdict, err)
    (r,) = verdict["results"]
    assert r["status"] == "fail" and r["gpu"] == 0 and r["injected"] == ["bitflip:gpu=0"]
    assert r["summary"].startswith("silent data corruption: kernel_reference (bf16, block 64): error ")
