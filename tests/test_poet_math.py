"""POET math and invariants on the torch path (CPU): the Cayley-Neumann error against theory, the
reference operations against their definitions, every invariant for every block size and dtype,
healthy problems that never fail over many seeds, and injected faults that always do."""

from __future__ import annotations

import math

import pytest

from gpucheck.poet import bounds
from gpucheck.poet.bounds import (
    PoetInputError,
    cnp_orthogonality_error,
    gamma,
    interval_check,
    parse_blocks,
    parse_dtypes,
)
from gpucheck.poet.invariants import INJECT_OPS, INVARIANTS, VerifyConfig, check_problem

torch = pytest.importorskip("torch")

from gpucheck.poet.ortho import (  # noqa: E402
    QPool,
    TorchOps,
    bd_torch,
    cnp_torch,
    flip_bit,
    make_problem,
)

CPU = torch.device("cpu")
F64 = torch.float64


@pytest.fixture(scope="module")
def env():
    torch.set_num_threads(1)
    return QPool(torch, CPU, seed=0), TorchOps(torch, CPU)


def _problem(pool, dtype, b, seed, *, k=2, m=32, rho=(0.1, 0.5), chain=3, index=None):
    return make_problem(torch, CPU, pool, index=seed if index is None else index, seed=seed, dtype=dtype, b=b,
                        n=k * b, m=m, rho_min=rho[0], rho_max=rho[1], chain_steps=chain)


# -- bounds and parsing -------------------------------------------------------------------------
def test_parse_blocks_and_dtypes():
    assert parse_blocks("256, 32,32") == [256, 32]
    assert parse_blocks([64]) == [64] and parse_blocks(128) == [128]
    for bad in ("48", "0", "", "abc", "32,512"):
        with pytest.raises(PoetInputError):
            parse_blocks(bad)
    assert parse_dtypes("BF16,float32, half") == ["bf16", "fp32", "fp16"]
    for bad in ("fp64", "", "tf32"):
        with pytest.raises(PoetInputError):
            parse_dtypes(bad)


def test_gamma_and_interval_check():
    assert gamma(10, 2.0**-24) == pytest.approx(10 * 2.0**-24, rel=1e-6)
    with pytest.raises(ValueError):
        gamma(2**24, 2.0**-24)
    assert interval_check(1.01, 0.9, 1.02) == (True, pytest.approx(0.01), pytest.approx(0.02), pytest.approx(0.5))
    ok, err, bound, ratio = interval_check(0.8, 0.9, 1.02)
    assert not ok and err == pytest.approx(0.2) and bound == pytest.approx(0.1) and ratio == pytest.approx(2.0)
    assert interval_check(math.nan, 0.9, 1.1)[0] is False


def _skew(b, rho, seed):
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(b, b, generator=g, dtype=F64)
    Q = M - M.T
    return Q * (rho / torch.linalg.matrix_norm(Q, 2))


@pytest.mark.parametrize("b", [32, 256])
@pytest.mark.parametrize("rho", [0.1, 0.3, 0.5, 0.9])
def test_cnp_orthogonality_error_is_exactly_the_theory_in_float64(b, rho):
    """||G^T G - I||_2 = 2 rho^4 - rho^8 for three Neumann terms (and rho^6 for two), equal, not
    just bounded; the singular values of G lie in [1 - rho^4, 1]."""
    Q = _skew(b, rho, seed=b)
    eye = torch.eye(b, dtype=F64)
    G3 = cnp_torch(torch, Q[None], acc=F64)[0]
    direct = eye + 2 * Q + 2 * Q @ Q + 2 * Q @ Q @ Q + Q @ Q @ Q @ Q
    assert torch.allclose(G3, direct, atol=1e-13)
    e3 = torch.linalg.matrix_norm(G3.T @ G3 - eye, 2).item()
    assert e3 == pytest.approx(cnp_orthogonality_error(rho), rel=1e-9, abs=1e-14)
    G2 = eye + 2 * Q + 2 * Q @ Q + Q @ Q @ Q
    e2 = torch.linalg.matrix_norm(G2.T @ G2 - eye, 2).item()
    assert e2 == pytest.approx(cnp_orthogonality_error(rho, terms=2), rel=1e-9, abs=1e-15)
    sv = torch.linalg.svdvals(G3)
    assert sv.min().item() == pytest.approx(1 - rho**4, rel=1e-9)
    assert sv.max().item() <= 1 + 1e-12
    # the exact Cayley transform is orthogonal: the CNP error is the truncation, nothing else
    C = (eye + Q) @ torch.linalg.inv(eye - Q)
    assert torch.linalg.matrix_norm(C.T @ C - eye, 2).item() < 1e-12


