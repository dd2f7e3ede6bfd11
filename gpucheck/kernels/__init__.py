"""CUDA kernel sources for the CuPy-backed checks (POET block-orthogonal matmul, HBM patterns).

Sources live next to this file as `<name>.cu`; `source(name)` returns the text that is compiled:
`prelude.cuh` (dtype conversions, a counter-based RNG; see its header for the rules every kernel
source follows) followed by the kernel file. `gpucheck.kernels.cupy_module` compiles and launches
them on a GPU; the test suite compiles the same text with NVRTC (tests/nvrtc.py) and runs it on
the CPU under an emulation header (tests/cudaemu.py). Nothing here imports CuPy or NumPy.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent

MASK64 = (1 << 64) - 1


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """Prelude + `<name>.cu`, the exact text NVRTC compiles."""
    if not name.replace("_", "").isalnum():
        raise ValueError(f"bad kernel source name {name!r}")
    path = _HERE / f"{name}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {path}")
    prelude = (_HERE / "prelude.cuh").read_text()
    return prelude + f"\n// ---- {name}.cu ----\n" + path.read_text()


def PRELUDE_FOR_TESTS() -> str:  # noqa: N802 - the prelude alone, for test kernels
    return (_HERE / "prelude.cuh").read_text()


def names() -> list[str]:
    """Every kernel source shipped (for the compile test)."""
    return sorted(p.stem for p in _HERE.glob("*.cu"))


def splitmix64(seed: int, index):
    """Word `index` of the seeded stream, as `gc_mix64` computes it on the device. `index` may be
    an int or a NumPy uint64 array (NumPy is imported only then)."""
    if isinstance(index, int):
        z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)
    import numpy as np  # noqa: PLC0415

    with np.errstate(over="ignore"):
        i = np.asarray(index, dtype=np.uint64)
        z = np.uint64(seed & MASK64) + (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
