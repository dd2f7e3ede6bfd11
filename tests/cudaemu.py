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

The emulation is as strict as a GPU where tests/cudaemu.h says so: every launch runs with
misaligned accesses faulting, shared memory poisoned before each block, the blocks in a shuffled
order and the GPU's flush to zero. A launcher call whose kernel faulted raises KernelFault (an
AssertionError: a test failure) with the emulator's message when it returns. The block order
comes from GPUCHECK_EMU_SEED: unset, this module sets a random seed for the session (the
processes it starts inherit it); tests/conftest.py prints it in the header and with every failed
test that launched an emulated kernel, and GPUCHECK_EMU_SEED=<that seed> runs the same orders.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpucheck.kernels import source

HEADER = Path(__file__).resolve().parent / "cudaemu.h"
CACHE = Path(tempfile.gettempdir()) / f"gpucheck-cudaemu-{os.getuid()}"
SEED_ENV = "GPUCHECK_EMU_SEED"
# What CuPy's RawModule appends to the options gpucheck gives it (cupy.cuda.compiler
# ._compile_with_cache_cuda, CuPy 13 and 14); NVRTC honours the last -ftz.
CUPY_APPENDED_OPTIONS: tuple[str, ...] = ("-ftz=true",)
# Compiled with UBSan's alignment check (its handler is cudaemu.h's, so no libubsan is linked).
CFLAGS: tuple[str, ...] = ("-std=c++20", "-O1", "-fPIC", "-pthread", "-w", "-fsanitize=alignment")
LAUNCHES = 0  # launcher calls so far (tests/conftest.py: did a failed test run emulated kernels)


class KernelFault(AssertionError):
    """An emulated kernel did what faults on a GPU (a misaligned address), or what the emulator
    refuses to guess (a partial warp mask)."""


def block_order_seed() -> str:
    """GPUCHECK_EMU_SEED: the seed every launch shuffles its blocks with ("grid": grid order).
    Set to a random one the first time it is asked for when unset; ValueError when malformed."""
    value = os.environ.get(SEED_ENV, "").strip()
    if not value:
        value = f"{random.SystemRandom().getrandbits(32):#x}"
        os.environ[SEED_ENV] = value
    if value != "grid":
        try:
            int(value, 0)
        except ValueError:
            raise ValueError(f"{SEED_ENV}={value!r}: a number (0x... for hex) or 'grid'") from None
    return value


def gpu_flushes_subnormals(options: tuple[str, ...] | None = None) -> bool:
    """Whether kernels compiled by CuPy with `options` (default: gpucheck's) flush fp32 subnormals
    to zero: the last -ftz=... of the options and what CuPy appends (--use_fast_math implies
    -ftz=true; NVRTC's default is false)."""
    if options is None:
        from gpucheck.kernels.cupy_module import OPTIONS

        options = OPTIONS
    ftz = False
    for opt in tuple(options) + CUPY_APPENDED_OPTIONS:
        m = re.fullmatch(r"--?ftz=(true|false)", opt)
        if m:
            ftz = m.group(1) == "true"
        elif opt in ("--use_fast_math", "-use_fast_math"):
            ftz = True
    return ftz


def usable() -> str | None:
    """None when g++ can build emulated kernels here, else why not."""
    return None if shutil.which("g++") else "g++ not installed (apt-get install g++)"


def build(name: str, driver: str, *, ftz: bool | None = None) -> ctypes.CDLL:
    """The emulated kernels of gpucheck/kernels/<name>.cu with `driver`'s launchers."""
    return build_text(name, source(name), driver, ftz=ftz)


def build_text(name: str, kernel_text: str, driver: str, *, ftz: bool | None = None) -> ctypes.CDLL:
    """Like build(), for kernel text given directly (it must start with the prelude). `ftz`: fp32
    flush to zero as on the GPU (default: gpu_flushes_subnormals(), true for gpucheck's options);
    False only for tests that show what the flush changes."""
    ftz = gpu_flushes_subnormals() if ftz is None else ftz
    block_order_seed()  # a malformed seed fails here, not in every launch
    text = '#include "%s"\n%s\n// ---- driver ----\n%s\n' % (HEADER, register_shared(kernel_text), driver)
    flags = CFLAGS + (f"-DGC_EMU_FTZ={int(ftz)}",)
    digest = hashlib.sha256((text + HEADER.read_text() + " ".join(flags)).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    lib = CACHE / f"{name}-{digest}.so"
    src = CACHE / f"{name}-{digest}.cpp"
    if not lib.exists() or not src.exists():
        src.write_text(text)
        _compile(name, src, lib, flags)
    return EmuLibrary(str(lib), src)


def _compile(name: str, src: Path, lib: Path, flags: tuple[str, ...]) -> None:
    """g++ in two steps: compiled with -fsanitize=alignment, linked without libubsan (cudaemu.h
    defines the handler), refusing undefined symbols."""
    obj = lib.with_suffix(f".{os.getpid()}.o")
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    steps = (["g++", *flags, "-c", str(src), "-o", str(obj)],
             ["g++", "-shared", "-pthread", "-Wl,--no-undefined", str(obj), "-o", str(tmp)])
    try:
        for cmd in steps:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"g++ failed on the emulated {name} kernels:\n{proc.stderr[-6000:]}")
        os.replace(tmp, lib)
    finally:
        obj.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


