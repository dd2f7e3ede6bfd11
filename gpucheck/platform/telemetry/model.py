"""The telemetry data model as types: what a snapshot, a GPU entry and a load sample hold.

These are TypedDicts: the data stays the plain JSON dicts every reader writes and every check
reads (docs/snapshot.md), and a type checker follows them. None is "not supported" (or, with the
field in the entry's `errors` map, "could not read"); see docs/snapshot.md for each field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:  # pragma: no cover
    from ..fabric.aer import PcieAerRecord
    from ..fabric.nvmlfabric import GpuFabric
    from ..fabric.fabricmanager import FabricManagerRecord

from ..net.model import NetRecord

# -- a snapshot (docs/snapshot.md) ------------------------------------------------------------------

KIND = "gpucheck.snapshot"  # a snapshot document's "kind"
VERSION = 1  # ... and its "version"
GPU_STATES = ("ok", "lost", "reset_required", "error")  # a GPU entry's "state"


class NvmlError(TypedDict):
    """Why NVML (or a GPU) could not be read: a failure kind (gpucheck.platform.telemetry.nvml.KINDS) and
    NVML's message."""

    kind: str
    message: str


class NvmlState(TypedDict):
    ok: bool
    error: NvmlError | None


# "class" is a keyword: the functional form.
PciDevice = TypedDict("PciDevice", {"bus_id": str, "class": str, "device": "str | None", "driver": "str | None"})


class ModePair(TypedDict):
    current: bool | None
    pending: bool | None


class EccErrors(TypedDict):
    volatile_corrected: int | None
    volatile_uncorrected: int | None
    aggregate_corrected: int | None
    aggregate_uncorrected: int | None
    sram_volatile_uncorrected: int | None
    sram_aggregate_uncorrected: int | None
    sram_threshold_exceeded: bool | None


class RemappedRows(TypedDict):
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None


class RetiredPages(TypedDict):
    single_bit: int | None
    double_bit: int | None
    pending: bool | None


class Temperature(TypedDict):
    gpu_c: int | None
    slowdown_c: int | None
    shutdown_c: int | None
    gpu_max_c: int | None


class Clocks(TypedDict):
    sm_mhz: int | None
    sm_max_mhz: int | None
    throttle_reasons: int | None
    throttle_reason_names: list[str] | None


class Power(TypedDict):
    usage_w: float | None
    limit_w: float | None


class Pcie(TypedDict):
    link_gen: int | None
    link_gen_max: int | None
    link_gen_gpu_max: int | None
    link_width: int | None
    link_width_max: int | None
    replay_counter: int | None


class NvLinkLink(TypedDict):
    link: int
    state: str | None  # telemetry.enums.NVLINK_STATE_NAMES, or "unknown_<n>"
    replay_errors: int | None
    recovery_errors: int | None
    crc_flit_errors: int | None
    crc_data_errors: int | None


class NvLink(TypedDict):
    supported: bool | None
    links: list[NvLinkLink]
    # An `nvidia-smi nvlink -s` capture whose NVML line says every link is inactive (and lists
    # none): gpucheck.platform.telemetry.nvlinkstatus. Absent from NVML readings.
    all_inactive: NotRequired[bool]


class GpuEntry(TypedDict):
    """One GPU of a snapshot, as the reader (gpucheck.platform.telemetry.reader.read_gpu) writes it."""

    index: int
    state: str  # "ok", "lost", "reset_required", "error"
    error: NvmlError | None  # why the GPU stopped being read (state other than ok)
    uuid: str | None
    name: str | None
    serial: str | None
    pci_bus_id: str | None
    pci_device_id: str | None
    architecture: str | None
    architecture_id: int | None
    persistence_mode: bool | None
    ecc_mode: ModePair
    mig_mode: ModePair
    ecc_errors: EccErrors
    remapped_rows: RemappedRows
    retired_pages: RetiredPages
    temperature: Temperature
    clocks: Clocks
    power: Power
    pcie: Pcie
    nvlink: NvLink
    recovery_action: int | None
    recovery_action_name: str | None
    fabric: GpuFabric | None  # NVML's GPU fabric info (platform.fabric.nvmlfabric); None: not supported
    errors: dict[str, str]  # field path -> failure kind, for each field that could not be read


class JudgedGpu(GpuEntry):
    """A GPU entry as the checks judge it (gpucheck.platform.telemetry.fields.judged_view): every value its
    field cannot hold is None and named in `invalid` (field path -> the value's repr)."""

    invalid: dict[str, str]


class _SnapshotExtras(TypedDict, total=False):
    gpucheck_version: str
    kernel_log: dict[str, Any] | None  # the kernel-log excerpt `gpucheck telemetry dump` records
    pcie_aer: PcieAerRecord | None  # AER files of GPUs, NICs, NVSwitches and their ports (platform.fabric.aer)
    fabric_manager: FabricManagerRecord | None  # Fabric Manager service state and log (platform.fabric.fabricmanager)
    net: NetRecord  # the RDMA ports and kernel modules (gpucheck.platform.net.record)


class Snapshot(_SnapshotExtras):
    """Everything the level-1 checks judge, read once (docs/snapshot.md)."""

    kind: str  # KIND
    version: int
    synthetic: bool
    source: str
    host: str
    captured_at: str
    nvml: NvmlState
    driver_version: str | None
    cuda_driver_version: str | None
    nvml_version: str | None
    pci_nvidia_devices: list[PciDevice]
    gpus: list[GpuEntry]


# -- telemetry under load -----------------------------------------------------------------------------


class _SampleExtras(TypedDict, total=False):
    power_limit_w: float | None  # a fake source may carry the enforced limit (a snapshot has it live)
    injected: bool  # eud.power's injections altered this sample


class Sample(_SampleExtras):
    """One reading of one GPU under load (NvmlSession.sample): None where it could not be read,
    `error` the first failure kind that was not a plain not_supported."""

    index: int
    sm_clock_mhz: int | None
    temperature_c: float | None
    power_w: float | None
    throttle_reasons: int | None
    throttle_reason_names: list[str] | None
    error: str | None
    time: float


class XidEvent(TypedDict):
    xid: int
    time: float


class _SummaryExtras(TypedDict, total=False):
    xid_note: str  # why Xid events were not watched during the load


class TelemetrySummary(_SummaryExtras):
    """One GPU's samples folded for its result (gpucheck.workers.sampler.summarize)."""

    samples: int
    sm_clock_min_mhz: float | None
    sm_clock_median_mhz: float | None
    sm_clock_max_mhz: float | None
    temperature_max_c: float | None
    power_mean_w: float | None
    throttle_reasons: list[str]
    slowdown_reasons: list[str]
    errors: list[str]
    xid: list[int]
    note: str | None
