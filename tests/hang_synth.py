"""Synthetic jobs built from recorded py-spy dumps (tests/fixtures/hang/, recorded from
tests/hang_train.py: a gloo job of 4 ranks where rank 2 hung in load_batch and the others waited
in all_reduce), for the analysis tests and benchmarks/bench_hang.py.

Every rank gets its node's own install paths (site-packages under /opt/venv<k>, the job script
under /jobs/<k>) and its own line numbers, and some ranks carry extra background threads, so the
analysis must normalize to group them. Outliers take another recorded or hand-written stack.
"""

from __future__ import annotations

import copy
from pathlib import Path

from gpucheck.hang.pyspy import parse_dump

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hang"
RECORDED_PREFIX = "/root/.pyenv/versions/3.11.7/lib/python3.11"
RECORDED_JOB = "/work/wt-hang/tests/"


def recorded(name: str) -> list[dict]:
    text = (FIXTURES / name).read_text()
    threads = parse_dump(text, pid=-1)
    return [t.to_dict() for t in threads]


ALL_REDUCE = recorded("pyspy-allreduce.json")
LOAD_BATCH = recorded("pyspy-load-batch.json")
LOCK_WAIT = [{"name": "MainThread", "tid": 1, "main": True, "active": False, "frames": [
    {"function": "Condition.wait", "file": f"{RECORDED_PREFIX}/threading.py", "line": 320},
    {"function": "save_checkpoint", "file": f"{RECORDED_PREFIX}/site-packages/megatron/training/checkpointing.py",
     "line": 410},
    {"function": "main", "file": f"{RECORDED_JOB}hang_train.py", "line": 66},
    {"function": "<module>", "file": f"{RECORDED_JOB}hang_train.py", "line": 72}]}]
PIN_MEMORY = {"name": "pin_memory", "tid": 9, "main": False, "active": False, "frames": [
    {"function": "_pin_memory_loop", "file": f"{RECORDED_PREFIX}/site-packages/torch/utils/data/_utils/pin_memory.py",
     "line": 52},
    {"function": "Thread.run", "file": f"{RECORDED_PREFIX}/threading.py", "line": 982}]}
STACKS = {"all_reduce": ALL_REDUCE, "load_batch": LOAD_BATCH, "lock": LOCK_WAIT}


def relocate(threads: list[dict], k: int, jitter: int) -> list[dict]:
    """The same stacks as seen on another node: other install paths, other line numbers."""
    out = copy.deepcopy(threads)
    for t in out:
        for f in t["frames"]:
            f["file"] = f["file"].replace(RECORDED_PREFIX, f"/opt/venv{k}/lib/python3.11").replace(
                RECORDED_JOB, f"/jobs/{k}/")
            if f["line"] is not None:
                f["line"] += jitter
    return out


def synthetic_job(world: int = 1024, per_node: int = 8, outliers: dict[int, str] | None = None,
                  world_size: int | None = -1) -> list[dict]:
    """`world` rank dicts (the analysis's input) on nodes n0001, n0002, ...: every rank waits in
    all_reduce except the `outliers` {rank: "load_batch" | "lock"}."""
    outliers = outliers or {}
    ranks = []
    for rank in range(world):
        node = rank // per_node
        threads = relocate(STACKS[outliers.get(rank, "all_reduce")], node % 3, rank % 5)
        if rank % 3 == 0:
            extra = relocate([PIN_MEMORY], node % 3, rank % 7)
            threads.append(extra[0])
        ranks.append({"rank": rank, "node": f"n{node + 1:04d}", "pid": 1000 + rank % per_node, "status": "dumped",
                      "error": None, "world_size": world if world_size == -1 else world_size,
                      "local_rank": rank % per_node, "threads": threads, "flight": None})
    return ranks
