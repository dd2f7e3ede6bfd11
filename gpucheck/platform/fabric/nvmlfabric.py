"""NVML's GPU fabric info (NVSwitch / multi-node NVLink registration) in gpucheck's names.

`nvmlDeviceGetGpuFabricInfoV` (struct `c_nvmlGpuFabricInfo_v3_t`, version `nvmlGpuFabricInfo_v3`:
state, status, cliqueId, clusterUuid, healthMask, healthSummary), else the older
`nvmlDeviceGetGpuFabricInfo` (`c_nvmlGpuFabricInfo_t`: no health). The reader
(platform/telemetry/reader.py) makes the call; this module turns its numbers into the GPU entry's
`fabric` group and back (the replay answers the call from the names):

    {"state": "completed", "status": "success", "clique_id": 2, "cluster_uuid": "dc6e40c4-...",
     "health_summary": "unhealthy" | None, "health": {"degraded_bw": "true"|"false"|"not_supported", ...}}

Every number is pynvml's own constant (NVML_GPU_FABRIC_STATE_*, NVML_GPU_FABRIC_HEALTH_*,
NVML_SUCCESS / NVML_ERROR_*); a value no constant names is `unknown_<n>`.
"""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

STATES = {"NVML_GPU_FABRIC_STATE_NOT_SUPPORTED": "not_supported", "NVML_GPU_FABRIC_STATE_NOT_STARTED": "not_started",
          "NVML_GPU_FABRIC_STATE_IN_PROGRESS": "in_progress", "NVML_GPU_FABRIC_STATE_COMPLETED": "completed"}
SUMMARIES = {"NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED": "not_supported",
             "NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY": "healthy",
             "NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY": "unhealthy",
             "NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY": "limited_capacity"}
# health mask field -> the suffix of its NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH,<suffix>_TRUE...} constants
HEALTH_FIELDS = {"degraded_bw": "DEGRADED_BW", "route_recovery": "ROUTE_RECOVERY",
                 "route_unhealthy": "ROUTE_UNHEALTHY", "access_timeout_recovery": "ACCESS_TIMEOUT_RECOVERY"}
HEALTH_VALUES = ("NOT_SUPPORTED", "TRUE", "FALSE")


class GpuFabric(TypedDict):
    """A GPU's fabric registration as the checks judge it (see the module)."""

    state: str | None
    status: str | None
    clique_id: int | None
    cluster_uuid: str | None
    health_summary: str | None
    health: dict[str, str]


def _named(module: Any, table: dict[str, str], value: int) -> str:
    for const, name in table.items():
        if getattr(module, const, None) == value:
            return name
    return f"unknown_{value}"


def _number(module: Any, table: dict[str, str], name: str) -> int | None:
    if name.startswith("unknown_") and name[8:].isdigit():
        return int(name[8:])
    for const, n in table.items():
        if n == name:
            value = getattr(module, const, None)
            return value if isinstance(value, int) else None
    return None


def status_name(module: Any, code: int) -> str:
    """NVML's return code as the registration status: success, or the NVML_ERROR_* name in lower case."""
    if code == getattr(module, "NVML_SUCCESS", 0):
        return "success"
    for name in dir(module):
        if name.startswith("NVML_ERROR_") and getattr(module, name) == code:
            return name[len("NVML_ERROR_"):].lower()
    return f"unknown_{code}"


def status_code(module: Any, name: str) -> int | None:
    if name == "success":
        return int(getattr(module, "NVML_SUCCESS", 0))
    if name.startswith("unknown_") and name[8:].isdigit():
        return int(name[8:])
    value = getattr(module, "NVML_ERROR_" + name.upper(), None)
    return value if isinstance(value, int) else None


