"""ptxas's resource report for a kernel source, through NVRTC (tests and benchmarks; no GPU).

NVRTC compiling for a real architecture (--gpu-architecture=sm_XX) runs ptxas: inline PTX is
assembled, and `--ptxas-options=--verbose` reports, per kernel, its registers, spills and static
shared memory, as nvcc -Xptxas -v would.

    report(kernels.source("poet"), "poet", "sm_90")["poet_bd_mma_bf16"]
    # {"registers": 83, "spill_stores": 0, "spill_loads": 0, "stack_frame": 0, "smem": 40448}

`parse(log)` reads such a report (NVRTC's log or `ptxas -v`'s) one function block at a time: a
block starts at "Compiling entry function 'X'" or "Function properties for X" and every figure
after it, up to the next block, is X's. A kernel without shared memory has no "bytes smem" on its
"Used N registers" line: its smem is 0, never the next kernel's figure.
"""

from __future__ import annotations

import ctypes
import re

import nvrtc

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse(log: str) -> dict[str, dict[str, int]]:
    """{function: {stack_frame, spill_stores, spill_loads[, registers, smem]}} from a ptxas
    --verbose report; registers and smem only for functions with a "Used N registers" line (the
    entry functions; a non-inlined device function reports its frame and spills only)."""
    functions: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in log.splitlines():
        start = _ENTRY.search(line) or _PROPERTIES.search(line)
        if start:
            current = functions.setdefault(start.group(1), {})
            continue
        if current is None:
            continue
        frame = _FRAME.search(line)
        if frame:
            current.update(stack_frame=int(frame.group(1)), spill_stores=int(frame.group(2)),
                           spill_loads=int(frame.group(3)))
        used = _USED.search(line)
        if used:
            smem = _SMEM.search(line)
            current.update(registers=int(used.group(1)), smem=int(smem.group(1)) if smem else 0)
    return functions


def report(text: str, name: str, arch: str, options: tuple[str, ...] = ("--std=c++17",)) -> dict[str, dict[str, int]]:
    """{kernel: {registers, spill_stores, spill_loads, stack_frame, smem}} for every entry
    function; nvrtc.CompileError with the log on failure, FileNotFoundError without libnvrtc."""
    path = nvrtc.find_library()
    if path is None:
        raise FileNotFoundError("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    lib = ctypes.CDLL(path)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), f"{name}.cu".encode(), 0, None, None) != 0:
        raise nvrtc.CompileError("nvrtcCreateProgram failed")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options), b"--ptxas-options=--verbose"]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value or 1)
        lib.nvrtcGetProgramLog(prog, log)
        text_log = log.value.decode(errors="replace")
        if rc != 0:
            raise nvrtc.CompileError(f"{name}.cu for {arch}:\n{text_log}")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return {fn: r for fn, r in parse(text_log).items() if "registers" in r}


def blocks_per_sm(resources: dict[str, int], threads: int, *, regs_per_sm: int = 65536, smem_per_sm: int = 233472,
                  smem_reserved: int = 1024, max_blocks: int = 32, max_threads: int = 2048) -> int:
    """Resident thread blocks per SM of a kernel with these resources (H100/H200, sm_90: 64 Ki
    registers, 228 KiB shared memory of which 1 KiB is reserved per block, 2048 threads, 32
    blocks), ignoring register allocation granularity (a slight overestimate)."""
    by_regs = regs_per_sm // max(1, resources["registers"] * threads)
    by_smem = smem_per_sm // (resources["smem"] + smem_reserved) if resources["smem"] else max_blocks
    return min(by_regs, by_smem, max_blocks, max_threads // threads)
