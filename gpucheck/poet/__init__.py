"""POET-style orthogonal matmuls as a self-checking stress test (check poet.ortho, docs/poet.md).

bounds (tolerances, pure), ortho (torch reference math and random problems), invariants (one
problem: run and verify), cupy_ops (the CUDA kernels of gpucheck/kernels/poet.cu through CuPy),
worker (the per-GPU worker target). Nothing here imports torch, NumPy or CuPy at import time.
"""
