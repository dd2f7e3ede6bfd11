"""Software fingerprint: the versions that decide whether two results are comparable.

Reads package metadata rather than importing frameworks (a level-1 run must not import torch);
where torch or CuPy is already imported by a compute check, their runtime versions are used.
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .telemetry.model import Snapshot


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None


def _cuda_pkg_version(prefix: str) -> str | None:
    """Version of an NVIDIA wheel such as nvidia-cublas-cu12 / nvidia-cublas (CUDA 13)."""
    return _dist_version(f"{prefix}-cu13", f"{prefix}-cu12", f"{prefix}-cu11", prefix)


def software_fingerprint(snapshot: "Snapshot | None" = None) -> dict[str, str | None]:
    fp: dict[str, str | None] = {
        "driver": snapshot.get("driver_version") if snapshot else None,
        "cuda_driver": snapshot.get("cuda_driver_version") if snapshot else None,
        "nvml": snapshot.get("nvml_version") if snapshot else None,
        "torch": _dist_version("torch"),
        "cuda_runtime": _cuda_pkg_version("nvidia-cuda-runtime"),
        "cublas": _cuda_pkg_version("nvidia-cublas"),
        "cudnn": _cuda_pkg_version("nvidia-cudnn"),
        "nccl": _cuda_pkg_version("nvidia-nccl"),
        "cupy": _dist_version("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    torch = sys.modules.get("torch")  # only if a compute check already imported it
    if torch is not None:
        try:
            fp["torch"] = str(torch.__version__)
            if getattr(torch.version, "cuda", None):
                fp["cuda_runtime"] = str(torch.version.cuda)
            if torch.backends.cudnn.is_available():
                fp["cudnn"] = str(torch.backends.cudnn.version())
            if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
                v = torch.cuda.nccl.version()
                fp["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # a broken CUDA install must not break the verdict
            pass
    return fp
