"""`nvidia-smi nvlink -s` captures: each GPU's NVLinks and their state, the part of NVLink that
`nvidia-smi -q` does not print (gpucheck.platform.telemetry.formatgaps). Reading only.

    GPU 0: Tesla V100-SXM2-32GB (UUID: GPU-b45d9bdf-...)
             Link 0: 25.781 GB/s
             Link 3: <inactive>
    GPU 6: NVIDIA A100-SXM4-80GB (UUID: GPU-9667d95e-...)
    NVML: Unable to retrieve NVLink information as all links are inactive

A link with a speed is active; `<inactive>` is inactive; the NVML line means every link of that
GPU is inactive (nvidia-smi lists none, so their number is unknown). The capture holds no error
counters (`nvidia-smi nvlink -e` prints them): they are not carried, never "no errors".
"""

from __future__ import annotations

import re
from typing import TypedDict

_GPU_RE = re.compile(r"^GPU (\d+): (.*?)\s*\(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
_LINK_RE = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
_ALL_INACTIVE_RE = re.compile(r"Unable to retrieve NVLink information as all links are inactive", re.I)
_SPEED_RE = re.compile(r"^(\d+(?:\.\d+)?) GB/s$")


class StatusLink(TypedDict):
    link: int
    state: str  # "active" or "inactive" (telemetry.enums.NVLINK_STATE_NAMES)
    speed_gbps: float | None


class StatusGpu(TypedDict):
    index: int
    name: str
    uuid: str
    links: list[StatusLink]
    all_inactive: bool  # nvidia-smi says every link is inactive (and lists none)


def detect(text: str) -> bool:
    """Whether `text` is `nvidia-smi nvlink -s` output: a GPU line with its UUID followed by a
    Link line or NVML's all-inactive line (`nvidia-smi -L` alone has no Link lines)."""
    lines = [line for line in text.splitlines()[:2000] if line.strip()]
    for first, second in zip(lines, lines[1:]):
        if _GPU_RE.match(first.strip()) and (_LINK_RE.match(second) or _ALL_INACTIVE_RE.search(second)):
            return True
    return False


def _link(m: re.Match[str]) -> StatusLink:
    value = m.group(2)
    speed = _SPEED_RE.match(value)
    if speed:
        return {"link": int(m.group(1)), "state": "active", "speed_gbps": float(speed.group(1))}
    if value.strip("<>").lower() == "inactive":
        return {"link": int(m.group(1)), "state": "inactive", "speed_gbps": None}
    raise ValueError(f"link {m.group(1)}: {value!r} is neither a speed nor <inactive>")


def parse(text: str) -> list[StatusGpu]:
    """The GPUs of an `nvidia-smi nvlink -s` capture. Raises ValueError (one line) for a line
    that does not read."""
    gpus: list[StatusGpu] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        gpu = _GPU_RE.match(line)
        link = _LINK_RE.match(raw)
        if gpu:
            gpus.append({"index": int(gpu.group(1)), "name": gpu.group(2), "uuid": gpu.group(3), "links": [],
                         "all_inactive": False})
        elif gpus and link:
            try:
                gpus[-1]["links"].append(_link(link))
            except ValueError as e:
                raise ValueError(f"line {n}: {e}") from None
        elif gpus and _ALL_INACTIVE_RE.search(line):
            gpus[-1]["all_inactive"] = True
        else:
            raise ValueError(f"line {n}: {line[:80]!r} is not part of nvidia-smi nvlink -s output")
    return gpus
