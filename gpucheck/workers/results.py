"""What each worker returns: the plain, picklable dict a worker target hands back through the pool
(gpucheck.workers.pool: `WorkerOutcome.result`), as TypedDicts a type checker follows. The data is
unchanged: these types describe the dicts the workers already build.

Every worker may instead return `SetupError` (its device could not be used: not a hardware
verdict; gpucheck.workers.per_gpu.unfinished_result turns it into an `error`). Keys a worker sets
only in some runs are in the `total=False` base of its type. The progress reports a worker sends
while it runs are here too (`WorkerProgress`).
"""

from __future__ import annotations

from typing import TypedDict, TypeVar, Union

# What a worker target returns and what its progress reports hold: the pool carries them without
# looking inside (gpucheck.workers.pool.WorkerOutcome), and a check names the pair of its target
# (`WorkerOutcome[BurnResult | SetupError, BurnProgress]`).
R = TypeVar("R")
P = TypeVar("P")


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


class BurnRun(_BurnOptional):
    """A burn's data while it runs (gpucheck.compute.gemm.Burner.run) ..."""

    device: DeviceInfo
    config: BurnRunConfig
    dtypes: dict[str, BurnDtype]
    skipped: dict[str, str]  # dtype -> why it did not run
    sdc: list[SdcEvent]  # the first events (BurnConfig.max_events)
    sdc_count: int
    injected: list[str]
    notes: list[str]
    stopped: str | None


class BurnResult(BurnRun):
    """... and what it returns: with its totals."""

    iterations: int
    seconds: float


# -- poet.ortho: gpucheck.poet.worker:poet_worker ----------------------------------------------------------------
class PoetRunConfig(TypedDict):
    duration_s: float
    dtypes: list[str]
    blocks: list[int]
    rho: list[float]  # [rho_min, rho_max]
    chain_steps: int
    verify_rows: int
    ortho_blocks: int
    seed: int
    bound_scale: float
    dense_acc_roundoff: float


class PoetCombo(TypedDict):
    """One dtype/block combination's problem sizes and running totals (PoetRunner._combos)."""

    dtype: str
    block: int
    size: int  # n
    rows: int  # m
    problems: int
    launches: int
    flops: float
    seconds: float
    violations: int
    max_ratio: dict[str, float | None]  # invariant -> worst error/bound ratio (None: not finite)
    checks: dict[str, int]  # invariant -> comparisons made


class PoetIntervalDetails(TypedDict, total=False):
    """What a violated interval invariant adds besides its value and interval."""

    norm_w: float  # frobenius_norm: the two norms
    norm_w_eff: float
    step: int  # norm_drift: the merge


class PoetViolationDetails(PoetIntervalDetails, total=False):
    """What a violated invariant adds about where and by how much (gpucheck.poet.invariants)."""

    elements: int  # an elementwise or bitwise comparison: how many elements are off
    where: str
    index: list[int]
    got: float
    expected: float
    value: float  # an interval check: the value and its interval
    lo: float
    hi: float
    measured: float  # cnp_orthogonality: ||G^T G - I||_2, its theory and rho
    theory: float
    rho: float
    rows_bad: int  # row_norms: rows out of their interval
    injected: bool  # set for every violation of the problem (an injection fired in it)
    time_s: float  # set for the violations the worker keeps: seconds into the run


class PoetViolation(PoetViolationDetails):
    """One violated invariant of one problem."""

    invariant: str
    dtype: str
    block: int
    problem: int
    op: str
    error: float
    bound: float
    distribution: str
    size: int
    rows: int


class PoetDevice(DeviceInfo, total=False):
    cupy: str | None  # CUDA: the CuPy version, None when CuPy is not installed


class _PoetOptional(TypedDict, total=False):
    out_of_memory: str


class PoetRun(_PoetOptional):
    """POET's data while it runs (gpucheck.poet.worker.PoetRunner._header) ..."""

    device: PoetDevice
    backend: str
    cuda_kernels: bool
    backend_note: str | None
    config: PoetRunConfig
    combos: dict[str, PoetCombo]  # "<dtype>/<block>"
    stopped: str | None


