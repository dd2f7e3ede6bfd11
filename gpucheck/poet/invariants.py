"""One POET problem: run its operations through a backend (torch or the CUDA kernels), verify
every invariant, return plain data. The same code for both backends.

    out = check_problem(torch, ops, problem, VerifyConfig(...), inject=None, beat=chan.heartbeat)
    out["violations"]   # [{"invariant", "dtype", "block", "problem", "op", "error", "bound", ...}]
    out["ratios"]       # {invariant: worst error / bound seen (a healthy run stays <= 1)}

Operations of one problem (n features, m rows, k = n / b blocks; Pi_* permutations):
    G_in, G_out = cnp(Q_in), cnp(Q_out)                                    CUDA kernel (2)
    Y1    = bd(x, G_in, gather Pi_in)        = x Pi_in BD(G_in)            CUDA kernel (1) or (3)
    Z     = dense(Y1, W)                     = Y1 W^T                      torch / cuBLAS
    y_in  = bd(Z, G_out, scatter Pi_out)     = Z BD(G_out) Pi_out          CUDA kernel
    A     = bd(W, G_in^T, scatter Pi_in^T)   = W BD(G_in)^T Pi_in^T        CUDA kernel
    W_eff = bd(A^T, G_out, scatter Pi_out)^T = Pi_out^T BD(G_out)^T A      CUDA kernel
    y_w   = dense(x, W_eff)                  = x W_eff^T                   torch / cuBLAS
    X2    = bd(Y1, G_in^T, scatter Pi_in^T)  = x Pi_in BD(G_in G_in^T) Pi_in^T (round trip)
    merge chain: W_t = Pi^T BD(G_out,t)^T W_(t-1) BD(G_in,t)^T Pi^T with fresh transforms
Every kernel operation runs twice on the same inputs, and a block-diagonal apply runs on every
unit the backend has for the dtype (ops.units: tensor cores and CUDA cores for bf16/fp16 on the
CUDA kernels), each twice; the first result of the first unit is the one used downstream.

Invariants (the tolerances are derived in gpucheck.poet.bounds and docs/poet.md):
    cnp_reference        every G element vs the float64 Cayley-Neumann of the stored Q
    cnp_orthogonality    ||G^T G - I||_2 per sampled block vs the theory 2 rho^4 - rho^8
    kernel_reference     every element of every bd output vs float64 from the same stored inputs
    forward_equivalence  y_in vs y_w on sampled rows (input-centric vs weight-centric)
    frobenius_norm       ||W_eff||_F / ||W||_F within the singular-value range of the CNP blocks
    row_norms            every row of A keeps the norm of the same row of W (a neuron's norm)
    round_trip           X2 vs x Pi BD((I - Q^4)^2) Pi^T, the exact CNP round trip (X up to
                         the CNP's orthogonality error)
    norm_drift           ||W_t||_F / ||W||_F over the merge chain within the compounded bound
    repeat_bitwise       every kernel run twice on the same inputs gives the same bits (every
                         kernel has a fixed reduction order): catches a flip in any bit, also
                         those below the rounding bounds above
    core_agreement       the CUDA-core result of every bd vs the tensor-core one, within the sum
                         of both units' kernel_reference bounds (only where both units exist)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypedDict

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

    from ..workers.results import PoetIntervalDetails, PoetViolation, PoetViolationDetails

from .bounds import (
    STORE_ROUNDOFF,
    U64,
    acc_coeff,
    cnp_coeff,
    cnp_orthogonality_error,
    cnp_orthogonality_shift,
    float64_eig_error,
    gamma,
    interval_check,
    norm_eval_error,
    stage_floor,
    unit_acc_coeff,
    unit_floor,
)
from .ortho import TOP_MANTISSA_BIT, Problem, Transform, bd_torch, cnp_torch, flip_bit

INVARIANTS: tuple[str, ...] = (
    "cnp_reference",
    "cnp_orthogonality",
    "kernel_reference",
    "forward_equivalence",
    "frobenius_norm",
    "row_norms",
    "round_trip",
    "norm_drift",
    "repeat_bitwise",
    "core_agreement",
)
UNIT_NAMES = {"tensor": "tensor cores", "cuda": "CUDA cores", "torch": "torch"}
# Where an injected bit flip can land: the output of one kernel call.
INJECT_OPS: tuple[str, ...] = ("forward", "output", "merge", "roundtrip", "cnp")


class PoetBitflip(TypedDict, total=False):
    """The bitflip injection: flip `bit` of element (row, col) of the output of `op` in problem
    `problem` (None: the top mantissa bit, a default element, problem 0)."""

    op: str  # INJECT_OPS
    bit: int | None
    row: int | None
    col: int | None
    problem: int | None


class ProblemCheck(TypedDict):
    """One problem run and verified (check_problem)."""

    violations: list[PoetViolation]
    ratios: dict[str, float]  # invariant -> the worst error/bound ratio (inf: not finite)
    checks: dict[str, int]  # invariant -> comparisons made
    launches: int
    flops: float
    injected: list[str]


@dataclass
class CnpInfo:
    """One CNP block set as later bounds need it (_Checker.cnp): float64 copies, the exact CNP,
    beta (elementwise bound of |G - G_exact|), eta (bound of ||G_j - G_exact,j||_2 per block), the
    transform, and the singular-value ranges of the stored blocks. Tensors: in-process only."""

    name: str
    G64: Any
    Gx: Any
    beta: Any
    eta: list[float]
    t: Transform
    sig_lo: list[float]
    sig_hi: list[float]


@dataclass
class VerifyConfig:
    verify_rows: int = 256  # rows of y compared input-centric vs weight-centric
    ortho_blocks: int = 4  # CNP blocks per problem whose ||G^T G - I||_2 is measured
    dense_acc_roundoff: float = 2.0**-23
    bound_scale: float = 1.0  # multiplies every bound (1: as derived)
    max_events: int = 8


class _Checker:
    def __init__(self, torch: Any, prob: Problem, cfg: VerifyConfig, rng: random.Random,
                 units: tuple[str, ...] = ("cuda",)):
        self.torch = torch
        self.prob = prob
        self.cfg = cfg
        self.rng = rng
        self.units = units  # the units of a bd: the first computes what is used downstream
        self.violations: list[PoetViolation] = []
        self.ratios: dict[str, float] = {}
        self.checks: dict[str, int] = {}
        dt = prob.dtype
        self.u = STORE_ROUNDOFF[dt]
        self.cb = unit_acc_coeff(units[0], prob.b)
        self.cn = acc_coeff(prob.n, cfg.dense_acc_roundoff)
        self.fb = unit_floor(units[0], dt, prob.b)
        self.fn = stage_floor(dt, prob.n)

    # -- recording ---------------------------------------------------------------------------
    def _ratio(self, name: str, r: float) -> None:
        self.checks[name] = self.checks.get(name, 0) + 1
        if not (r <= self.ratios.get(name, -1.0)):  # NaN or larger
            self.ratios[name] = r if math.isfinite(r) else math.inf

    def _violation(self, name: str, op: str, error: float, bound: float,
                   **details: "Unpack[PoetViolationDetails]") -> None:
        p = self.prob
        self.violations.append({
            "invariant": name, "dtype": p.dtype, "block": p.b, "problem": p.index, "op": op,
            "error": error if math.isfinite(error) else math.inf, "bound": bound,
            "distribution": p.distribution, "size": p.n, "rows": p.m, **details,
        })

    def elementwise(self, name: str, op: str, got: Any, expected: Any, bound: Any, shape_names: tuple[str, ...],
                    row_map: list[int] | None = None) -> None:
        """|got - expected| <= bound element by element (float64). A NaN or Inf in `got` always
        fails, even where the bound is infinite (propagated from an earlier non-finite value).
        row_map: the problem's row numbers of the compared rows (sampled rows)."""
        torch = self.torch
        bound = bound * self.cfg.bound_scale
        got64 = got.to(torch.float64)
        err = (got64 - expected).abs()
        nonfinite = ~torch.isfinite(got64)
        ratio = torch.nan_to_num(err / bound, nan=math.inf, posinf=math.inf).masked_fill(nonfinite, math.inf)
        bad = ~(err <= bound) | nonfinite
        nbad = int(bad.sum().item())
        flat = int(ratio.reshape(-1).argmax().item())
        worst = float(ratio.reshape(-1)[flat].item())
        self._ratio(name, worst)
        if nbad:
            idx = _unravel(flat, tuple(ratio.shape))
            if row_map is not None:
                idx = (row_map[idx[0]],) + idx[1:]
            where = ", ".join(f"{k} {v}" for k, v in zip(shape_names, idx))
            self._violation(name, op, float(err.reshape(-1)[flat].item()), float(bound.reshape(-1)[flat].item()),
                            elements=nbad, where=where, index=list(idx),
                            got=float(got.reshape(-1)[flat].item()), expected=float(expected.reshape(-1)[flat].item()))

    def bitwise(self, name: str, op: str, first: Any, again: Any, shape_names: tuple[str, ...]) -> None:
        """`first` and `again` (the same kernel on the same inputs) hold the same bits. Ratio 0
        when they do, inf when not; the violation names the first element that differs."""
        torch = self.torch
        view = {2: torch.int16, 4: torch.int32}[first.element_size()]
        a, b = first.contiguous().view(view), again.contiguous().view(view)
        diff = a != b
        ndiff = int(diff.sum().item())
        self._ratio(name, math.inf if ndiff else 0.0)
        if not ndiff:
            return
        flat = int(diff.reshape(-1).nonzero()[0, 0].item())
        idx = _unravel(flat, tuple(diff.shape))
        got, again_v = float(first.reshape(-1)[flat].item()), float(again.reshape(-1)[flat].item())
        mask = (1 << (8 * first.element_size())) - 1
        bits = f"bits {int(a.reshape(-1)[flat].item()) & mask:#x} then {int(b.reshape(-1)[flat].item()) & mask:#x}"
        err = abs(got - again_v) if math.isfinite(got) and math.isfinite(again_v) else math.inf
        where = ", ".join(f"{k} {v}" for k, v in zip(shape_names, idx))
        self._violation(name, op, err, 0.0, elements=ndiff, where=f"{where}, {bits}", index=list(idx), got=got,
                        expected=again_v)

    def interval(self, name: str, op: str, value: float, lo: float, hi: float, where: str,
                 **details: "Unpack[PoetIntervalDetails]") -> None:
        ok, err, bound, ratio = interval_check(value, lo, hi)
        self._ratio(name, ratio)
        if not ok:
            self._violation(name, op, err, bound, where=where, value=value, lo=lo, hi=hi, **details)

    # -- the CNP blocks ----------------------------------------------------------------------
    def cnp(self, G: Any, t: Transform, name: str) -> CnpInfo:
        """cnp_reference for one G; returns what later bounds need: float64 copies, the exact
        CNP, beta (elementwise bound of |G - G_exact|), eta (bound of ||G_j - G_exact,j||_2),
        the singular-value ranges of the stored blocks."""
        torch = self.torch
        f64 = torch.float64
        b = self.prob.b
        Q64 = t.Q.to(f64)
        Gx = cnp_torch(torch, Q64, acc=f64)
        P = cnp_torch(torch, Q64.abs(), acc=f64)
        beta = self.u * Gx.abs() + cnp_coeff(b, self.u) * P + stage_floor(self.prob.dtype, 4 * b)
        self.elementwise("cnp_reference", f"cnp {name}", G, Gx, beta, ("block", "row", "col"))
        bs = beta * self.cfg.bound_scale
        eta = (bs.sum(2).amax(1) * bs.sum(1).amax(1)).sqrt()  # ||B||_2 <= sqrt(||B||_1 ||B||_inf)
        eta_l = [float(v) for v in eta.tolist()]
        rho_hi = [r + d for r, d in zip(t.rho, t.drho)]
        sig_lo = [max(0.0, 1.0 - rh**4 - e) for rh, e in zip(rho_hi, eta_l)]
        sig_hi = [1.0 + e for e in eta_l]
        return CnpInfo(name=name, G64=G.to(f64), Gx=Gx, beta=beta, eta=eta_l, t=t, sig_lo=sig_lo, sig_hi=sig_hi)

    def orthogonality(self, infos: list[CnpInfo]) -> None:
        """cnp_orthogonality on `ortho_blocks` blocks drawn from all G's of the problem:
        | ||G_j^T G_j - I||_2 - (2 rho^4 - rho^8) | <= 2 eta + eta^2 + shift(rho, drho) + float64
        error. A block with a NaN or Inf (an exponent flip) is a violation with error inf; it never
        reaches the eigensolver (which raises on non-finite input on CPUs)."""
        torch = self.torch
        pairs = [(i, j) for i, info in enumerate(infos) for j in range(len(info.eta))]
        if not pairs or self.cfg.ortho_blocks <= 0:
            return
        pick = self.rng.sample(pairs, min(self.cfg.ortho_blocks, len(pairs)))
        Gs = torch.stack([infos[i].G64[j] for i, j in pick])
        b = Gs.shape[-1]
        eye = torch.eye(b, dtype=Gs.dtype, device=Gs.device)
        M = Gs.transpose(1, 2) @ Gs - eye
        finite = torch.isfinite(M).flatten(1).all(1)
        M = torch.where(finite[:, None, None], M, torch.zeros_like(M))
        e = torch.linalg.eigvalsh(M).abs().amax(1)
        e = torch.where(finite, e, torch.full_like(e, math.inf))
        absG = Gs.abs()
        a = (absG.sum(2).amax(1) * absG.sum(1).amax(1)).sqrt()
        for (i, j), ej, aj in zip(pick, e.tolist(), a.tolist()):
            info = infos[i]
            t: Transform = info.t
            rho, drho, eta = t.rho[j], t.drho[j], info.eta[j]
            theory = cnp_orthogonality_error(rho)
            slack = (2.0 * eta + eta * eta + cnp_orthogonality_shift(rho, drho)
                     + float64_eig_error(b, aj)) * self.cfg.bound_scale
            err = abs(ej - theory) if math.isfinite(ej) else math.inf
            if not math.isfinite(ej):  # NaN/Inf in the block: its slack (from |G|) may be inf too
                slack = slack if math.isfinite(slack) else math.nan
            ratio = err / slack if math.isfinite(ej) else math.inf
            self._ratio("cnp_orthogonality", ratio)
            if not (math.isfinite(ej) and err <= slack):
                self._violation("cnp_orthogonality", f"cnp {info.name}", err, slack, where=f"block {j}",
                                measured=ej, theory=theory, rho=rho)

    # -- one bd call: kernel_reference, returns the local bound ------------------------------
    def bd_reference(self, op: str, got: Any, X: Any, G64: Any, absG: Any, **kw: Any) -> tuple[Any, Any, Any]:
        """Compare a bd output (of the first unit) with float64 from its own stored inputs; return
        (ref, |X| |BD(G)|, local bound) with local = u |ref| + (1 + u) c_b |X| |BD(G)| + floor."""
        torch = self.torch
        f64 = torch.float64
        X64 = X.to(f64)
        ref = bd_torch(torch, X64, G64, acc=f64, **kw)
        absr = bd_torch(torch, X64.abs(), absG, acc=f64, **kw)
        loc = self.u * ref.abs() + (1.0 + self.u) * self.cb * absr + self.fb
        self.elementwise("kernel_reference", op, got, ref, loc, ("row", "col"))  # of the stored output
        return ref, absr, loc

    def unit_bound(self, unit: str, ref: Any, absr: Any) -> Any:
        """kernel_reference's local bound for a bd computed on `unit`."""
        b, u = self.prob.b, self.u
        return u * ref.abs() + (1.0 + u) * unit_acc_coeff(unit, b) * absr + unit_floor(unit, self.prob.dtype, b)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(flat % s)
        flat //= s
    return tuple(reversed(out))


