"""The reference workloads of the bitwise reproducibility test, and their digest.

WORKLOAD_VERSION names the definition of every workload below: shapes, dtypes, input
generation, model, optimizer, determinism settings and the digest format. Bump it whenever any
change could change a single output bit; the version is part of the fingerprint, so digests of
two versions are never compared.

Workloads (in this order)
-------------------------

    gemm.fp32         C = A @ B in float32 with IEEE fp32 matmul precision (no TF32)
    gemm.tf32         the same with TF32 tensor cores allowed (CUDA only: CPU workers have no TF32)
    gemm.bf16         bfloat16 operands and result
    gemm.fp16         float16 operands and result
    transformer.step  one full training step of a small decoder-only transformer in bfloat16:
                      forward, loss, backward, one AdamW step

Each GEMM workload multiplies, for every shape of the preset, four operand distributions:

    normal   Irwin-Hall sums of four uniform integers (close to N(0, 1) after scaling)
    wide     full-mantissa values scaled by 2^e per row of A and per column of B (e drawn per row
             and column), so the terms of one dot product span many binades
    uniform  full-mantissa values in (-1, 1)
    mixed    small integers of both signs: exact cancellation

Inputs are identical on every machine: they are drawn as integers with torch.randint from a
seeded CPU torch.Generator (the Mersenne twister, integer arithmetic only, no vectorised
floating-point path), moved to the device, and turned into floats there by exact operations only
(an integer below the dtype's significand limit, times powers of two built from exponent bits;
see Exact). Every value is exactly representable in its dtype; generation checks that and raises
if not. Seeds are CRC-32 values of the workload version, workload, output and operand names.

Presets: the size of each workload depends on the device ("gpu": GEMMs up to 2048^3, the
transformer at width 512, 4 layers, sequence 256, batch 4; "cpu": the same definitions with
small shapes, width 512, 2 layers, sequence 16, batch 2, so that a CPU worker finishes in
seconds). The preset is part of the fingerprint: digests of two presets are never compared.

Determinism (apply_determinism, or the determinism() context manager): torch.use_deterministic_algorithms(True), cuDNN deterministic
and not benchmarking, fp32 matmul precision "highest" (TF32 only inside gemm.tf32), and
CUBLAS_WORKSPACE_CONFIG=:4096:8 in the worker's environment before its first cuBLAS call. The
transformer's attention is written out as GEMMs, masked softmax and GEMMs (no fused
scaled-dot-product kernel, whose backward may accumulate with atomics), the token embedding is
a one-hot GEMM (no index-add in the backward), and the loss is a one-hot weighted sum of
log-softmax (no gather/scatter). AdamW runs its single-tensor implementation (foreach and fused
off). CPU workers run with one thread (reduction order depends on the thread count).

Digest
------

For each output, in the workload's order: part = SHA-256 of the output's raw bytes (row-major,
little-endian, in its own dtype). The workload digest is the SHA-256 of the manifest

    gpucheck.repro <WORKLOAD_VERSION> <workload>\\n
    <label> <dtype> <shape, comma-separated> <part hex>\\n      (one line per output)

so that anyone can recompute it, and a mismatch can be narrowed to one output by its part.
GEMM outputs are C of every (distribution, shape); the training step's outputs are the loss,
the logits, the gradient of every parameter and every parameter after the AdamW step
(parameters in name order).
"""

from __future__ import annotations

import contextlib
import hashlib
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import DeterminismSettings

WORKLOAD_VERSION = "gpucheck-repro-1"

GEMM_WORKLOADS: tuple[str, ...] = ("gemm.fp32", "gemm.tf32", "gemm.bf16", "gemm.fp16")
TRANSFORMER = "transformer.step"
WORKLOADS: tuple[str, ...] = (*GEMM_WORKLOADS, TRANSFORMER)
DISTRIBUTIONS: tuple[str, ...] = ("normal", "wide", "uniform", "mixed")
# Workloads a preset does not run, and why (said in the results).
NOT_IN_PRESET: dict[str, dict[str, str]] = {
    "cpu": {"gemm.tf32": "TF32 is a GPU tensor-core mode; CPU workers have no TF32 path"},
    "gpu": {},
}


