"""Per-SKU dense peak TFLOP/s by burn dtype: the data the burn's SKU floor is computed from.

Dense means without 2:4 structured sparsity: NVIDIA datasheets print the tensor-core rates "with
sparsity" (footnote *), and the dense rate is half of that. `fp32` is the plain (IEEE, CUDA-core)
FP32 rate, `tf32` the TF32 tensor-core rate, `fp64` the FP64 tensor-core rate (what DGEMM runs
on), `fp8` the E4M3 tensor-core rate. None: the SKU has no such unit (A100 has no FP8).

The floor the burn applies is a configurable fraction of these numbers (checks.burn.gemm
sku_warn_fraction / sku_fail_fraction); a GPU whose name matches no row is judged by its peers
only, and its result says so.

Sources (checked 2026-11; datasheet numbers, boost clock):
- H100 SXM5 and H100 PCIe: NVIDIA H100 Tensor Core GPU datasheet, SXM / PCIe columns:
  FP64 34 / 26, FP64 Tensor 67 / 51, FP32 67 / 51, TF32 989* / 756*, BF16 and FP16 1,979* / 1,513*,
  FP8 3,958* / 3,026* TFLOPS (* with sparsity). Tabulated at
  https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html ; the exact dense values below
  (66.9, 494.7, 989.4, 1978.9) are from https://glennklockwood.com/garden/processors/h100 .
- H200 SXM: same GH100 compute as H100 SXM (FP8 3,958* TFLOPS, FP64 34 / Tensor 67); dense
  FP16/BF16 ~989, FP8 ~1,979: https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html
- A100 SXM4 and PCIe (40 GB and 80 GB): NVIDIA A100 datasheet
  (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): FP64 9.7, FP64 Tensor 19.5, FP32 19.5,
  TF32 156 (312*), BF16/FP16 312 (624*); the same peak rates for both form factors.
  Tabulated at https://glennklockwood.com/garden/processors/A100 .
- B200 (HGX B200, 1,000 W): NVIDIA HGX B200 / GB200 NVL72 specification table, per GPU:
  FP8 9 PFLOPS*, FP16/BF16 4.5 PFLOPS*, TF32 2.2 PFLOPS*, FP32 75 TFLOPS, FP64/FP64 Tensor 37
  TFLOPS. Quoted at https://zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html and
  https://glennklockwood.com/garden/processors/B200 .

H100 NVL, H200 NVL, GH200 and H800 are deliberately absent (no number we could confirm): they are
judged by peers only.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import first_match, name_matches


@dataclass(frozen=True)
class Sku:
    name: str
    pattern: str  # regex searched in the NVML / torch device name
    dense_tflops: dict[str, float | None]
    source: str

    def matches(self, device_name: str) -> bool:
        return name_matches(self.pattern, device_name)

    def peak(self, dtype: str) -> float | None:
        return self.dense_tflops.get(dtype)


_H100_SXM = {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}

# Order matters: the first row whose pattern matches wins (NVL variants are excluded explicitly).
SKUS: tuple[Sku, ...] = (
    Sku("H100 SXM", r"\bH100\b(?!\s*(NVL|PCIe)).*\b(SXM|HBM3)\b", dict(_H100_SXM),
        "NVIDIA H100 datasheet (SXM5), dense = sparse/2"),
    Sku("H100 PCIe", r"\bH100\b.*\bPCIe\b",
        {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
        "NVIDIA H100 datasheet (PCIe), dense = sparse/2"),
    Sku("H200 SXM", r"\bH200\b(?!\s*NVL)", dict(_H100_SXM),
        "NVIDIA H200 datasheet: H100 SXM compute, dense = sparse/2"),
    Sku("A100 SXM", r"\bA100\b.*SXM",
        {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "fp8": None},
        "NVIDIA A100 datasheet r4"),
    Sku("A100 PCIe", r"\bA100\b.*PCIE",
        {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "fp8": None},
        "NVIDIA A100 datasheet r4"),
    Sku("B200", r"\bB200\b",
        {"fp64": 37.0, "fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        "NVIDIA HGX B200 specifications (1,000 W), dense = sparse/2"),
)


def lookup(device_name: str | None) -> Sku | None:
    """The table row for an NVML / torch device name ("NVIDIA H100 80GB HBM3"), or None."""
    return first_match(SKUS, device_name)
