"""The machine code of gpucheck's kernels, checked on the CPU (tests/sass.py: NVRTC with CuPy's
options -> PTX -> ptxas -> cubin -> nvdisasm, for sm_80 and sm_90).

- The figures agree three ways (ptxas's report, the cubin's ELF, NVRTC's own ptxas: the cubin
  read here is the one CuPy loads) and CuPy's -ftz=true is in the code.
- POET's tensor-core kernels run HMMA of their dtype, every A and B operand register loaded by
  LDSM (ldmatrix, plain and .trans); memtest's sweeps move 16 bytes per global access.
- No kernel uses local memory (no spills, no stack frame, no LDL/STL).
- Registers and shared memory allow the occupancy the launches and docs assume: poet_bd_mma 8
  blocks of 128 per H100/H200 SM, __launch_bounds__ equal to the blocks cupy_ops launches; every
  memtest kernel runs in blocks of up to 1024 threads (the largest `block` the check accepts),
  its check kernels 4 blocks of 256 per SM and its fill kernels 8.
- tests/ptxas.py reads each function's own figures (its old regex ran across function blocks).

A missing tool (libnvrtc, ptxas, nvdisasm) skips, and fails where GPUCHECK_REQUIRE_NVRTC is set (CI).
"""

from __future__ import annotations

import os
import re

import pytest

import nvrtc
import ptxas
import sass
from gpucheck import kernels
from gpucheck.tests_suite.eud_memtest import DEFAULTS as MEMTEST_DEFAULTS
from gpucheck.eud.memtest_cupy import MAX_BLOCK, UNROLL
from gpucheck.kernels.cupy_module import OPTIONS
from gpucheck.poet import cupy_ops

ARCHS = ["sm_80", "sm_90"]
SOURCES = ["memtest", "poet"]
GPU_OF = {"sm_80": sass.AMPERE, "sm_90": sass.HOPPER}

# Every test here compiles the kernels with NVRTC and ptxas (seconds each): the full suite only.
pytestmark = pytest.mark.slow


def _require_tools() -> None:
    missing = [t for t in sass.TOOLS if sass.find_tool(t) is None]
    if nvrtc.find_library() is None:
        missing.append("libnvrtc")
    if missing:
        what = f"{', '.join(missing)} not found (pip install nvidia-cuda-nvrtc nvidia-cuda-nvcc nvidia-cuda-nvdisasm)"
        if os.environ.get("GPUCHECK_REQUIRE_NVRTC"):
            pytest.fail(f"GPUCHECK_REQUIRE_NVRTC is set but {what}")
        pytest.skip(what)


def _code(name: str, arch: str) -> dict[str, sass.Function]:
    _require_tools()
    return sass.compile_source(name, arch)


def _entries(fns: dict[str, sass.Function]) -> dict[str, sass.Function]:
    return {n: f for n, f in fns.items() if f.registers is not None}


# ---- the pipeline ----------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", SOURCES)
def test_the_figures_agree_three_ways(name, arch):
    """ptxas's report and the cubin's ELF give the same registers, frame and shared memory (an
    sm_90 cubin's shared section also holds the 1 KiB the system reserves per block, at its
    start), and NVRTC's own ptxas, compiling to a cubin as CuPy does, reports the same: the
    cubin disassembled here is the one CuPy loads."""
    fns = _code(name, arch)
    entries = _entries(fns)
    assert entries, fns.keys()
    reserved = sass.HOPPER.smem_reserved if arch == "sm_90" else 0
    for fn, f in entries.items():
        assert (f.elf_registers, f.elf_frame) == (f.registers, f.stack_frame), fn
        assert f.elf_smem == f.smem + (reserved if f.smem else 0), (fn, f.elf_smem, f.smem)
    own = ptxas.report(kernels.source(name), name, arch, sass.CUPY_NVRTC_OPTIONS)
    assert {fn: (r["registers"], r["smem"]) for fn, r in own.items()} == \
        {fn: (f.registers, f.smem) for fn, f in entries.items()}