class PoetResult(PoetRun):
    """... and what it returns: with the run's totals (PoetRunner._summary)."""

    problems: int
    violations: list[PoetViolation]  # the first invariant violations
    violation_count: int
    injected: list[str]
    seconds: float
    tflops: float | None
    invariants: list[str]


# -- eud.memtest: gpucheck.eud.memtest_worker:memtest_worker -------------------------------------------------------
class _MemtestDeviceExtras(TypedDict, total=False):
    numpy: str  # the NumPy backend (a CPU stand-in)
    cupy: str  # the CuPy backend (a GPU): CuPy's version and the device
    capability: list[int]
    sms: int
    memory_bytes: int
    l2_bytes: int | None
    scrub_bytes: int  # the buffer written between steps to evict L2
    blocks_per_sm: dict[str, int]  # kernel -> resident blocks per SM
    cuda_runtime: int


class MemtestDevice(_MemtestDeviceExtras):
    """What the pattern test ran on (the backend's info())."""

    name: str
    device: str  # "cuda" or "cpu"
    backend: str


class _MemoryExtras(TypedDict, total=False):
    total_bytes: int | None  # the first round: the memory the target was sized from
    headroom_bytes: int
    note: str | None
    target_bytes: int
    region_bytes: int
    chunk_count: int
    chunk_bytes: int
    allocation_note: str | None
    reserve_bytes: int | None  # the headroom round: what it leaves free


class MemtestMemory(_MemoryExtras):
    """How the region was sized and allocated (backend.target_bytes / second_round_target, then
    gpucheck.eud.memtest_worker.run_memtest)."""

    free_bytes: int | None  # None: host memory stands in


class MemtestChunk(TypedDict):
    index: int
    bytes: int
    address: int


class MemtestCopy(TypedDict, total=False):
    """The device-to-device copy baseline (gpucheck.eud.memtest_worker._copy_bandwidth)."""

    gbps: float | None
    bytes: int
    repeats: int
    samples_s: list[float]
    counted: str
    note: str  # no copy: why


class MemtestPatternTotals(TypedDict, total=False):
    runs: int
    bytes: int
    seconds: float
    errors: int
    gbps: float | None  # set at the end of the run


# A miscompare as the pattern test records it (gpucheck.eud.patterns.decode_step, then the
# worker adds where it is and the log the run); "pass" is a keyword: the functional form.
MemtestErrorRecord = TypedDict("MemtestErrorRecord", {
    "word": int, "offset": int, "expected": int, "actual": int, "bits": list[int],
    "chunk": "int | None", "address": "int | None", "round": int,
    "pattern": "str | None", "step": "str | None", "pass": "int | None",
}, total=False)


class _StepOptional(TypedDict, total=False):
    first_word: int | None
    last_word: int | None


class MemtestStep(_StepOptional):
    """One verify step's errors (gpucheck.eud.patterns.decode_step)."""

    errors: int
    records: list[MemtestErrorRecord]
    or_bits: int
    up: list[int]  # per bit: flips 0 -> 1
    down: list[int]  # ... and 1 -> 0


# ... once the worker names the pattern, step and pass it came from (ErrorLog.add)
MemtestStepEvent = TypedDict("MemtestStepEvent", {
    "errors": int, "records": "list[MemtestErrorRecord]", "or_bits": int, "up": "list[int]",
    "down": "list[int]", "first_word": "int | None", "last_word": "int | None",
    "pattern": str, "step": str, "pass": int,
}, total=False)


# A confirmation rerun (ErrorLog.confirm); "round" is set (2) when eud.memtest merges the headroom
# round's into the first round's.
MemtestConfirmation = TypedDict("MemtestConfirmation", {
    "pattern": str, "pass": int, "errors": int, "errors_again": int, "same_words": int, "reproduced": bool,
    "round": int,
}, total=False)


class MemtestErrors(TypedDict):
    """Every miscompare of a round, folded (gpucheck.eud.patterns.ErrorLog.summary)."""

    errors: int
    steps_with_errors: int
    records: list[MemtestErrorRecord]
    records_kept: int
    distinct_words_recorded: int
    first_offset: int | None
    last_offset: int | None
    up: list[int]
    down: list[int]
    bits: list[int]
    patterns: list[str]
    persistent_words: int
    persistent_offsets: list[int]
    confirmations: list[MemtestConfirmation]


