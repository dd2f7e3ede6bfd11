"""poet.ortho's CuPy backend on the CPU: gpucheck.poet.cupy_ops.CupyOps (and the backend selection
and gpucheck.kernels.cupy_module under it) run unchanged against a stub `cupy`
(tests/fakecupy.py) whose launches execute gpucheck/kernels/poet.cu under the CPU emulator, every
argument checked against the kernel's parameter list. The tensors are CPU tensors: the test points
`CupyOps.tensor_device` (where every launch's tensors must be) at the CPU and stands in for
torch.cuda.current_stream (the stream the kernels are ordered on); everything else, the argument
lists as CuPy gets them, the grids, the stream and device handling, the synchronisation after
every launch, and the results, is the GPU path's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")

import cudaemu  # noqa: E402
import fakecupy  # noqa: E402
from gpucheck.kernels import cupy_module, source  # noqa: E402
from gpucheck.poet.bounds import STORE_ROUNDOFF, U32, acc_coeff, cnp_coeff, stage_floor  # noqa: E402
from gpucheck.poet.cupy_ops import CupyOps, CupyUnavailable  # noqa: E402
from gpucheck.poet.invariants import VerifyConfig, check_problem  # noqa: E402
from gpucheck.poet.ortho import QPool, TorchOps, bd_torch, cnp_torch, make_problem  # noqa: E402
from gpucheck.poet.worker import PoetConfig, PoetRunner, select_backend  # noqa: E402
from gpucheck.result import Action, Status  # noqa: E402
from gpucheck.tests_suite.poet import judge_data  # noqa: E402
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


def test_the_backend_selection_picks_the_cupy_kernels_and_compiles_them_once(fake):
    ops, note = select_backend(torch, CUDA0, "auto")
    assert isinstance(ops, CupyOps) and ops.cuda_kernels and note is None
    ops2, _ = select_backend(torch, CUDA0, "cupy")
    assert isinstance(ops2, CupyOps)
    (mod,) = fake.modules  # compiled at the first CupyOps, cached for the device after that
    assert mod.code == source("poet") and mod.options == cupy_module.OPTIONS and fake.launches == []
    assert ops.tensor_device == CUDA0  # production: every tensor of a launch on cuda:0
    # a device CuPy does not see: the torch path with the reason, or an error where cupy was asked for
    ops, note = select_backend(torch, torch.device("cuda", 1), "auto")
    assert isinstance(ops, TorchOps) and not ops.cuda_kernels
    assert note == "CuPy 14.0.0+fakecupy sees 1 GPU(s), not cuda:1: the CUDA kernels were not exercised (torch path)"
    with pytest.raises(CupyUnavailable, match="sees 1 GPU"):
        select_backend(torch, torch.device("cuda", 1), "cupy")


def _cnp_bound(Q, dtype):
    b = Q.shape[-1]
    Q64 = Q.double()
    Gx = cnp_torch(torch, Q64, acc=F64)
    u = STORE_ROUNDOFF[dtype]
    return Gx, u * Gx.abs() + cnp_coeff(b, u) * cnp_torch(torch, Q64.abs(), acc=F64) \
        + stage_floor(dtype, 4 * b)


def _bd_bound(dtype, X, G, **kw):
    """|Y - ref64| <= u |ref| + (1 + u) c_b |X| |BD(G)| + floor (the kernel_reference bound)."""
    u = STORE_ROUNDOFF[dtype]
    ref = bd_torch(torch, X.double(), G.double(), acc=F64, **kw)
    absr = bd_torch(torch, X.double().abs(), G.double().abs(), acc=F64, **kw)
    return ref, u * ref.abs() + (1 + u) * acc_coeff(G.shape[-1], U32) * absr + stage_floor(dtype, G.shape[-1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64])
def test_cupy_ops_compute_what_the_reference_does(fake, dtype, b):
    ops, tops = _ops(), TorchOps(torch, CPU)
    p = _problem(dtype, b)
    k, n, m = p.k, p.n, p.m
    G = ops.cnp(p.t_in.Q, dtype)
    Gx, beta = _cnp_bound(p.t_in.Q, dtype)
    assert G.dtype == p.x.dtype and bool(((G.double() - Gx).abs() <= beta).all())
    assert bool(((G.double() - tops.cnp(p.t_in.Q, dtype).double()).abs() <= 2 * beta).all())
    cases = [(p.x, dict(in_idx=p.t_in.perm)),  # gather in
             (p.W, dict(transpose=True, out_idx=p.t_in.perm)),  # transposed blocks, scatter out
             (p.W, dict(x_t=True, y_t=True, out_idx=p.t_out.inv))]  # transposed operand and result
    for X, kw in cases:
        Y = ops.bd(X, G, **kw)
        ref, bound = _bd_bound(dtype, X, G, **kw)
        assert Y.dtype == X.dtype and bool(((Y.double() - ref).abs() <= bound).all()), kw
        assert bool(((Y.double() - tops.bd(X, G, **kw).double()).abs() <= 2 * bound).all()), kw

    sfx = SUFFIX[dtype]
    assert [ln.kernel for ln in fake.launches] == ["poet_cnp_step_f32", "poet_cnp_step_f32", f"poet_cnp_step_{sfx}"] + \
        [f"poet_bd_apply_{sfx}"] * 3
    cnp_grid, bd_grid = (k * b // 32, (b + 63) // 64, 1), (k * b // 32, (m + 127) // 128, 1)
    w_grid = (k * b // 32, (n + 127) // 128, 1)  # the launches on W (n x n) cover n rows
    assert [ln.grid for ln in fake.launches] == [cnp_grid] * 3 + [bd_grid, w_grid, w_grid]
    for ln in fake.launches:
        assert ln.block == (256, 1, 1) and ln.stream == 0 and ln.device == 0
    assert fake.syncs == [0] * 6  # every launch synchronised on its stream (sync=True)
    # the Horner steps: H1 = 2I + Q(2I + Q) from Q alone (H = NULL, first = 1), then from H1, then G
    c1, c2, c3 = (ln.args for ln in fake.launches[:3])
    assert c1[1] == 0 and (c1[5], c1[6]) == (2.0, 1) and (c2[5], c2[6]) == (2.0, 0) and (c3[5], c3[6]) == (1.0, 0)
    assert c1[2] == c2[1] and c2[2] == c3[1] and int(c3[2]) == G.data_ptr()  # H1 -> step 2, H2 -> step 3 -> G
    bd1 = fake.launches[3].args
    assert int(bd1[0]) == p.x.data_ptr() and int(bd1[3]) == G.data_ptr() and int(bd1[7]) != 0 and int(bd1[8]) == 0
    assert [int(a) for a in bd1[9:]] == [m, b, k, 0] and [int(a) for a in bd1[1:3]] == [n, 1]
    assert fake.torch_stream.asked == [CUDA0] * 6  # torch's current stream of the ops' device


def test_launches_go_on_torchs_current_stream(fake):
    made = []
    external = fake.cuda.ExternalStream
    fake.cuda.ExternalStream = lambda ptr, dev: made.append((ptr, dev)) or external(ptr, dev)
    ops = _ops()
    p = _problem("fp32", 32)
    G = ops.cnp(p.t_in.Q, "fp32")
    fake.torch_stream.ptr = 0x7F00  # torch switched to a side stream
    ops.bd(p.x, G)
    ops.bd(p.x, G)
    fake.torch_stream.ptr = 0
    ops.bd(p.x, G)
    assert [ln.stream for ln in fake.launches] == [0, 0, 0, 0x7F00, 0x7F00, 0]
    assert fake.syncs == [0, 0, 0, 0x7F00, 0x7F00, 0]  # each launch waited for on its own stream
    assert made == [(0x7F00, 0)]  # wrapped once, reused while torch's stream stays the same
    assert ops._stream is fake.cuda.Stream.null


def test_a_tensor_on_another_device_is_refused_before_any_launch(fake):
    ops = _ops()
    p = _problem("fp32", 32)
    G = ops.cnp(p.t_in.Q, "fp32")
    n0 = len(fake.launches)
    with pytest.raises(ValueError, match="poet_bd_apply_f32: a tensor on meta passed to a launch on cpu"):
        ops.bd(p.x, G.to("meta"))
    assert len(fake.launches) == n0


def test_a_kernel_fault_is_a_kernel_error_naming_the_launch(fake):
    ops = _ops()
    p = _problem("bf16", 32)
    G = ops.cnp(p.t_in.Q, "bf16")
    fake.fail_next("poet_bd_apply_bf16")
    with pytest.raises(cupy_module.KernelError, match=r"poet:poet_bd_apply_bf16 grid=\(2, 1, 1\) block=\(256, 1, 1\): "
                                                      r"cudaErrorIllegalAddress"):
        ops.bd(p.x, G)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_the_per_problem_check_is_clean_and_catches_a_flipped_bit(fake, dtype):
    p = _problem(dtype, 32, m=40, chain_steps=2, seed=31, index=1)
    out = check_problem(torch, _ops(), p, VerifyConfig(ortho_blocks=2))
    assert out["violations"] == [] and out["launches"] == 4 * 3 + 7 == len(fake.launches)
    assert all(r <= 1.0 for r in out["ratios"].values())
    p = _problem(dtype, 32, m=40, chain_steps=2, seed=31, index=1)
    out = check_problem(torch, _ops(), p, VerifyConfig(ortho_blocks=2), inject={"op": "output", "problem": 1})
    v = out["violations"][0]
    assert v["invariant"] == "kernel_reference" and v["op"] == "bd_apply Z·BD(G_out)·Π_out"
    assert v["where"] == "row 20, col 21"


def test_the_worker_loop_on_the_cupy_backend_passes_clean_and_fails_a_flip(fake):
    def run(bitflip):
        cfg = PoetConfig.from_args({"duration_s": 0.3, "dtypes": "fp32,bf16,fp16", "blocks": "32", "cpu_rows": 32,
                                    "chain_steps": 2, "ortho_blocks": 2, "backend": "cupy", "bitflip": bitflip})
        return PoetRunner(torch, CPU, LocalChannel(), cfg, _ops()).run()

    clean = run(None)
    assert clean["backend"] == "cupy" and clean["cuda_kernels"] is True and clean["problems"] >= 1
    assert clean["violation_count"] == 0
    ran = [c for c in clean["combos"].values() if c["problems"]]
    assert ran and all(c["launches"] == 19 * c["problems"] for c in ran)
    r = judge_data(0, clean, [])
    assert r.status == Status.PASS and "backend: CUDA kernels (gpucheck/kernels/poet.cu) through CuPy" in r.evidence[0]
    assert r.metrics["cuda_kernels"] == 1 and r.metrics["launches"] == sum(c["launches"] for c in ran)

    bad = run({"op": "forward", "problem": 0})
    assert bad["violation_count"] >= 1 and bad["violations"][0]["problem"] == 0 and bad["injected"]
    r = judge_data(0, bad, ["bitflip:gpu=0"])
    assert r.status == Status.FAIL and r.action == Action.DRAIN and "silent data corruption" in r.summary
