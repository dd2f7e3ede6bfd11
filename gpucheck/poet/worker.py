"""The poet.ortho worker: a loop of fresh random POET problems on one device, every one verified.

`poet_worker(args, chan)` is the worker target (gpucheck.workers.pool.run_workers). It picks the
backend (the CUDA kernels through CuPy on a GPU when CuPy is installed, else the torch
implementation of the same operations), then runs problems round-robin over every (dtype, block
size) pair until the duration is used up, sending a heartbeat after every operation and a
progress report every `window_s`. It returns plain data; gpucheck.tests_suite.poet_ortho judges it.

Fault injection (args): `bitflip` = {"op", "bit", "row", "col", "problem"} flips one bit of one
output of that operation in that problem (gpucheck.poet.invariants.INJECT_OPS); `hang_after_s`
stops the loop dead (no heartbeat, deaf to stop requests), like a kernel that never returns.
"""

from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence, TypedDict

from .bounds import DENSE_ACC_ROUNDOFF, parse_blocks, parse_dtypes
from .invariants import INJECT_OPS, INVARIANTS, PoetBitflip, ProblemCheck, VerifyConfig, check_problem
from .ortho import QPool, TorchOps, make_problem, set_precision

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import PoetCombo, PoetDevice, PoetResult, PoetRun, PoetViolation, SetupError

BACKENDS = ("auto", "cupy", "torch")


class PoetArgs(TypedDict, total=False):
    """poet_worker's arguments (PoetConfig.from_args: a key not given keeps PoetConfig's default)."""

    duration_s: float
    dtypes: Sequence[str] | str  # names, or a comma list (parse_dtypes)
    blocks: Sequence[int] | str  # sizes, or a comma list (parse_blocks)
    size: int | None
    gpu_size: int
    cpu_blocks: int
    rows: int | None
    gpu_rows: int
    cpu_rows: int
    rho_min: float
    rho_max: float
    chain_steps: int
    verify_rows: int
    ortho_blocks: int
    q_pool: int
    dense_acc_roundoff: float
    bound_scale: float
    seed: int
    backend: str
    window_s: float
    max_events: int
    bitflip: PoetBitflip  # injections (the check's --inject)
    hang_after_s: float


