"""Bandwidth arithmetic, as nccl-tests defines it, so that gpucheck's numbers compare with theirs.

Pure functions: no torch, no I/O.

- ``size`` (S) is the per-rank buffer of the operation in bytes: the all-reduce buffer, the
  all-gather *output* (n chunks of S/n), the all-to-all send buffer (n chunks of S/n). This is
  the "size" column of nccl-tests.
- ``algbw = S / t`` in GB/s (10^9 bytes per second, as nccl-tests prints).
- ``busbw = algbw * factor(op, n)``: 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
  reduce-scatter and all-to-all, 1 for broadcast. busbw is the number to compare with a link's
  peak bandwidth and it does not depend on the number of ranks.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "all_to_all", "reduce_scatter", "broadcast")
# Ops gpucheck runs (reduce_scatter and broadcast have formulas for completeness of the table).
RUN_OPS: tuple[str, ...] = ("all_reduce", "all_gather", "all_to_all")

_ALIASES = {
    "allreduce": "all_reduce", "all-reduce": "all_reduce", "ar": "all_reduce",
    "allgather": "all_gather", "all-gather": "all_gather", "ag": "all_gather",
    "alltoall": "all_to_all", "all-to-all": "all_to_all", "a2a": "all_to_all",
    "reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter", "rs": "reduce_scatter",
}

ELEMENT_BYTES = 4  # float32, as nccl-tests' default type


def normalize_op(name: str) -> str:
    s = name.strip().lower()
    s = _ALIASES.get(s, s)
    if s not in OPS:
        raise ValueError(f"unknown collective {name!r} (use one of {', '.join(RUN_OPS)})")
    return s


def parse_ops(text: str | Iterable[str]) -> list[str]:
    parts = text.split(",") if isinstance(text, str) else list(text)
    ops: list[str] = []
    for p in parts:
        if not str(p).strip():
            continue
        op = normalize_op(str(p))
        if op not in RUN_OPS:
            raise ValueError(f"collective {op!r} is not run by gpucheck (use {', '.join(RUN_OPS)})")
        if op not in ops:
            ops.append(op)
    if not ops:
        raise ValueError("no collective named")
    return ops


def busbw_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth correction factor for `op` on `nranks` ranks."""
    op = normalize_op(op)
    n = int(nranks)
    if n < 1:
        raise ValueError("nranks must be >= 1")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algbw_gbs(size_bytes: int, seconds: float) -> float | None:
    """Algorithm bandwidth in GB/s (1e9 B/s); None when the time is not positive."""
    if seconds is None or seconds <= 0:
        return None
    return size_bytes / seconds / 1e9


def busbw_gbs(op: str, nranks: int, size_bytes: int, seconds: float) -> float | None:
    a = algbw_gbs(size_bytes, seconds)
    return None if a is None else a * busbw_factor(op, nranks)


def median(values: Sequence[float]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    m = len(vals) // 2
    return vals[m] if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2.0


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


MAX_SIZE_BYTES = 1 << 40  # 1 TiB: far above any GPU's memory, and no float rounding below it


def parse_size(text: str) -> int:
    """'64K', '1M', '1MiB', '1G', '4096' -> bytes (binary multiples, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad size {text!r} (want e.g. 64K, 1M, 1G)")
    v = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(v) or v < 1 or v > MAX_SIZE_BYTES or v != int(v):
        shown = text if len(str(text)) <= 30 else f"{str(text)[:20]}... ({len(str(text))} characters)"
        raise ValueError(f"bad size {shown!r}: must be a whole number of bytes from 1 to 1024G")
    return int(v)


def parse_sizes(text: str) -> list[int]:
    """A comma list of sizes and ranges: '1M,4M' or '1M-64M' (doubling, like nccl-tests -f 2)."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if dash:
            a, b = parse_size(lo), parse_size(hi)
            if a > b:
                raise ValueError(f"bad size range {part!r}: start is above the end")
            s = a
            while s <= b:
                out.append(s)
                s *= 2
        else:
            out.append(parse_size(part))
    if not out:
        raise ValueError("no size given")
    return sorted(set(out))


def align_size(size_bytes: int, nranks: int) -> int:
    """Round a size down to whole float32 elements divisible by the rank count (the all-gather
    and all-to-all chunks must be equal), never below one element per rank."""
    unit = ELEMENT_BYTES * max(1, int(nranks))
    return max(unit, (int(size_bytes) // unit) * unit)


def format_size(n: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return f"{n} B"