def _fro(torch: Any, t: Any) -> float:
    return float(torch.linalg.vector_norm(t.to(torch.float64)).item())


class _Injector:
    """Flips one bit of one output of the op named in the injection, once."""

    def __init__(self, torch: Any, prob: Problem, inject: PoetBitflip | None):
        self.torch = torch
        self.prob = prob
        self.spec = inject if inject and int(inject.get("problem") or 0) == prob.index else None
        # an int when given, else None (the defaults below)
        self.spec_row = None if self.spec is None else self.spec.get("row")
        self.spec_col = None if self.spec is None else self.spec.get("col")
        self.done: list[str] = []

    def __call__(self, op: str, t: Any) -> None:
        spec = self.spec
        if spec is None or self.done or (spec.get("op") or "forward") != op:
            return
        p = self.prob
        bit = spec.get("bit")
        bit = TOP_MANTISSA_BIT[p.dtype] if bit is None else int(bit)
        if op == "cnp":  # block 0 of G_in; default a diagonal element (about 1)
            b = p.b
            r = int(self.spec_row) % b if self.spec_row is not None else b // 2
            c = int(self.spec_col) % b if self.spec_col is not None else b // 2
            flat, where = r * b + c, f"block 0, element ({r}, {c})"
        else:
            rows, cols = tuple(t.shape)
            r = int(self.spec_row) % rows if self.spec_row is not None else rows // 2
            c = int(self.spec_col) % cols if self.spec_col is not None else cols // 3
            flat = r * cols + c
            where = f"element ({r}, {c})"
        before, after = flip_bit(self.torch, t, flat, bit)
        self.done.append(f"bitflip: {op} output of problem {p.index} ({p.dtype}, block {p.b}), {where}, "
                         f"bit {bit}: {before:.6g} -> {after:.6g}")