def test_fp32_cnp_stays_within_theory_plus_its_derived_rounding_floor(env):
    """The fp32 Horner evaluation (the kernel's order) is within 2 eta + eta^2 of the theory,
    where eta is the worst-case bound of the rounding; and that floor is far below the theory's
    value at rho = 0.5, so the comparison is not vacuous."""
    b, rho = 64, 0.5
    Q = _skew(b, rho, seed=3).to(torch.float32)
    rho32 = torch.linalg.matrix_norm(Q.double(), 2).item()
    G = cnp_torch(torch, Q[None])[0].double()
    e = torch.linalg.matrix_norm(G.T @ G - torch.eye(b, dtype=F64), 2).item()
    P = cnp_torch(torch, Q.double().abs()[None], acc=F64)[0]
    beta = bounds.cnp_theta(b) * P
    eta = math.sqrt(beta.sum(0).max().item() * beta.sum(1).max().item())
    theory = cnp_orthogonality_error(rho32)
    assert abs(e - theory) <= 2 * eta + eta**2
    assert 2 * eta + eta**2 < 0.05 * theory


def test_qpool_blocks_are_skew_with_the_drawn_spectral_norm(env):
    pool, _ = env
    p = _problem(pool, "fp32", 64, seed=11, k=3)
    for t in (p.t_in, p.t_out):
        Q = t.Q.double()
        assert torch.equal(Q, -Q.transpose(1, 2))  # exactly skew-symmetric after rounding to fp32
        norms = torch.linalg.matrix_norm(Q, 2)
        for j in range(Q.shape[0]):
            assert abs(norms[j].item() - t.rho[j]) <= t.drho[j]
            assert 0.1 <= t.rho[j] <= 0.5
        assert sorted(t.perm.tolist()) == list(range(p.n)) and torch.equal(t.perm[t.inv], torch.arange(p.n))


def test_bd_reference_matches_its_definition_with_permutations_and_transposes():
    g = torch.Generator().manual_seed(5)
    m, k, b = 6, 3, 4
    n = k * b
    X = torch.randn(m, n, generator=g, dtype=F64)
    G = torch.randn(k, b, b, generator=g, dtype=F64)
    BD = torch.block_diag(*G)
    perm = torch.randperm(n, generator=g)
    P = torch.eye(n, dtype=F64)[:, perm]  # (X P)[:, j] = X[:, perm[j]]
    assert torch.allclose(X @ P, X[:, perm])
    assert torch.allclose(bd_torch(torch, X, G, in_idx=perm, acc=F64), X @ P @ BD)
    assert torch.allclose(bd_torch(torch, X, G, transpose=True, out_idx=perm, acc=F64), X @ BD.T @ P.T)
    inv = torch.argsort(perm)
    assert torch.allclose(bd_torch(torch, X, G, out_idx=inv, acc=F64), X @ BD @ P)
    Wt = torch.randn(n, n, generator=g, dtype=F64)
    # x_t / y_t: the weight-centric merge Pi^T BD^T A computed as (A^T BD Pi)^T
    assert torch.allclose(bd_torch(torch, Wt, G, x_t=True, y_t=True, out_idx=inv, acc=F64), P.T @ BD.T @ Wt)


