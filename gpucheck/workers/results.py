"""What each worker returns: the plain, picklable dict a worker target hands back through the pool
(gpucheck.workers.pool: `WorkerOutcome.result`), as TypedDicts a type checker follows. The data is
unchanged: these types describe the dicts the workers already build.

Every worker may instead return `SetupError` (its device could not be used: not a hardware
verdict; gpucheck.workers.per_gpu.unfinished_result turns it into an `error`). Keys a worker sets
only in some runs are in the `total=False` base of its type. Deep, per-dtype or per-pattern parts
whose shape is the judging code's business stay `dict[str, Any]` and are described where they are
made.
"""

from __future__ import annotations

from typing import Any, TypedDict, Union


class SetupError(TypedDict):
    """The device could not be used (torch without CUDA, no such GPU, a bad option)."""

    setup_error: str


class _DeviceExtras(TypedDict, total=False):
    sms: int  # CUDA: streaming multiprocessors
    memory_bytes: int  # CUDA: device memory
    cublas: int  # CUDA: torch's compiled cuBLAS/CUDA version, where torch tells
    threads: int  # CPU: torch's threads


class DeviceInfo(_DeviceExtras):
    """What a worker computed on (gpucheck.workers.pool.device_info)."""

    device: str  # "cuda" or "cpu"
    torch: str
    cuda_runtime: str | None
    name: str
    capability: list[int] | None  # CUDA compute capability [major, minor]; None on the CPU


# -- burn.gemm and eud.power: gpucheck.compute.gemm:burn_worker ------------------------------------------------
class BurnDtype(TypedDict):
    """One dtype's burn (Burner.burn_dtype)."""

    dtype: str
    size: int
    repeats: int
    iterations: int
    sets: int
    seconds: float
    tflops: float | None
    tflops_windows: list[float]
    repeat_checks: int
    repeat_mismatches: int
    reference_checks: int
    reference_elements: int
    reference_failures: int
    reference_max_error: float
    reference_tolerance: float
    distributions: dict[str, int]
    sdc_events: int


class BurnRunConfig(TypedDict):
    size: int
    repeats: int
    duration_s: float
    window_s: float
    ref_rows: int
    seed: int


class _SdcKinds(TypedDict, total=False):
    max_rel_error: float  # a repeat mismatch: the largest relative difference
    odd_one_out: str  # ... and which of the repeats disagreed with the others
    got: float  # a reference mismatch: the worst element and its float64 reference
    expected: float
    normalized_error: float
    tolerance: float


class SdcEvent(_SdcKinds):
    """One silent-data-corruption event: two runs of the same GEMM that differ ("repeat"), or a
    result off its float64 reference ("reference")."""

    kind: str  # "repeat" or "reference"
    dtype: str
    distribution: str
    set: int
    iteration: int
    elements: int  # how many elements differ
    first: list[int]  # [row, col] of the first
    max_abs_error: float
    time_s: float
    injected: bool


class _BurnOptional(TypedDict, total=False):
    allocation_errors: list[str]  # dtypes whose operands could not be allocated


class BurnResult(_BurnOptional):
    device: DeviceInfo
    config: BurnRunConfig
    dtypes: dict[str, BurnDtype]
    skipped: dict[str, str]  # dtype -> why it did not run
    sdc: list[SdcEvent]  # the first events (BurnConfig.max_events)
    sdc_count: int
    injected: list[str]
    notes: list[str]
    stopped: str | None
    iterations: int
    seconds: float


# -- poet.ortho: gpucheck.poet.worker:poet_worker ----------------------------------------------------------------
class _PoetOptional(TypedDict, total=False):
    out_of_memory: str


class PoetResult(_PoetOptional):
    device: DeviceInfo
    backend: str
    cuda_kernels: bool
    backend_note: str | None
    config: dict[str, Any]
    combos: dict[str, dict[str, Any]]  # "<dtype>/<block>" -> problems, violations, max_ratio, checks, ...
    stopped: str | None
    problems: int
    violations: list[dict[str, Any]]  # the first invariant violations
    violation_count: int
    injected: list[str]
    seconds: float
    tflops: float | None
    invariants: list[str]


# -- eud.memtest: gpucheck.eud.memtest_worker:memtest_worker -------------------------------------------------------
class _MemtestOptional(TypedDict, total=False):
    setup_error: str  # no memory could be allocated
    region_bytes: int
    copy: dict[str, Any]
    inject_problem: str
    headroom_round: dict[str, Any] | None
    passes: int
    per_pattern: dict[str, dict[str, Any]]
    bytes_moved: int
    kernel_seconds: float
    gbps: float | None
    errors: dict[str, Any]
    ecc: dict[str, Any]
    seconds: float
    config: dict[str, Any]


class MemtestResult(_MemtestOptional):
    device: dict[str, Any]
    backend: str
    patterns: list[str]
    stopped: str | None
    notes: list[str]
    injected: list[str]
    memory: dict[str, Any]
    chunks: list[dict[str, Any]]


# -- repro.bitwise: gpucheck.repro.worker:repro_worker -------------------------------------------------------------
class _ReproOptional(TypedDict, total=False):
    stopped: str


class ReproDigest(TypedDict):
    """One workload's outputs in one run."""

    digest: str  # sha256 of every output, hex
    parts: dict[str, str]  # output label -> its own digest (hex, shortened)
    outputs: int
    bytes: int
    seconds: float


class ReproResult(_ReproOptional):
    fingerprint: dict[str, Any]  # gpucheck.repro.fingerprint: the software and hardware it ran on
    key: str
    preset: str
    workloads: list[str]
    runs: list[dict[str, ReproDigest]]  # per run: workload -> its digest
    settings: dict[str, Any]
    injected: list[str]
    seconds: float


# -- eud.bandwidth: gpucheck.eud.copybw:copybw_worker --------------------------------------------------------------
class _CopyBwOptional(TypedDict, total=False):
    cuda_runtime: str | None
    stopped: str | None
    p2p_note: str


class CopyBwResult(_CopyBwOptional):
    device: str
    torch: str
    gpus: dict[int, dict[str, Any]]  # per GPU: h2d/d2h/d2d bandwidths, NUMA node, error
    pairs: list[dict[str, Any]]  # peer-to-peer copies: src, dst, gbps
    notes: list[str]
    injected: list[str]
    config: dict[str, Any]


WorkerResult = Union[BurnResult, PoetResult, MemtestResult, ReproResult, CopyBwResult, SetupError]
