"""A small torch.distributed (gloo) training loop for the `gpucheck hang` tests.

Each rank is its own process, started with RANK and WORLD_SIZE (as torchrun sets them; under srun
SLURM_PROCID and SLURM_NTASKS), MASTER_ADDR and MASTER_PORT in its environment, and steps forever:
load a batch, all_reduce its gradient.

HANG_RANK=R HANG_AFTER=K: rank R stops in load_batch at step K (stuck in data loading) and the
other ranks block in the all_reduce of step K, waiting for it. Every rank prints "step N" after
each step and "hanging" when it stops, flushed, on stdout.

FR_AFTER=S: once no step has finished for S seconds, a thread writes this rank's flight-recorder
dump (TORCH_FR_BUFFER_SIZE is on) to $TORCH_FR_DUMP_TEMP_FILE<rank> (atomically, again every
second), as the NCCL watchdog does on a timeout. Only then: torch 2.13 can deadlock when a dump
runs while the main thread records a collective (the dump holds the GIL and waits for the
recorder's lock; the recorder holds the lock and waits for the GIL to capture the Python stack).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def rank_and_world() -> tuple[int, int]:
    env = os.environ
    return int(env.get("RANK", env.get("SLURM_PROCID", "-1"))), int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "0")))


def load_batch(step: int, rank: int) -> torch.Tensor:
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    if rank == hang_rank and step >= int(os.environ.get("HANG_AFTER", "3")):
        print("hanging", flush=True)
        while True:  # stuck reading data: never reaches the collective
            time.sleep(0.5)
    return torch.full((4096,), float(rank + step))


def train_step(batch: torch.Tensor) -> torch.Tensor:
    grad = batch * 2.0
    dist.all_reduce(grad)
    return grad


LAST_STEP = [time.monotonic()]


def dump_flight_recorder(prefix: str, rank: int, after_s: float) -> None:
    import torch._C._distributed_c10d as c10d

    path = f"{prefix}{rank}"
    while True:
        time.sleep(0.2)
        if time.monotonic() - LAST_STEP[0] < after_s:
            continue
        data = c10d._dump_fr_trace()
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        time.sleep(1.0)


def main() -> int:
    rank, world = rank_and_world()
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=int(os.environ.get("COLLECTIVE_TIMEOUT", "600"))))
    if os.environ.get("FR_AFTER"):
        threading.Thread(target=dump_flight_recorder, name="fr-dump", daemon=True,
                         args=(os.environ["TORCH_FR_DUMP_TEMP_FILE"], rank, float(os.environ["FR_AFTER"]))).start()
    step = 0
    while True:
        train_step(load_batch(step, rank))
        step += 1
        LAST_STEP[0] = time.monotonic()
        print(f"step {step}", flush=True)
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))


if __name__ == "__main__":
    sys.exit(main())
