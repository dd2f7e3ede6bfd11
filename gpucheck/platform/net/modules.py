"""The loaded kernel modules, from /proc/modules (the GPUDirect RDMA check asks for
nvidia_peermem or nv_peer_mem)."""

from __future__ import annotations

import os

from .model import Modules

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def parse_proc_modules(text: str) -> list[str]:
    """The module names of /proc/modules' text ("nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)")."""
    return sorted({line.split()[0] for line in text.splitlines() if line.split()})


def read_modules(proc_root: str | os.PathLike[str] = "/proc") -> Modules:
    path = os.path.join(proc_root, "modules")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return {"loaded": parse_proc_modules(f.read()), "error": None}
    except OSError as e:
        return {"loaded": None, "error": f"cannot read {path}: {e.strerror or e}"}
