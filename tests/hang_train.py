"""A small torch.distributed (gloo) training loop for the `gpucheck hang` tests.

Each rank is its own process, started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its
environment (as torchrun or srun would), steps forever: load a batch, all_reduce its gradient.

HANG_RANK=R HANG_AFTER=K: rank R stops in load_batch at step K (stuck in data loading) and the
other ranks block in the all_reduce of step K, waiting for it. Every rank prints "step N" after
each step and "hanging" when it stops, flushed, on stdout.

FR_EVERY=S: a thread writes this rank's flight-recorder dump (TORCH_FR_BUFFER_SIZE is on) to
$TORCH_FR_DUMP_TEMP_FILE<rank> every S seconds (atomically), as the NCCL watchdog does on a timeout.
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


def dump_flight_recorder(prefix: str, rank: int, every_s: float) -> None:
    import torch._C._distributed_c10d as c10d

    path = f"{prefix}{rank}"
    while True:
        data = c10d._dump_fr_trace()
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        time.sleep(every_s)


def main() -> int:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=int(os.environ.get("COLLECTIVE_TIMEOUT", "600"))))
    if os.environ.get("FR_EVERY"):
        threading.Thread(target=dump_flight_recorder, name="fr-dump", daemon=True,
                         args=(os.environ["TORCH_FR_DUMP_TEMP_FILE"], rank, float(os.environ["FR_EVERY"]))).start()
    step = 0
    while True:
        train_step(load_batch(step, rank))
        step += 1
        print(f"step {step}", flush=True)
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))


if __name__ == "__main__":
    sys.exit(main())