class _Run:
    """One problem's operations through `ops`, each kernel repeated and every unit run, with the
    checks of each result made where it is produced."""

    def __init__(self, torch: Any, ops: Any, prob: Problem, ck: _Checker, inj: _Injector, beat: Callable[[], None]):
        self.torch, self.ops, self.prob, self.ck, self.inj, self.beat = torch, ops, prob, ck, inj, beat

    def cnp(self, t: Transform, name: str, inject_op: str | None = None) -> tuple[Any, CnpInfo]:
        """G of transform t, twice: cnp_reference on the first, repeat_bitwise between the two."""
        ops, dtype = self.ops, self.prob.dtype
        G = ops.cnp(t.Q, dtype)
        again = ops.cnp(t.Q, dtype)
        ops.sync()
        if inject_op:
            self.inj(inject_op, G)
        self.beat()
        info = self.ck.cnp(G, t, name)
        self.ck.bitwise("repeat_bitwise", f"cnp {name}", G, again, ("block", "row", "col"))
        return G, info

    def bd(self, op: str, X: Any, G: Any, info: CnpInfo, inject_op: str | None = None,
           **kw: Any) -> tuple[Any, Any, Any]:
        """One block-diagonal apply on every unit, each twice: kernel_reference on the first
        unit's first result (the one returned and used downstream), repeat_bitwise for every
        unit, core_agreement of the other units with the first. Returns (Y, ref, local bound)."""
        ops, ck = self.ops, self.ck
        runs = []
        for i, unit in enumerate(ck.units):
            ukw = {"unit": unit} if i else {}  # the first unit is the backend's default
            runs.append((ops.bd(X, G, **kw, **ukw), ops.bd(X, G, **kw, **ukw)))
        ops.sync()
        Y = runs[0][0]
        if inject_op:
            self.inj(inject_op, Y)
        self.beat()
        ref, absr, loc = ck.bd_reference(f"bd_apply {op}", Y, X, info.G64, info.G64.abs(), **kw)
        for unit, (first, again) in zip(ck.units, runs):
            label = f"bd_apply {op}" + (f" ({UNIT_NAMES[unit]})" if len(ck.units) > 1 else "")
            ck.bitwise("repeat_bitwise", label, first, again, ("row", "col"))
        Y64 = Y.to(self.torch.float64)
        for unit, (first, _) in zip(ck.units[1:], runs[1:]):
            ck.elementwise("core_agreement", f"bd_apply {op}: {UNIT_NAMES[unit]} vs {UNIT_NAMES[ck.units[0]]}",
                           first, Y64, loc + ck.unit_bound(unit, ref, absr), ("row", "col"))
        return Y, ref, loc