@dataclass(frozen=True)
class TransformerConfig:
    vocab: int
    width: int
    heads: int
    layers: int
    ffn: int
    seq: int
    batch: int
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1


@dataclass(frozen=True)
class Preset:
    name: str
    gemm_shapes: tuple[tuple[int, int, int], ...]  # (m, n, k): C[m, n] = A[m, k] @ B[k, n]
    transformer: TransformerConfig
    skipped: dict[str, str] = field(default_factory=dict)


PRESET_DEFS: dict[str, Preset] = {
    "gpu": Preset(
        "gpu",
        gemm_shapes=((2048, 2048, 2048), (1536, 3072, 1024), (1000, 1500, 700)),
        transformer=TransformerConfig(vocab=2048, width=512, heads=8, layers=4, ffn=2048, seq=256, batch=4),
        skipped=NOT_IN_PRESET["gpu"],
    ),
    "cpu": Preset(
        "cpu",
        gemm_shapes=((64, 64, 64), (48, 80, 96), (33, 17, 65)),
        transformer=TransformerConfig(vocab=256, width=512, heads=8, layers=2, ffn=2048, seq=16, batch=2),
        skipped=NOT_IN_PRESET["cpu"],
    ),
}

# Significand bits that an input value may use so that it is exact in the dtype it is generated
# in. TF32 operands are generated in FP32 with full 24-bit significands: rounding them to TF32's
# 11 significant bits is the tensor cores' job, and part of what gemm.tf32 exercises.
_SIG_BITS = {"fp32": 24, "tf32": 24, "bf16": 8, "fp16": 11}
# Exponent range of the "wide" row/column scales; fp16 is kept narrow so that no sum overflows
# (its smallest values are fp16 subnormals, exactly representable).
_WIDE_EXP = {"fp32": (-20, 10), "tf32": (-20, 10), "bf16": (-20, 10), "fp16": (-6, 1)}
# Largest |integer| of the "mixed" distribution: fp16 sums of k <= 4096 terms stay < 65504.
_MIXED_MAX = {"fp32": 8, "tf32": 8, "bf16": 8, "fp16": 2}


class WorkloadError(ValueError):
    """An unknown workload or preset, or an input that is not exact (a bug, never hardware)."""


def preset_for(device: str) -> Preset:
    return PRESET_DEFS["cpu" if device == "cpu" else "gpu"]


def workloads_for(preset: str) -> list[str]:
    """The workloads a preset runs, in order."""
    skipped = NOT_IN_PRESET[preset]
    return [w for w in WORKLOADS if w not in skipped]


def select_workloads(names: list[str] | tuple[str, ...], preset: str) -> tuple[list[str], dict[str, str]]:
    """Validate `names` ("all" means every workload); return (workloads to run in canonical order,
    {workload: why it is not run on this preset})."""
    wanted: set[str] = set()
    for n in names:
        n = str(n).strip()
        if n == "all":
            wanted.update(WORKLOADS)
        elif n in WORKLOADS:
            wanted.add(n)
        else:
            raise WorkloadError(f"unknown workload {n!r} (known: {', '.join(WORKLOADS)}, all)")
    if not wanted:
        raise WorkloadError("no workload selected")
    skipped = {w: why for w, why in NOT_IN_PRESET[preset].items() if w in wanted}
    return [w for w in WORKLOADS if w in wanted and w not in skipped], skipped


