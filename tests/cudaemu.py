"""Run gpucheck's CUDA kernel sources on the CPU (tests only).

    lib = cudaemu.build("poet", DRIVER)          # DRIVER: C++ text exporting launchers
    lib.emu_bd_apply_f32(gx, gy, gz, bx, by, bz, ptr, ...)

`build` compiles gpucheck.kernels.source(name) (prelude + kernel file, the text NVRTC compiles)
plus the driver with g++ -std=c++20 against tests/cudaemu.h into a shared library, cached by the
hash of its text, and loads it with ctypes. A driver exports one launcher per kernel:

    extern "C" void emu_bd_apply_f32(EMU_LAUNCH_PARAMS, const float* x, float* y, int n) {
        EMU_LAUNCH(bd_apply_f32(x, y, n));
    }

Arrays are passed as NumPy arrays' `ctypes.data` (or torch tensors' `data_ptr()`); see `ptr()`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpucheck.kernels import source

HEADER = Path(__file__).resolve().parent / "cudaemu.h"
CACHE = Path(tempfile.gettempdir()) / f"gpucheck-cudaemu-{os.getuid()}"


def usable() -> str | None:
    """None when g++ can build emulated kernels here, else why not."""
    return None if shutil.which("g++") else "g++ not installed (apt-get install g++)"


def build(name: str, driver: str) -> ctypes.CDLL:
    """The emulated kernels of gpucheck/kernels/<name>.cu with `driver`'s launchers."""
    return build_text(name, source(name), driver)


def build_text(name: str, kernel_text: str, driver: str) -> ctypes.CDLL:
    """Like build(), for kernel text given directly (it must start with the prelude)."""
    text = "#include \"%s\"\n%s\n// ---- driver ----\n%s\n" % (HEADER, kernel_text, driver)
    digest = hashlib.sha256((text + HEADER.read_text()).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    lib = CACHE / f"{name}-{digest}.so"
    if not lib.exists():
        src = CACHE / f"{name}-{digest}.cpp"
        src.write_text(text)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run(
            ["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-w", str(src), "-o", str(tmp)],
            capture_output=True, text=True, timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"g++ failed on the emulated {name} kernels:\n{proc.stderr[-6000:]}")
        os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


def ptr(array) -> ctypes.c_void_p:
    """A device-pointer stand-in for a NumPy array or a torch tensor (contiguous)."""
    if hasattr(array, "data_ptr"):
        return ctypes.c_void_p(array.data_ptr())
    return ctypes.c_void_p(array.ctypes.data)