def check_problem(torch: Any, ops: Any, prob: Problem, cfg: VerifyConfig, inject: PoetBitflip | None = None,
                  beat: Callable[[], None] | None = None) -> ProblemCheck:
    """Run one problem through `ops` and verify it. Returns plain data (see the module doc)."""
    beat = beat or (lambda: None)
    rng = random.Random(prob.seed)
    units = tuple(ops.units(prob.dtype))
    ck = _Checker(torch, prob, cfg, rng, units)
    inj = _Injector(torch, prob, inject)
    run = _Run(torch, ops, prob, ck, inj, beat)
    launches0 = ops.launches
    x, W, ti, to = prob.x, prob.W, prob.t_in, prob.t_out

    G_in, ci = run.cnp(ti, "G_in", inject_op="cnp")
    G_out, co = run.cnp(to, "G_out")
    infos = [ci, co]
    # input-centric forward, then the weight-centric merge W_eff
    Y1, _, e1 = run.bd("x·Π_in·BD(G_in)", x, G_in, ci, inject_op="forward", in_idx=ti.perm)
    Z = ops.dense(Y1, W)
    y_in, ref3, _ = run.bd("Z·BD(G_out)·Π_out", Z, G_out, co, inject_op="output", out_idx=to.inv)
    A, _, eA = run.bd("W·BD(G_in)ᵀ·Π_inᵀ", W, G_in, ci, transpose=True, out_idx=ti.perm)
    W_eff, _, locW = run.bd("Π_outᵀ·BD(G_out)ᵀ·A", A, G_out, co, inject_op="merge", x_t=True, y_t=True,
                            out_idx=to.inv)
    eWe = locW + bd_torch(torch, eA, co.G64.abs(), x_t=True, y_t=True, out_idx=to.inv, acc=torch.float64)
    y_w = ops.dense(x, W_eff)
    beat()
    _forward_equivalence(ck, prob, cfg, rng, Y1, Z, y_in, y_w, W_eff, e1, ref3, eWe, co)
    beat()
    lo1, hi1, nW, nWe = _frobenius(ck, prob, cfg, W_eff, eWe, ci, co)
    _row_norms(ck, prob, cfg, A, eA, ci)
    beat()
    _round_trip(run, Y1, G_in, ci, e1)
    _chain(run, cfg, infos, W_eff, nW, nWe, lo1, hi1)
    ck.orthogonality(infos)
    for v in ck.violations:
        v["injected"] = bool(inj.done)
    return {
        "violations": ck.violations,
        "ratios": ck.ratios,
        "checks": ck.checks,
        "launches": ops.launches - launches0,
        "flops": _flops(prob),
        "injected": inj.done,
    }


