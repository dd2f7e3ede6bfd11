"""The NVRTC options CuPy compiles gpucheck's kernels with, read from the installed CuPy itself.

    import cupy_options                        # from tests/ (pytest puts it on sys.path)
    cupy_options.CUPY_NVRTC_OPTIONS            # everything CuPy passes to nvrtcCompileProgram, sm_90
    cupy_options.CUPY_CODEGEN_OPTIONS          # the same without -I paths and -arch: what shapes the code
    cupy_options.cupy_nvrtc_options(OPTIONS, "80")   # for other options or another architecture

gpucheck compiles with `cupy.RawModule(code=..., options=cupy_module.OPTIONS)`. CuPy 14.2 adds to
those options before NVRTC sees them (read in CuPy's v14.2.0 source, which the installed wheel
ships as cupy/cuda/compiler.py, and whose Cython parts live in cupy/_core/raw.pyx and core.pyx):

- cupy/_core/raw.pyx `_get_raw_module` -> cupy/_core/core.pyx `compile_with_cache(code, options,
  prepend_cupy_headers=False, backend='nvrtc', ...)` -> `assemble_cupy_compiler_options`: the
  bundled CCCL include dirs (-I .../cupy/_cccl/{cub,thrust,libcudacxx}) before the options,
  `--std=c++17` after them only when they name no standard, then -I CuPy's headers and -I the
  CUDA headers;
- cupy/cuda/compiler.py `_compile_with_cache_cuda`: `-ftz=true` (and `--device-debug
  --generate-line-info` with CUPY_CUDA_COMPILE_WITH_DEBUG=1);
- `_compile_using_nvrtc_no_warning`: `-arch=sm_XX` (a cubin; `-arch=compute_XX`, PTX, with
  CUPY_COMPILE_WITH_PTX=1 or for an architecture newer than NVRTC's), then
  `--device-as-default-execution-space` (and `--pch` with CUPY_NVRTC_USE_PCH=1).

Rather than copy that list, `cupy_nvrtc_options` runs CuPy's own code path (core.compile_with_cache
with the arguments raw.pyx passes) with CuPy's NVRTC program class replaced by a recorder, and
returns the options of the compile that would have produced the module. Nothing is compiled and
no GPU is needed; the per-device memoisation of the architecture lookup (which asks the CUDA
runtime for the current device) is bypassed with the architecture given. CuPy's private names
used here (`_NVRTCProgram`, `_get_arch_for_options_for_nvrtc`, `_empty_file_preprocess_cache`)
are those of the pinned 14.2.0: a CuPy that renames them fails here loudly, not silently.
"""

from __future__ import annotations

import os
from typing import Any

from gpucheck.kernels.cupy_module import OPTIONS

ARCH = "90"  # H100/H200: the GPUs gpucheck's GPU checks run on


class _Recorded(Exception):
    pass


def cupy_nvrtc_options(options: tuple[str, ...] = OPTIONS, arch: str = ARCH) -> tuple[str, ...]:
    """What CuPy's RawModule(code=..., options=options) passes to NVRTC for compute capability
    `arch` ("90"), under the current CUPY_* environment."""
    import cupy  # noqa: F401 - a test dependency; ImportError here names it
    from cupy._core import core
    from cupy.cuda import compiler

    seen: list[tuple[str, ...]] = []

    class Recorder:
        def __init__(self, src: Any, name: Any = "default_program", *args: Any, **kwargs: Any):
            self.src = src

        def compile(self, options: tuple = (), log_stream: Any = None) -> tuple[bytes, None]:
            if self.src == "":  # _preprocess: the compiler's version comments of an empty file
                return b"// cupy_options: recorded\n", None
            seen.append(tuple(options))
            raise _Recorded

    saved = (compiler._NVRTCProgram, compiler._get_arch_for_options_for_nvrtc,
             dict(compiler._empty_file_preprocess_cache), os.environ.get("CUPY_CACHE_IN_MEMORY"))
    compiler._NVRTCProgram = Recorder
    compiler._get_arch_for_options_for_nvrtc = compiler._get_arch_for_options_for_nvrtc.__wrapped__
    compiler._empty_file_preprocess_cache.clear()
    os.environ["CUPY_CACHE_IN_MEMORY"] = "1"  # no lookup in ~/.cupy/kernel_cache: always "compile"
    try:
        core.compile_with_cache('extern "C" __global__ void k() {}', tuple(options), arch=arch,
                                prepend_cupy_headers=False, backend="nvrtc", translate_cucomplex=False,
                                enable_cooperative_groups=False, name_expressions=None, log_stream=None,
                                jitify=False)
    except _Recorded:
        pass
    finally:
        compiler._NVRTCProgram, compiler._get_arch_for_options_for_nvrtc = saved[0], saved[1]
        compiler._empty_file_preprocess_cache.clear()
        compiler._empty_file_preprocess_cache.update(saved[2])
        if saved[3] is None:
            os.environ.pop("CUPY_CACHE_IN_MEMORY", None)
        else:
            os.environ["CUPY_CACHE_IN_MEMORY"] = saved[3]
    if len(seen) != 1:
        raise RuntimeError(f"CuPy's compile path did not reach NVRTC exactly once ({seen!r}): not CuPy 14.2's?")
    return seen[0]


def codegen_options(options: tuple[str, ...]) -> tuple[str, ...]:
    """`options` without include paths and the architecture (a compile for another target gives
    its own --gpu-architecture): the flags that shape the generated code."""
    return tuple(o for o in options if not o.startswith(("-I", "-arch=", "--gpu-architecture")))


CUPY_NVRTC_OPTIONS: tuple[str, ...] = cupy_nvrtc_options()
CUPY_CODEGEN_OPTIONS: tuple[str, ...] = codegen_options(CUPY_NVRTC_OPTIONS)