class MemtestHeadroomRound(_MemoryExtras):
    """The second allocation round over the headroom (gpucheck.eud.memtest_worker._Memtest.headroom_round)."""

    released_bytes: int
    held_bytes: int
    free_bytes: int | None
    chunks: list[MemtestChunk]
    passes: int
    errors: MemtestErrors


class EccReading(TypedDict):
    """One reading of a GPU's ECC and row-remapping counters (gpucheck.eud.memtest_ecc.read_counters)."""

    label: str
    counters: dict[str, int | bool | None]  # counter -> value; None: not supported
    errors: dict[str, str]  # counter -> NVML's failure kind


class EccData(TypedDict):
    """The readings of one run (gpucheck.eud.memtest_ecc.EccMonitor.to_data)."""

    source: str | None
    reads: list[EccReading]
    note: str | None
    failure: str | None
    injected: list[str]


class MemtestRunConfig(TypedDict):
    fraction: float
    passes: int
    duration_s: float | None
    seed: int
    max_errors: int
    confirm: bool
    headroom_round: bool


class _MemtestOptional(TypedDict, total=False):
    setup_error: str  # no memory could be allocated
    region_bytes: int
    copy: MemtestCopy
    inject_problem: str
    headroom_round: MemtestHeadroomRound | None
    passes: int
    per_pattern: dict[str, MemtestPatternTotals]
    bytes_moved: int
    kernel_seconds: float
    gbps: float | None
    errors: MemtestErrors
    ecc: EccData
    seconds: float
    config: MemtestRunConfig
    memory: MemtestMemory
    chunks: list[MemtestChunk]  # the first chunks


class MemtestResult(_MemtestOptional):
    device: MemtestDevice
    backend: str
    patterns: list[str]
    stopped: str | None
    notes: list[str]
    injected: list[str]


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


class CudaFingerprint(TypedDict):
    """What a GPU's bitwise results depend on (gpucheck.repro.fingerprint.cuda_fingerprint)."""

    device: str  # "cuda"
    gpu: str
    compute_capability: str
    sm_count: int
    driver: str | None
    cuda_runtime: str | None
    torch: str
    cublas: str | None
    blas_backend: str | None
    workload_version: str
    preset: str


class CpuFingerprint(TypedDict):
    """... and a CPU worker's (gpucheck.repro.fingerprint.cpu_fingerprint)."""

    device: str  # "cpu"
    cpu: str | None
    cpu_capability: str | None
    cpu_flags: list[str]
    torch: str
    blas: str | None
    mkl: str | None
    onednn: str | None
    threads: int
    workload_version: str
    preset: str


Fingerprint = Union[CudaFingerprint, CpuFingerprint]


class DeterminismSettings(TypedDict, total=False):
    """The process-wide settings the workloads ran under (gpucheck.repro.workloads.apply_determinism)."""

    deterministic_algorithms: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    float32_matmul_precision: str
    threads: int
    cublas_workspace_config: str | None  # set by the worker


class ReproResult(_ReproOptional):
    fingerprint: Fingerprint  # the software and hardware it ran on
    key: str
    preset: str
    workloads: list[str]
    runs: list[dict[str, ReproDigest]]  # per run: workload -> its digest
    settings: DeterminismSettings
    injected: list[str]
    seconds: float


# -- eud.bandwidth: gpucheck.eud.copybw:copybw_worker --------------------------------------------------------------
class _CopyOptional(TypedDict, total=False):
    counted: str  # d2d: "bytes read + bytes written"


class CopyMeasure(_CopyOptional):
    """One timed transfer of `bytes` (gpucheck.eud.copybw._result)."""

    gbps: float | None
    bytes: int
    repeats: int
    samples_s: list[float]
    spread: float | None  # (max - min) / median of the samples


class NumaPlacement(TypedDict, total=False):
    """Where the host buffer of a GPU's transfers lived (gpucheck.eud.copybw._host_buffer)."""

    node: int | None  # the GPU's NUMA node (sysfs)
    affinity: str  # the CPUs the buffer was first touched from
    affinity_error: str
    pinned: str  # how it was page-locked


