"""The machine code of gpucheck's kernels, without a GPU (tests and benchmarks).

    fns = compile_source("poet", "sm_90")
    f = fns["poet_bd_mma_bf16"]
    f.registers, f.smem, f.count("HMMA"), f.count("LDSM"), f.sass

The pipeline is the production one up to the cubin: NVRTC (tests/nvrtc.py, the `nvidia-cuda-nvrtc`
wheel) compiles `gpucheck.kernels.source(name)` with the options CuPy's RawModule compiles it with
(CUPY_NVRTC_OPTIONS) to PTX; ptxas (wheel `nvidia-cuda-nvcc`) assembles the PTX for a real
architecture into a cubin, with its --verbose resource report; nvdisasm (wheel
`nvidia-cuda-nvdisasm`) prints the cubin's SASS. Per function, from three independent readings:
ptxas's report (registers, spills, stack frame, static shared memory), the cubin's ELF (the
EIATTR_REGCOUNT and EIATTR_FRAME_SIZE records of `.nv.info`, the size of `.nv.shared.<function>`)
and the SASS (instruction counts by opcode, local-memory instructions LDL/STL). `launch_bounds`
comes from the PTX (`.maxntid`, `.minnctapersm`: what `__launch_bounds__` declared).

`find_tool(name)` says where ptxas or nvdisasm is (the wheels' `nvidia/cu*/bin`, then
$CUDA_HOME/bin and /usr/local/cuda/bin), or None; `compile_source` raises ToolMissing without one.
"""

from __future__ import annotations

import collections
import functools
import glob
import os
import re
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cupy_options
import nvrtc
import ptxas

from gpucheck import kernels

# What cupy.RawModule(code=..., options=OPTIONS) hands NVRTC, read from the installed CuPy's own
# compile path (tests/cupy_options.py), without the include paths and the -arch: one definition of
# CuPy's options for every test.
CUPY_NVRTC_OPTIONS: tuple[str, ...] = cupy_options.CUPY_CODEGEN_OPTIONS

TOOLS = ("ptxas", "nvdisasm")
# .nv.info attribute records (format byte 0x04: a 16-bit size and that many bytes follow): the
# payload of these is (symbol index, value), both 32-bit.
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", re.M)
_SECTION = re.compile(r"^\s*\.section\s+\.text\.(\w+),", re.M)


class ToolMissing(FileNotFoundError):
    pass


def find_tool(name: str) -> str | None:
    """The path of `name` (ptxas, nvdisasm) from the CUDA wheels on sys.path or a toolkit."""
    candidates: list[str] = []
    for root in sys.path:
        candidates += sorted(glob.glob(os.path.join(root or ".", "nvidia", "cu*", "bin", name)))
        candidates += sorted(glob.glob(os.path.join(root or ".", "nvidia", "cuda_nvcc", "bin", name)))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", name))
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


@dataclass(frozen=True)
class Function:
    """One function of a cubin. The figures named elf_* come from the cubin, the others from
    ptxas's report; registers and smem are None for a non-entry function (ptxas reports its
    frame and spills only)."""

    name: str
    arch: str
    registers: int | None
    spill_stores: int
    spill_loads: int
    stack_frame: int
    smem: int | None
    elf_registers: int | None
    elf_frame: int | None
    elf_smem: int
    max_threads: int | None  # __launch_bounds__'s first argument (.maxntid), None without
    min_blocks: int | None   # its second (.minnctapersm), None without
    sass: str
    opcodes: dict[str, int]  # full mnemonic (with modifiers) -> instructions

    def count(self, op: str) -> int:
        """Instructions whose mnemonic is `op` or starts with `op.` ("LDG" counts LDG.E.128)."""
        return sum(n for mnemonic, n in self.opcodes.items() if mnemonic == op or mnemonic.startswith(op + "."))

    def local_memory_instructions(self) -> int:
        return self.count("LDL") + self.count("STL")