def test_input_and_weight_centric_forward_agree_in_exact_arithmetic(env):
    """The identity the forward_equivalence invariant relies on, in float64 with explicit
    permutation matrices: x Pi_in BD(G_in) W^T BD(G_out) Pi_out = x W_eff^T."""
    pool, _ = env
    p = _problem(pool, "fp32", 32, seed=2, k=3)
    n = p.n
    Gi = cnp_torch(torch, p.t_in.Q.double(), acc=F64)
    Go = cnp_torch(torch, p.t_out.Q.double(), acc=F64)
    Pi = torch.eye(n, dtype=F64)[:, p.t_in.perm]
    Po = torch.eye(n, dtype=F64)[:, p.t_out.perm]
    x, W = p.x.double(), p.W.double()
    y = x @ Pi @ torch.block_diag(*Gi) @ W.T @ torch.block_diag(*Go) @ Po
    W_eff = Po.T @ torch.block_diag(*Go).T @ W @ torch.block_diag(*Gi).T @ Pi.T
    assert torch.allclose(y, x @ W_eff.T, atol=1e-12)
    A = bd_torch(torch, W, Gi, transpose=True, out_idx=p.t_in.perm, acc=F64)
    assert torch.allclose(bd_torch(torch, A, Go, x_t=True, y_t=True, out_idx=p.t_out.inv, acc=F64), W_eff, atol=1e-12)


# -- every invariant, every block size and dtype -------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("b", [32, 64, 128, 256])
def test_every_invariant_holds_on_a_healthy_problem(env, dtype, b):
    pool, ops = env
    m = 16 if b == 256 else 32
    out = check_problem(torch, ops, _problem(pool, dtype, b, seed=b + 7, m=m), VerifyConfig(ortho_blocks=2))
    assert out["violations"] == []
    assert set(out["ratios"]) == set(INVARIANTS) - {"core_agreement"}  # torch has one unit
    assert all(0.0 <= r <= 1.0 for r in out["ratios"].values()), out["ratios"]
    assert out["checks"]["kernel_reference"] == 9 and out["checks"]["cnp_reference"] == 6
    assert out["checks"]["norm_drift"] == 2 and out["checks"]["cnp_orthogonality"] == 2
    assert out["checks"]["repeat_bitwise"] == 6 + 9 and out["ratios"]["repeat_bitwise"] == 0.0
    assert out["launches"] == 2 * (6 + 9) and out["flops"] > 0 and out["injected"] == []


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_healthy_problems_never_fail_over_many_seeds(env, dtype):
    """60 fresh problems per dtype (both data distributions, block sizes 32 and 64, rho up to 0.9):
    no violation. The worst ratios are recorded to show the bounds are used, not vacuous."""
    pool, ops = env
    worst = {}
    for s in range(60):
        rho = (0.1, 0.9) if s % 4 == 0 else (0.1, 0.5)
        p = _problem(pool, dtype, 32 if s % 2 else 64, seed=10_000 + s, m=16, rho=rho, chain=2)
        out = check_problem(torch, ops, p, VerifyConfig(ortho_blocks=2))
        assert out["violations"] == [], (s, out["violations"][:1])
        for k, v in out["ratios"].items():
            worst[k] = max(worst.get(k, 0.0), v)
    assert max(worst.values()) <= 1.0
    if dtype != "fp32":  # rounding to bf16 / fp16 nearly reaches its half-ulp bound
        assert worst["kernel_reference"] > 0.5 and worst["cnp_reference"] > 0.5


# -- injected faults -----------------------------------------------------------------------------
EXPECTED = {
    # op: invariants that must fire for a top-mantissa-bit flip (fp32, block 32)
    "forward": {"kernel_reference", "forward_equivalence", "round_trip"},
    "output": {"kernel_reference", "forward_equivalence"},
    "merge": {"kernel_reference", "forward_equivalence"},
    "roundtrip": {"kernel_reference", "round_trip"},
    "cnp": {"cnp_reference", "cnp_orthogonality", "round_trip"},
}


@pytest.mark.parametrize("op", INJECT_OPS)
def test_a_top_mantissa_flip_in_any_kernel_output_is_caught_by_the_right_invariants(env, op):
    pool, ops = env
    p = _problem(pool, "fp32", 32, seed=3, index=0)
    out = check_problem(torch, ops, p, VerifyConfig(ortho_blocks=4), inject={"op": op})
    fired = {v["invariant"] for v in out["violations"]}
    assert EXPECTED[op] <= fired, fired
    assert len(out["injected"]) == 1 and out["injected"][0].startswith(f"bitflip: {op} output of problem 0")
    assert all(v["injected"] for v in out["violations"])
    first = out["violations"][0]
    assert first["error"] > first["bound"] and first["dtype"] == "fp32" and first["block"] == 32
    # the same problem without the flip is clean: the flip, not the problem, failed it
    assert check_problem(torch, ops, _problem(pool, "fp32", 32, seed=3, index=0), VerifyConfig())["violations"] == []