FMA_KERNEL = r"""
extern "C" __global__ void fma_k(const float* a, float* c) {
    c[threadIdx.x] = __fmaf_rn(a[threadIdx.x], 3.0f, c[threadIdx.x]);
}
"""


@pytest.mark.parametrize("arch", ARCHS)
def test_the_code_is_compiled_with_cupys_options(arch):
    """CuPy appends -ftz=true: fp32 arithmetic written in C flushes subnormals (FFMA.FTZ for
    __fmaf_rn, FADD.FTZ for +), as the same FMA compiled without CuPy's options does not. POET's
    CUDA-core tiles accumulate with gc_fmaf (inline fma.rn.f32) so that its bounds' gradual
    underflow holds: plain FFMA only, while the Horner step's C-level diagonal adds flush."""
    assert sass.CUPY_NVRTC_OPTIONS[:len(OPTIONS)] == OPTIONS and "-ftz=true" in sass.CUPY_NVRTC_OPTIONS
    poet = _code("poet", arch)
    for name in ("poet_bd_apply_f32", "poet_cnp_step_f32"):
        assert poet[name].count("FFMA") > 0 and poet[name].count("FFMA.FTZ") == 0, name
    assert poet["poet_cnp_step_f32"].count("FADD.FTZ") > 0
    assert sass.compile_text(FMA_KERNEL, "fma", arch)["fma_k"].count("FFMA.FTZ") == 1
    plain = sass.compile_text(FMA_KERNEL, "fma", arch, OPTIONS)["fma_k"]
    assert plain.count("FFMA.FTZ") == 0 and plain.count("FFMA") == 1


# ---- what the kernels compile to -----------------------------------------------------------------
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)\s+([^;]*);")


def _dest_width(opcode: str) -> int:
    """32-bit registers an instruction's first operand spans when it is a register it writes."""
    if opcode.startswith("LDSM."):
        return int(opcode.rsplit(".", 1)[1]) if opcode.rsplit(".", 1)[1] in ("2", "4") else 1
    if opcode.startswith("HMMA."):
        return 4
    if ".128" in opcode:
        return 4
    if ".64" in opcode or opcode.startswith("IMAD.WIDE"):
        return 2
    return 1


def hmma_operand_sources(sass_text: str) -> list[tuple[str, str]]:
    """For every HMMA, and each register of its A (4) and B (2) operands: the opcode of the
    nearest instruction before it that writes that register, as (HMMA's operand, writer)."""
    instrs = [(m.group(1), [o.strip() for o in m.group(2).split(",")]) for m in _INSTR.finditer(sass_text)]
    found = []
    for i, (op, args) in enumerate(instrs):
        if not op.startswith("HMMA."):
            continue
        for operand, width in ((args[1], 4), (args[2], 2)):
            base = int(re.match(r"R(\d+)", operand).group(1))
            for reg in range(base, base + width):
                writer = "none"
                for prev_op, prev_args in reversed(instrs[:i]):
                    dest = re.match(r"R(\d+)", prev_args[0]) if prev_args else None
                    if dest and int(dest.group(1)) <= reg < int(dest.group(1)) + _dest_width(prev_op):
                        writer = prev_op
                        break
                found.append((f"R{reg}", writer))
    return found


def test_the_operand_scan_sees_a_scalar_shared_load():
    """The scan on SASS of the shape the kernel had before ldmatrix (synthetic: an A operand
    assembled from 32-bit LDS, a B operand half from LDSM, half from a move)."""
    text = """
        /*0000*/                   LDS R32, [R5] ;
        /*0010*/                   LDS R33, [R5+0x210] ;
        /*0020*/                   LDSM.16.M88.4 R34, [R6] ;
        /*0030*/                   LDSM.16.MT88.2 R24, [R7] ;
        /*0040*/                   IMAD.MOV.U32 R25, RZ, RZ, R9 ;
        /*0050*/                   HMMA.16816.F32.BF16 R20, R32.reuse, R24, R20 ;
    """
    assert hmma_operand_sources(text) == [("R32", "LDS"), ("R33", "LDS"), ("R34", "LDSM.16.M88.4"),
                                          ("R35", "LDSM.16.M88.4"), ("R24", "LDSM.16.MT88.2"),
                                          ("R25", "IMAD.MOV.U32")]