def seed_of(*parts: str) -> int:
    """A seed that is the same on every machine and every Python (never hash())."""
    return zlib.crc32("/".join((WORKLOAD_VERSION, *parts)).encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# determinism settings

CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def set_deterministic_algorithms(torch: Any, mode: bool, warn_only: bool = False) -> None:
    """torch.use_deterministic_algorithms(mode) without its import of torch._inductor, which costs
    about 2.3 s of CPU per worker process in torch 2.13 (more than importing torch; level 1 starts
    one worker per GPU): the Inductor setting it also makes only matters to torch.compile, which no
    workload uses, and is still made when Inductor is already loaded."""
    import sys  # noqa: PLC0415

    inductor: Any = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = mode
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without the private entry: the public call
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        setter(mode, warn_only=warn_only)


def apply_determinism(torch: Any) -> "DeterminismSettings":
    """Process-wide settings every workload runs under; returns what was set (for the record).
    CUBLAS_WORKSPACE_CONFIG is the caller's job: it must be in the environment before the first
    cuBLAS call of the process (the worker sets it before it imports torch)."""
    set_deterministic_algorithms(torch, True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")
    return {
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "cudnn_deterministic": True,
        "cudnn_benchmark": False,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "threads": int(torch.get_num_threads()),
    }


@contextlib.contextmanager
def determinism(torch: Any) -> "Iterator[DeterminismSettings]":
    """apply_determinism for the duration of the block, then the process's previous settings
    again (for callers that run the workloads in their own process: benchmarks, tests)."""
    old = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
           torch.get_float32_matmul_precision())
    try:
        yield apply_determinism(torch)
    finally:
        set_deterministic_algorithms(torch, old[0], warn_only=old[1])
        torch.backends.cudnn.deterministic = old[2]
        torch.backends.cudnn.benchmark = old[3]
        torch.set_float32_matmul_precision(old[4])


@contextlib.contextmanager
def _matmul_precision(torch: Any, precision: str) -> Iterator[None]:
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


# ---------------------------------------------------------------------------------------------
# exact input generation


def _gen(torch: Any, *parts: str) -> Any:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed_of(*parts))
    return g


def _ints(torch: Any, g: Any, shape: tuple[int, ...], lo: int, hi: int) -> Any:
    """Uniform integers in [lo, hi] as int32 (Mersenne twister, integer arithmetic only)."""
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32)


def _irwin_hall(torch: Any, g: Any, shape: tuple[int, ...], a: int) -> Any:
    """Sum of four uniform integers in [-a, a] (|sum| <= 4a), as int32."""
    acc = _ints(torch, g, shape, -a, a)
    for _ in range(3):
        acc += _ints(torch, g, shape, -a, a)
    return acc