@pytest.mark.parametrize("dtype,bit", [("fp32", 30), ("bf16", 14), ("fp16", 14), ("bf16", 6), ("fp16", 9)])
@pytest.mark.parametrize("b", [32, 256])
def test_exponent_and_mantissa_flips_are_caught_in_every_dtype(env, dtype, bit, b):
    pool, ops = env
    p = _problem(pool, dtype, b, seed=21, m=16, index=0, chain=1)
    out = check_problem(torch, ops, p, VerifyConfig(ortho_blocks=1), inject={"op": "forward", "bit": bit})
    v = [x for x in out["violations"] if x["invariant"] == "kernel_reference"]
    assert v and v[0]["where"] == f"row 8, col {p.n // 3}" and v[0]["elements"] == 1


def test_a_flip_in_another_problem_does_not_fire(env):
    pool, ops = env
    out = check_problem(torch, ops, _problem(pool, "bf16", 32, seed=4, index=1), VerifyConfig(),
                        inject={"op": "forward", "problem": 0})
    assert out["violations"] == [] and out["injected"] == []


def test_corrupted_cnp_block_breaks_orthogonality_against_theory(env):
    """A G that is wrong everywhere by a little (as a faulty multiplier would make it): scaled
    by 1 + 2^-6. Each element stays plausible, but orthogonality and the references catch it."""
    pool, ops = env

    class ScaledCnp(TorchOps):
        def cnp(self, Q, dtype):
            G = super().cnp(Q, dtype)
            return (G.float() * (1 + 2.0**-6)).to(G.dtype)

    p = _problem(pool, "fp32", 64, seed=9, index=0)
    out = check_problem(torch, ScaledCnp(torch, CPU), p, VerifyConfig(ortho_blocks=4))
    fired = {v["invariant"] for v in out["violations"]}
    assert {"cnp_reference", "cnp_orthogonality", "frobenius_norm", "row_norms", "round_trip"} <= fired


def test_a_wrong_permutation_is_caught(env):
    """A kernel that forgets the output scatter computes a plausible, norm-preserving result:
    the references and the forward equivalence catch it; the norms cannot."""
    pool, _ = env

    class NoScatter(TorchOps):
        def bd(self, X, G, *, in_idx=None, out_idx=None, transpose=False, x_t=False, y_t=False):
            return super().bd(X, G, in_idx=in_idx, out_idx=None, transpose=transpose, x_t=x_t, y_t=y_t)

    p = _problem(pool, "bf16", 32, seed=12, index=0)
    out = check_problem(torch, NoScatter(torch, CPU), p, VerifyConfig())
    fired = {v["invariant"] for v in out["violations"]}
    assert {"kernel_reference", "forward_equivalence", "round_trip"} <= fired
    assert "frobenius_norm" not in fired and "row_norms" not in fired


def test_flip_bit_helper():
    t = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert flip_bit(torch, t, 1, 6) == (2.0, 3.0)
    t = torch.tensor([1.0], dtype=torch.float32)
    assert flip_bit(torch, t, 0, 31) == (1.0, -1.0)
    with pytest.raises(ValueError):
        flip_bit(torch, t, 0, 32)


# -- review additions: conventions, non-finite outputs, two-sided orthogonality, the chain ----------
class _Recording(TorchOps):
    """TorchOps that keeps every block-diagonal output, in call order."""

    def __init__(self):
        super().__init__(torch, CPU)
        self.bd_out = []

    def bd(self, X, G, **kw):
        Y = super().bd(X, G, **kw)
        self.bd_out.append(Y)
        return Y