@pytest.mark.parametrize("arch", ARCHS)
def test_poet_tensor_core_kernels_feed_hmma_from_ldmatrix(arch):
    fns = _code("poet", arch)
    for kernel, hmma in (("poet_bd_mma_bf16", "HMMA.16816.F32.BF16"), ("poet_bd_mma_f16", "HMMA.16816.F32")):
        f = fns[kernel]
        assert f.opcodes.get(hmma, 0) > 0 and f.count("HMMA") == f.opcodes[hmma], (kernel, f.opcodes)
        assert f.opcodes.get("LDSM.16.M88.4", 0) > 0 and f.opcodes.get("LDSM.16.MT88.4", 0) > 0, f.opcodes
        assert 4 * f.count("LDSM") == 3 * f.count("HMMA"), f.opcodes  # A + 2 B loads per 4 n8 tiles, none wasted
        sources = hmma_operand_sources(f.sass)
        assert len(sources) == 6 * f.count("HMMA")
        assert {w for _, w in sources} <= {"LDSM.16.M88.4", "LDSM.16.MT88.4"}, sources
    for kernel in ("poet_bd_apply_bf16", "poet_cnp_step_f32"):  # the CUDA-core path stays on the FMA units
        assert fns[kernel].count("HMMA") == 0 and fns[kernel].count("LDSM") == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_memtest_sweeps_move_16_bytes_per_global_access(arch):
    """Every global load of a check sweep and of the scrub, and every store of a fill, is 128-bit
    (LDG.E.128 / STG.E.128); the check kernels issue MT_UNROLL of them per step. The only other
    global accesses of a check kernel are mt_error's: its volatile read of the record counter
    (LDG .STRONG) and the 64-bit error records and write-back stores."""
    fns = _code("memtest", arch)
    for fn, f in fns.items():
        loads = {op: n for op, n in f.opcodes.items() if op.startswith("LDG")}
        stores = {op: n for op, n in f.opcodes.items() if op.startswith("STG")}
        if fn.startswith("memtest_check_"):
            assert loads.get("LDG.E.128", 0) >= UNROLL, (fn, loads)
            assert all(".STRONG" in op for op in loads if op != "LDG.E.128"), (fn, loads)
            assert stores.get("STG.E.128", 0) >= UNROLL, (fn, stores)  # write_back
        elif fn.startswith("memtest_fill_"):
            assert not loads and set(stores) == {"STG.E.128"} and stores["STG.E.128"] >= UNROLL, (fn, stores)
        elif fn == "memtest_scrub":
            assert set(loads) == {"LDG.E.128"} and set(stores) == {"STG.E.128"}, (fn, loads, stores)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", SOURCES)
def test_no_kernel_uses_local_memory(name, arch):
    for fn, f in _code(name, arch).items():
        assert (f.spill_stores, f.spill_loads, f.stack_frame) == (0, 0, 0), fn
        local = {op: n for op, n in f.opcodes.items() if op[:3] in ("LDL", "STL")}
        assert f.local_memory_instructions() == 0, (fn, local)


# ---- occupancy -------------------------------------------------------------------------------
def test_the_occupancy_model_follows_the_allocation_rules():
    """Registers per warp round up to 256, shared memory per block gets the 1 KiB reservation and
    rounds up to 128 bytes, and threads and blocks cap the answer."""
    assert sass.blocks_per_sm(64, 24576, 128) == 8  # 64 x 32 = 2048 per warp: 32 warps; 233472 // 25600 = 9
    assert sass.blocks_per_sm(65, 0, 128) == 7  # 65 x 32 = 2080 -> 2304 per warp: 28 warps
    assert sass.blocks_per_sm(83, 40448, 128) == 5  # the kernel before ldmatrix
    assert sass.blocks_per_sm(32, 37888, 128) == 6  # 37888 + 1024 = 38912: exactly 6 in 228 KiB
    assert sass.blocks_per_sm(32, 37889, 128) == 5
    assert sass.blocks_per_sm(8, 0, 32) == 32 and sass.blocks_per_sm(8, 0, 1024) == 2
    assert sass.blocks_per_sm(64, 24576, 128, sass.AMPERE) == 6


