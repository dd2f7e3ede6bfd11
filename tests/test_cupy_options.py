"""The NVRTC options CuPy compiles gpucheck's kernels with (tests/cupy_options.py reads them from
the installed CuPy), and what gpucheck/kernels/cupy_module.py says about them."""

from __future__ import annotations

import os

import pytest

if os.environ.get("GPUCHECK_NO_SKIP"):  # CI installed it (.ci/run): its absence fails, never skips
    import cupy  # noqa: F401
else:
    pytest.importorskip("cupy")  # a test dependency (pyproject.toml [test])

import cupy_options  # noqa: E402
import nvrtc  # noqa: E402
from gpucheck.kernels import cupy_module, source  # noqa: E402

FMA = 'extern "C" __global__ void k(float* a, float b) { a[0] = a[0] * b + 1.0f; }'
CUPY_ENV = ("CUPY_COMPILE_WITH_PTX", "CUPY_NVRTC_USE_PCH", "CUPY_CUDA_COMPILE_WITH_DEBUG")


def _fma(options: tuple[str, ...]) -> list[str]:
    if nvrtc.find_library() is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    ptx = nvrtc.compile_ptx(FMA, "ftz", "sm_90", cupy_options.codegen_options(options))
    return [ln.split()[0] for ln in ptx.splitlines() if ln.strip().startswith("fma.")]


def test_what_cupy_14_passes_to_nvrtc_for_gpuchecks_kernels():
    """CuPy 14.2's RawModule: CCCL includes, gpucheck's options, CuPy's and CUDA's headers,
    -ftz=true, -arch=sm_90 (a cubin), --device-as-default-execution-space."""
    assert not [v for v in CUPY_ENV if os.environ.get(v)], "CUPY_* compile settings change the options"
    opts = cupy_options.CUPY_NVRTC_OPTIONS
    assert cupy_options.CUPY_CODEGEN_OPTIONS == ("--std=c++17", "-ftz=true", "--device-as-default-execution-space")
    assert cupy_module.OPTIONS == ("--std=c++17",)
    start = opts.index(cupy_module.OPTIONS[0])
    assert opts[start:start + len(cupy_module.OPTIONS)] == cupy_module.OPTIONS  # passed through, in order
    assert opts.count("--std=c++17") == 1  # gpucheck names the standard: CuPy adds none of its own
    assert opts.index("-ftz=true") > start  # after gpucheck's options: it wins (below)
    assert opts[-2:] == ("-arch=sm_90", "--device-as-default-execution-space")
    includes = [o for o in opts if o.startswith("-I")]
    assert len(includes) == 5 and all(os.path.isdir(o[2:]) for o in includes)
    assert all(o.startswith("-I") for o in opts[:start])  # the CCCL dirs come first


def test_an_ftz_false_from_gpucheck_would_have_no_effect_under_cupy():
    """cupy_module.OPTIONS's comment: CuPy appends -ftz=true and NVRTC honours the last occurrence,
    so fp32 arithmetic compiles to its .ftz form whatever gpucheck passes."""
    assert _fma(cupy_module.OPTIONS) == ["fma.rn.f32"]  # gpucheck's options alone: IEEE
    assert _fma(cupy_options.CUPY_NVRTC_OPTIONS) == ["fma.rn.ftz.f32"]  # as CuPy compiles them
    with_false = cupy_options.cupy_nvrtc_options(cupy_module.OPTIONS + ("-ftz=false",))
    assert with_false.index("-ftz=false") < with_false.index("-ftz=true")
    assert _fma(with_false) == ["fma.rn.ftz.f32"]


def test_other_architectures_and_options_go_through_cupys_own_code():
    opts = cupy_options.cupy_nvrtc_options(("-DX=1",), "80")
    assert "-arch=sm_80" in opts and "-DX=1" in opts
    assert "--std=c++17" in opts  # CuPy's default standard where none is named
    assert opts.index("-DX=1") < opts.index("--std=c++17")


@pytest.mark.slow
def test_gpuchecks_kernels_compile_with_cupys_options():
    if nvrtc.find_library() is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    for name in ("memtest", "poet"):
        assert ".entry" in nvrtc.compile_ptx(source(name), name, "sm_90", cupy_options.CUPY_NVRTC_OPTIONS)