def _elf_sections(blob: bytes) -> dict[str, tuple[int, int, int, int]]:
    """{section name: (type, offset, size, link)} of an ELF64 little-endian file."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise ValueError("not a little-endian ELF64 cubin")
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQII", blob, shoff + i * shentsize) for i in range(shnum)]
    names_off = headers[shstrndx][4]

    def name(off: int) -> str:
        return blob[names_off + off:blob.index(b"\0", names_off + off)].decode()

    return {name(h[0]): (h[1], h[4], h[5], h[6]) for h in headers}


def _elf_symbols(blob: bytes, sections: dict[str, tuple[int, int, int, int]]) -> list[str]:
    """Symbol names of .symtab by index."""
    _, off, size, _ = sections[".symtab"]
    _, str_off, _, _ = sections[".strtab"]
    names = []
    for i in range(size // 24):
        st_name, = struct.unpack_from("<I", blob, off + 24 * i)
        names.append(blob[str_off + st_name:blob.index(b"\0", str_off + st_name)].decode())
    return names


def read_cubin(blob: bytes) -> dict[str, dict[str, int]]:
    """{function: {registers, frame, smem}} from a cubin's ELF: EIATTR_REGCOUNT and
    EIATTR_FRAME_SIZE of the global .nv.info section, the size of .nv.shared.<function> (0
    without one). Only functions with a .text section."""
    sections = _elf_sections(blob)
    symbols = _elf_symbols(blob, sections)
    out = {name[len(".text."):]: {"smem": 0} for name in sections if name.startswith(".text.")}
    for fn, r in out.items():
        if f".nv.shared.{fn}" in sections:
            r["smem"] = sections[f".nv.shared.{fn}"][2]
    _, off, size, _ = sections.get(".nv.info", (0, 0, 0, 0))
    pos, end = off, off + size
    while pos < end:
        fmt, attr = blob[pos], blob[pos + 1]
        if fmt == 0x04:  # EIFMT_SVAL: a 16-bit size, then the payload
            length, = struct.unpack_from("<H", blob, pos + 2)
            if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and length == 8:
                sym, value = struct.unpack_from("<II", blob, pos + 4)
                key = "registers" if attr == _EIATTR_REGCOUNT else "frame"
                out.setdefault(symbols[sym], {"smem": 0})[key] = value
            pos += 4 + length
        else:  # EIFMT_NVAL / BVAL / HVAL: the value (if any) fits in the 4-byte record
            pos += 4
    return out


def split_sass(text: str) -> dict[str, str]:
    """{function: its SASS} from nvdisasm's output (one .text.<function> section each)."""
    starts = list(_SECTION.finditer(text))
    return {m.group(1): text[m.start():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
            for i, m in enumerate(starts)}


def opcodes(sass_text: str) -> dict[str, int]:
    """Instruction counts by mnemonic (the predicate guard dropped, modifiers kept)."""
    return dict(collections.Counter(_INSTRUCTION.findall(sass_text)))


def launch_bounds(ptx: str) -> dict[str, tuple[int | None, int | None]]:
    """{entry: (.maxntid x, .minnctapersm)} from PTX (None where the directive is absent)."""
    out: dict[str, tuple[int | None, int | None]] = {}
    for m in re.finditer(r"\.entry (\w+)\((.*?)\)\s*([^{]*)\{", ptx, re.S):
        directives = m.group(3)
        ntid = re.search(r"\.maxntid (\d+)", directives)
        blocks = re.search(r"\.minnctapersm (\d+)", directives)
        out[m.group(1)] = (int(ntid.group(1)) if ntid else None, int(blocks.group(1)) if blocks else None)
    return out


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise nvrtc.CompileError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def _tools() -> tuple[str, str]:
    found = {t: find_tool(t) for t in TOOLS}
    missing = [t for t, p in found.items() if p is None]
    if missing:
        raise ToolMissing(f"{', '.join(missing)} not found (pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm)")
    return found["ptxas"], found["nvdisasm"]  # type: ignore[return-value]


@functools.lru_cache(maxsize=None)
def compile_text(text: str, name: str, arch: str, options: tuple[str, ...] = CUPY_NVRTC_OPTIONS) -> dict[str, Function]:
    """Every function of `text` compiled for `arch` ("sm_90"): NVRTC -> PTX -> ptxas -> nvdisasm."""
    ptxas_path, nvdisasm_path = _tools()
    ptx = nvrtc.compile_ptx(text, name, arch, options)
    with tempfile.TemporaryDirectory(prefix="gpucheck-sass-") as tmp:
        src, cubin = Path(tmp, f"{name}.ptx"), Path(tmp, f"{name}.cubin")
        src.write_text(ptx)
        log = _run([ptxas_path, f"-arch={arch}", "-v", "-o", str(cubin), str(src)], f"ptxas {name} {arch}")
        disasm = _run([nvdisasm_path, "-c", str(cubin)], f"nvdisasm {name} {arch}")
        elf = read_cubin(cubin.read_bytes())
    report, bounds, code = ptxas.parse(log), launch_bounds(ptx), split_sass(disasm)
    return {fn: _function(fn, arch, report.get(fn, {}), elf.get(fn, {}), bounds.get(fn, (None, None)), code[fn])
            for fn in code}


def _function(fn: str, arch: str, rep: dict[str, int], elf: dict[str, int], bounds: tuple[int | None, int | None],
              sass_text: str) -> Function:
    return Function(name=fn, arch=arch, registers=rep.get("registers"), spill_stores=rep.get("spill_stores", 0),
                    spill_loads=rep.get("spill_loads", 0), stack_frame=rep.get("stack_frame", 0),
                    smem=rep.get("smem"), elf_registers=elf.get("registers"), elf_frame=elf.get("frame"),
                    elf_smem=elf.get("smem", 0), max_threads=bounds[0], min_blocks=bounds[1], sass=sass_text,
                    opcodes=opcodes(sass_text))


def compile_source(name: str, arch: str) -> dict[str, Function]:
    """compile_text of gpucheck.kernels.source(name), the text CuPy compiles."""
    return compile_text(kernels.source(name), name, arch)


# ---- occupancy: what the CUDA occupancy calculator answers for a compiled kernel ------------------
@dataclass(frozen=True)
class SM:
    """Per-SM limits of a GPU generation (CUDA C++ Programming Guide, "Compute Capabilities")."""

    registers: int = 65536
    smem: int = 233472           # 228 KiB (H100/H200); an A100 has 167936 (164 KiB)
    smem_reserved: int = 1024    # shared memory the system reserves per block (sm_80 and later)
    max_blocks: int = 32
    max_threads: int = 2048
    reg_unit: int = 256          # registers are allocated per warp in units of 256
    smem_unit: int = 128         # shared memory is allocated per block in units of 128 bytes


HOPPER = SM()
AMPERE = SM(smem=167936)


def blocks_per_sm(registers: int, smem: int, threads: int, sm: SM = HOPPER) -> int:
    """Resident blocks of `threads` threads per SM for a kernel with these registers per thread
    and static shared memory: the minimum over registers (allocated per warp, rounded up to
    sm.reg_unit), shared memory (+ the per-block reservation), threads and blocks."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // sm.reg_unit) * sm.reg_unit
    by_regs = (sm.registers // per_warp) // warps if per_warp else sm.max_blocks
    by_smem = sm.smem // (-(-(smem + sm.smem_reserved) // sm.smem_unit) * sm.smem_unit)
    return min(by_regs, by_smem, sm.max_blocks, sm.max_threads // threads)