@pytest.mark.parametrize("arch", ARCHS)
def test_poet_kernels_fit_the_blocks_they_are_launched_with(arch):
    """__launch_bounds__ is the block cupy_ops launches (a bigger launch would fail, a smaller
    bound would waste registers); poet_bd_mma's registers and static shared memory (as planned,
    cupy_ops.mma_shared_bytes) let MMA_MIN_BLOCKS (8) blocks of 128 threads share an H100/H200 SM,
    and as many as an A100's 164 KiB of shared memory holds (6)."""
    fns = _entries(_code("poet", arch))
    for kernel, f in fns.items():
        assert f.max_threads == cupy_ops.block_of(kernel)[0], kernel
    gpu = GPU_OF[arch]
    by_smem = gpu.smem // (cupy_ops.mma_shared_bytes() + gpu.smem_reserved)
    for kernel in ("poet_bd_mma_bf16", "poet_bd_mma_f16"):
        f = fns[kernel]
        assert f.min_blocks == cupy_ops.MMA_MIN_BLOCKS and f.smem == cupy_ops.mma_shared_bytes(), kernel
        assert f.registers <= gpu.registers // (cupy_ops.MMA_MIN_BLOCKS * cupy_ops.MMA_THREADS), kernel
        blocks = sass.blocks_per_sm(f.registers, f.smem, cupy_ops.MMA_THREADS, gpu)
        assert blocks == min(cupy_ops.MMA_MIN_BLOCKS, by_smem) >= (8 if arch == "sm_90" else 6), (kernel, blocks)


@pytest.mark.parametrize("arch", ARCHS)
def test_memtest_kernels_fit_every_block_the_check_accepts(arch):
    """memtest sizes its grids from the occupancy API (one wave), for any `block` up to 1024: each
    kernel must fit a block of 1024 threads. With the default block of 256, the check kernels
    hold 4 blocks per SM (1,024 threads, each with MT_UNROLL 16-byte loads in flight: the 64 KB
    per SM benchmarks/RESULTS.md counts on) and the fill and scrub kernels 8 (2,048 threads)."""
    block = MEMTEST_DEFAULTS["block"]
    for fn, f in _entries(_code("memtest", arch)).items():
        assert sass.blocks_per_sm(f.registers, f.smem, MAX_BLOCK) >= 1, (fn, f.registers)
        if fn != "memtest_flip":  # one thread, launched alone
            want = 4 if fn.startswith("memtest_check_") else 8
            assert sass.blocks_per_sm(f.registers, f.smem, block) >= want, (fn, f.registers, f.smem)


# ---- tests/ptxas.py --------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_ptxas_report_keeps_every_kernels_own_figures(arch):
    """Every entry of memtest.cu with its own figures: memtest_flip (no shared memory; its block in
    the log comes first) has none, the check kernels have their mt_block (128 + 6 words), and
    mt_error (a non-inlined device function, no "Used" line) is no kernel. The regex this parser
    replaced read memtest_flip's smem from the next kernel's line and lost the kernels in between."""
    _require_tools()
    text = kernels.source("memtest")
    rep = ptxas.report(text, "memtest", arch)
    entries = set(re.findall(r"\.entry (\w+)", nvrtc.compile_ptx(text, "memtest", arch, ("--std=c++17",))))
    assert set(rep) == entries and len(entries) == 10
    mt_block = 4 * (128 + 6)
    for fn, r in rep.items():
        assert r["smem"] == (mt_block if fn.startswith("memtest_check_") else 0), (fn, r)
        assert r["spill_stores"] == r["spill_loads"] == 0 and r["registers"] > 0, (fn, r)
    assert rep["memtest_flip"]["registers"] < rep["memtest_check_pair"]["registers"]
