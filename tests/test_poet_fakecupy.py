"""poet.ortho's CuPy backend on the CPU: gpucheck.poet.cupy_ops.CupyOps (and the backend selection
and gpucheck.kernels.cupy_module under it) run unchanged against a stub `cupy`
(tests/fakecupy.py) whose launches execute gpucheck/kernels/poet.cu under the CPU emulator, every
argument checked against the kernel's parameter list and every block against its
__launch_bounds__. The tensors are CPU tensors: the test points `CupyOps.tensor_device` (where
every launch's tensors must be) at the CPU and stands in for torch.cuda.current_stream (the
stream the kernels are ordered on); everything else, the argument lists as CuPy gets them, the
grids and blocks of both block-diagonal kernels, the stream and device handling, the single
synchronisation where results are needed (no host sync per launch), and the results, is the GPU
path's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")

import cudaemu  # noqa: E402
import fakecupy  # noqa: E402
from gpucheck.kernels import cupy_module, source  # noqa: E402
from gpucheck.poet.bounds import STORE_ROUNDOFF, cnp_coeff, stage_floor, unit_acc_coeff, unit_floor  # noqa: E402
from gpucheck.poet.cupy_ops import CupyOps, CupyUnavailable  # noqa: E402
from gpucheck.poet.invariants import VerifyConfig, check_problem  # noqa: E402
from gpucheck.poet.ortho import QPool, TorchOps, bd_torch, cnp_torch, make_problem  # noqa: E402
from gpucheck.poet.worker import PoetConfig, PoetRunner, select_backend  # noqa: E402
from gpucheck.core.result import Action, Status  # noqa: E402
from gpucheck.tests_suite.poet_ortho import judge_data  # noqa: E402
from gpucheck.workers.pool import LocalChannel  # noqa: E402

CPU = torch.device("cpu")
CUDA0 = torch.device("cuda", 0)
F64 = torch.float64
SUFFIX = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


class TorchStream:
    """torch.cuda.current_stream(device) on a CPU-only torch: the stream whose handle `ptr` is."""

    def __init__(self):
        self.ptr = 0  # torch's default stream is the legacy null stream
        self.asked = []

    def __call__(self, device=None):
        self.asked.append(device)
        return SimpleNamespace(cuda_stream=self.ptr)


@pytest.fixture
def fake(monkeypatch):
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    fake = fakecupy.install(monkeypatch)
    fake.torch_stream = TorchStream()
    monkeypatch.setattr(torch.cuda, "current_stream", fake.torch_stream)
    return fake


def _ops():
    """CupyOps exactly as the worker makes it for cuda:0, computing on CPU tensors."""
    ops = CupyOps(torch, CUDA0)
    ops.tensor_device = CPU
    return ops


def _problem(dtype, b, m=40, chain_steps=1, seed=None, index=0):
    pool = QPool(torch, CPU, seed=1)
    return make_problem(torch, CPU, pool, index=index, seed=b if seed is None else seed, dtype=dtype, b=b, n=2 * b,
                        m=m, rho_min=0.1, rho_max=0.5, chain_steps=chain_steps)


@pytest.mark.slow
def test_the_backend_selection_picks_the_cupy_kernels_and_compiles_them_once(fake):
    ops, note = select_backend(torch, CUDA0, "auto")
    assert isinstance(ops, CupyOps) and ops.cuda_kernels and note is None
    ops2, _ = select_backend(torch, CUDA0, "cupy")
    assert isinstance(ops2, CupyOps)
    (mod,) = fake.modules  # compiled at the first CupyOps, cached for the device after that
    assert mod.code == source("poet") and mod.options == cupy_module.OPTIONS and fake.launches == []
    assert ops.tensor_device == CUDA0  # production: every tensor of a launch on cuda:0
    assert ops.tensor_cores and ops.units("bf16") == ("tensor", "cuda") and ops.units("fp32") == ("cuda",)
    # a device CuPy does not see: the torch path with the reason, or an error where cupy was asked for
    ops, note = select_backend(torch, torch.device("cuda", 1), "auto")
    assert isinstance(ops, TorchOps) and not ops.cuda_kernels
    assert note == "CuPy 14.2.0+fakecupy sees 1 GPU(s), not cuda:1: the CUDA kernels were not exercised (torch path)"
    with pytest.raises(CupyUnavailable, match="sees 1 GPU"):
        select_backend(torch, torch.device("cuda", 1), "cupy")


def _cnp_bound(Q, dtype):
    b = Q.shape[-1]
    Q64 = Q.double()
    Gx = cnp_torch(torch, Q64, acc=F64)
    u = STORE_ROUNDOFF[dtype]
    return Gx, u * Gx.abs() + cnp_coeff(b, u) * cnp_torch(torch, Q64.abs(), acc=F64) \
        + stage_floor(dtype, 4 * b)


def _bd_bound(dtype, X, G, unit="cuda", **kw):
    """|Y - ref64| <= u |ref| + (1 + u) c_b |X| |BD(G)| + floor (the kernel_reference bound of
    `unit`)."""
    u, b = STORE_ROUNDOFF[dtype], G.shape[-1]
    ref = bd_torch(torch, X.double(), G.double(), acc=F64, **kw)
    absr = bd_torch(torch, X.double().abs(), G.double().abs(), acc=F64, **kw)
    return ref, u * ref.abs() + (1 + u) * unit_acc_coeff(unit, b) * absr + unit_floor(unit, dtype, b)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64])
def test_cupy_ops_compute_what_the_reference_does(fake, dtype, b):
    ops, tops = _ops(), TorchOps(torch, CPU)
    p = _problem(dtype, b)
    k, n, m = p.k, p.n, p.m
    G = ops.cnp(p.t_in.Q, dtype)
    assert fake.syncs == []  # no host sync per launch
    ops.sync()
    assert fake.syncs == [0]  # one, where the result is needed
    Gx, beta = _cnp_bound(p.t_in.Q, dtype)
    assert G.dtype == p.x.dtype and bool(((G.double() - Gx).abs() <= beta).all())
    assert bool(((G.double() - tops.cnp(p.t_in.Q, dtype).double()).abs() <= 2 * beta).all())
    cases = [(p.x, dict(in_idx=p.t_in.perm)),  # gather in
             (p.W, dict(transpose=True, out_idx=p.t_in.perm)),  # transposed blocks, scatter out
             (p.W, dict(x_t=True, y_t=True, out_idx=p.t_out.inv))]  # transposed operand and result
    units = ops.units(dtype)
    assert units == (("cuda",) if dtype == "fp32" else ("tensor", "cuda"))
    for X, kw in cases:
        for unit in units:
            Y = ops.bd(X, G, unit=unit, **kw)
            ops.sync()
            ref, bound = _bd_bound(dtype, X, G, unit, **kw)
            assert Y.dtype == X.dtype and bool(((Y.double() - ref).abs() <= bound).all()), (unit, kw)
            _, tbound = _bd_bound(dtype, X, G, "torch", **kw)
            assert bool(((Y.double() - tops.bd(X, G, **kw).double()).abs() <= bound + tbound).all()), (unit, kw)

    sfx = SUFFIX[dtype]
    bd_kernels = [f"poet_bd_mma_{sfx}" if u == "tensor" else f"poet_bd_apply_{sfx}" for u in units]
    assert [ln.kernel for ln in fake.launches] == ["poet_cnp_step_f32", "poet_cnp_step_f32", f"poet_cnp_step_{sfx}"] + \
        bd_kernels * 3
    cnp_grid = (k * b // 32, (b + 63) // 64, 1)
    grids = {("apply", rows): (k * b // 32, (rows + 127) // 128, 1) for rows in (m, n)}
    grids.update({("mma", rows): (k, (rows + 63) // 64, 1) for rows in (m, n)})  # one diagonal block per x
    want = [grids["mma" if u == "tensor" else "apply", rows] for rows in (m, n, n) for u in units]
    assert [ln.grid for ln in fake.launches] == [cnp_grid] * 3 + want
    for ln in fake.launches:
        assert ln.block == ((128, 1, 1) if "_mma_" in ln.kernel else (256, 1, 1)), ln
        assert ln.stream == 0 and ln.device == 0
    assert fake.syncs == [0] * (1 + 3 * len(units))
    # the Horner steps: H1 = 2I + Q(2I + Q) from Q alone (H = NULL, first = 1), then from H1, then G
    c1, c2, c3 = (ln.args for ln in fake.launches[:3])
    assert c1[1] == 0 and (c1[5], c1[6]) == (2.0, 1) and (c2[5], c2[6]) == (2.0, 0) and (c3[5], c3[6]) == (1.0, 0)
    assert c1[2] == c2[1] and c2[2] == c3[1] and int(c3[2]) == G.data_ptr()  # H1 -> step 2, H2 -> step 3 -> G
    for bd1 in (ln.args for ln in fake.launches[3:3 + len(units)]):  # both units: the same argument list
        assert int(bd1[0]) == p.x.data_ptr() and int(bd1[3]) == G.data_ptr() and int(bd1[7]) != 0
        assert int(bd1[8]) == 0 and [int(a) for a in bd1[9:]] == [m, b, k, 0] and [int(a) for a in bd1[1:3]] == [n, 1]
    assert fake.torch_stream.asked == [CUDA0] * len(fake.launches)  # torch's current stream of the ops' device


def test_a_gpu_older_than_sm_80_runs_every_dtype_on_the_cuda_core_kernel(monkeypatch):
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    fake = fakecupy.install(monkeypatch, cc="75")
    monkeypatch.setattr(torch.cuda, "current_stream", TorchStream())
    ops = _ops()
    assert not ops.tensor_cores and ops.units("bf16") == ("cuda",)
    p = _problem("bf16", 32)
    ops.bd(p.x, ops.cnp(p.t_in.Q, "bf16"), in_idx=p.t_in.perm)
    with pytest.raises(ValueError, match="no 'tensor' unit for bf16 here"):
        ops.bd(p.x, p.x.new_zeros(2, 32, 32), unit="tensor")
    ops.sync()
    assert [ln.kernel for ln in fake.launches][-1] == "poet_bd_apply_bf16"


def test_a_launch_beyond_the_kernels_launch_bounds_is_refused_as_the_driver_does(fake):
    """The tensor-core kernel is compiled for 128 threads: launched with the CUDA-core kernel's 256
    it would not run on a GPU, and the stub refuses it the same way."""
    mod = cupy_module.module("poet")
    fn = mod.get_function("poet_bd_mma_bf16")
    with pytest.raises(fakecupy.CUDADriverError, match="INVALID_VALUE"):
        fn((1, 1, 1), (256, 1, 1), ())
    assert fake.launches == []


def test_launches_go_on_torchs_current_stream(fake):
    made = []
    external = fake.module.cuda.ExternalStream
    fake.module.cuda.ExternalStream = lambda ptr, dev: made.append((ptr, dev)) or external(ptr, dev)
    ops = _ops()
    p = _problem("fp32", 32)
    G = ops.cnp(p.t_in.Q, "fp32")
    ops.sync()
    fake.torch_stream.ptr = 0x7F00  # torch switched to a side stream
    ops.bd(p.x, G)
    ops.bd(p.x, G)
    ops.sync()
    fake.torch_stream.ptr = 0
    ops.bd(p.x, G)
    fake.torch_stream.ptr = 0x7F00
    ops.bd(p.x, G)
    ops.sync()
    assert [ln.stream for ln in fake.launches] == [0, 0, 0, 0x7F00, 0x7F00, 0, 0x7F00]
    assert fake.syncs == [0, 0x7F00, 0, 0x7F00]  # each sync waits once on every stream its launches went to
    assert made == [(0x7F00, 0), (0x7F00, 0)]  # wrapped when torch's stream changes, reused while it stays
    ops.sync()
    assert fake.syncs == [0, 0x7F00, 0, 0x7F00]  # nothing launched since: nothing to wait for


def test_a_tensor_on_another_device_is_refused_before_any_launch(fake):
    ops = _ops()
    p = _problem("fp32", 32)
    G = ops.cnp(p.t_in.Q, "fp32")
    n0 = len(fake.launches)
    with pytest.raises(ValueError, match="poet_bd_apply_f32: a tensor on meta passed to a launch on cpu"):
        ops.bd(p.x, G.to("meta"))
    assert len(fake.launches) == n0


def test_a_kernel_fault_is_a_kernel_error_naming_the_launch(fake):
    """A fault surfaces at the next sync (as an asynchronous CUDA fault does), named: the launch
    itself when it was the only one since the last sync, else every launch since then."""
    ops = _ops()
    p = _problem("bf16", 32)
    G = ops.cnp(p.t_in.Q, "bf16")
    ops.sync()
    fake.fail_next("poet_bd_mma_bf16")
    ops.bd(p.x, G)  # launched: the fault is not known yet
    with pytest.raises(cupy_module.KernelError, match=r"poet:poet_bd_mma_bf16 grid=\(2, 1, 1\) block=\(128, 1, 1\): "
                                                      r"cudaErrorIllegalAddress"):
        ops.sync()
    fake.fail_next("poet_bd_apply_bf16")
    ops.bd(p.x, G)
    ops.bd(p.x, G, unit="cuda")
    with pytest.raises(cupy_module.KernelError, match=r"poet:one of 2 launches \(poet_bd_mma_bf16 grid=\(2, 1, 1\) "
                                                      r"block=\(128, 1, 1\); poet_bd_apply_bf16 grid=\(2, 1, 1\) "
                                                      r"block=\(256, 1, 1\)\): cudaErrorIllegalAddress"):
        ops.sync()
    ops.sync()  # reported once: the launches are no longer pending


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_the_per_problem_check_is_clean_and_catches_a_flipped_bit(fake, dtype):
    p = _problem(dtype, 32, m=40, chain_steps=2, seed=31, index=1)
    out = check_problem(torch, _ops(), p, VerifyConfig(ortho_blocks=2))
    units = 1 if dtype == "fp32" else 2  # bf16/fp16: tensor cores and CUDA cores
    assert out["violations"] == [] and out["launches"] == 2 * (4 * 3) + 2 * units * 7 == len(fake.launches)
    assert all(r <= 1.0 for r in out["ratios"].values())
    assert len(fake.syncs) == 4 + 7  # once per operation (its repeat and units included), not per launch
    assert out["checks"].get("core_agreement", 0) == 7 * (units - 1)
    p = _problem(dtype, 32, m=40, chain_steps=2, seed=31, index=1)
    out = check_problem(torch, _ops(), p, VerifyConfig(ortho_blocks=2), inject={"op": "output", "problem": 1})
    v = out["violations"][0]
    assert v["invariant"] == "kernel_reference" and v["op"] == "bd_apply Z·BD(G_out)·Π_out"
    assert v["where"] == "row 20, col 21"


@pytest.mark.slow
def test_the_worker_loop_on_the_cupy_backend_passes_clean_and_fails_a_flip(fake):
    def run(bitflip):
        cfg = PoetConfig.from_args({"duration_s": 0.3, "dtypes": "fp32,bf16,fp16", "blocks": "32", "cpu_rows": 32,
                                    "chain_steps": 2, "ortho_blocks": 2, "backend": "cupy", "bitflip": bitflip})
        return PoetRunner(torch, CPU, LocalChannel(), cfg, _ops()).run()

    clean = run(None)
    assert clean["backend"] == "cupy" and clean["cuda_kernels"] is True and clean["problems"] >= 1
    assert clean["violation_count"] == 0
    ran = [c for c in clean["combos"].values() if c["problems"]]
    per_problem = {"fp32": 2 * 12 + 2 * 7, "bf16": 2 * 12 + 4 * 7, "fp16": 2 * 12 + 4 * 7}
    assert ran and all(c["launches"] == per_problem[c["dtype"]] * c["problems"] for c in ran)
    if any(c["dtype"] != "fp32" for c in ran):
        assert "core_agreement" in clean["invariants"]
    r = judge_data(0, clean, [])
    assert r.status == Status.PASS and "backend: CUDA kernels (gpucheck/kernels/poet.cu) through CuPy" in r.evidence[0]
    assert r.metrics["cuda_kernels"] == 1 and r.metrics["launches"] == sum(c["launches"] for c in ran)

    bad = run({"op": "forward", "problem": 0})
    assert bad["violation_count"] >= 1 and bad["violations"][0]["problem"] == 0 and bad["injected"]
    r = judge_data(0, bad, ["bitflip:gpu=0"])
    assert r.status == Status.FAIL and r.action == Action.DRAIN and "silent data corruption" in r.summary
