"""Tolerances of the POET invariants, derived from the dtype's unit roundoff, the sizes and the
Cayley-Neumann error (docs/poet.md, "Tolerances"). Pure arithmetic on floats: no torch here.

Model (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 2-3):
- fl(x op y) = (x op y)(1 + d), |d| <= u; a dot product of length n accumulated in a format with
  unit roundoff u, in any order, has |fl(a.b) - a.b| <= gamma_n(u) |a|.|b|, gamma_n = n u / (1 - n u);
- gamma_n + gamma_m + gamma_n gamma_m <= gamma_(n+m) (Lemma 3.3);
- a result stored in a narrower format adds u_s |value| (round to nearest), or an absolute half
  spacing of the subnormals where the value is below the format's smallest normal.
Every bound here is a worst case: no safety factor, no probabilistic sqrt(n) argument.

Underflow. The floors (ACC_FLOOR = 2^-150 per fp32 operation, SUBNORMAL_HALF_SPACING) assume
gradual underflow: fl(x) = x(1 + d) + e with |d| <= u and |e| <= 2^-150, e = 0 unless the result
is subnormal. CuPy compiles every kernel with -ftz=true, which flushes fp32 subnormal inputs and
results of the C-level arithmetic (add/mul/fma .ftz) to zero; there a flushed result errs by up to
2^-126 and a flushed input a_k costs |a_k b_k| < 2^-126 |b_k|, which no constant floor bounds. The
floors hold on the GPU all the same because no fp32 operation of the POET kernels that can take or
give a subnormal flushes:
- the CUDA-core accumulation is gc_fmaf (prelude.cuh: fma.rn.f32, no .ftz), the tensor cores'
  mma.sync has no .ftz, and the stores and loads convert by bit arithmetic (bf16), by cvt without
  .ftz (fp16) or not at all (fp32);
- the only .ftz operations left (tests/test_poet_kernels.py checks the PTX) add the Horner constant
  c in {1, 2} to a diagonal element x (cnp: q + 2, acc + c). A subnormal x is below half an ulp of
  c (2^-24), so flushing it changes no rounded sum; and x + c is never subnormal: |x| < 1/2 gives
  |x + c| > 1/2, and |x| >= 1/2 makes x a multiple of 2^-24, as c is, so a nonzero x + c is at
  least 2^-24.
tests/test_kernel_infra.py shows the difference under the emulated flush: a dot product at the
bottom of fp32's range stays within stage_floor with gc_fmaf and leaves it with __fmaf_rn.
"""

from __future__ import annotations

import math
from typing import Sequence

DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")
BLOCK_SIZES: tuple[int, ...] = (32, 64, 128, 256)
ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}

U32 = 2.0**-24  # fp32: the kernels' accumulator
U64 = 2.0**-53  # float64: the references
# Unit roundoff of the storage format of each kernel output. fp32 outputs are the accumulator
# itself: no second rounding.
STORE_ROUNDOFF: dict[str, float] = {"fp32": 0.0, "bf16": 2.0**-8, "fp16": 2.0**-11}
UNIT_ROUNDOFF: dict[str, float] = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
# Half the spacing of the subnormals: the absolute error of rounding a tiny value (IEEE, round to
# nearest, gradual underflow).
SUBNORMAL_HALF_SPACING: dict[str, float] = {"fp32": 2.0**-150, "bf16": 2.0**-134, "fp16": 2.0**-25}
# Accumulator of a dense torch/cuBLAS GEMM: fp32, but tensor-core accumulation is not IEEE round
# to nearest (alignment with truncation, Fasi et al. 2021): budgeted at one ulp, 2 u32, which also
# covers round-toward-zero. A config may override it (`dense_acc_roundoff`).
DENSE_ACC_ROUNDOFF = 2.0**-23
# Per-element rounding floor of the accumulator (fp32 subnormals), per operation: gradual
# underflow, which the kernels keep under CuPy's -ftz=true (module docstring, "Underflow").
ACC_FLOOR = 2.0**-150
# Tensor cores (mma.sync, bf16/fp16 products, fp32 accumulation): not IEEE. Each instruction adds
# its exact products and the accumulator in fused groups of g products, aligning every term to
# the largest one with truncation and truncating the normalised sum to fp32 (Fasi, Higham,
# Mikaitis, Pranesh 2021: g = 4 on V100, 8 on A100; Khattak and Mikaitis 2025: 16 on H100).
# Truncation (round toward zero) has unit roundoff 2^-23, twice round-to-nearest's.
TC_ROUNDOFF = 2.0**-23
TC_GROUPS: tuple[int, ...] = (4, 8, 16)
# Units a block-diagonal apply runs on: the scalar CUDA kernel (fp32 FMA), the tensor-core kernel,
# and torch (fp32 bmm standing in for the kernels).
UNITS: tuple[str, ...] = ("cuda", "tensor", "torch")


