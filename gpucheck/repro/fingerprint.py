"""The repro fingerprint: everything the output bits of the reference workloads depend on.

Bits are only comparable between machines with the same fingerprint, so every digest is stored
and compared under its fingerprint's key (the SHA-256 of the fingerprint's canonical JSON).

On a GPU (read in the worker, where torch runs on that GPU):

    device              "cuda"
    gpu                 the device name ("NVIDIA H100 80GB HBM3")
    compute_capability  "9.0"
    sm_count            streaming multiprocessors (a MIG slice has fewer, and cuBLAS picks
                        other kernels for it)
    driver              NVIDIA driver version (from NVML, else /proc/driver/nvidia/version)
    cuda_runtime        the CUDA runtime torch was built with (torch.version.cuda)
    torch               torch.__version__
    cublas              the cuBLAS library loaded in the process (cublasGetProperty), else its
                        file name or wheel version
    blas_backend        torch's preferred BLAS library (cuBLAS or cuBLASLt pick different kernels)
    workload_version    gpucheck.repro.workloads.WORKLOAD_VERSION
    preset              the workload sizes ("gpu")

cuDNN is not part of it: no workload calls cuDNN (no convolution; attention is written out as
GEMMs).

On a CPU worker: "cpu", the processor model and the instruction-set extensions that change
which kernels run (torch's CPU capability, AVX-512/AMX flags), torch, its BLAS and oneDNN
versions, the thread count (reduction order depends on it), the workload version and the
"cpu" preset.

Nothing here imports torch: the worker passes its torch module in.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import TYPE_CHECKING, Any, Mapping, TypedDict

from .workloads import WORKLOAD_VERSION

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import CpuFingerprint, CudaFingerprint, Fingerprint

GPU_FIELDS = ("device", "gpu", "compute_capability", "sm_count", "driver", "cuda_runtime", "torch", "cublas",
              "blas_backend", "workload_version", "preset")
CPU_FIELDS = ("device", "cpu", "cpu_capability", "cpu_flags", "torch", "blas", "mkl", "onednn", "threads",
              "workload_version", "preset")
# CPU flags that select different math kernels in MKL / oneDNN / ATen.
_CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "sve", "sve2", "asimd", "bf16")


def canonical(fp: Mapping[str, object]) -> str:
    """Any fingerprint (one this gpucheck reads, or one a reference file holds) as canonical JSON."""
    return json.dumps(fp, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint_key(fp: Mapping[str, object]) -> str:
    """SHA-256 (hex) of the fingerprint's canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(canonical(fp).encode("utf-8")).hexdigest()


def short_key(key: str) -> str:
    return key[:12]


def describe(fp: "Fingerprint") -> str:
    """One line a person can read."""
    if fp.get("device") == "cuda":
        return (f"{fp.get('gpu')} (sm {fp.get('compute_capability')}, {fp.get('sm_count')} SMs), "
                f"driver {fp.get('driver')}, CUDA {fp.get('cuda_runtime')}, torch {fp.get('torch')}, "
                f"cuBLAS {fp.get('cublas')} ({fp.get('blas_backend')}), workloads {fp.get('workload_version')}"
                f"/{fp.get('preset')}")
    mkl = fp.get("mkl")
    return (f"CPU {fp.get('cpu')} ({fp.get('cpu_capability')}), torch {fp.get('torch')}, BLAS {fp.get('blas')}"
            f"{' ' + str(mkl) if mkl else ''}, oneDNN {fp.get('onednn')}, "
            f"{fp.get('threads')} thread(s), workloads {fp.get('workload_version')}/{fp.get('preset')}")


def differences(a: "Fingerprint", b: "Fingerprint") -> list[str]:
    """The fields where two fingerprints differ, as 'field: a vs b'."""
    out = []
    fa: Mapping[str, object] = a  # compared field by field, whichever kind each is
    fb: Mapping[str, object] = b
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            out.append(f"{k}: {fa.get(k)!r} vs {fb.get(k)!r}")
    return out


