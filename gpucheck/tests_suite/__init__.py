"""The checks: one module per check id (`ecc.py` is `ecc`, `burn_gemm.py` is `burn.gemm`,
`eud_memtest.py` is `eud.memtest`, ...), each exposing `CHECKS` and importing only the check SDK
(gpucheck.sdk, gpucheck.sdk.workers), its engine (gpucheck.eud, gpucheck.nccl, gpucheck.poet, ...)
and the platform readers or data it judges, never another check. `registry.py` holds the one
table that lists them with their levels.

GPU states: a GPU the snapshot marks lost / reset_required / error is reported by *every* per-GPU
check as a result of that GPU naming the state (fail, or error for a permission problem), not
skipped: a run restricted to one check (`--check ecc`) must not pass a node whose GPU is gone.
"""