def _forward_equivalence(ck: _Checker, prob: Problem, cfg: VerifyConfig, rng: random.Random, Y1: Any, Z: Any,
                         y_in: Any, y_w: Any, W_eff: Any, e1: Any, ref3: Any, eWe: Any, co: CnpInfo) -> None:
    """y_in (input-centric) vs y_w (weight-centric) on `verify_rows` sampled rows."""
    torch = ck.torch
    f64 = torch.float64
    u, cb, cn, fb, fn = ck.u, ck.cb, ck.cn, ck.fb, ck.fn
    x, W, to = prob.x, prob.W, prob.t_out
    rows = sorted(rng.sample(range(prob.m), min(prob.m, max(1, cfg.verify_rows))))
    R = torch.tensor(rows, dtype=torch.long, device=x.device)
    W64, We64 = W.to(f64), W_eff.to(f64)
    xR = x.index_select(0, R).to(f64)
    Y1R = Y1.index_select(0, R).to(f64)
    ZR = Z.index_select(0, R).to(f64)
    S2 = Y1R @ W64.t()
    e2 = u * S2.abs() + ((1.0 + u) * cn * Y1R.abs() + e1.index_select(0, R)) @ W64.abs().t() + fn
    e3 = (u * ref3.index_select(0, R).abs()
          + bd_torch(torch, (1.0 + u) * cb * ZR.abs() + e2, co.G64.abs(), out_idx=to.inv, acc=f64) + fb)
    Syw = xR @ We64.t()
    e_yw = u * Syw.abs() + xR.abs() @ ((1.0 + u) * cn * We64.abs() + eWe).t() + fn
    ck.elementwise("forward_equivalence", "x·Π_in·BD(G_in)·Wᵀ·BD(G_out)·Π_out vs x·W_effᵀ",
                   y_in.index_select(0, R), y_w.index_select(0, R).to(f64), e3 + e_yw, ("row", "col"),
                   row_map=rows)