def closest(fp: "Fingerprint", others: "list[Fingerprint]") -> "tuple[Fingerprint, list[str]] | None":
    """The stored fingerprint that differs from `fp` in the fewest fields, and those fields."""
    best = None
    for o in others:
        d = differences(fp, o)
        if best is None or len(d) < len(best[1]):
            best = (o, d)
    return best


# ---------------------------------------------------------------------------------------------
# reading it (in the worker)


def driver_version(given: str | None = None) -> str | None:
    if given:
        return str(given)
    try:
        text = open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for [^ ]+)?\s+([0-9][0-9.]+)", text)
    return m.group(1) if m else None


def _loaded_library(name: str) -> str | None:
    """Path of a shared library mapped into this process whose file name starts with `name`."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(" ")[-1]
                if os.path.basename(path).startswith(name):
                    return path
    except OSError:
        return None
    return None


def cublas_version() -> str | None:
    """The version of the cuBLAS library this process loaded (call after the first GEMM):
    cublasGetProperty(MAJOR, MINOR, PATCH), else the version in its file name, else the
    nvidia-cublas wheel's version."""
    import ctypes

    path = _loaded_library("libcublas.so")
    if path:
        try:
            lib = ctypes.CDLL(path)
            parts = []
            for prop in (0, 1, 2):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                v = ctypes.c_int(-1)
                if lib.cublasGetProperty(prop, ctypes.byref(v)) != 0:
                    raise OSError("cublasGetProperty failed")
                parts.append(str(v.value))
            return ".".join(parts)
        except (OSError, AttributeError):
            m = re.search(r"libcublas\.so\.(\d+(?:\.\d+)*)", os.path.basename(os.path.realpath(path)))
            if m:
                return m.group(1)
    from ..platform.fingerprint import _cuda_pkg_version

    return _cuda_pkg_version("nvidia-cublas")


def cuda_fingerprint(torch: Any, dev: Any, *, preset: str, driver: str | None = None) -> "CudaFingerprint":
    props = torch.cuda.get_device_properties(dev)
    try:
        backend = str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1]
    except (AttributeError, RuntimeError):
        backend = None
    return {
        "device": "cuda",
        "gpu": str(props.name),
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": int(props.multi_processor_count),
        "driver": driver_version(driver),
        "cuda_runtime": str(torch.version.cuda) if torch.version.cuda else None,
        "torch": str(torch.__version__),
        "cublas": cublas_version(),
        "blas_backend": backend,
        "workload_version": WORKLOAD_VERSION,
        "preset": preset,
    }


def _cpu_model() -> tuple[str | None, list[str]]:
    model: str | None = None
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if model is None and key in ("model name", "cpu model", "processor") and not value.strip().isdigit():
                    model = value.strip()
                elif not flags and key in ("flags", "features"):
                    have = set(value.split())
                    flags = [fl for fl in _CPU_FLAGS if fl in have]
                if model and flags:
                    break
    except OSError:
        pass
    if model is None:
        import platform

        model = platform.processor() or platform.machine() or None
    return model, flags


class CpuLibraries(TypedDict):
    blas: str | None
    mkl: str | None
    onednn: str | None


def torch_cpu_libraries(torch: Any) -> CpuLibraries:
    """BLAS, MKL and oneDNN versions from torch's build configuration."""
    text = torch.__config__.show()
    m = re.search(r"BLAS_INFO=([^,\s]+)", text)
    mkl = re.search(r"Math Kernel Library Version ([^\s]+)", text)
    dnn = re.search(r"(?:MKL-DNN|oneDNN)\s+v?([0-9][^\s]*)", text)
    return {
        "blas": m.group(1) if m else None,
        "mkl": mkl.group(1) if mkl else None,
        "onednn": dnn.group(1) if dnn else None,
    }


def cpu_fingerprint(torch: Any, *, preset: str) -> "CpuFingerprint":
    model, flags = _cpu_model()
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        capability = None
    return {
        "device": "cpu",
        "cpu": model,
        "cpu_capability": capability,
        "cpu_flags": flags,
        "torch": str(torch.__version__),
        **torch_cpu_libraries(torch),
        "threads": int(torch.get_num_threads()),
        "workload_version": WORKLOAD_VERSION,
        "preset": preset,
    }