class PoetInputError(ValueError):
    pass


def parse_dtypes(value: str | Sequence[str]) -> list[str]:
    """'fp32,bf16' or ['bf16'] -> ['fp32', 'bf16']; PoetInputError for anything else."""
    from ..core.choices import parse_choices

    return parse_choices(value, DTYPES, what="dtype", error=PoetInputError, aliases=ALIASES)

def parse_blocks(value: str | int | Sequence[int] | Sequence[str]) -> list[int]:
    """'32,256' or [64] -> block sizes; PoetInputError unless each is one of BLOCK_SIZES."""
    if isinstance(value, int):
        items: list = [value]
    elif isinstance(value, str):
        items = value.split(",")
    else:
        items = list(value)
    out: list[int] = []
    for raw in items:
        text = str(raw).strip()
        if not text:
            continue
        try:
            b = int(text)
        except ValueError:
            raise PoetInputError(f"bad block size {text!r} (use {', '.join(map(str, BLOCK_SIZES))})") from None
        if b not in BLOCK_SIZES:
            raise PoetInputError(f"block size {b} not supported (use {', '.join(map(str, BLOCK_SIZES))})")
        if b not in out:
            out.append(b)
    if not out:
        raise PoetInputError(f"no block size given (use {', '.join(map(str, BLOCK_SIZES))})")
    return out


def gamma(n: int, u: float) -> float:
    """gamma_n(u) = n u / (1 - n u)."""
    nu = n * u
    if nu >= 1.0:
        raise ValueError(f"gamma_{n}({u}) undefined: n u >= 1")
    return nu / (1.0 - nu)


def acc_coeff(n: int, u_acc: float) -> float:
    """Relative (to |A|.|B|) accumulation bound of one product stage of inner size n, plus the
    float64 reference's own error (it is computed, not exact)."""
    return gamma(n, u_acc) + gamma(n + 2, U64)


def mma_acc_coeff(n: int) -> float:
    """Relative (to |A|.|B|) accumulation bound of a length-n dot product on tensor cores, plus the
    float64 reference's own error.

    One fused group of g exact products p_i and the accumulator c: every term is aligned to the
    largest, |t_max| >= 2^e, keeping 23 bits below 2^e, so each of the other g terms loses less
    than 2^(e-23) <= u |t_max|; the sum is then truncated to fp32, less than u |sum|: the error is
    below (g + 1) u (|c| + sum |p_i|), u = TC_ROUNDOFF. Chained over s = ceil(n / g) groups,
    E_j <= (1 + e) E_(j-1) + e T_j (T_j the sum of |products| so far, e = (g + 1) u) gives
    E_s <= ((1 + e)^s - 1) T_n. The worst over TC_GROUPS (it is g = 4's: (g + 1) / g is largest)."""
    worst = max(math.expm1(math.ceil(n / g) * math.log1p((g + 1) * TC_ROUNDOFF)) for g in TC_GROUPS)
    return worst + gamma(n + 2, U64)


def unit_acc_coeff(unit: str, n: int) -> float:
    """acc_coeff of a block-diagonal apply of inner size n computed on `unit` (UNITS): fp32 FMA
    (round to nearest) for the scalar kernel and torch, mma_acc_coeff on tensor cores."""
    if unit == "tensor":
        return mma_acc_coeff(n)
    if unit in ("cuda", "torch"):
        return acc_coeff(n, U32)
    raise ValueError(f"unknown unit {unit!r} (one of {', '.join(UNITS)})")


def unit_floor(unit: str, dtype: str, n: int) -> float:
    """stage_floor for `unit`: on tensor cores every term of a group and every group's sum may be
    truncated at the bottom of fp32's range, a full subnormal spacing (2^-149) each: at most
    2n + 1 of them."""
    if unit == "tensor":
        return SUBNORMAL_HALF_SPACING[dtype] + (2 * n + 1) * 2.0 * ACC_FLOOR
    if unit in ("cuda", "torch"):
        return stage_floor(dtype, n)
    raise ValueError(f"unknown unit {unit!r} (one of {', '.join(UNITS)})")


def stage_floor(dtype: str, n: int) -> float:
    """Absolute per-element floor of one stage: rounding a subnormal result to the storage format,
    and n accumulator operations at the bottom of fp32's range."""
    return SUBNORMAL_HALF_SPACING[dtype] + (n + 1) * ACC_FLOOR


def cnp_theta(b: int, u: float = U32) -> float:
    """Relative (to P = I + 2|Q| + 2|Q|^2 + 2|Q|^3 + |Q|^4) bound of the Horner evaluation of
    G = I + Q(2I + Q(2I + Q(2I + Q))) with unit roundoff u (fp32: the kernel; U64: the float64
    reference): (1 + u)(1 + gamma_(b+1)(u))^3 - 1 (one rounding for 2I + Q, then three steps of a
    length-b dot product plus one addition)."""
    return (1.0 + u) * (1.0 + gamma(b + 1, u)) ** 3 - 1.0


