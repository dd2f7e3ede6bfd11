"""Which devices a compute check starts workers on: shared by every check that uses the pool."""

from __future__ import annotations

from typing import TypedDict

from ..core.check import Context
from ..core.result import Result, Status


class WorkerTarget(TypedDict):
    """A device a compute check starts a worker on."""

    gpu: int  # the NVML index (or the CPU worker's number)
    visible: str | None  # CUDA_VISIBLE_DEVICES that pins the worker to it (its UUID), or None
    name: str | None  # the GPU's model


def worker_targets(ctx: Context, device: str, check_id: str, verb: str = "tested"
                   ) -> tuple[list[WorkerTarget], list[Result]]:
    """The GPUs (or CPU workers) to start workers on, and a skip for each selected GPU that is not
    usable (lost, reset required: the inventory check judges those).

    Each target is {"gpu": index, "visible": UUID (to pin the worker) or None, "name": model or
    None}. On CPU: workers 0..ctx.workers-1, honouring ctx.gpus. On CUDA: the snapshot's GPUs; a
    direct caller without a snapshot gets torch's device count (torch is imported here only then).
    """
    wanted = set(ctx.gpus) if ctx.gpus is not None else None
    if device == "cpu":
        ids = [i for i in range(ctx.workers) if wanted is None or i in wanted]
        return [{"gpu": i, "visible": None, "name": None} for i in ids], []
    if ctx.snapshot is None:
        import torch  # noqa: PLC0415 - no snapshot: ask torch, in this process

        ids = [i for i in range(torch.cuda.device_count()) if wanted is None or i in wanted]
        return [{"gpu": i, "visible": None, "name": None} for i in ids], []
    targets: list[WorkerTarget] = []
    skipped: list[Result] = []
    for e in sorted(ctx.selected_gpu_entries(), key=lambda e: int(e.get("index", 0))):
        idx = int(e["index"])
        state = e.get("state", "ok")
        if state != "ok":
            skipped.append(Result(check_id, Status.SKIP,
                                  f"not {verb}: GPU state is {state} (the inventory check judges it)", gpu=idx))
            continue
        targets.append({"gpu": idx, "visible": e.get("uuid") or str(idx), "name": e.get("name")})
    return targets, skipped