def test_the_checked_operations_follow_the_issues_formulas_with_explicit_permutation_matrices(env):
    """Not only an identity between the two paths (which a consistently wrong permutation would
    keep): Y1, y_in, W_eff and X2 as check_problem computes them equal the issue's formulas
    y = x Pi_in BD(G_in) W^T BD(G_out) Pi_out, W_eff = Pi_out^T BD(G_out)^T W BD(G_in)^T Pi_in^T,
    with (X Pi)[:, j] = X[:, perm[j]], evaluated with explicit matrices in float64."""
    pool, _ = env
    p = _problem(pool, "fp32", 32, seed=41, k=3, m=8, chain=2)
    ops = _Recording()
    assert check_problem(torch, ops, p, VerifyConfig())["violations"] == []
    Y1, y_in, A, W_eff, X2, A2, W2 = ops.bd_out[::2]  # every operation runs twice (repeat_bitwise)
    assert all(torch.equal(a, b) for a, b in zip(ops.bd_out[::2], ops.bd_out[1::2]))
    n = p.n
    Gi = torch.block_diag(*cnp_torch(torch, p.t_in.Q.double(), acc=F64))
    Go = torch.block_diag(*cnp_torch(torch, p.t_out.Q.double(), acc=F64))
    Pi = torch.eye(n, dtype=F64)[:, p.t_in.perm]
    Po = torch.eye(n, dtype=F64)[:, p.t_out.perm]
    x, W = p.x.double(), p.W.double()
    close = dict(rtol=1e-4, atol=1e-4)
    assert torch.allclose(Y1.double(), x @ Pi @ Gi, **close)
    assert torch.allclose(y_in.double(), x @ Pi @ Gi @ W.T @ Go @ Po, **close)
    assert torch.allclose(W_eff.double(), Po.T @ Go.T @ W @ Gi.T @ Pi.T, **close)
    assert torch.allclose(X2.double(), x @ Pi @ Gi @ Gi.T @ Pi.T, **close)
    t2i, t2o = p.chain[0]
    Gi2 = torch.block_diag(*cnp_torch(torch, t2i.Q.double(), acc=F64))
    Go2 = torch.block_diag(*cnp_torch(torch, t2o.Q.double(), acc=F64))
    Pi2 = torch.eye(n, dtype=F64)[:, t2i.perm]
    Po2 = torch.eye(n, dtype=F64)[:, t2o.perm]
    assert torch.allclose(W2.double(), Po2.T @ Go2.T @ W_eff.double() @ Gi2.T @ Pi2.T, **close)
    # and a permutation is not its own inverse here: the test would see Pi swapped for Pi^T
    assert not torch.allclose(Pi, Pi.T)


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("where", ["cnp", "bd"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_nan_or_inf_output_is_an_sdc_violation_never_a_crash(env, value, where, dtype):
    """An exponent flip can make Inf (bf16 1.0 with bit 14 flipped) or NaN. The check must report
    it as a violation of the invariants, not raise (the float64 eigensolver refuses non-finite
    input: that used to crash the worker and turn an SDC into 'worker crashed')."""
    pool, _ = env

    class Bad(TorchOps):
        def cnp(self, Q, dtype):
            G = super().cnp(Q, dtype)
            if where == "cnp":
                G[:, 3, 3] = value  # every block of every G: sampled by cnp_orthogonality for sure
            return G

        def bd(self, X, G, **kw):
            Y = super().bd(X, G, **kw)
            if where == "bd" and not self.hit:
                Y.view(-1)[5] = value
                self.hit = True
            return Y

    ops = Bad(torch, CPU)
    ops.hit = False
    out = check_problem(torch, ops, _problem(pool, dtype, 32, seed=3, m=16, chain=2), VerifyConfig(ortho_blocks=2))
    fired = {v["invariant"] for v in out["violations"]}
    first = out["violations"][0]
    if where == "cnp":
        assert {"cnp_reference", "cnp_orthogonality", "row_norms", "frobenius_norm", "norm_drift"} <= fired, fired
        assert first["invariant"] == "cnp_reference"
    else:
        # Y1 feeds y_in and X2; the repeat of Y1's kernel is clean: the bits differ
        assert fired == {"kernel_reference", "forward_equivalence", "round_trip", "repeat_bitwise"}, fired
        assert first["invariant"] == "kernel_reference" and first["where"] == "row 0, col 5"
    assert first["error"] == math.inf and out["ratios"][first["invariant"]] == math.inf


def test_too_orthogonal_blocks_fail_cnp_orthogonality_it_is_two_sided(env):
    """A kernel that computes the exact Cayley transform (orthogonal) instead of the three-term
    Cayley-Neumann G is wrong: |0 - (2 rho^4 - rho^8)| is far outside the rounding slack, and the
    round trip (expected x Pi BD((I - Q^4)^2) Pi^T, not x) sees it too."""
    pool, _ = env

    class ExactCayley(TorchOps):
        def cnp(self, Q, dtype):
            Q64 = Q.double()
            eye = torch.eye(Q.shape[-1], dtype=F64)
            return ((eye + Q64) @ torch.linalg.inv(eye - Q64)).to(torch.float32)

    p = _problem(pool, "fp32", 32, seed=8, m=16, rho=(0.4, 0.5))
    out = check_problem(torch, ExactCayley(torch, CPU), p, VerifyConfig(ortho_blocks=4))
    orth = [v for v in out["violations"] if v["invariant"] == "cnp_orthogonality"]
    assert orth and all(v["measured"] < 1e-5 and v["theory"] > 0.05 for v in orth)
    assert {"cnp_reference", "round_trip"} <= {v["invariant"] for v in out["violations"]}


def test_a_norm_changing_merge_in_the_chain_fails_norm_drift_at_that_merge(env):
    """A merge kernel of the chain whose output is 1 + 2^-5 too large: norm_drift names the merge
    step (and kernel_reference the element); the first merge (W_eff) stays clean."""
    pool, _ = env

    class LoudMerge(TorchOps):
        calls = 0

        def bd(self, X, G, **kw):
            Y = super().bd(X, G, **kw)
            self.calls += 1
            # the second bd of merge 2, in both of its runs (calls: Y1, y_in, A, W_eff, X2, A2, W2, each twice)
            if self.calls in (13, 14):
                Y = (Y.float() * (1 + 2.0**-5)).to(Y.dtype)
            return Y

    p = _problem(pool, "fp32", 64, seed=17, m=16, chain=3)
    out = check_problem(torch, LoudMerge(torch, CPU), p, VerifyConfig())
    drift = [v for v in out["violations"] if v["invariant"] == "norm_drift"]
    assert drift and drift[0]["where"] == "merge 2" and drift[0]["value"] > drift[0]["hi"]
    assert "frobenius_norm" not in {v["invariant"] for v in out["violations"]}


def test_the_rho_shift_bound_covers_the_whole_interval_and_the_slope_alone_does_not():
    """|f(r) - f(rho)| for every r within drho of rho (f = 2 r^4 - r^8, increasing on [0, 1)) is
    bounded by cnp_orthogonality_shift; the slope at rho times drho is below it for rho < 0.81
    (the slope still grows there), which is why the slope is not used."""
    f = cnp_orthogonality_error
    for rho in (0.1, 0.3, 0.5, 0.7, 0.9):
        d = 1e-3
        worst = max(abs(f(min(r, 0.999999)) - f(rho)) for r in (rho - d, rho + d))
        assert bounds.cnp_orthogonality_shift(rho, d) >= worst
    assert bounds.cnp_orthogonality_slope(0.5) * 1e-3 < f(0.501) - f(0.5)


def test_the_float64_reference_error_is_budgeted_for_every_block_size():
    """cnp_reference compares with a computed float64 Cayley-Neumann: its Horner error
    (~3 (b + 1) 2^-53 of P) must be in the bound, not a constant 2^-50 (too small from b = 2)."""
    for b in (32, 64, 128, 256):
        theta64 = bounds.cnp_theta(b, bounds.U64)
        assert theta64 > 2.0**-50 and theta64 == pytest.approx(3 * (b + 1) * 2.0**-53, rel=1e-3)
        for u in (0.0, 2.0**-8, 2.0**-11):
            assert bounds.cnp_coeff(b, u) == pytest.approx((1 + u) * (bounds.cnp_theta(b) + theta64), rel=1e-15)