def _frobenius(ck: _Checker, prob: Problem, cfg: VerifyConfig, W_eff: Any, eWe: Any, ci: CnpInfo,
               co: CnpInfo) -> tuple[float, float, float, float]:
    """frobenius_norm of W_eff; returns the interval it was judged against (the start of the
    drift chain) and the two norms."""
    torch = ck.torch
    nW = _fro(torch, prob.W)
    nWe = _fro(torch, W_eff)
    rr = _fro(torch, eWe) * cfg.bound_scale / nW
    ev = 4.0 * norm_eval_error(prob.n * prob.n)
    s_lo = min(ci.sig_lo) * min(co.sig_lo)
    s_hi = max(ci.sig_hi) * max(co.sig_hi)
    lo1, hi1 = max(0.0, s_lo - rr), s_hi + rr
    ck.interval("frobenius_norm", "‖W_eff‖_F / ‖W‖_F", nWe / nW, lo1 - ev, hi1 + ev, where="W_eff",
                norm_w=nW, norm_w_eff=nWe)
    return lo1, hi1, nW, nWe


def _row_norms(ck: _Checker, prob: Problem, cfg: VerifyConfig, A: Any, eA: Any, ci: CnpInfo) -> None:
    """row_norms of A = W BD(G_in)^T Pi^T (row norms do not see the column permutation)."""
    torch = ck.torch
    f64 = torch.float64
    n, k, b = prob.n, prob.k, prob.b
    W64 = prob.W.to(f64)
    seg2 = (W64.reshape(n, k, b) ** 2).sum(2)
    sl = torch.tensor(ci.sig_lo, dtype=f64, device=W64.device) ** 2
    sh = torch.tensor(ci.sig_hi, dtype=f64, device=W64.device) ** 2
    nw = seg2.sum(1).sqrt()
    nA = torch.linalg.vector_norm(A.to(f64), dim=1)
    rA = torch.linalg.vector_norm(eA, dim=1) * cfg.bound_scale
    evr = 4.0 * norm_eval_error(n)
    lo = ((seg2 * sl).sum(1).sqrt() - rA) / nw - evr
    hi = ((seg2 * sh).sum(1).sqrt() + rA) / nw + evr
    v = nA / nw
    above = v >= 1.0
    err = torch.where(above, v - 1.0, 1.0 - v)
    bnd = torch.where(above, hi - 1.0, 1.0 - lo)
    vbad = ~torch.isfinite(v)  # a NaN/Inf row always fails (its bound may be inf too)
    ratio = torch.nan_to_num(err / bnd, nan=math.inf).masked_fill(vbad, math.inf)
    worst = int(ratio.argmax().item())
    ck._ratio("row_norms", float(ratio[worst].item()))
    bad = ~((v >= lo) & (v <= hi)) | vbad
    if bool(bad.any().item()):
        ck._violation("row_norms", "rows of W·BD(G_in)ᵀ·Π_inᵀ vs rows of W", float(err[worst].item()),
                      float(bnd[worst].item()), where=f"row {worst}", rows_bad=int(bad.sum().item()),
                      value=float(v[worst].item()), lo=float(lo[worst].item()), hi=float(hi[worst].item()))


