"""Worker target for the bitwise reproducibility test (gpucheck.workers.pool).

`repro_worker(args, chan)` runs in its own process on one GPU (or as one CPU worker): it sets
CUBLAS_WORKSPACE_CONFIG before torch touches cuBLAS, selects the device, applies the
determinism settings, and runs each selected workload twice from scratch (run 1 then run 2,
workload after workload), digesting the outputs of every run. It returns plain data:

    {
      "fingerprint": {...}, "key": "<sha256>",     # gpucheck.repro.fingerprint
      "preset": "gpu" | "cpu",
      "workloads": ["gemm.bf16", ...],             # what was asked, in order
      "runs": [{"gemm.bf16": {"digest": hex, "parts": {label: hex16}, "outputs": n,
                              "bytes": b, "seconds": s}, ...},      # run 1
               {...}],                                              # run 2
      "settings": {...},                           # determinism settings in force
      "injected": ["..."],                         # faults injected by request
      "seconds": total,
      "stopped": reason                            # only when asked to stop early
    }

or {"setup_error": "..."} when the device cannot be used (no CUDA in torch, no such GPU).

args: workloads (list), preset ("gpu"/"cpu"), driver (the NVML driver version, optional),
bitflip (optional): {"workload": name, "output": index, "element": index or None, "bit": int,
"runs": [1, 2]}: flip that bit of that output before it is digested, in those runs.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, TypedDict

from .workloads import (CUBLAS_WORKSPACE_CONFIG, PRESET_DEFS, WorkloadError, determinism, digest, flip_bit,
                        run_workload, select_workloads)

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import DeterminismSettings, Fingerprint, ReproDigest, ReproResult, SetupError

PART_HEX = 16  # characters of each output's part digest returned (enough to name the output)


class ReproBitflip(TypedDict):
    """The bitflip injection: flip `bit` of element `element` (None: a default one) of output
    `output` of `workload` before it is digested, in the runs `runs`."""

    workload: str
    output: int
    element: int | None
    bit: int
    runs: list[int]


class _ReproArgsOptional(TypedDict, total=False):
    preset: str  # "gpu" or "cpu" (default: the device's)
    driver: str | None  # the NVML driver version, for the fingerprint
    bitflip: ReproBitflip


class ReproArgs(_ReproArgsOptional):
    """repro_worker's arguments."""

    workloads: list[str]


def repro_worker(args: ReproArgs, chan: Any) -> "ReproResult | SetupError":
    from ..workers.pool import torch_and_device

    # Read by cuBLAS when it creates its handle (the first GEMM): before any CUDA work.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
    preset = PRESET_DEFS[str(args.get("preset", "cpu" if chan.device == "cpu" else "gpu"))]
    workloads, _ = select_workloads(list(args.get("workloads") or ["all"]), preset.name)
    torch, dev, setup_error = torch_and_device(chan)
    if setup_error:
        return setup_error
    return run_all(torch, dev, chan, workloads, preset.name, args)


def run_all(torch: Any, dev: Any, chan: Any, workloads: list[str], preset_name: str,
            args: ReproArgs) -> "ReproResult":
    """The two runs of every workload on `dev` (the worker's body; callable in-process)."""
    with determinism(torch) as settings:
        settings["cublas_workspace_config"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        return _run_all(torch, dev, chan, workloads, preset_name, args, settings)


def _run_all(torch: Any, dev: Any, chan: Any, workloads: list[str], preset_name: str,
             args: ReproArgs, settings: "DeterminismSettings") -> "ReproResult":
    from . import fingerprint as fpm

    preset = PRESET_DEFS[preset_name]
    t_start = time.monotonic()
    flip = args.get("bitflip")
    injected: list[str] = []
    runs: list[dict[str, ReproDigest]] = [{}, {}]
    stopped = None

    def beat() -> None:
        chan.heartbeat()

    for w in workloads:
        for r in (0, 1):
            if chan.should_stop():
                stopped = chan.stop_reason or "stop"
                break
            chan.progress({"workload": w, "run": r + 1})
            t0 = time.monotonic()
            outputs = run_workload(torch, dev, w, preset, beat)
            if flip and flip.get("workload") == w and (r + 1) in flip.get("runs", [1, 2]):
                oi = int(flip.get("output", 0))
                if not 0 <= oi < len(outputs):
                    raise WorkloadError(f"bitflip output {oi} out of range ({w} has {len(outputs)} outputs)")
                label, t = outputs[oi]
                idx, bit = flip_bit(torch, t, flip.get("element"), int(flip.get("bit", 0)))
                injected.append(f"bitflip: bit {bit} of element {idx} of output {label!r} of {w}, run {r + 1}")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            hexd, parts, nbytes = digest(torch, w, outputs)
            del outputs
            runs[r][w] = {
                "digest": hexd,
                "parts": {k: v[:PART_HEX] for k, v in parts.items()},
                "outputs": len(parts),
                "bytes": nbytes,
                "seconds": round(time.monotonic() - t0, 4),
            }
            chan.progress({"workload": w, "run": r + 1, "digest": hexd[:PART_HEX]})
        if stopped:
            break

    fp: Fingerprint
    if dev.type == "cuda":
        fp = fpm.cuda_fingerprint(torch, dev, preset=preset.name, driver=args.get("driver"))
    else:
        fp = fpm.cpu_fingerprint(torch, preset=preset.name)
    out: ReproResult = {
        "fingerprint": fp,
        "key": fpm.fingerprint_key(fp),
        "preset": preset.name,
        "workloads": list(workloads),
        "runs": runs,
        "settings": settings,
        "injected": injected,
        "seconds": round(time.monotonic() - t_start, 4),
    }
    if stopped:
        out["stopped"] = stopped
    return out
