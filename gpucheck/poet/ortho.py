"""POET math in torch: the reference operations, the torch backend (the path used on CPUs and on
GPUs without CuPy), and the random problems the check verifies.

Conventions (docs/poet.md):
- a permutation `perm` (int64, length n) acts on columns: (X Pi)[:, j] = X[:, perm[j]] (a gather);
  (X Pi^T)[:, perm[j]] = X[:, j] (a scatter with the same index); X Pi = scatter by argsort(perm).
- BD(G) is block diagonal with the k blocks G[j] (b x b) on its diagonal; n = k b.
- bd(X, G, in_idx, out_idx, transpose, x_t, y_t): the logical input A is X (or X^T with x_t);
  R = A[:, in_idx] . BD(G) (BD(G)^T with transpose); the result column c goes to out_idx[c]; the
  result is returned as stored (its transpose with y_t). Exactly what the CUDA kernel
  poet_bd_apply_<dtype> computes.
- cnp(Q): G = I + Q(2I + Q(2I + Q(2I + Q))) = I + 2Q + 2Q^2 + 2Q^3 + Q^4 (Cayley-Neumann, three
  Neumann terms), evaluated in this order in the accumulation dtype, then rounded to the storage
  dtype once. Exactly the order of the kernel poet_cnp_step_<dtype>.

torch is passed in (never imported at module level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .bounds import rho_uncertainty

STORAGE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Top mantissa bit of each storage format: the default bit an injected flip hits.
TOP_MANTISSA_BIT = {"fp32": 22, "bf16": 6, "fp16": 9}


def storage_dtype(torch: Any, dtype: str) -> Any:
    return getattr(torch, STORAGE[dtype])


# ---------------------------------------------------------------------------------------------
# the operations


def bd_torch(torch: Any, X: Any, G: Any, *, in_idx: Any = None, out_idx: Any = None, transpose: bool = False,
             x_t: bool = False, y_t: bool = False, acc: Any = None, out: Any = None) -> Any:
    """Block-diagonal apply (see the module doc) computed with torch.bmm in `acc` (default
    float32), rounded to `out` (default: acc)."""
    acc = acc or torch.float32
    A = X.t() if x_t else X
    m, n = A.shape
    k, b, _ = G.shape
    if k * b != n:
        raise ValueError(f"{k} blocks of {b} do not cover {n} columns")
    if in_idx is not None:
        A = A.index_select(1, in_idx)
    A = A.to(acc).reshape(m, k, b).transpose(0, 1)
    Gm = G.to(acc)
    if transpose:
        Gm = Gm.transpose(1, 2)
    R = torch.bmm(A, Gm).transpose(0, 1).reshape(m, n)
    if out is not None and out != acc:
        R = R.to(out)
    if out_idx is not None:
        Y = torch.empty_like(R)
        Y.index_copy_(1, out_idx, R)
        R = Y
    return R.t().contiguous() if y_t else R.contiguous()


def cnp_torch(torch: Any, Q: Any, *, acc: Any = None, out: Any = None) -> Any:
    """Cayley-Neumann G of every block of Q (k, b, b), Horner order, in `acc`, rounded to `out`."""
    acc = acc or torch.float32
    Qa = Q.to(acc)
    b = Qa.shape[-1]
    eye = torch.eye(b, dtype=acc, device=Qa.device)
    H = Qa + 2.0 * eye
    H = torch.bmm(Qa, H) + 2.0 * eye
    H = torch.bmm(Qa, H) + 2.0 * eye
    G = torch.bmm(Qa, H) + eye
    return G.to(out) if out is not None and out != acc else G


class TorchOps:
    """The torch backend: the same operations as the CUDA kernels, with torch.bmm (fp32
    accumulation) standing in for them. The dense GEMM is torch's on every backend."""

    name = "torch"
    cuda_kernels = False

    def __init__(self, torch: Any, dev: Any):
        self.torch = torch
        self.dev = dev
        self.launches = 0

    def units(self, dtype: str) -> tuple[str, ...]:
        """The units a block-diagonal apply of `dtype` runs on, the first one by default
        (gpucheck.poet.bounds.UNITS); a check compares the others with it."""
        return ("torch",)

    def sync(self) -> None:
        """Wait for the operations launched so far (torch raises its own errors): call before
        reading their results."""

    def cnp(self, Q: Any, dtype: str) -> Any:
        self.launches += 1
        return cnp_torch(self.torch, Q, out=storage_dtype(self.torch, dtype))

    def bd(self, X: Any, G: Any, *, in_idx: Any = None, out_idx: Any = None, transpose: bool = False,
           x_t: bool = False, y_t: bool = False, unit: str | None = None) -> Any:
        if unit not in (None, "torch"):
            raise ValueError(f"the torch backend has no unit {unit!r}")
        self.launches += 1
        return bd_torch(self.torch, X, G, in_idx=in_idx, out_idx=out_idx, transpose=transpose, x_t=x_t,
                        y_t=y_t, out=X.dtype)

    def dense(self, A: Any, B: Any) -> Any:
        """A . B^T in the storage dtype: cuBLAS on a GPU (fp32 accumulation: reduced-precision
        reductions and TF32 are off, see set_precision); on a CPU in fp32, rounded once."""
        torch = self.torch
        if A.device.type == "cuda":
            return torch.matmul(A, B.t())
        return (A.float() @ B.float().t()).to(A.dtype)