def _round_trip(run: _Run, Y1: Any, G_in: Any, ci: CnpInfo, e1: Any) -> None:
    """X2 = x Pi BD(G) BD(G)^T Pi^T against x Pi BD((I - Q^4)^2) Pi^T."""
    torch, prob, ck = run.torch, run.prob, run.ck
    f64 = torch.float64
    ti = prob.t_in
    X2, _, loc2 = run.bd("Y1·BD(G_in)ᵀ·Π_inᵀ", Y1, G_in, ci, inject_op="roundtrip", transpose=True, out_idx=ti.perm)
    Gx, beta = ci.Gx, ci.beta
    aGx = Gx.abs() + beta
    D = Gx @ Gx.transpose(1, 2)  # = (I - Q^4)^2, the exact CNP round trip
    # float64 evaluation of D and of x.D (expected): (1 + gamma_b)^2 - 1 <= gamma_2b of |x| |G| |G|^T
    Gerr = (beta @ aGx.transpose(1, 2) + aGx @ beta.transpose(1, 2) + beta @ beta.transpose(1, 2)
            + gamma(2 * prob.b, U64) * (Gx.abs() @ Gx.abs().transpose(1, 2)))
    x64 = prob.x.to(f64)
    expected = bd_torch(torch, x64, D, in_idx=ti.perm, out_idx=ti.perm, acc=f64)
    bound_rt = (loc2 + bd_torch(torch, e1, ci.G64.abs(), transpose=True, out_idx=ti.perm, acc=f64)
                + bd_torch(torch, x64.abs(), Gerr, in_idx=ti.perm, out_idx=ti.perm, acc=f64))
    ck.elementwise("round_trip", "x·Π_in·BD(G_in)·BD(G_in)ᵀ·Π_inᵀ vs x·Π_in·BD((I−Q⁴)²)·Π_inᵀ", X2, expected,
                   bound_rt, ("row", "col"))


