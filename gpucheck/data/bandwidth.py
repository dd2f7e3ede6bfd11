"""Per-SKU copy bandwidth: the data eud.bandwidth's SKU floors come from.

Units are GB/s (10^9 bytes per second). Host<->device (H2D, D2H) and peer-to-peer (P2P) count
the bytes transferred once; device-to-device (D2D, a copy within one GPU's memory) counts bytes
read plus bytes written, as the issue that asked for this check quotes the H100 figure.

Only numbers with a source are here; everything else is None and the GPU is judged against the
node's other GPUs only (its result says so).

Sources (checked 2026-11):

- Azure HPC/AI node health checks (github.com/Azure/azurehpc-health-checks), the per-VM configs
  `conf/<vm>.conf` and `customTests/azure_gpu_bandwidth.nhc`. `check_gpu_bw <H2D/D2H> <P2P>` runs
  NVIDIA nvbandwidth (host_to_device_memcpy_ce, device_to_host_memcpy_ce,
  device_to_device_memcpy_read_ce; 10 iterations) and *fails* a GPU below the first number for
  H2D and D2H and below the second for every GPU pair; it *warns* below 1.05 x those numbers:
    - ND H100 v5 (8x H100 SXM 80GB, nd96isr_h100_v5.conf): `check_gpu_bw 48 335`
    - ND H200 v5 (8x H200 SXM, nd96isr_h200_v5.conf): `check_gpu_bw 48 335`
    - ND GB200 v6 (4x GB200, nd128isr_ndr_gb200_v6.conf): `check_gpu_bw 48 335`
    - NC H100 v5 (2x H100 NVL, nc80adis_h100_v5.conf): `check_gpu_bw 52 350`
  and for ND A100 v4 (8x A100 SXM 80GB, nd96amsr_a100_v4.conf) `check_cuda_bw 24`
  (customTests/azure_cuda_bandwidth.nhc: SuperBench `gpu-copy --size 134217728 --htod` and
  `--dtoh`, 128 MiB copies between every GPU and every NUMA node; each GPU's best NUMA node
  counts, and the GPU fails when the lower of its H2D and D2H is below 24 GB/s; no warning band).
  Azure locks the GPU clocks for these tests (nvidia-smi -lgc); gpucheck never changes clocks,
  which matters little for copy-engine transfers over PCIe. gpucheck's P2P copy is issued from
  the source GPU (nvbandwidth's "read" test issues it from the destination); both cross the same
  NVLink fabric.
- "An H100 on PCIe Gen5 x16 reaches about 50 GB/s each way" and "an H100 copies about 3.0 TB/s
  counting reads and writes" (device to device): the gpucheck issue that specified this check
  (issue 9), used for H100 PCIe's host link (no Azure row) and for H100 SXM's D2D (3.0 TB/s of
  its 3.35 TB/s HBM3). For typical values (not floors) the check derives floors with
  `typical_warn_fraction` / `typical_fail_fraction` (0.9 / 0.75 of typical): the faults this
  check exists for (a link trained at half width or one generation lower, a GPU whose memory runs
  slow) halve the bandwidth, so 0.75 sits midway between healthy (1.0) and such a fault (0.5).

No H2D number could be confirmed for A100 PCIe, H100 NVL under other clouds, B200 or H20; no D2D
copy number for any GPU but H100 SXM; no P2P number for PCIe-only GPUs (their P2P, when possible,
goes over PCIe switches whose topology varies by server): all of those are judged by peers only.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import first_match, name_matches

AZURE_WARN_FACTOR = 1.05  # azure_gpu_bandwidth.nhc: WARN_BW = EXP_BW * 1.05


@dataclass(frozen=True)
class BandwidthSku:
    name: str
    pattern: str  # regex searched in the NVML / torch device name
    host_link: str  # what the GPU's host link is (for the evidence)
    pcie_gen: int | None  # the PCIe generation the H2D numbers assume
    pcie_width: int | None
    h2d_fail_gbps: float | None = None  # fail below (each of H2D and D2H)
    h2d_warn_gbps: float | None = None  # warn below
    h2d_typical_gbps: float | None = None  # typical value when no floor is published
    p2p_fail_gbps: float | None = None
    p2p_warn_gbps: float | None = None
    d2d_typical_gbps: float | None = None  # read + write counted
    source: str = ""

    def matches(self, device_name: str) -> bool:
        return name_matches(self.pattern, device_name)


def _azure(fail: float) -> tuple[float, float]:
    return fail, round(fail * AZURE_WARN_FACTOR, 2)


_H2D_48 = _azure(48.0)
_P2P_335 = _azure(335.0)

# Order matters: the first row whose pattern matches wins.
SKUS: tuple[BandwidthSku, ...] = (
    BandwidthSku("H100 NVL", r"\bH100\b\s*NVL", "PCIe Gen5 x16", 5, 16,
                 *_azure(52.0), None, *_azure(350.0), None,
                 source="Azure NC H100 v5 health check: check_gpu_bw 52 350"),
    BandwidthSku("H100 SXM", r"\bH100\b(?!\s*(NVL|PCIe)).*\b(SXM|HBM3)\b", "PCIe Gen5 x16", 5, 16,
                 *_H2D_48, 50.0, *_P2P_335, 3000.0,
                 source="Azure ND H100 v5 health check: check_gpu_bw 48 335; D2D ~3.0 TB/s (issue 9)"),
    BandwidthSku("H100 PCIe", r"\bH100\b.*\bPCIe\b", "PCIe Gen5 x16", 5, 16,
                 None, None, 50.0, None, None, None,
                 source="~50 GB/s each way on PCIe Gen5 x16 (issue 9); floors from typical_*_fraction"),
    BandwidthSku("H200 SXM", r"\bH200\b(?!\s*NVL)", "PCIe Gen5 x16", 5, 16,
                 *_H2D_48, None, *_P2P_335, None,
                 source="Azure ND H200 v5 health check: check_gpu_bw 48 335"),
    BandwidthSku("GB200", r"\bGB200\b", "NVLink-C2C to the Grace CPU", None, None,
                 *_H2D_48, None, *_P2P_335, None,
                 source="Azure ND GB200 v6 health check: check_gpu_bw 48 335"),
    BandwidthSku("A100 SXM", r"\bA100\b.*SXM", "PCIe Gen4 x16", 4, 16,
                 24.0, None, None, None, None, None,
                 source="Azure ND A100 v4 health check: check_cuda_bw 24 (fail only)"),
)


def lookup(device_name: str | None) -> BandwidthSku | None:
    """The table row for a device name ("NVIDIA H100 80GB HBM3"), or None."""
    return first_match(SKUS, device_name)