def set_precision(torch: Any) -> None:
    """IEEE fp32 matmuls (no TF32) and fp32 split-K reductions for fp16/bf16 GEMMs, so that the
    accumulation bounds hold (the same settings as the burn)."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):  # torch >= 2.9
        m.fp32_precision = "ieee"
    else:
        m.allow_tf32 = False
    for flag in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        try:
            setattr(m, flag, False)
        except (AttributeError, RuntimeError):
            pass


# ---------------------------------------------------------------------------------------------
# random problems


class QPool:
    """Base skew-symmetric matrices of spectral norm 1 per block size (float64, on the device),
    measured once with a float64 eigensolver. A block's Q is a base conjugated by a random signed
    permutation (exact in floating point, keeps skew-symmetry and the spectrum) and scaled to a
    random rho: every problem's Q is fresh, and its ||Q||_2 is known without an eigensolver."""

    def __init__(self, torch: Any, dev: Any, seed: int, size: int = 8):
        self.torch = torch
        self.dev = dev
        self.seed = seed
        self.size = size
        self._bases: dict[int, Any] = {}

    def bases(self, b: int) -> Any:
        base = self._bases.get(b)
        if base is None:
            torch = self.torch
            gen = torch.Generator(device=self.dev)
            gen.manual_seed((self.seed * 1_000_003 + b) % (2**63 - 1))
            M = torch.randn((self.size, b, b), generator=gen, dtype=torch.float64, device=self.dev)
            S = M - M.transpose(1, 2)  # exactly skew-symmetric: fl(a - c) = -fl(c - a)
            top = torch.linalg.eigvalsh(S.transpose(1, 2) @ S)[:, -1].clamp_min(0.0).sqrt()
            base = S / top[:, None, None]  # sign-symmetric rounding: still exactly skew
            self._bases[b] = base
        return base


@dataclass
class Transform:
    """One side's orthogonal transform: Q (k, b, b) fp32 with ||Q_j||_2 = rho[j] (within drho[j]),
    and a permutation of the n features (perm, its inverse, and int32 copies for the kernels)."""

    Q: Any
    rho: list[float]
    drho: list[float]
    perm: Any
    inv: Any


@dataclass
class Problem:
    index: int
    seed: int
    dtype: str
    b: int
    k: int
    n: int
    m: int
    distribution: str
    x: Any  # (m, n) storage dtype
    W: Any  # (n, n) storage dtype
    t_in: Transform
    t_out: Transform
    chain: list[tuple[Transform, Transform]] = field(default_factory=list)  # later merges (in, out)


