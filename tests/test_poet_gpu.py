"""poet.ortho on a real GPU (run on the GPU machine: python3 -m pytest -m gpu tests/test_poet_gpu.py).

The CUDA kernels through CuPy against the float64 / torch references for every dtype and block
size (the tensor-core kernel poet_bd_mma included: within its derived bound, the same bits when
run again, agreeing with the CUDA-core kernel within both bounds, and its speed against torch.bmm
recorded), every invariant on the device, healthy seeds, injected faults in any bit, a kernel
fault surfacing as KernelError, and `gpucheck poet` end to end on the node's GPUs (the tests
marked gpu).

Unmarked, so in the CPU suite: what the CuPy launches are made of, checked against poet.cu itself
(the launch arguments' C types against the kernels' parameter lists, the tile constants, the
static shared memory, CUDA's grid limits), which no CPU emulation exercises."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpucheck.poet.bounds import STORE_ROUNDOFF, cnp_coeff, stage_floor, unit_acc_coeff, unit_floor
from gpucheck.poet.invariants import INJECT_OPS, INVARIANTS, VerifyConfig, check_problem

needs_gpu = pytest.mark.gpu
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


def _require_cupy_and_cuda():
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _problem(gpu, dtype, b, seed, n=1024, m=512, chain=3, index=None):
    from gpucheck.poet.ortho import make_problem

    torch, dev, _, _, pool = gpu
    return make_problem(torch, dev, pool, index=seed if index is None else index, seed=seed, dtype=dtype, b=b, n=n,
                        m=m, rho_min=0.1, rho_max=0.5, chain_steps=chain)


@needs_gpu
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
    beta = u * Gx.abs() + cnp_coeff(b, u) * P + stage_floor(dtype, 4 * b)
    assert bool(((G.to(f64) - Gx).abs() <= beta).all())
    assert bool(((G.to(f64) - tops.cnp(p.t_in.Q, dtype).to(f64)).abs() <= 2 * beta).all())
    # (1) and (3): block-diagonal apply in every mode, on every unit (tensor cores for bf16/fp16)
    X, perm, inv = p.x, p.t_in.perm, p.t_in.inv
    assert cops.units(dtype) == (("cuda",) if dtype == "fp32" else ("tensor", "cuda"))
    for src, kw in ((X, dict(in_idx=perm)), (X, dict(transpose=True, out_idx=perm)),
                    (X, dict(in_idx=perm, out_idx=inv)), (X, dict()), (p.W, dict(x_t=True, y_t=True, out_idx=inv))):
        ref = bd_torch(torch, src.to(f64), G.to(f64), acc=f64, **kw)
        absr = bd_torch(torch, src.to(f64).abs(), G.to(f64).abs(), acc=f64, **kw)
        out = {}
        for unit in cops.units(dtype):
            Y = cops.bd(src, G, unit=unit, **kw)
            again = cops.bd(src, G, unit=unit, **kw)
            cops.sync()
            bound = u * ref.abs() + (1 + u) * unit_acc_coeff(unit, b) * absr + unit_floor(unit, dtype, b)
            assert bool(((Y.to(f64) - ref).abs() <= bound).all()), (unit, kw)
            assert torch.equal(Y.view(torch.int16 if Y.element_size() == 2 else torch.int32),
                               again.view(torch.int16 if Y.element_size() == 2 else torch.int32)), (unit, kw)
            out[unit] = (Y, bound)
        tbound = u * ref.abs() + (1 + u) * unit_acc_coeff("torch", b) * absr + unit_floor("torch", dtype, b)
        Yt = tops.bd(src, G, **kw)
        for unit, (Y, bound) in out.items():
            assert bool(((Y.to(f64) - Yt.to(f64)).abs() <= bound + tbound).all()), (unit, kw)
        if len(out) == 2:  # the two units agree within the sum of their bounds (core_agreement)
            (Ya, ba), (Yb, bb) = out["tensor"], out["cuda"]
            assert bool(((Ya.to(f64) - Yb.to(f64)).abs() <= ba + bb).all()), kw


@needs_gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64, 128, 256])
def test_every_invariant_holds_on_the_device(gpu, dtype, b):
    torch, dev, cops, _, _ = gpu
    out = check_problem(torch, cops, _problem(gpu, dtype, b, seed=100 + b, n=2048, m=1024), VerifyConfig())
    assert out["violations"] == [], out["violations"][:2]
    two_units = dtype != "fp32"  # bf16/fp16 on sm_80+: tensor cores and CUDA cores
    assert set(out["ratios"]) == set(INVARIANTS) - (set() if two_units else {"core_agreement"})
    assert max(out["ratios"].values()) <= 1.0
    # 6 CNP constructions of 3 launches and 9 block-diagonal applies, each run twice, on every unit
    assert out["launches"] == 2 * 6 * 3 + 2 * (2 if two_units else 1) * 9


@needs_gpu
def test_healthy_device_problems_never_fail_over_many_seeds(gpu):
    torch, dev, cops, _, _ = gpu
    for dtype in ("fp32", "bf16", "fp16"):
        for s in range(24):
            b = (32, 64, 128, 256)[s % 4]
            out = check_problem(torch, cops, _problem(gpu, dtype, b, seed=5000 + s, n=512, m=256, chain=2),
                                VerifyConfig())
            assert out["violations"] == [], (dtype, s, out["violations"][:1])


@needs_gpu
def test_the_torch_backend_on_the_device_is_clean_too(gpu):
    torch, dev, _, tops, _ = gpu
    for dtype in ("fp32", "bf16", "fp16"):
        out = check_problem(torch, tops, _problem(gpu, dtype, 128, seed=7, n=2048, m=1024), VerifyConfig())
        assert out["violations"] == [], out["violations"][:1]


@needs_gpu
@pytest.mark.parametrize("op", INJECT_OPS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_flipped_bit_in_a_kernel_output_is_caught_on_the_device(gpu, op, dtype):
    torch, dev, cops, _, _ = gpu
    p = _problem(gpu, dtype, 64, seed=3, index=0)
    out = check_problem(torch, cops, p, VerifyConfig(), inject={"op": op})
    fired = {v["invariant"] for v in out["violations"]}
    assert ("cnp_reference" if op == "cnp" else "kernel_reference") in fired, fired
    assert len(out["injected"]) == 1


@needs_gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_a_flip_in_any_bit_of_any_kernel_output_fails_on_the_device(gpu, dtype):
    """Every bit of every operation's output: the repeat of the kernel on the same inputs differs
    in that bit (repeat_bitwise), whatever the rounding bounds would let through."""
    torch, dev, cops, _, _ = gpu
    nbits = 32 if dtype == "fp32" else 16
    for op in INJECT_OPS:
        for bit in range(nbits):
            p = _problem(gpu, dtype, 64, seed=11, n=256, m=128, chain=1, index=0)
            out = check_problem(torch, cops, p, VerifyConfig(ortho_blocks=1), inject={"op": op, "bit": bit})
            fired = {v["invariant"] for v in out["violations"]}
            assert "repeat_bitwise" in fired, (op, bit, fired)


@needs_gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64, 128, 256])
def test_the_tensor_core_kernel_at_gpu_size_against_torch_bmm(gpu, dtype, b, record_property):
    """m = 16384, n = 4096 (the benchmark's size): the tensor-core kernel within its derived bound
    of the float64 reference (computed in row chunks), the same bits on every run, and its time
    against torch.bmm with the gather (recorded, not judged: benchmarks/bench_poet.py measures)."""
    import time

    from gpucheck.poet.ortho import bd_torch

    torch, dev, cops, tops, _ = gpu
    f64 = torch.float64
    p = _problem(gpu, dtype, b, seed=b, n=4096, m=16384, chain=1)
    G = tops.cnp(p.t_in.Q, dtype)
    X, perm = p.x, p.t_in.perm
    Y = cops.bd(X, G, in_idx=perm)
    again = cops.bd(X, G, in_idx=perm)
    cops.sync()
    assert torch.equal(Y.view(torch.int16), again.view(torch.int16))
    u = STORE_ROUNDOFF[dtype]
    for r0 in range(0, p.m, 2048):
        Xr = X[r0:r0 + 2048]
        ref = bd_torch(torch, Xr.to(f64), G.to(f64), in_idx=perm, acc=f64)
        absr = bd_torch(torch, Xr.to(f64).abs(), G.to(f64).abs(), in_idx=perm, acc=f64)
        bound = u * ref.abs() + (1 + u) * unit_acc_coeff("tensor", b) * absr + unit_floor("tensor", dtype, b)
        assert bool(((Y[r0:r0 + 2048].to(f64) - ref).abs() <= bound).all()), r0

    def timed(fn, reps=20):
        fn()
        torch.cuda.synchronize(dev)
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize(dev)
        return (time.perf_counter() - t) / reps

    k = p.n // b
    perm32 = perm.to(torch.int32)  # converted once, not inside the timing
    t_mma = timed(lambda: cops.bd(X, G, in_idx=perm32))
    t_cuda = timed(lambda: cops.bd(X, G, in_idx=perm32, unit="cuda"))
    t_bmm = timed(lambda: torch.bmm(X.index_select(1, perm).reshape(p.m, k, b).transpose(0, 1), G)
                  .transpose(0, 1).reshape(p.m, p.n))
    cops.sync()
    tflops = 2.0 * p.m * p.n * b / 1e12
    record_property("tensor_core_tflops", tflops / t_mma)
    record_property("cuda_core_tflops", tflops / t_cuda)
    record_property("bmm_gather_tflops", tflops / t_bmm)
    print(f"\n{torch.cuda.get_device_name(dev)} {dtype} b={b}: tensor cores {tflops / t_mma:.1f} TFLOP/s, "
          f"CUDA cores {tflops / t_cuda:.1f}, torch bmm+gather {tflops / t_bmm:.1f}; "
          f"ratio vs bmm+gather {t_bmm / t_mma:.2f}")


@needs_gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_emulators_mma_model_against_the_hardware(gpu, dtype, record_property):
    """The CPU emulator's arithmetic model of mma.sync (the products and c summed in binary64,
    truncated to fp32 once) is a model, not the hardware: the same tensor-core kernel on the GPU
    and under the emulator, on the same inputs, both within the tensor-core bound of float64;
    the share of output elements whose bits differ is recorded (0 would mean the model is
    bit-accurate on these data)."""
    import cudaemu
    import poet_emu

    from gpucheck.poet.ortho import bd_torch

    if cudaemu.usable():
        pytest.skip(cudaemu.usable())
    torch, dev, cops, _, _ = gpu
    f64 = torch.float64
    b = 64
    p = _problem(gpu, dtype, b, seed=21, n=2 * b, m=256, chain=1)
    G = cops.cnp(p.t_in.Q, dtype)
    Y = cops.bd(p.x, G, in_idx=p.t_in.perm)
    cops.sync()
    emu = poet_emu.EmuOps(poet_emu.build())
    Ye = emu.bd(p.x.cpu(), G.cpu(), in_idx=p.t_in.perm.cpu())
    X64, G64 = p.x.cpu().to(f64), G.cpu().to(f64)
    ref = bd_torch(torch, X64, G64, in_idx=p.t_in.perm.cpu(), acc=f64)
    absr = bd_torch(torch, X64.abs(), G64.abs(), in_idx=p.t_in.perm.cpu(), acc=f64)
    u = STORE_ROUNDOFF[dtype]
    bound = u * ref.abs() + (1 + u) * unit_acc_coeff("tensor", b) * absr + unit_floor("tensor", dtype, b)
    assert bool(((Y.cpu().to(f64) - ref).abs() <= bound).all()) and bool(((Ye.to(f64) - ref).abs() <= bound).all())
    differ = float((Y.cpu().view(torch.int16) != Ye.view(torch.int16)).double().mean())
    record_property("emulator_bits_differ_share", differ)
    print(f"\n{torch.cuda.get_device_name(dev)} {dtype}: {differ:.2%} of the tensor-core outputs differ in bits "
          "from the emulator's model")


@needs_gpu
def test_a_faulting_kernel_is_a_kernel_error_naming_the_launch():
    """A launch on a bad address must surface as KernelError naming that launch at the sync after
    it, not as a later, unrelated failure. In a subprocess: the fault poisons that process's CUDA
    context."""
    _require_cupy_and_cuda()
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
            ops._run("poet_bd_apply_f32", (2, 2, 1), args)  # launched: the fault surfaces at the sync
            ops.sync()
        except KernelError as e:
            print("KERNELERROR", e, flush=True)  # before the poisoned context's teardown at exit
        else:
            print("NO ERROR", flush=True)
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


@needs_gpu
def test_gpucheck_poet_end_to_end_on_the_gpus(tmp_path):
    _require_cupy_and_cuda()
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


# ---------------------------------------------------------------------------------------------
# the launches against poet.cu (CPU: no CuPy, no GPU)

POET_CU = ROOT / "gpucheck" / "kernels" / "poet.cu"
# the C type of a kernel parameter -> the NumPy scalar type CuPy must be handed for it
C_TO_NUMPY = {"ptr": "uint64", "gc_i64": "int64", "int": "int32", "float": "float32"}


def _kernel_signatures() -> dict[str, list[str]]:
    """Entry point name -> the C types of its parameters ("ptr" for any pointer), from poet.cu's
    POET_*_ENTRY macros and their instantiations."""
    text = POET_CU.read_text()
    macros: dict[str, list[str]] = {}
    for m in re.finditer(r"#define (POET_\w+_ENTRY)\(NAME, TAG\)((?:[^\n]*\\\n)+[^\n]*)", text):
        body = m.group(2).replace("\\\n", " ")
        params = re.search(r"\bNAME\(([^)]*)\)", body).group(1)
        types = []
        for p in params.split(","):
            decl = p.strip().rsplit(None, 1)[0] if "*" not in p else "ptr"
            types.append(decl.replace("const ", "").strip())
        macros[m.group(1)] = types
    sigs = {}
    for m in re.finditer(r"^(POET_\w+_ENTRY)\((\w+), \w+\)$", text, re.M):
        sigs[m.group(2)] = macros[m.group(1)]
    return sigs


def _defines() -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define (POET_\w+) (\d+)$", POET_CU.read_text(), re.M)}


def test_the_launch_constants_are_poet_cu_s():
    from gpucheck.poet import cupy_ops as co

    d = _defines()
    assert (d["POET_THREADS"], d["POET_TN"], d["POET_TK"], d["POET_BD_TM"], d["POET_CNP_TM"]) == \
        (co.THREADS, co.TN, co.TK, co.BD_TM, co.CNP_TM)
    assert (d["POET_MMA_THREADS"], d["POET_MMA_TM"], d["POET_MMA_TN"], d["POET_MMA_KC"], d["POET_MMA_BMAX"],
            d["POET_MMA_PAD"], d["POET_MMA_MIN_BLOCKS"]) == (co.MMA_THREADS, co.MMA_TM, co.MMA_TN, co.MMA_KC,
                                                          co.MMA_BMAX, co.MMA_PAD, co.MMA_MIN_BLOCKS)
    # a thread owns (TM/32) x 4 outputs: 8 threads across the 32 tile columns, 32 down the rows
    assert co.THREADS == (co.TN // 4) * 32 and co.THREADS <= co.MAX_BLOCK_THREADS
    assert co.BD_TM % 32 == 0 and co.CNP_TM % 32 == 0
    # the tensor-core kernel: a warp per 16 rows (one m16 strip), 4 n8 tiles per pass, k16 steps
    assert co.MMA_THREADS == 32 * (co.MMA_TM // 16) and co.MMA_TN == 4 * 8 and co.MMA_KC % 16 == 0
    assert co.MMA_BMAX % co.MMA_KC == 0 and co.MMA_PAD * 2 == 16  # 16-byte aligned, conflict-free rows


def test_static_shared_memory_fits_every_launch():
    from gpucheck.poet import cupy_ops as co

    assert co.tile_shared_bytes(co.BD_TM) == 4 * (32 * 129 + 32 * 33) == 20736
    assert co.tile_shared_bytes(co.CNP_TM) == 4 * (32 * 65 + 32 * 33) == 12544
    assert max(co.tile_shared_bytes(tm) for tm in (co.BD_TM, co.CNP_TM)) <= co.MAX_STATIC_SHARED
    assert co.mma_shared_bytes() == 2 * (64 * 136 + 64 * 40) + 8 * 256 == 24576 <= co.MAX_STATIC_SHARED


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64, 128, 256])
def test_launch_arguments_have_the_kernel_parameters_types(dtype, b):
    """Every argument CupyOps hands CuPy is a NumPy scalar of exactly its parameter's C type (a
    Python int would go as 8 bytes), in the kernel's order, with the grid of the docs."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    from gpucheck.poet.cupy_ops import bd_plan, cnp_plan, launch_args
    from gpucheck.poet.ortho import storage_dtype

    sigs = _kernel_signatures()
    assert len(sigs) == 8
    st = storage_dtype(torch, dtype)
    k, m = 2, 130
    n = k * b
    X, G, Y = torch.zeros(m, n, dtype=st), torch.zeros(k, b, b, dtype=st), torch.zeros(m, n, dtype=st)
    idx = torch.arange(n, dtype=torch.int32)
    Q, H1, H2 = (torch.zeros(k, b, b) for _ in range(3))
    launches = [bd_plan(X, G, Y, in_idx=idx, transpose=True), *cnp_plan(Q, H1, H2, G)]
    if dtype != "fp32":
        launches.append(bd_plan(X, G, Y, in_idx=idx, transpose=True, tensor_cores=True))
        assert launches[-1][0] == f"poet_bd_mma_{dtype.replace('fp', 'f')}" and launches[-1][1] == (k, 3, 1)
    for kernel, grid, args in launches:
        conv = launch_args(args, np)
        assert kernel in sigs, kernel
        assert [np.dtype(type(a)).name for a in conv] == [C_TO_NUMPY[t] for t in sigs[kernel]], kernel
        assert all(isinstance(a, np.generic) for a in conv)
        for (kind, v), a in zip(args, conv):
            if kind == "ptr":
                assert int(a) == (0 if v is None else v.data_ptr())
            else:
                assert a == v
    assert launches[0][1] == (n // 32, (m + 127) // 128, 1)
    assert launches[1][1] == (n // 32, (b + 63) // 64, 1)
    ptrs = [int(a) for a in launch_args(launches[0][2], np)[:5] if a.dtype == np.uint64]
    assert ptrs == [X.data_ptr(), G.data_ptr(), Y.data_ptr()]


def test_launch_arguments_and_grids_refuse_what_cuda_cannot_take():
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    from gpucheck.poet.cupy_ops import MAX_ROWS, bd_plan, launch_args, size_problem

    with pytest.raises(ValueError, match="int32"):
        launch_args([("i32", 2**31)], np)
    with pytest.raises(ValueError, match="int64"):
        launch_args([("i64", -(2**63) - 1)], np)
    assert launch_args([("i32", -(2**31)), ("f32", 2.0)], np) == (np.int32(-(2**31)), np.float32(2.0))
    # gridDim.y <= 65535 row tiles: more rows is a ValueError before any launch, and a setup error
    meta = dict(device="meta", dtype=torch.bfloat16)
    G = torch.empty(1, 32, 32, **meta)
    assert MAX_ROWS == 65535 * 64  # the tensor-core kernel's 64-row tiles are the smaller
    kernel, grid, _ = bd_plan(torch.empty(MAX_ROWS, 32, **meta), G, torch.empty(MAX_ROWS, 32, **meta),
                              tensor_cores=True)
    assert grid == (1, 65535, 1)
    with pytest.raises(ValueError, match="grid"):
        bd_plan(torch.empty(MAX_ROWS + 1, 32, **meta), G, torch.empty(MAX_ROWS + 1, 32, **meta), tensor_cores=True)
    big = 65535 * 128  # the CUDA-core kernel's 128-row tiles reach further, size_problem the lesser
    assert bd_plan(torch.empty(big, 32, **meta), G, torch.empty(big, 32, **meta))[1] == (1, 65535, 1)
    assert size_problem(4096, 4096) is None and "rows" in size_problem(MAX_ROWS + 1, 4096)
    # the kernel reads int32 indices
    X, Y = torch.zeros(4, 32), torch.zeros(4, 32)
    with pytest.raises(ValueError, match="int32"):
        bd_plan(X, torch.zeros(1, 32, 32), Y, in_idx=torch.arange(32))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_poet_cu_compiles_with_the_options_cupy_compiles_it_with(arch):
    """cupy.RawModule adds its own NVRTC options after gpucheck's (CuPy 14: -ftz=true, then
    --device-as-default-execution-space with the -arch): the source must compile with those too."""
    import nvrtc

    from gpucheck import kernels
    from gpucheck.kernels.cupy_module import OPTIONS

    if nvrtc.find_library() is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    ptx = nvrtc.compile_ptx(kernels.source("poet"), "poet", arch,
                            OPTIONS + ("-ftz=true", "--device-as-default-execution-space"))
    assert sorted(re.findall(r"\.entry (\w+)", ptx)) == sorted(_kernel_signatures())
