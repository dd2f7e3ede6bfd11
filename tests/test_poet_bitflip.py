"""POET catches a flip in any bit. The rounding bounds of the reference invariants are wider than
the last mantissa bits (a flip of bit 0 of an fp32 output changes it by 2^-23 of itself, inside
any accumulation bound), so every kernel operation also runs twice on the same inputs and the two
results must hold the same bits (repeat_bitwise; every POET kernel has a fixed reduction order,
as the burn's GEMM repeat relies on too). Swept here over every bit position of every dtype and
every operation an injection can hit, on the CPU path (torch) and, for the lowest bit, on the CUDA
kernels under the emulator; and end to end through `gpucheck poet --device cpu`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cudaemu
from gpucheck.poet.invariants import INJECT_OPS, VerifyConfig, check_problem

torch = pytest.importorskip("torch")

import poet_emu  # noqa: E402
from gpucheck.poet.ortho import QPool, TorchOps, make_problem  # noqa: E402

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
BITS = {"fp32": 32, "bf16": 16, "fp16": 16}


@pytest.fixture(scope="module")
def pool():
    torch.set_num_threads(1)
    return QPool(torch, CPU, seed=0)


def _flipped(ops, pool, dtype, op, bit, seed=5):
    p = make_problem(torch, CPU, pool, index=0, seed=seed, dtype=dtype, b=32, n=64, m=16, rho_min=0.1, rho_max=0.5,
                     chain_steps=1)
    return check_problem(torch, ops, p, VerifyConfig(ortho_blocks=1), inject={"op": op, "bit": bit})


@pytest.mark.parametrize("dtype", list(BITS))
@pytest.mark.parametrize("op", INJECT_OPS)
def test_a_flip_in_every_bit_of_every_operation_fails_on_the_cpu_path(pool, dtype, op):
    ops = TorchOps(torch, CPU)
    missed = []
    for bit in range(BITS[dtype]):
        out = _flipped(ops, pool, dtype, op, bit)
        assert len(out["injected"]) == 1, (bit, out["injected"])
        fired = {v["invariant"] for v in out["violations"]}
        if "repeat_bitwise" not in fired:
            missed.append((bit, sorted(fired)))
    assert missed == []
    # and without the flip the same problem is clean: the repeat itself never differs
    p = make_problem(torch, CPU, pool, index=0, seed=5, dtype=dtype, b=32, n=64, m=16, rho_min=0.1, rho_max=0.5,
                     chain_steps=1)
    assert check_problem(torch, ops, p, VerifyConfig(ortho_blocks=1))["violations"] == []


def test_the_lowest_bits_are_caught_only_by_the_repeat(pool):
    """What the bounds let through: bit 0 of an fp32 output is within every rounding bound, and
    repeat_bitwise alone names it, with the two bit patterns."""
    out = _flipped(TorchOps(torch, CPU), pool, "fp32", "output", 0)
    (v,) = out["violations"]
    assert v["invariant"] == "repeat_bitwise" and v["bound"] == 0.0 and v["elements"] == 1
    assert v["where"].startswith("row 8, col 21, bits 0x") and " then 0x" in v["where"]
    assert v["got"] != v["expected"] and abs(v["got"] - v["expected"]) <= 2.0**-22 * abs(v["expected"])


@pytest.fixture(scope="module")
def emu_lib():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    return poet_emu.build()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(BITS))
def test_the_lowest_bit_of_every_kernel_output_fails_on_the_emulated_cuda_kernels(pool, emu_lib, dtype):
    """The CUDA kernels (scalar, tensor-core for bf16/fp16, CNP) run twice give the same bits, so
    a flip of bit 0 of any output (the least visible to the bounds) is caught; the clean problem
    passes on the same kernels."""
    for op in INJECT_OPS:
        out = _flipped(poet_emu.EmuOps(emu_lib), pool, dtype, op, 0)
        assert "repeat_bitwise" in {v["invariant"] for v in out["violations"]}, op
    p = make_problem(torch, CPU, pool, index=0, seed=5, dtype=dtype, b=32, n=64, m=16, rho_min=0.1, rho_max=0.5,
                     chain_steps=1)
    assert check_problem(torch, poet_emu.EmuOps(emu_lib), p, VerifyConfig(ortho_blocks=1))["violations"] == []


@pytest.mark.slow
def test_gpucheck_poet_on_the_cpu_fails_a_flip_of_bits_0_to_5_of_an_fp32_output(tmp_path):
    """The issue's measurement: `gpucheck poet --device cpu --inject bitflip:gpu=0,op=output,bit=B`
    passed for B = 0..5. One run, one CPU worker per bit: every one fails (exit 1, drain), each
    named by repeat_bitwise, and only its own flip is attributed to it."""
    args = [sys.executable, "-m", "gpucheck", "poet", "--device", "cpu", "--workers", "6", "--duration", "2s",
            "--dtype", "fp32", "--block", "32", "--json", "--state-dir", str(tmp_path)]
    for bit in range(6):
        args += ["--inject", f"bitflip:gpu={bit},op=output,bit={bit}"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    results = {r["gpu"]: r for r in verdict["results"]}
    assert sorted(results) == list(range(6))
    for bit, r in results.items():
        assert r["status"] == "fail" and r["action"] == "drain", r
        assert r["summary"].startswith("silent data corruption: repeat_bitwise (fp32, block 32): error "), r["summary"]
        assert r["injected"] == [f"bitflip:gpu={bit},op=output,bit={bit}"]
