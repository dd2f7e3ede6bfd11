"""Compile gpucheck's kernel sources with NVRTC, without a GPU (tests only).

NVRTC is what CuPy's RawModule compiles with on the GPU machine; the test suite compiles the same
text for the architectures gpucheck supports, so a kernel source that would not compile there
fails here. The library comes from the `nvidia-cuda-nvrtc` wheel (a test dependency) or a CUDA
toolkit; `find_library()` says where, or None.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path


def find_library() -> str | None:
    candidates: list[str] = []
    for root in sys.path:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libnvrtc.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            candidates += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    for c in candidates:
        if "builtins" not in Path(c).name:
            return c
    return None


class CompileError(RuntimeError):
    pass


def compile_ptx(text: str, name: str, arch: str, options: tuple[str, ...] = ()) -> str:
    """PTX for `text` compiled for `arch` ("sm_90"); CompileError with NVRTC's log on failure."""
    path = find_library()
    if path is None:
        raise FileNotFoundError("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    lib = ctypes.CDLL(path)
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), f"{name}.cu".encode(), 0, None, None)
    if rc != 0:
        raise CompileError(f"nvrtcCreateProgram returned {rc}")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value or 1)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise CompileError(f"{name}.cu for {arch}:\n{log.value.decode(errors='replace')}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