def _chain(run: _Run, cfg: VerifyConfig, infos: list[CnpInfo], W_eff: Any, nW: float, nWe: float,
           lo_c: float, hi_c: float) -> None:
    """The merge-then-reinitialize chain: norm_drift after every merge (infos grows by the
    chain's CNP blocks, for cnp_orthogonality)."""
    torch, prob, ck = run.torch, run.prob, run.ck
    ev = 4.0 * norm_eval_error(prob.n * prob.n)
    W_prev, n_prev = W_eff, nWe
    for step, (t2i, t2o) in enumerate(prob.chain, start=2):
        gi, c2i = run.cnp(t2i, f"G_in (merge {step})")
        go, c2o = run.cnp(t2o, f"G_out (merge {step})")
        infos += [c2i, c2o]
        A2, _, eA2 = run.bd(f"merge {step} W·BD(G_in)ᵀ·Π_inᵀ", W_prev, gi, c2i, transpose=True, out_idx=t2i.perm)
        W2, _, eW2 = run.bd(f"merge {step} Π_outᵀ·BD(G_out)ᵀ·A", A2, go, c2o, x_t=True, y_t=True,
                            out_idx=t2o.inv)
        eW2 = eW2 + bd_torch(torch, eA2, c2o.G64.abs(), x_t=True, y_t=True, out_idx=t2o.inv, acc=torch.float64)
        delta = _fro(torch, eW2) * cfg.bound_scale / n_prev
        lo_c *= max(0.0, min(c2i.sig_lo) * min(c2o.sig_lo) - delta)
        hi_c *= max(c2i.sig_hi) * max(c2o.sig_hi) + delta
        n_t = _fro(torch, W2)
        evs = step * ev
        ck.interval("norm_drift", f"‖W_{step}‖_F / ‖W‖_F after {step} merges", n_t / nW, lo_c - evs, hi_c + evs,
                    where=f"merge {step}", step=step)
        W_prev, n_prev = W2, n_t
        run.beat()


def _flops(p: Problem) -> float:
    """FLOPs of the problem's operations (not of its verification)."""
    cnp = 3 * 2.0 * p.k * p.b**3
    bd_x = 2.0 * p.m * p.n * p.b
    bd_w = 2.0 * p.n * p.n * p.b
    dense = 2.0 * p.m * p.n * p.n
    merges = len(p.chain)
    return (2 + 2 * merges) * cnp + 3 * bd_x + (2 + 2 * merges) * bd_w + 2 * dense