def pow2(torch: Any, e: Any) -> Any:
    """2**e (float32) built from the exponent bits: exact, no pow() call. e in [-126, 127]."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def exact_cast(torch: Any, x32: Any, dtype: Any) -> Any:
    """x32 (float32) in `dtype`, checking that nothing was rounded."""
    y = x32.to(dtype)
    if not torch.equal(y.to(torch.float32), x32):
        raise WorkloadError(f"input generation is not exact in {dtype} (a gpucheck bug)")
    return y


@dataclass
class Exact:
    """A tensor defined by integers drawn on the CPU and exact float operations done on the
    device: (ints * 2^-shift) * 2^exps (exps along dimension `dim`, when given) + offset.

    The CPU part (the draws) is integer arithmetic; the device part is an integer-to-float
    conversion of |ints| < 2^24, multiplications by powers of two and one addition whose exact
    result is representable: every step is exact, so the values are the same on every device."""

    ints: Any  # int32, on the CPU
    shift: int = 0
    exps: Any = None  # int32 per row (dim 0) or column (dim 1), on the CPU
    dim: int = 0
    offset: float = 0.0

    def materialize(self, torch: Any, dev: Any, dtype: Any) -> Any:
        if int(self.ints.abs().max()) >= 1 << 24:
            raise WorkloadError("integer out of the exact float32 range (a gpucheck bug)")
        x = self.ints.to(dev).to(torch.float32)
        if self.shift:
            x = x * 2.0**-self.shift
        if self.exps is not None:
            if int(self.exps.min()) < -126 or int(self.exps.max()) > 127:
                raise WorkloadError("exponent out of the normal float32 range (a gpucheck bug)")
            s = pow2(torch, self.exps.to(dev))
            x = x * (s.view(-1, 1) if self.dim == 0 else s.view(1, -1))
        if self.offset:
            x = x + self.offset
        return exact_cast(torch, x, dtype)


def gemm_operand(torch: Any, dtype_name: str, dist: str, shape: tuple[int, int], scale_dim: int,
                 *seed_parts: str) -> Exact:
    """One GEMM operand, exactly representable in `dtype_name`. scale_dim: the dimension along
    which the "wide" distribution scales (0: rows of A, 1: columns of B)."""
    g = _gen(torch, *seed_parts)
    p = _SIG_BITS[dtype_name]
    if dist == "normal":
        a = (1 << (p - 2)) - 1  # |sum of four| < 2^p
        return Exact(_irwin_hall(torch, g, shape, a), shift=p - 2)  # ~ N(0, 1.15)
    if dist == "uniform":
        top = (1 << p) - 1
        return Exact(_ints(torch, g, shape, -top, top), shift=p)
    if dist == "wide":
        top = (1 << p) - 1
        m = _ints(torch, g, shape, -top, top)
        lo, hi = _WIDE_EXP[dtype_name]
        return Exact(m, shift=p, exps=_ints(torch, g, (shape[scale_dim],), lo, hi), dim=scale_dim)
    if dist == "mixed":
        mm = _MIXED_MAX[dtype_name]
        return Exact(_ints(torch, g, shape, -mm, mm))
    raise WorkloadError(f"unknown distribution {dist!r}")


_TORCH_DTYPE = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def run_gemm(torch: Any, dev: Any, workload: str, preset: Preset, beat: Callable[[], None]) -> list[tuple[str, Any]]:
    dtype_name = workload.split(".", 1)[1]
    dtype = getattr(torch, _TORCH_DTYPE[dtype_name])
    outputs: list[tuple[str, Any]] = []
    precision = "high" if dtype_name == "tf32" else "highest"
    with _matmul_precision(torch, precision):
        for (m, n, k) in preset.gemm_shapes:
            for dist in DISTRIBUTIONS:
                label = f"{dist}.{m}x{n}x{k}"
                A = gemm_operand(torch, dtype_name, dist, (m, k), 0, workload, label, "A").materialize(torch, dev, dtype)
                B = gemm_operand(torch, dtype_name, dist, (k, n), 1, workload, label, "B").materialize(torch, dev, dtype)
                outputs.append((label, A @ B))
                beat()
    return outputs


# ---------------------------------------------------------------------------------------------
# the transformer training step


def param_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    D, F, V, T = cfg.width, cfg.ffn, cfg.vocab, cfg.seq
    shapes: dict[str, tuple[int, ...]] = {"embed": (V, D), "pos": (T, D), "lnf.w": (D,), "lnf.b": (D,), "head.w": (V, D)}
    for i in range(cfg.layers):
        shapes.update({
            f"l{i}.ln1.w": (D,), f"l{i}.ln1.b": (D,),
            f"l{i}.attn.qkv.w": (3 * D, D), f"l{i}.attn.qkv.b": (3 * D,),
            f"l{i}.attn.out.w": (D, D), f"l{i}.attn.out.b": (D,),
            f"l{i}.ln2.w": (D,), f"l{i}.ln2.b": (D,),
            f"l{i}.mlp.fc1.w": (F, D), f"l{i}.mlp.fc1.b": (F,),
            f"l{i}.mlp.fc2.w": (D, F), f"l{i}.mlp.fc2.b": (D,),
        })
    return dict(sorted(shapes.items()))


def init_params(torch: Any, cfg: TransformerConfig, dev: Any) -> dict[str, Any]:  # name -> its tensor
    """The weights on `dev` in bfloat16, exact: matrices are Irwin-Hall integers (|m| <= 60)
    times 2^-10 (std about 0.0175), biases integers in [-8, 8] times 2^-12, LayerNorm gains
    1 + [-8, 8] * 2^-7 and shifts [-8, 8] * 2^-10. Every value has at most 8 significant bits."""
    params: dict[str, Any] = {}
    for name, shape in param_shapes(cfg).items():
        g = _gen(torch, TRANSFORMER, "param", name)
        if ".ln" in name or name.startswith("lnf."):
            m = _ints(torch, g, shape, -8, 8)
            ex = Exact(m, shift=7, offset=1.0) if name.endswith(".w") else Exact(m, shift=10)
        elif name.endswith(".b"):
            ex = Exact(_ints(torch, g, shape, -8, 8), shift=12)
        else:
            ex = Exact(_irwin_hall(torch, g, shape, 15), shift=10)
        params[name] = ex.materialize(torch, dev, torch.bfloat16)
    return params


def tokens_for(torch: Any, cfg: TransformerConfig) -> Any:
    g = _gen(torch, TRANSFORMER, "tokens")
    return _ints(torch, g, (cfg.batch, cfg.seq + 1), 0, cfg.vocab - 1).to(torch.int64)


def _forward(torch: Any, P: dict[str, Any], tokens_in: Any, cfg: TransformerConfig) -> Any:
    F = torch.nn.functional
    B, T = tokens_in.shape
    D, H, V = cfg.width, cfg.heads, cfg.vocab
    dh = D // H
    dt = P["embed"].dtype
    dev = P["embed"].device
    onehot = (tokens_in.unsqueeze(-1) == torch.arange(V, device=dev)).to(dt)
    x = onehot @ P["embed"] + P["pos"][:T]
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).triu(1)
    scale = dh**-0.5  # 1/8 for dh = 64: a power of two
    for i in range(cfg.layers):
        p = f"l{i}."
        h = F.layer_norm(x, (D,), P[p + "ln1.w"], P[p + "ln1.b"], eps=1e-5)
        qkv = F.linear(h, P[p + "attn.qkv.w"], P[p + "attn.qkv.b"]).view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        s = (q @ k.transpose(-2, -1)).float() * scale
        s = s.masked_fill(causal, float("-inf"))
        a = s.softmax(dim=-1).to(dt)
        o = (a @ v).transpose(1, 2).reshape(B, T, D)
        x = x + F.linear(o, P[p + "attn.out.w"], P[p + "attn.out.b"])
        h = F.layer_norm(x, (D,), P[p + "ln2.w"], P[p + "ln2.b"], eps=1e-5)
        h = F.gelu(F.linear(h, P[p + "mlp.fc1.w"], P[p + "mlp.fc1.b"]), approximate="tanh")
        x = x + F.linear(h, P[p + "mlp.fc2.w"], P[p + "mlp.fc2.b"])
    x = F.layer_norm(x, (D,), P["lnf.w"], P["lnf.b"], eps=1e-5)
    return F.linear(x, P["head.w"])


def run_transformer(torch: Any, dev: Any, preset: Preset, beat: Callable[[], None]) -> list[tuple[str, Any]]:
    cfg = preset.transformer
    F = torch.nn.functional
    P = {n: t.requires_grad_(True) for n, t in init_params(torch, cfg, dev).items()}
    tokens = tokens_for(torch, cfg).to(dev)
    beat()
    logits = _forward(torch, P, tokens[:, :-1], cfg)
    target = (tokens[:, 1:].unsqueeze(-1) == torch.arange(cfg.vocab, device=dev)).to(torch.float32)
    logp = F.log_softmax(logits.float(), dim=-1)
    loss = -(logp * target).sum() / float(cfg.batch * cfg.seq)
    beat()
    loss.backward()
    beat()
    names = list(P)
    grads = [(f"grad.{n}", P[n].grad.detach().clone()) for n in names]
    opt = torch.optim.AdamW([P[n] for n in names], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                            weight_decay=cfg.weight_decay, foreach=False, fused=False)
    opt.step()
    beat()
    return [("loss", loss.detach()), ("logits", logits.detach()), *grads,
            *((f"param.{n}", P[n].detach()) for n in names)]


def run_workload(torch: Any, dev: Any, workload: str, preset: Preset,
                 beat: Callable[[], None] = lambda: None) -> list[tuple[str, Any]]:
    """Run one workload from scratch (inputs generated anew); its outputs in order."""
    if workload in preset.skipped:
        raise WorkloadError(f"{workload} is not run on the {preset.name} preset: {preset.skipped[workload]}")
    if workload in GEMM_WORKLOADS:
        return run_gemm(torch, dev, workload, preset, beat)
    if workload == TRANSFORMER:
        return run_transformer(torch, dev, preset, beat)
    raise WorkloadError(f"unknown workload {workload!r}")


# ---------------------------------------------------------------------------------------------
# digest and fault injection

_DTYPE_NAME = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
               "torch.float64": "float64", "torch.int64": "int64", "torch.int32": "int32"}


def tensor_bytes(torch: Any, t: Any) -> tuple[Any, memoryview]:
    """The raw bytes of `t` (row-major, its own dtype): (the host tensor holding them, a
    zero-copy view of its memory). Keep the tensor alive while the view is used."""
    import ctypes

    c = t.detach()
    c = c.to("cpu") if c.device.type != "cpu" else c
    c = c.contiguous()
    n = c.numel() * c.element_size()
    if n == 0:
        return c, memoryview(b"")
    buf = (ctypes.c_char * n).from_address(c.data_ptr())
    return c, memoryview(buf).cast("B")


def digest(torch: Any, workload: str, outputs: list[tuple[str, Any]]) -> tuple[str, dict[str, str], int]:
    """(workload digest hex, {label: part hex}, bytes hashed). See the module doc for the format."""
    lines = [f"gpucheck.repro {WORKLOAD_VERSION} {workload}\n"]
    parts: dict[str, str] = {}
    total = 0
    for label, t in outputs:
        host, raw = tensor_bytes(torch, t)
        total += raw.nbytes
        part = hashlib.sha256(raw).hexdigest()
        del raw, host
        parts[label] = part
        dname = _DTYPE_NAME.get(str(t.dtype), str(t.dtype))
        lines.append(f"{label} {dname} {','.join(str(int(s)) for s in t.shape)} {part}\n")
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest(), parts, total


_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def flip_bit(torch: Any, t: Any, element: int | None = None, bit: int = 0) -> tuple[int, int]:
    """Flip one bit of one element of `t` in place (fault injection). Returns (element, bit)."""
    n = t.numel()
    if n == 0:
        raise WorkloadError("cannot flip a bit of an empty output")
    idx = n // 2 if element is None else int(element)
    if not 0 <= idx < n:
        raise WorkloadError(f"bitflip element {idx} out of range (output has {n} elements)")
    size = t.element_size()
    nbits = 8 * size
    if not 0 <= int(bit) < nbits:
        raise WorkloadError(f"bitflip bit {bit} out of range (0..{nbits - 1} for {t.dtype})")
    if not t.is_contiguous():
        raise WorkloadError("bitflip needs a contiguous output")
    mask = 1 << int(bit)
    if size > 1 and mask >= 1 << (nbits - 1):
        mask -= 1 << nbits  # the signed value of that bit pattern
    with torch.no_grad():
        view = t.detach().reshape(-1).view(getattr(torch, _INT_VIEW[size]))
        view[idx] ^= mask
    return idx, int(bit)
