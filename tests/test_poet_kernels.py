"""gpucheck/kernels/poet.cu on the CPU (tests/cudaemu.py): the very kernels and launch plans the
GPU runs, against the torch/float64 reference for every dtype, and the whole per-problem check
(every invariant) run on them, healthy and with an injected bit flip."""

from __future__ import annotations

import os
import re

import pytest

import cudaemu
import nvrtc
from gpucheck import kernels
from gpucheck.kernels.cupy_module import OPTIONS
from gpucheck.poet.bounds import STORE_ROUNDOFF, U32, acc_coeff, cnp_coeff, stage_floor
from gpucheck.poet.invariants import VerifyConfig, check_problem

torch = pytest.importorskip("torch")

import poet_emu  # noqa: E402
from gpucheck.poet.cupy_ops import bd_plan, cnp_plan  # noqa: E402
from gpucheck.poet.ortho import QPool, TorchOps, bd_torch, cnp_torch, make_problem  # noqa: E402

CPU = torch.device("cpu")
F64 = torch.float64


@pytest.fixture(scope="module")
def lib():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    torch.set_num_threads(1)
    return poet_emu.build()


EmuOps = poet_emu.EmuOps


def _data(dtype, m, k, b, seed):
    g = torch.Generator().manual_seed(seed)
    st = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    n = k * b
    X = torch.randn(m, n, generator=g).to(st)
    G = (torch.eye(b) + 0.2 * torch.randn(k, b, b, generator=g) / b**0.5).to(st)
    perm = torch.randperm(n, generator=g)
    return X, G, perm


