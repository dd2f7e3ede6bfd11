"""Expected intra-node bus bandwidth per GPU SKU and topology (data, not code).

Each entry is what a healthy node of that kind reaches at large sizes (256 MiB and up) in
nccl-tests' busbw, with the source of the number. A site overrides or adds values with
`[checks."nccl.intra"] expected_<op>_gbs = ...` in its config. An op without an entry is judged
by data integrity, rank balance and the node's own baseline only.

`all_reduce` is the ring/tree number (what NCCL reaches without NVLink SHARP); `nvls` holds the
number with NVLS (NVLink SHARP on NVSwitch systems), used when the check's `nvls` parameter is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Expectation:
    sku: str
    gpus: int
    link: str
    busbw_gbs: dict[str, float]
    nvls_busbw_gbs: dict[str, float] = field(default_factory=dict)
    source: str = ""
    match: tuple[str, ...] = ()

    def for_op(self, op: str, nvls: bool = False) -> float | None:
        if nvls and op in self.nvls_busbw_gbs:
            return self.nvls_busbw_gbs[op]
        return self.busbw_gbs.get(op)


TABLE: tuple[Expectation, ...] = (
    Expectation(
        sku="H100 SXM", gpus=8, link="NVLink 4 / NVSwitch",
        busbw_gbs={"all_reduce": 370.0},
        nvls_busbw_gbs={"all_reduce": 480.0},
        source="gpucheck issue 7: 8xH100 SXM over NVLink, ~370 GB/s ring all-reduce, ~480 GB/s with NVLS "
               "(public nccl-tests references give 460-480 GB/s with NVLS)",
        match=("H100 80GB HBM3", "H100 SXM", "H100-SXM"),
    ),
    Expectation(
        sku="H200 SXM", gpus=8, link="NVLink 4 / NVSwitch",
        busbw_gbs={"all_reduce": 370.0},
        nvls_busbw_gbs={"all_reduce": 480.0},
        source="same NVLink 4 / NVSwitch fabric (18 links, 900 GB/s per GPU) as the H100 SXM entry",
        match=("H200",),
    ),
    Expectation(
        sku="A100 SXM", gpus=8, link="NVLink 3 / NVSwitch",
        busbw_gbs={"all_reduce": 230.0},
        source="public nccl-tests references: 8xA100 SXM4 all_reduce busbw 230-250 GB/s at large sizes",
        match=("A100-SXM", "A100 SXM"),
    ),
)


def lookup(gpu_name: str | None, gpus: int) -> Expectation | None:
    """The table entry for `gpus` GPUs named `gpu_name` (NVML/CUDA name), or None."""
    if not gpu_name:
        return None
    name = gpu_name.upper()
    for e in TABLE:
        if e.gpus == gpus and any(m.upper() in name for m in e.match):
            return e
    return None


def expected_busbw(op: str, gpu_name: str | None, gpus: int, *, nvls: bool = False,
                   overrides: Mapping[str, object] | None = None) -> tuple[float | None, str]:
    """(expected busbw in GB/s or None, where it came from). `overrides`: the check's parameters,
    whose `expected_<op>_gbs` (> 0) wins over the table."""
    key = f"expected_{op}_gbs"
    given = overrides.get(key) if overrides else None
    if isinstance(given, (int, float)) and float(given) > 0:
        return float(given), f"config {key}"
    e = lookup(gpu_name, gpus)
    if e is None:
        return None, ""
    v = e.for_op(op, nvls)
    if v is None:
        return None, ""
    return v, f"{gpus}x{e.sku} over {e.link}{' with NVLS' if nvls and op in e.nvls_busbw_gbs else ''}"