def _health(module: Any, mask: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for field, suffix in HEALTH_FIELDS.items():
        shift = getattr(module, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{suffix}", None)
        width = getattr(module, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{suffix}", None)
        if not isinstance(shift, int) or not isinstance(width, int):
            continue
        value = (mask >> shift) & width
        names = {getattr(module, f"NVML_GPU_FABRIC_HEALTH_MASK_{suffix}_{v}", None): v.lower() for v in HEALTH_VALUES}
        out[field] = names.get(value, f"unknown_{value}")
    return out


def health_mask(module: Any, health: dict[str, str]) -> int:
    """The mask NVML would have answered for `health` (fields it does not name: not supported)."""
    mask = 0
    for field, suffix in HEALTH_FIELDS.items():
        shift = getattr(module, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{suffix}", None)
        value = getattr(module, f"NVML_GPU_FABRIC_HEALTH_MASK_{suffix}_{health.get(field, 'not_supported').upper()}", None)
        if isinstance(shift, int) and isinstance(value, int):
            mask |= value << shift
    return mask


def decode(module: Any, st: Any) -> GpuFabric:
    """A filled fabric-info struct -> the `fabric` group (health only from the v3 struct)."""
    has_health = hasattr(st, "healthSummary")
    raw_uuid = bytes(st.clusterUuid)
    return {"state": _named(module, STATES, int(st.state)), "status": status_name(module, int(st.status)),
            "clique_id": int(st.cliqueId), "cluster_uuid": str(uuid.UUID(bytes=raw_uuid)) if len(raw_uuid) == 16 else None,
            "health_summary": _named(module, SUMMARIES, int(st.healthSummary)) if has_health else None,
            "health": _health(module, int(st.healthMask)) if has_health else {}}


def encode(module: Any, fabric: GpuFabric, st: Any) -> None:
    """Fill struct `st` from a recorded `fabric` group (the replay's answer). Raises ValueError
    for a group whose names no NVML value has."""
    state = _number(module, STATES, str(fabric.get("state")))
    status = status_code(module, str(fabric.get("status")))
    if state is None or status is None:
        raise ValueError(f"fabric state {fabric.get('state')!r} / status {fabric.get('status')!r}: no NVML value")
    st.state, st.status = state, status
    st.cliqueId = int(fabric.get("clique_id") or 0)
    text = fabric.get("cluster_uuid")
    raw = uuid.UUID(text).bytes if isinstance(text, str) else bytes(16)
    for i, b in enumerate(raw):
        st.clusterUuid[i] = b
    if hasattr(st, "healthSummary"):
        summary = fabric.get("health_summary")
        number = _number(module, SUMMARIES, summary) if isinstance(summary, str) else 0
        st.healthSummary = number or 0
        st.healthMask = health_mask(module, dict(fabric.get("health") or {}))


def parse_nvsmi_fabric(text: str) -> list[GpuFabric]:
    """The `Fabric` blocks of an `nvidia-smi -q` text (or a grep of them), one per GPU, in order;
    N/A values are None (not supported)."""
    out: list[GpuFabric] = []
    cur: GpuFabric | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "Fabric":
            cur = {"state": None, "status": None, "clique_id": None, "cluster_uuid": None, "health_summary": None,
                   "health": {}}
            out.append(cur)
            continue
        if cur is None or ":" not in stripped:
            continue
        key, _, value = (p.strip() for p in stripped.partition(":"))
        _nvsmi_field(cur, key, value)
    return out


def _nvsmi_field(cur: GpuFabric, key: str, value: str) -> None:
    v = None if value in ("N/A", "[N/A]", "") else value
    words = v.lower().replace(" ", "_") if v is not None else None
    if key == "State":
        cur["state"] = words
    elif key == "Status":
        cur["status"] = words
    elif key == "CliqueId":
        cur["clique_id"] = int(v) if v is not None and v.isdigit() else None
    elif key == "ClusterUUID":
        cur["cluster_uuid"] = v
    elif key == "Summary":
        cur["health_summary"] = words
    elif key == "Bandwidth" and words is not None:
        cur["health"]["degraded_bw"] = {"full": "false", "degraded": "true"}.get(words, words)
    elif key in ("Route Recovery in progress", "Route Unhealthy", "Access Timeout Recovery") and words is not None:
        cur["health"][{"Route Recovery in progress": "route_recovery", "Route Unhealthy": "route_unhealthy",
                       "Access Timeout Recovery": "access_timeout_recovery"}[key]] = words