def cnp_coeff(b: int, u_s: float) -> float:
    """Coefficient of P in the elementwise bound of |G_stored - G_ref64| (cnp_reference):
    beta = u_s |G_ref64| + cnp_coeff(b, u_s) P + floor, with
    cnp_coeff = (1 + u_s)(theta_b(u32) + theta_b(u64)): the fp32 evaluation, and the float64
    reference's own Horner error (which also turns u_s |G| into u_s |G_ref64|)."""
    return (1.0 + u_s) * (cnp_theta(b, U32) + cnp_theta(b, U64))


def cnp_orthogonality_error(rho: float, terms: int = 3) -> float:
    """||G^T G - I||_2 of the Cayley-Neumann G built with `terms` Neumann terms from a
    skew-symmetric Q with ||Q||_2 = rho < 1, in exact arithmetic.

    With S = I + Q + ... + Q^k = (I - Q^(k+1))(I - Q)^-1 and G = (I + Q) S, every factor is a
    polynomial in Q (they commute) and G^T = (I - Q) S(-Q), so
    G^T G = (I - (-Q)^(k+1)) (I - Q^(k+1)). Q has eigenvalues +-i lambda:
      k = 3: G^T G = (I - Q^4)^2, Q^4 has eigenvalues lambda^4, error 2 rho^4 - rho^8 (attained);
      k = 2: G^T G = I - Q^6, Q^6 has eigenvalues -lambda^6, error rho^6.
    Also, the singular values of G (k = 3) are 1 - lambda^4: in [1 - rho^4, 1].
    """
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must be in [0, 1), not {rho}")
    if terms == 3:
        return 2.0 * rho**4 - rho**8
    if terms == 2:
        return rho**6
    raise ValueError("only 2 and 3 Neumann terms are modelled")


def cnp_orthogonality_slope(rho: float) -> float:
    """d/drho (2 rho^4 - rho^8) = 8 rho^3 - 8 rho^7 (>= 0 on [0, 1))."""
    return 8.0 * rho**3 - 8.0 * rho**7


def cnp_orthogonality_shift(rho: float, drho: float) -> float:
    """How far 2 r^4 - r^8 can be from its value at rho for any r in [rho - drho, rho + drho]
    (within [0, 1)): the function is increasing there, so the larger of the two end differences.
    (The slope at rho times drho is not a bound: the slope grows up to rho = (3/7)^(1/4).)"""
    f = cnp_orthogonality_error
    hi = min(rho + drho, 1.0 - 1e-12)
    lo = max(rho - drho, 0.0)
    # evaluated as a difference of two values near f(rho): add the rounding of that difference
    return max(f(hi) - f(rho), f(rho) - f(lo)) + 4.0 * U64 * f(hi)


def rho_uncertainty(rho: float, b: int) -> float:
    """How far ||Q32||_2 can be from the target rho after rounding the (scaled, float64) Q to
    fp32: ||dQ||_2 <= ||dQ||_F <= u32 ||Q||_F <= u32 sqrt(b) rho; plus the float64 measurement
    of the base matrix S: the product S^T S (gamma_b(u64) |S|^T|S|, and || |S| ||_2^2 <= b ||S||_2^2:
    b^2 u64 relative), a backward-stable eigensolver (counted as 64 b u64), the square root, the
    division and the scaling by rho (a few u64 each, inside the 64 b)."""
    return U32 * math.sqrt(b) * rho + (b * b + 64.0 * b) * U64 * rho


def float64_eig_error(b: int, abs_norm: float) -> float:
    """Error of ||G^T G - I||_2 evaluated in float64 (product gamma_b(u64) |G|^T|G|, and a backward
    stable symmetric eigensolver, c b u64 ||M||, c = 4): 8 b u64 (1 + abs_norm^2)."""
    return 8.0 * b * U64 * (1.0 + abs_norm**2)


def norm_eval_error(n: int) -> float:
    """Relative error of a 2-norm of n float64 values: gamma_(n+2)(u64) (squares, sum, sqrt)."""
    return gamma(n + 2, U64)


def interval_check(value: float, lo: float, hi: float, center: float = 1.0) -> tuple[bool, float, float, float]:
    """Judge `value` against [lo, hi] around `center` (1: an exactly orthogonal transform). Returns
    (ok, error, bound, ratio): error = |value - center|, bound = the allowed distance on that
    side (hi - center or center - lo), ratio = error / bound (inf for a NaN value)."""
    if not math.isfinite(value):
        return False, math.inf, max(hi - center, center - lo), math.inf
    if value >= center:
        err, bound = value - center, hi - center
    else:
        err, bound = center - value, center - lo
    ok = lo <= value <= hi
    ratio = err / bound if bound > 0 else (0.0 if err == 0 else math.inf)
    return ok, err, bound, ratio