def make_transform(torch: Any, gen: Any, pool: QPool, b: int, n: int, rho_min: float, rho_max: float) -> Transform:
    dev = pool.dev
    k = n // b
    bases = pool.bases(b)
    rho = (rho_min + (rho_max - rho_min) * torch.rand((k,), generator=gen, dtype=torch.float64, device=dev))
    idx = torch.randint(0, bases.shape[0], (k,), generator=gen, device=dev)
    order = torch.argsort(torch.rand((k, b), generator=gen, device=dev), dim=1)
    signs = torch.randint(0, 2, (k, b), generator=gen, device=dev).to(torch.float64) * 2.0 - 1.0
    B = bases.index_select(0, idx)
    B = B.gather(1, order[:, :, None].expand(k, b, b)).gather(2, order[:, None, :].expand(k, b, b))
    Q64 = B * signs[:, :, None] * signs[:, None, :] * rho[:, None, None]
    Q = Q64.to(torch.float32).contiguous()
    perm = torch.randperm(n, generator=gen, device=dev)
    inv = torch.argsort(perm)
    rho_list = [float(r) for r in rho.tolist()]
    return Transform(Q=Q, rho=rho_list, drho=[rho_uncertainty(r, b) for r in rho_list], perm=perm, inv=inv)


def make_problem(torch: Any, dev: Any, pool: QPool, *, index: int, seed: int, dtype: str, b: int, n: int, m: int,
                 rho_min: float, rho_max: float, chain_steps: int) -> Problem:
    """A fresh random problem: x (m x n) and W (n x n) in the storage dtype, input- and output-side
    transforms, and chain_steps - 1 more transform pairs for the merge chain. Odd problems use
    "wide" data: rows of x and W scaled by 2^e, e uniform in [-6, 6]."""
    if n % b:
        raise ValueError(f"size {n} is not a multiple of the block size {b}")
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed % (2**63 - 1))
    st = storage_dtype(torch, dtype)
    dist = "normal" if index % 2 == 0 else "wide"
    x = torch.randn((m, n), generator=gen, device=dev)
    W = torch.randn((n, n), generator=gen, device=dev) / math.sqrt(n)
    if dist == "wide":
        x = x * torch.randint(-6, 7, (m, 1), generator=gen, device=dev).to(torch.float32).exp2()
        W = W * torch.randint(-6, 7, (n, 1), generator=gen, device=dev).to(torch.float32).exp2()
    x = x.to(st).contiguous()
    W = W.to(st).contiguous()
    t_in = make_transform(torch, gen, pool, b, n, rho_min, rho_max)
    t_out = make_transform(torch, gen, pool, b, n, rho_min, rho_max)
    chain = [(make_transform(torch, gen, pool, b, n, rho_min, rho_max),
              make_transform(torch, gen, pool, b, n, rho_min, rho_max)) for _ in range(max(0, chain_steps - 1))]
    return Problem(index=index, seed=seed, dtype=dtype, b=b, k=n // b, n=n, m=m, distribution=dist, x=x, W=W,
                   t_in=t_in, t_out=t_out, chain=chain)


def flip_bit(torch: Any, t: Any, flat_index: int, bit: int) -> tuple[float, float]:
    """Flip `bit` of element `flat_index` of the contiguous tensor `t` in place; (before, after)."""
    esize = t.element_size()
    nbits = 8 * esize
    if not 0 <= bit < nbits:
        raise ValueError(f"bit must be in 0..{nbits - 1} for {t.dtype}, not {bit}")
    view = {2: torch.int16, 4: torch.int32}[esize]
    flat = t.view(-1)
    before = float(flat[flat_index].item())
    mask = -(1 << bit) if bit == nbits - 1 else (1 << bit)
    flat.view(view)[flat_index:flat_index + 1].bitwise_xor_(torch.tensor([mask], dtype=view, device=t.device))
    return before, float(flat[flat_index].item())