def _assert_bd_within_bound(dtype, Y, X, G, **kw):
    """|Y - ref64| <= u |ref| + (1 + u) c_b |X| |BD(G)| + floor: the kernel_reference bound."""
    b = G.shape[-1]
    u = STORE_ROUNDOFF[dtype]
    ref = bd_torch(torch, X.double(), G.double(), acc=F64, **kw)
    absr = bd_torch(torch, X.double().abs(), G.double().abs(), acc=F64, **kw)
    bound = u * ref.abs() + (1 + u) * acc_coeff(b, U32) * absr + stage_floor(dtype, b)
    err = (Y.double() - ref).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    return bound


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b,k,m", [(32, 3, 40), (64, 2, 130)])
def test_bd_kernel_matches_the_reference_in_every_mode(lib, dtype, b, k, m):
    """Gather in, scatter out, transposed blocks, transposed operand and result; m not a multiple
    of the 128-row tile (row guard); two row tiles for m = 130."""
    ops, tops = EmuOps(lib), TorchOps(torch, CPU)
    X, G, perm = _data(dtype, m, k, b, seed=b + m)
    inv = torch.argsort(perm)
    modes = [dict(in_idx=perm), dict(transpose=True, out_idx=perm), dict(in_idx=perm, out_idx=inv, transpose=True),
             dict()]
    for kw in modes:
        Y = ops.bd(X, G, unit="cuda", **kw)  # the CUDA-core kernel (bf16/fp16 default to tensor cores)
        assert Y.dtype == X.dtype and tuple(Y.shape) == (m, k * b)
        bound = _assert_bd_within_bound(dtype, Y, X, G, **kw)
        # the torch backend (fp32 accumulation in another order) is within the same bound of the
        # reference, so the two agree within twice that
        Yt = tops.bd(X, G, **kw)
        assert bool(((Y.double() - Yt.double()).abs() <= 2 * bound).all())
    # x_t / y_t: a square operand read and written transposed (the weight-centric merge)
    Wt = torch.randn(k * b, k * b, generator=torch.Generator().manual_seed(1)).to(X.dtype)
    Y = ops.bd(Wt, G, x_t=True, y_t=True, out_idx=inv, unit="cuda")
    _assert_bd_within_bound(dtype, Y, Wt, G, x_t=True, y_t=True, out_idx=inv)
    assert [c[0] for c in ops.calls] == [f"poet_bd_apply_{ {'fp32': 'f32', 'bf16': 'bf16', 'fp16': 'f16'}[dtype]}"] * 5
    assert ops.calls[0][1] == (k * b // 32, (m + 127) // 128, 1)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64])
def test_cnp_kernel_matches_the_float64_cayley_neumann(lib, dtype, b):
    ops = EmuOps(lib)
    pool = QPool(torch, CPU, seed=1)
    p = make_problem(torch, CPU, pool, index=0, seed=b, dtype=dtype, b=b, n=3 * b, m=8, rho_min=0.1, rho_max=0.5,
                     chain_steps=1)
    G = ops.cnp(p.t_in.Q, dtype)
    assert [c[0] for c in ops.calls] == ["poet_cnp_step_f32", "poet_cnp_step_f32",
                                         f"poet_cnp_step_{ {'fp32': 'f32', 'bf16': 'bf16', 'fp16': 'f16'}[dtype]}"]
    Q64 = p.t_in.Q.double()
    Gx = cnp_torch(torch, Q64, acc=F64)
    P = cnp_torch(torch, Q64.abs(), acc=F64)
    u = STORE_ROUNDOFF[dtype]
    beta = u * Gx.abs() + cnp_coeff(b, u) * P + stage_floor(dtype, 4 * b)
    assert bool(((G.double() - Gx).abs() <= beta).all())
    # the torch backend evaluates the same Horner order: within the same bound, so within 2 beta
    Gt = TorchOps(torch, CPU).cnp(p.t_in.Q, dtype)
    assert bool(((G.double() - Gt.double()).abs() <= 2 * beta).all())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_the_whole_check_runs_on_the_emulated_kernels(lib, dtype):
    ops = EmuOps(lib)
    pool = QPool(torch, CPU, seed=2)
    p = make_problem(torch, CPU, pool, index=1, seed=31, dtype=dtype, b=32, n=64, m=40, rho_min=0.1, rho_max=0.5,
                     chain_steps=2)
    out = check_problem(torch, ops, p, VerifyConfig(ortho_blocks=2))
    # 4 CNP constructions of 3 launches and 7 block-diagonal applies, each run twice; bf16 and fp16
    # run every apply on both units (tensor cores and CUDA cores)
    units = 2 if dtype != "fp32" else 1
    assert out["violations"] == [] and out["launches"] == 2 * (4 * 3) + 2 * units * 7
    assert all(r <= 1.0 for r in out["ratios"].values())
    assert out["checks"]["repeat_bitwise"] == 4 + 7 * units and out["ratios"]["repeat_bitwise"] == 0.0
    assert out["checks"].get("core_agreement", 0) == 7 * (units - 1)
    # the same problem with a flipped bit in one kernel output: caught
    p = make_problem(torch, CPU, pool, index=1, seed=31, dtype=dtype, b=32, n=64, m=40, rho_min=0.1, rho_max=0.5,
                     chain_steps=2)
    out = check_problem(torch, EmuOps(lib), p, VerifyConfig(ortho_blocks=2), inject={"op": "output", "problem": 1})
    assert out["violations"] and out["violations"][0]["invariant"] == "kernel_reference"
    assert out["violations"][0]["op"] == "bd_apply Z·BD(G_out)·Π_out" and out["violations"][0]["where"] == "row 20, col 21"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_bound_holds_at_the_bottom_of_fp32_under_the_gpus_flush_to_zero(lib, dtype):
    """Operands whose products (about 2^-126) and sums are subnormal or just above, on the kernels
    as the GPU runs them under CuPy's -ftz=true (the emulator flushes as it does): the kernel_reference
    bound, with its floor of 2^-150 per operation, holds because the kernels accumulate with gc_fmaf
    (fma.rn.f32, no .ftz). With __fmaf_rn (fma.rn.ftz.f32) the subnormal products vanish and the
    error is about 2^-126 (tests/test_kernel_infra.py: the dot product at the same scale). fp16
    cannot hold these values."""
    assert cudaemu.gpu_flushes_subnormals()
    ops = EmuOps(lib)
    g = torch.Generator().manual_seed(11)
    st = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    m, k, b = 40, 2, 32
    X = (torch.randn(m, k * b, generator=g) * 2.0**-64).to(st)
    G = (torch.randn(k, b, b, generator=g) * 2.0**-62).to(st)
    tiny = (X.double() @ torch.block_diag(*G.double())).abs()
    assert bool((tiny < 2.0**-126).float().mean() > 0.1)  # many outputs subnormal in fp32
    for kw in (dict(), dict(transpose=True)):
        Y = ops.bd(X, G, unit="cuda", **kw)
        _assert_bd_within_bound(dtype, Y, X, G, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kernels_keep_gradual_underflow_under_cupys_options(arch):
    """The PTX of poet.cu compiled with gpucheck's options plus what CuPy appends (-ftz=true): every
    fp32 fma without .ftz (gc_fmaf), no flushing multiply; the only .ftz operations are the CNP's
    additions of its Horner constants, which no subnormal changes (gpucheck.poet.bounds,
    "Underflow")."""
    if nvrtc.find_library() is None:
        if os.environ.get("GPUCHECK_REQUIRE_NVRTC"):
            pytest.fail("GPUCHECK_REQUIRE_NVRTC is set but libnvrtc was not found (pip install nvidia-cuda-nvrtc)")
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    ptx = nvrtc.compile_ptx(kernels.source("poet"), "poet", arch, OPTIONS + cudaemu.CUPY_APPENDED_OPTIONS)
    assert set(re.findall(r"\b([a-z]+(?:\.[a-z0-9]+)*\.ftz(?:\.[a-z0-9]+)*)", ptx)) == {"add.ftz.f32"}
    assert ptx.count("fma.rn.f32") >= 2 * 32  # the bd and cnp tiles' inner loops, unrolled


def test_launch_plans_refuse_what_the_kernels_cannot_do():
    X = torch.zeros(4, 48)
    G = torch.zeros(3, 16, 16)  # block 16: not a multiple of the 32-column tile
    with pytest.raises(ValueError, match="tile"):
        bd_plan(X, G, torch.zeros(4, 48))
    X = torch.zeros(4, 64)
    G = torch.zeros(2, 32, 32)
    with pytest.raises(ValueError, match="output shape"):
        bd_plan(X, G, torch.zeros(64, 4))
    with pytest.raises(ValueError, match="same storage dtype"):
        bd_plan(X, G.to(torch.bfloat16), torch.zeros(4, 64))
    with pytest.raises(ValueError):
        cnp_plan(torch.zeros(1, 48, 48), torch.zeros(1, 48, 48), torch.zeros(1, 48, 48), torch.zeros(1, 48, 48))
    kernel, grid, args = bd_plan(X, G, torch.zeros(64, 4), x_t=False, y_t=True)
    assert kernel == "poet_bd_apply_f32" and grid == (2, 1, 1)
    assert [a for a in args if a[0] == "i64"] == [("i64", 64), ("i64", 1), ("i64", 1), ("i64", 4)]
