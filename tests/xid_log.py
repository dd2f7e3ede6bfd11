"""A config whose xid check reads a kernel log of our own holding an Xid 79 (a GPU fallen off
the bus) a few seconds ago: the fault the gate tests expect to be judged whatever else fails."""

from __future__ import annotations

import time
from pathlib import Path


def xid79_config(tmp_path: Path, bus: str = "0000:2a:00") -> Path:
    """A config whose xid check reads a kernel log holding Xid 79 on `bus`, a few seconds ago."""
    when = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 5))
    log = tmp_path / "kern.log"
    log.write_text(f"{when} node kernel: NVRM: Xid (PCI:{bus}): 79, pid=42, name=python3, "
                   "GPU has fallen off the bus.\n")
    config = tmp_path / "config.toml"
    config.write_text(f'[checks.xid]\nfiles = ["{log}"]\n')
    return config
