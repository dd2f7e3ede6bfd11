"""poet.cu's kernels under the CPU emulator, for the POET tests: the launchers of every entry
point, and KernelOps whose launches run them (the CuPy backend minus CuPy).

    lib = poet_emu.build()            # g++ once per text (cached by tests/cudaemu.py)
    ops = poet_emu.EmuOps(lib)        # ops.bd / ops.cnp / ops.units as gpucheck.poet.cupy_ops has them
"""

from __future__ import annotations

import ctypes

import torch

import cudaemu
from gpucheck.poet.cupy_ops import KernelOps, block_of

DRIVER = ""
for _suf, _st in (("f32", "float"), ("bf16", "gc_u16"), ("f16", "gc_u16")):
    DRIVER += f"""
extern "C" void emu_poet_bd_apply_{_suf}(EMU_LAUNCH_PARAMS, const {_st}* X, gc_i64 x_rs, gc_i64 x_cs, const {_st}* G,
        {_st}* Y, gc_i64 y_rs, gc_i64 y_cs, const int* in_idx, const int* out_idx, int m, int b, int k, int transpose) {{
    EMU_LAUNCH(poet_bd_apply_{_suf}(X, x_rs, x_cs, G, Y, y_rs, y_cs, in_idx, out_idx, m, b, k, transpose));
}}
extern "C" void emu_poet_cnp_step_{_suf}(EMU_LAUNCH_PARAMS, const float* Q, const float* H, {_st}* out, int b, int k,
        float c, int first) {{
    EMU_LAUNCH(poet_cnp_step_{_suf}(Q, H, out, b, k, c, first));
}}
"""
for _suf in ("bf16", "f16"):
    DRIVER += f"""
extern "C" void emu_poet_bd_mma_{_suf}(EMU_LAUNCH_PARAMS, const gc_u16* X, gc_i64 x_rs, gc_i64 x_cs, const gc_u16* G,
        gc_u16* Y, gc_i64 y_rs, gc_i64 y_cs, const int* in_idx, const int* out_idx, int m, int b, int k, int transpose) {{
    EMU_LAUNCH(poet_bd_mma_{_suf}(X, x_rs, x_cs, G, Y, y_rs, y_cs, in_idx, out_idx, m, b, k, transpose));
}}
"""
_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float}


def build() -> ctypes.CDLL:
    return cudaemu.build("poet", DRIVER)


class EmuOps(KernelOps):
    """KernelOps whose launches run the emulated kernels, synchronously, with the thread block
    each kernel is launched with on the GPU (cupy_ops.block_of). `calls`: (kernel, grid) of every
    launch."""

    name = "emu"

    def __init__(self, lib: ctypes.CDLL):
        super().__init__(torch, torch.device("cpu"))
        self.lib = lib
        self.calls: list[tuple[str, tuple[int, int, int]]] = []

    def _run(self, kernel, grid, args):
        fn = getattr(self.lib, "emu_" + kernel)
        fn.argtypes = [ctypes.c_uint] * 6 + [_CTYPES[k] for k, _ in args]
        fn.restype = None
        vals = [(None if v is None else v.data_ptr()) if k == "ptr" else v for k, v in args]
        self.calls.append((kernel, grid))
        fn(*grid, *block_of(kernel), *vals)