class EmuLibrary(ctypes.CDLL):
    """A loaded emulation: every `emu_*` function (a launcher) raises KernelFault when it returns
    with a fault kept (cudaemu.h: emu_fault_take)."""

    def __init__(self, path: str, cpp: Path):
        super().__init__(path)
        self._cpp = cpp
        take = super().__getitem__("emu_fault_take")
        take.argtypes = [ctypes.c_char_p, ctypes.c_ulong]
        take.restype = ctypes.c_int
        self._take = take

    def __getitem__(self, name):
        fn = super().__getitem__(name)
        if isinstance(name, str) and name.startswith("emu_") and name != "emu_fault_take":
            fn.errcheck = self._check
        return fn

    def _check(self, result, func, args):
        global LAUNCHES
        LAUNCHES += 1
        buf = ctypes.create_string_buffer(8192)
        if self._take(buf, len(buf)):
            raise KernelFault(f"{func.__name__}: {self._with_source_line(buf.value.decode(errors='replace'))}")
        return result

    def _with_source_line(self, message: str) -> str:
        """The message, plus the source line it names (`(<file>.cpp:<line>)`, the compiled text):
        as a line of the kernel file (gpucheck.kernels.source marks where it starts) or of the text
        built."""
        m = re.search(r"\((/[^():]+\.cpp):(\d+)\)", message)
        if not m:
            return message
        try:
            lines = Path(m.group(1)).read_text().splitlines()
            n = int(m.group(2))
            text = lines[n - 1].strip()
        except (OSError, IndexError, ValueError):
            return message
        where = f"line {n - 1} of the kernel text"  # line 1 of the .cpp includes cudaemu.h
        for i in range(n - 1, 0, -1):
            mark = re.fullmatch(r"// ---- (\S+) ----", lines[i - 1].strip())
            if mark:
                where = f"{mark.group(1)} line {n - i}"
                break
        return f"{message}\n    at {where}: {text}"


# ---- __shared__ registration (cudaemu.h: "Shared memory holds junk") ------------------------------
_COMMENT_OR_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
_SHARED_DECL = re.compile(r"__shared__\s+(?P<type>(?:__align__\s*\([^()]*\)\s*)?[A-Za-z_][\w:<>, *&]*?)\s*"
                          r"\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\[\];]+\]\s*)*);")


def _code_only(text: str) -> str:
    """`text` with every comment blanked (same length, newlines kept), strings kept."""
    def blank(m: re.Match) -> str:
        s = m.group(0)
        return s if s[0] in "\"'" else re.sub(r"[^\n]", " ", s)

    return _COMMENT_OR_STRING.sub(blank, text)


def _registrable(code: str, at: int, decl: re.Match) -> bool:
    """Whether the __shared__ at `at` declares one variable of static size, outside a macro."""
    start = code.rfind("\n", 0, at) + 1
    before = code[max(0, start - 2):start].rstrip("\n")
    line = code[start:at]
    return (not before.endswith("\\") and not line.lstrip().startswith("#")
            and "extern" not in line.split() and "," not in re.sub(r"<[^<>]*>", "", decl.group("type"))
            and not code[at:decl.end()].rstrip(";").rstrip().endswith("\\"))


def register_shared(text: str) -> str:
    """`text` with `EMU_SHARED(name);` after every `__shared__ T name[...];` declaration.
    ValueError for a __shared__ the emulator cannot register (extern, several names or an
    initializer in one declaration, inside a macro)."""
    code = _code_only(text)
    out, pos = [], 0
    for m in re.finditer(r"\b__shared__\b", code):
        decl = _SHARED_DECL.match(code, m.start())
        if decl is None or not _registrable(code, m.start(), decl):
            end = code.find("\n", m.start())
            line = code[code.rfind("\n", 0, m.start()) + 1:len(code) if end < 0 else end]
            raise ValueError(f"cudaemu cannot register this __shared__ declaration (one variable of static "
                             f"size per declaration, no initializer, not in a macro, alignment as __align__(n)): "
                             f"{line.strip()!r}")
        out.append(text[pos:decl.end()])
        out.append(f" EMU_SHARED({decl.group('name')});")
        pos = decl.end()
    out.append(text[pos:])
    return "".join(out)


def ptr(array) -> ctypes.c_void_p:
    """A device-pointer stand-in for a NumPy array or a torch tensor (contiguous)."""
    if hasattr(array, "data_ptr"):
        return ctypes.c_void_p(array.data_ptr())
    return ctypes.c_void_p(array.ctypes.data)
