"""Allocation failures of a worker: gpucheck's own limit, never a hardware verdict.

A worker that cannot allocate what its size asks for (an operand larger than memory, a size whose
byte count overflows, GPU memory taken by another process) has not examined the GPU: its check is
`error` ("could not allocate ..."), exit 3, never `fail`. `allocation_failure` recognises such an
exception (one table of the allocators' own messages); `allocating(what)` turns one into a
`WorkerSetupError` that names what was being allocated, and the pool
(gpucheck.workers.pool._child_main) returns every `WorkerSetupError` and every allocation failure a
target leaves uncaught as the target's `SetupError` data, the one path to a setup error.

A CUDA error that is not about memory size (an illegal address, an ECC error) is not an allocation
failure: it stays a crash, which the check judges.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# Lower-case fragments of the allocators' messages (torch's CPU and CUDA caching allocators,
# CuPy's memory pool, NumPy).
ALLOCATOR_MESSAGES = (
    "out of memory",  # torch.OutOfMemoryError "CUDA out of memory", CuPy "Out of memory allocating"
    "can't allocate memory",  # torch DefaultCPUAllocator
    "storage size calculation overflowed",  # torch: a size whose byte count overflows int64
    "unable to allocate",  # NumPy "Unable to allocate 74.5 GiB for an array ..."
    "cudaerrormemoryallocation",  # CuPy's CUDARuntimeError name for a failed cudaMalloc
)
# Exception types that are allocation failures whatever they say (by name, so that neither torch
# nor CuPy is imported here).
ALLOCATION_TYPES = ("MemoryError", "OverflowError", "OutOfMemoryError")


def allocation_failure(exc: BaseException) -> str | None:
    """Why `exc` is an allocation failure ("<Type>: <message>"), or None when it is something else."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc).strip()
    if names.intersection(ALLOCATION_TYPES) or (
            isinstance(exc, RuntimeError) and any(m in text.lower() for m in ALLOCATOR_MESSAGES)):
        first_line = text.splitlines()[0] if text else ""
        return f"{type(exc).__name__}: {first_line}".rstrip(": ")
    return None


class WorkerSetupError(RuntimeError):
    """The worker could not set up its device (torch without CUDA, no such GPU, an allocation its
    size asks for): not a hardware verdict. Targets may catch it and return it as data; the pool
    returns one a target leaves uncaught as the target's SetupError (gpucheck.workers.pool)."""


@contextmanager
def allocating(what: str) -> Iterator[None]:
    """Run the block; an allocation failure in it becomes a WorkerSetupError
    "could not allocate <what>: <why>" (gpucheck's own limit, not the GPU's fault)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only allocation failures are converted; the rest re-raised
        why = allocation_failure(e)
        if why is None or isinstance(e, WorkerSetupError):
            raise
        raise WorkerSetupError(f"could not allocate {what}: {why}") from None