@dataclass
class PoetConfig:
    duration_s: float = 30.0
    dtypes: list[str] = field(default_factory=lambda: ["fp32", "bf16", "fp16"])
    blocks: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    size: int | None = None  # n (features); None: gpu_size on a GPU, cpu_blocks * b on a CPU
    gpu_size: int = 4096
    cpu_blocks: int = 2
    rows: int | None = None  # m (tokens); None: gpu_rows / cpu_rows
    gpu_rows: int = 4096
    cpu_rows: int = 64
    rho_min: float = 0.1
    rho_max: float = 0.5
    chain_steps: int = 3
    verify_rows: int = 256
    ortho_blocks: int = 4
    q_pool: int = 8
    dense_acc_roundoff: float = DENSE_ACC_ROUNDOFF
    bound_scale: float = 1.0
    seed: int = 0
    backend: str = "auto"
    window_s: float = 1.0
    max_events: int = 8
    bitflip: PoetBitflip | None = None
    hang_after_s: float | None = None

    @classmethod
    def from_args(cls, args: PoetArgs) -> "PoetConfig":
        from ..workers.settings import set_given

        cfg = cls()
        set_given(cfg, args, float, ("duration_s", "rho_min", "rho_max", "dense_acc_roundoff", "bound_scale",
                                     "window_s"))
        set_given(cfg, args, int, ("size", "gpu_size", "cpu_blocks", "rows", "gpu_rows", "cpu_rows", "chain_steps",
                                   "verify_rows", "ortho_blocks", "q_pool", "seed", "max_events"))
        if args.get("dtypes") is not None:
            cfg.dtypes = parse_dtypes(args["dtypes"])
        if args.get("blocks") is not None:
            cfg.blocks = parse_blocks(args["blocks"])
        if args.get("backend") is not None:
            cfg.backend = str(args["backend"])
        bitflip = args.get("bitflip")
        cfg.bitflip = bitflip.copy() if bitflip is not None else None
        cfg.hang_after_s = float(args["hang_after_s"]) if args.get("hang_after_s") is not None else None
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if not 0.0 <= self.rho_min <= self.rho_max < 1.0:
            raise ValueError(f"need 0 <= rho_min <= rho_max < 1, not {self.rho_min}, {self.rho_max}")
        if self.size is not None:
            bad = [b for b in self.blocks if self.size % b]
            if bad or self.size <= 0:
                raise ValueError(f"size {self.size} is not a multiple of block size(s) {bad}")
        if self.chain_steps < 1:
            raise ValueError("chain_steps must be at least 1")
        for key in ("cpu_blocks", "gpu_size", "gpu_rows", "cpu_rows", "q_pool"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be positive")
        if self.rows is not None and self.rows < 1:
            raise ValueError("rows must be positive")
        if self.bitflip is not None and (self.bitflip.get("op") or "forward") not in INJECT_OPS:
            raise ValueError(f"bitflip op must be one of {', '.join(INJECT_OPS)}, not {self.bitflip.get('op')!r}")
        if self.bound_scale <= 0:
            raise ValueError("bound_scale must be positive")
        if not 0.0 < self.dense_acc_roundoff < 1.0:
            raise ValueError("dense_acc_roundoff must be in (0, 1)")
        if self.max_events < 1:
            raise ValueError("max_events must be at least 1 (the first violation names the failure)")
        if self.bitflip is not None:
            self._validate_bitflip()

    def _validate_bitflip(self) -> None:
        """The flip's problem and bit: the bit must exist in the storage format of the dtype that
        problem runs (problems go round-robin over the (dtype, block) pairs)."""
        if self.bitflip is None:
            return
        problem = self.bitflip.get("problem")
        problem = 0 if problem is None else int(problem)
        if problem < 0:
            raise ValueError(f"bitflip problem must be >= 0, not {problem}")
        bit = self.bitflip.get("bit")
        if bit is not None:
            plan = [(dt, b) for dt in self.dtypes for b in self.blocks]
            dt = plan[problem % len(plan)][0]
            nbits = 32 if dt == "fp32" else 16
            if not 0 <= int(bit) < nbits:
                raise ValueError(f"bitflip bit must be in 0..{nbits - 1} for problem {problem} ({dt}), not {bit}")

    def n_for(self, b: int, device: str) -> int:
        if self.size is not None:
            return self.size
        return self.gpu_size if device == "cuda" else self.cpu_blocks * b

    def m_for(self, device: str) -> int:
        if self.rows is not None:
            return self.rows
        return self.gpu_rows if device == "cuda" else self.cpu_rows


def select_backend(torch: Any, dev: Any, want: str) -> tuple[Any, str | None]:
    """(ops, note): the CuPy kernels where asked for or available on a GPU, else torch. `note`
    says why the CUDA kernels are not exercised (None when they are, or on a CPU)."""
    if dev.type != "cuda":
        if want == "cupy":
            raise ValueError("the CuPy backend needs a CUDA device")
        return TorchOps(torch, dev), None
    if want == "torch":
        return TorchOps(torch, dev), "torch backend requested: the CUDA kernels were not exercised"
    try:
        importlib.import_module("cupy")  # a broken CuPy install raises ImportError too
    except ImportError as e:
        if want == "cupy":
            raise
        return TorchOps(torch, dev), f"CuPy not installed ({e}): the CUDA kernels were not exercised (torch path)"
    from .cupy_ops import CupyOps, CupyUnavailable

    try:
        return CupyOps(torch, dev), None
    except CupyUnavailable as e:  # installed, but e.g. built for a CUDA the driver does not support
        if want == "cupy":
            raise
        return TorchOps(torch, dev), f"{e}: the CUDA kernels were not exercised (torch path)"


def poet_worker(args: PoetArgs, chan: Any) -> "PoetResult | SetupError":
    """Worker target: select the device and backend, run the loop; plain data out."""
    from ..workers.alloc import allocating
    from ..workers.pool import torch_and_device

    try:
        cfg = PoetConfig.from_args(args)
    except (TypeError, ValueError) as e:  # a bad option, not a GPU fault
        return {"setup_error": f"bad option: {e}"}
    torch, dev, setup_error = torch_and_device(chan)
    if setup_error:
        return setup_error
    from ..kernels.cupy_module import KernelError
    from .cupy_ops import CupyUnavailable, size_problem

    if dev.type == "cuda":
        set_precision(torch)
    try:
        ops, note = select_backend(torch, dev, cfg.backend)
    except (ImportError, ValueError, KernelError, CupyUnavailable) as e:
        return {"setup_error": f"{type(e).__name__}: {e}"}
    if ops.cuda_kernels:  # sizes the launch geometry cannot cover: a bad option, not a GPU fault
        for b in cfg.blocks:
            why = size_problem(cfg.m_for(dev.type), cfg.n_for(b, dev.type))
            if why:
                return {"setup_error": f"bad size for the CUDA kernels: {why}"}
    for b in cfg.blocks:  # the dense GEMM's accumulation bound must exist for this n
        n = cfg.n_for(b, dev.type)
        if n * cfg.dense_acc_roundoff >= 1.0:
            return {"setup_error": f"bad option: dense_acc_roundoff {cfg.dense_acc_roundoff} times n = {n} is >= 1"}
    chan.heartbeat(force=True)
    rows, sizes = cfg.m_for(dev.type), sorted({cfg.n_for(b, dev.type) for b in cfg.blocks})
    with allocating(f"the POET problems ({rows} rows x n = {', '.join(map(str, sizes))} on {dev})"):
        return PoetRunner(torch, dev, chan, cfg, ops, note).run()


class PoetRunner:
    """The problem loop on one device. torch and the backend are passed in."""

    def __init__(self, torch: Any, dev: Any, chan: Any, cfg: PoetConfig, ops: Any, note: str | None = None):
        self.torch = torch
        self.dev = dev
        self.chan = chan
        self.cfg = cfg
        self.ops = ops
        self.note = note
        self.pool = QPool(torch, dev, cfg.seed, cfg.q_pool)
        self.vcfg = VerifyConfig(verify_rows=cfg.verify_rows, ortho_blocks=cfg.ortho_blocks,
                                 dense_acc_roundoff=cfg.dense_acc_roundoff, bound_scale=cfg.bound_scale,
                                 max_events=cfg.max_events)
        self.events: list[PoetViolation] = []
        self.event_count = 0
        self.injected: list[str] = []

    def device_info(self) -> "PoetDevice":
        from ..workers.pool import device_info

        info: PoetDevice = {**device_info(self.torch, self.dev)}
        if self.dev.type == "cuda":
            try:
                import cupy  # noqa: PLC0415

                info["cupy"] = cupy.__version__
            except ImportError:
                info["cupy"] = None
        return info

    def _beat(self) -> None:
        """After every operation: a heartbeat, and a stop request ends the problem."""
        self.chan.heartbeat()
        if self.chan.should_stop():
            raise _Stopped()

    def _combos(self) -> "dict[str, PoetCombo]":
        """Per dtype/block combination: its problem sizes and running totals."""
        cfg, device = self.cfg, self.dev.type
        return {f"{dt}/{b}": {
            "dtype": dt, "block": b, "size": cfg.n_for(b, device), "rows": cfg.m_for(device),
            "problems": 0, "launches": 0, "flops": 0.0, "seconds": 0.0, "violations": 0,
            "max_ratio": {}, "checks": {},
        } for dt in cfg.dtypes for b in cfg.blocks}

    def _header(self, combos: "dict[str, PoetCombo]") -> "PoetRun":
        """The result's fixed part: device, backend, configuration, and the combos to fill."""
        cfg = self.cfg
        return {
            "device": self.device_info(), "backend": self.ops.name, "cuda_kernels": bool(self.ops.cuda_kernels),
            "backend_note": self.note,
            "config": {"duration_s": cfg.duration_s, "dtypes": cfg.dtypes, "blocks": cfg.blocks,
                       "rho": [cfg.rho_min, cfg.rho_max], "chain_steps": cfg.chain_steps,
                       "verify_rows": cfg.verify_rows, "ortho_blocks": cfg.ortho_blocks, "seed": cfg.seed,
                       "bound_scale": cfg.bound_scale, "dense_acc_roundoff": cfg.dense_acc_roundoff},
            "combos": combos, "stopped": None,
        }

    def _solve(self, i: int, dt: str, b: int, c: "PoetCombo", out: "PoetRun") -> ProblemCheck | None:
        """Problem `i`, made and checked; None when the run ends here (`out` says why: asked to
        stop, or out of memory)."""
        cfg = self.cfg
        try:
            prob = make_problem(self.torch, self.dev, self.pool, index=i, seed=cfg.seed * 1_000_003 + i,
                                dtype=dt, b=b, n=c["size"], m=c["rows"], rho_min=cfg.rho_min,
                                rho_max=cfg.rho_max, chain_steps=cfg.chain_steps)
            return check_problem(self.torch, self.ops, prob, self.vcfg, inject=cfg.bitflip, beat=self._beat)
        except _Stopped:  # asked to stop in the middle of a problem: it is dropped, not judged
            out["stopped"] = self.chan.stop_reason
            return None
        except Exception as e:  # noqa: BLE001 - only out-of-memory is caught; the rest re-raised
            if not self._out_of_memory(e):
                raise
            # a sizing problem (--size/--rows too large, memory held by another process), not
            # a GPU fault: could not judge, unless violations were already found
            out["out_of_memory"] = (f"out of memory in problem {i} ({dt}, block {b}, n={c['size']}, "
                                    f"m={c['rows']}): {str(e).splitlines()[0][:200]}")
            return None

    def _tally(self, c: "PoetCombo", res: ProblemCheck, elapsed: float, t0: float) -> None:
        """One checked problem into its combo's totals and the run's violation events."""
        c["problems"] += 1
        c["launches"] += res["launches"]
        c["flops"] += res["flops"]
        c["seconds"] += elapsed
        for name, r in res["ratios"].items():
            worst = c["max_ratio"].get(name)  # a float while the run goes (None only in its summary)
            if not (r <= (-1.0 if worst is None else worst)):
                c["max_ratio"][name] = r
        for name, cnt in res["checks"].items():
            c["checks"][name] = c["checks"].get(name, 0) + cnt
        self.injected.extend(res["injected"])
        for v in res["violations"]:
            c["violations"] += 1
            self.event_count += 1
            if len(self.events) < max(1, self.cfg.max_events):
                v["time_s"] = round(time.monotonic() - t0, 3)
                self.events.append(v)

    def run(self) -> "PoetResult":
        cfg = self.cfg
        plan = [(dt, b) for dt in cfg.dtypes for b in cfg.blocks]
        combos = self._combos()
        out = self._header(combos)
        t0 = time.monotonic()
        deadline = t0 + cfg.duration_s
        w_start, w_flops = t0, 0.0
        i = 0
        while time.monotonic() < deadline:
            if self.chan.should_stop():
                out["stopped"] = self.chan.stop_reason
                break
            dt, b = plan[i % len(plan)]
            c = combos[f"{dt}/{b}"]
            p_start = time.monotonic()
            res = self._solve(i, dt, b, c, out)
            if res is None:
                break
            self._tally(c, res, time.monotonic() - p_start, t0)
            if cfg.hang_after_s is not None and time.monotonic() - t0 >= cfg.hang_after_s:
                self._hang()
            i += 1
            now = time.monotonic()
            w_flops += res["flops"]
            if now - w_start >= cfg.window_s:
                self.chan.progress({
                    "dtype": f"{dt} b{b}", "tflops": w_flops / (now - w_start) / 1e12, "problems": i,
                    "errors": self.event_count, "time_left_s": max(0.0, deadline - now),
                })
                w_start, w_flops = now, 0.0
            else:
                self.chan.heartbeat()
        if out["stopped"] is None and self.chan.should_stop():
            out["stopped"] = self.chan.stop_reason
        return self._summary(out, combos, i, time.monotonic() - t0)

    def _summary(self, out: "PoetRun", combos: "dict[str, PoetCombo]", problems: int,
                 seconds: float) -> "PoetResult":
        """The run's totals after `out`: problems, violations, rates, the invariants checked."""
        total_flops = sum(c["flops"] for c in combos.values())
        checked = [name for name in INVARIANTS if any(name in c["checks"] for c in combos.values())]
        for c in combos.values():
            c["max_ratio"] = {k: (v if v is not None and math.isfinite(v) else None) for k, v in c["max_ratio"].items()}
        return {
            **out, "problems": problems, "violations": self.events, "violation_count": self.event_count,
            "injected": self.injected, "seconds": round(seconds, 3),
            "tflops": (total_flops / seconds / 1e12) if seconds > 0 else None,
            "invariants": checked,  # core_agreement only where a second unit exists (tensor cores)
        }

    @staticmethod
    def _out_of_memory(e: BaseException) -> bool:
        """An allocation failure (CUDA out of memory, the CPU allocator's refusal, a size whose
        byte count overflows): gpucheck.workers.alloc's one classifier."""
        from ..workers.alloc import allocation_failure

        return allocation_failure(e) is not None

    @staticmethod
    def _hang() -> None:
        """Stand-in for a kernel that never returns: no heartbeat, no reaction to a stop."""
        while True:
            time.sleep(1.0)


class _Stopped(Exception):
    pass
