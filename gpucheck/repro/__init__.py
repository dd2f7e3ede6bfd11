"""Bitwise reproducibility: reference workloads, their digests, and comparisons.

Every machine runs the same reference workloads (a GEMM suite, one training step of a small
transformer decoder) on the same inputs, generated from fixed seeds; a SHA-256 digest of the
outputs is compared with a recorded reference for the same software and hardware fingerprint,
with the node's other GPUs (majority) and with a second run on the same GPU. A GPU whose bits
differ is suspected of silent data corruption (ByteRobust's "bitwise alignment test").

    workloads    the versioned workloads, their inputs and the digest (torch passed in, never
                 imported at module import)
    worker       the worker-pool target: runs the selected workloads twice on one device
    fingerprint  what the bits depend on (GPU model, driver, CUDA, torch, cuBLAS, ... or the CPU
                 and its math libraries), and its key
    store        the reference file (JSON, schema'd): load, validate, record, permission checks
    majority     pure majority votes: within a node, and across a fleet (fleet_outliers)
    judge        turns the workers' digests into per-GPU results and record decisions

Nothing in this package imports torch at import time; `majority`, `store` and `fingerprint`
import nothing heavy at all, so the fleet sweep can use them anywhere.
"""

# The reference file a check reads when none is named (`reference` parameter of repro.bitwise).
DEFAULT_REFERENCE_PATH = "/etc/gpucheck/repro-refs.json"
