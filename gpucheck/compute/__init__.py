"""Compute kernels that run inside worker processes (gpucheck.workers). Each module imports its
backend (torch, CuPy) lazily, inside the worker, never at import time."""