class LinkUnderLoad(TypedDict, total=False):
    """NVML's PCIe link while the H2D transfers ran (gpucheck.eud.copybw._LinkReader)."""

    gen: int | None
    width: int | None
    error: str


class CopyBwGpu(TypedDict, total=False):
    """One GPU's copies (gpucheck.eud.copybw.measure)."""

    gpu: int
    name: str | None
    error: str  # a copy failed (or no CUDA device for it): the finding
    numa: NumaPlacement
    h2d: CopyMeasure
    d2h: CopyMeasure
    d2d: CopyMeasure
    link_under_load: LinkUnderLoad


class _PairOptional(TypedDict, total=False):
    bytes: int  # measured: as CopyMeasure
    repeats: int
    samples_s: list[float]
    spread: float | None
    note: str  # not measured: why
    error: str  # the copy failed


class CopyBwPair(_PairOptional):
    """A peer-to-peer copy from src to dst."""

    src: int
    dst: int
    gbps: float | None


class _BriefError(TypedDict, total=False):
    error: str


class CopyBwBrief(_BriefError):
    """A GPU's bandwidths so far, small (gpucheck.eud.copybw._brief): what a stopped worker leaves."""

    h2d: float | None
    d2h: float | None
    d2d: float | None


class CopyBwRunConfig(TypedDict):
    h2d_bytes: int
    d2d_bytes: int
    p2p_bytes: int
    repeats: int
    warmup: int


class _CopyBwOptional(TypedDict, total=False):
    cuda_runtime: str | None
    stopped: str | None
    p2p_note: str


class CopyBwResult(_CopyBwOptional):
    device: str
    torch: str
    gpus: dict[int, CopyBwGpu]  # per GPU: h2d/d2h/d2d bandwidths, NUMA node, error
    pairs: list[CopyBwPair]  # peer-to-peer copies: src, dst, gbps
    notes: list[str]
    injected: list[str]
    config: CopyBwRunConfig


WorkerResult = Union[BurnResult, PoetResult, MemtestResult, ReproResult, CopyBwResult, SetupError]


# -- progress reports: what a worker sends with `chan.progress(...)` ---------------------------------------------
# The pool keeps the last one (`WorkerOutcome.progress`: what a worker that stopped early had
# reached) and the parent shows it live (gpucheck.workers.per_gpu.run_per_gpu merges the GPU's
# telemetry into a copy for the display).
class BurnProgress(TypedDict):
    """After every throughput window of a burn (gpucheck.compute.gemm.Burner._close_window)."""

    dtype: str
    tflops: float
    tflops_median: float
    iterations: int
    errors: int  # SDC events so far
    time_left_s: float
    windows: int


class PoetProgress(TypedDict):
    """After every throughput window of POET (gpucheck.poet.worker)."""

    dtype: str  # "<dtype> b<block>"
    tflops: float
    problems: int
    errors: int  # invariant violations so far
    time_left_s: float


# "pass" is a keyword: the functional form.
MemtestProgress = TypedDict("MemtestProgress", {
    "pattern": str, "pass": int, "round": int,
    "errors": int,  # errors found so far in this round
    "gbps": "float | None", "bytes_tested": int,
    "time_left_s": "float | None",  # None: a count of passes, not a duration
    "first_error": "MemtestErrorRecord | None",
})


class MemtestStall(TypedDict):
    """A GPU copy or kernel that has not finished for a while (gpucheck.eud.memtest_cupy)."""

    stalled: str
    waited_s: float


class CopyBwProgress(TypedDict):
    """Before each measurement of the copy-bandwidth worker (gpucheck.eud.copybw)."""

    current: int  # the GPU being measured (the source of a peer copy)
    what: str  # "h2d/d2h/d2d" or "p2p <src>-><dst>"
    measured: "dict[int, CopyBwBrief]"  # GPU -> what it measured so far


class _ReproProgressDigest(TypedDict, total=False):
    digest: str  # the workload's digest, shortened, once it ran


class ReproProgress(_ReproProgressDigest):
    """Before and after each workload run (gpucheck.repro.worker)."""

    workload: str
    run: int  # 1 or 2


WorkerProgress = Union[BurnProgress, PoetProgress, MemtestProgress, MemtestStall, CopyBwProgress, ReproProgress]
