"""What each field of a snapshot's GPU entry may hold, and the view of an entry the checks judge.

A GPU entry (docs/snapshot.md) holds plain values; None is "not supported" (or, with the field in
the entry's `errors` map, "could not read"). A value that is present but that the field cannot
hold (NaN, a negative or absurdly large counter, a temperature of a million degrees, text where a
count belongs, a group that is not an object, a link state NVML does not have) was not read
correctly either. `judged_view(g)` returns a copy of the entry in which every such value is None
and listed under the key "invalid" (field path -> the value's repr), so that every check treats
it exactly like a failed read: never a pass.

Field paths are those of the `errors` map: `ecc_errors.volatile_uncorrected`, a whole group
(`ecc_errors`) when the group itself is not an object, `nvlink.links[3].replay_errors`,
`nvlink.links[3]` for a link entry that is not a link.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from ..pci import normalize_bus_id
from .enums import NVLINK_STATE_NAMES
from .model import GpuEntry, JudgedGpu


@dataclass(frozen=True)
class FieldKind:
    """A valid value: `kind` text, bus_id, bool, int (integral numbers) or number, within
    [low, high] for numbers."""

    kind: str
    low: float | None = None
    high: float | None = None

    def problem(self, v: Any) -> bool:
        """True when `v` (not None) is not a value of this kind."""
        if self.kind == "text":
            return not isinstance(v, str) or not v.strip()
        if self.kind == "bus_id":
            return not isinstance(v, str) or normalize_bus_id(v) is None
        if self.kind == "bool":
            return not isinstance(v, bool)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return True
        if self.kind == "int" and not float(v).is_integer():
            return True
        return (self.low is not None and v < self.low) or (self.high is not None and v > self.high)


TEXT = FieldKind("text")
BOOL = FieldKind("bool")
COUNT = FieldKind("int", 0, 2**53)  # counters since driver load or lifetime; 2**53 is absurd already
CELSIUS = FieldKind("number", 0, 200)  # NVML reports unsigned degrees; 200 C is no GPU reading
MHZ = FieldKind("number", 0, 20000)
WATTS = FieldKind("number", 0, 20000)

TOP_FIELDS: dict[str, FieldKind] = {
    "uuid": TEXT,
    "name": TEXT,
    "serial": TEXT,
    "pci_bus_id": FieldKind("bus_id"),
    "pci_device_id": TEXT,
    "architecture": TEXT,
    "architecture_id": FieldKind("int", 0, 2**31),
    "persistence_mode": BOOL,
    "recovery_action": FieldKind("int", 0, 2**32 - 1),  # nvmlDeviceGpuRecoveryAction_t
    "recovery_action_name": TEXT,
}

GROUP_FIELDS: dict[str, dict[str, FieldKind]] = {
    "ecc_mode": {"current": BOOL, "pending": BOOL},
    "mig_mode": {"current": BOOL, "pending": BOOL},
    "ecc_errors": {
        "volatile_corrected": COUNT,
        "volatile_uncorrected": COUNT,
        "aggregate_corrected": COUNT,
        "aggregate_uncorrected": COUNT,
        "sram_volatile_uncorrected": COUNT,
        "sram_aggregate_uncorrected": COUNT,
        "sram_threshold_exceeded": BOOL,
    },
    "remapped_rows": {"correctable": COUNT, "uncorrectable": COUNT, "pending": BOOL, "failure": BOOL},
    "retired_pages": {"single_bit": COUNT, "double_bit": COUNT, "pending": BOOL},
    "temperature": {"gpu_c": CELSIUS, "slowdown_c": CELSIUS, "shutdown_c": CELSIUS, "gpu_max_c": CELSIUS},
    "clocks": {"sm_mhz": MHZ, "sm_max_mhz": MHZ, "throttle_reasons": FieldKind("int", 0, 2**64 - 1)},
    "power": {"usage_w": WATTS, "limit_w": WATTS},
    "pcie": {
        "link_gen": FieldKind("int", 0, 16),  # 0 never trains; judged below the maximum
        "link_gen_max": FieldKind("int", 1, 16),
        "link_gen_gpu_max": FieldKind("int", 1, 16),
        "link_width": FieldKind("int", 0, 64),  # x0: a link that did not train; judged below the maximum
        "link_width_max": FieldKind("int", 1, 64),
        "replay_counter": COUNT,
    },
    # NVML GPU fabric info (gpucheck.platform.fabric.nvmlfabric, in its words); `health` is judged
    # by fabric.nvswitch word by word
    "fabric": {"state": TEXT, "status": TEXT, "clique_id": FieldKind("int", 0, 2**32 - 1), "cluster_uuid": TEXT,
               "health_summary": TEXT},
}

LINK_FIELDS: dict[str, FieldKind] = {
    "replay_errors": COUNT,
    "recovery_errors": COUNT,
    "crc_flit_errors": COUNT,
    "crc_data_errors": COUNT,
}
LINK_NUMBER = FieldKind("int", 0, 1023)
# nvmlDeviceGetNvLinkState values as the reader names them (telemetry.enums.NVLINK_STATES), and
# the reader's name for a value it does not know.
LINK_STATES = NVLINK_STATE_NAMES
_UNKNOWN_STATE = re.compile(r"^unknown_\d+$")


def judged_view(g: GpuEntry | Mapping[str, Any]) -> JudgedGpu:
    """A copy of GPU entry `g` in which every present value its field cannot hold is None and
    named in the copy's "invalid" map (field path -> repr of the value)."""
    view: Any = copy.deepcopy(g)
    invalid: dict[str, str] = {}
    for key, kind in TOP_FIELDS.items():
        v = view.get(key)
        if v is not None and kind.problem(v):
            invalid[key] = repr(v)
            view[key] = None
    for group, kinds in GROUP_FIELDS.items():
        _check_group(view, group, kinds, invalid)
    names = view["clocks"].get("throttle_reason_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        view["clocks"]["throttle_reason_names"] = None  # derived from the mask: judged there
    _check_nvlink(view, invalid)
    view["invalid"] = invalid
    judged: JudgedGpu = view
    return judged


def _check_group(view: dict[str, Any], group: str, kinds: dict[str, FieldKind], invalid: dict[str, str]) -> None:
    raw = view.get(group)
    if raw is None:
        view[group] = {k: None for k in kinds}
        return
    if not isinstance(raw, dict):
        invalid[group] = repr(raw)
        view[group] = {k: None for k in kinds}
        return
    for key, kind in kinds.items():
        v = raw.get(key)
        if v is not None and kind.problem(v):
            invalid[f"{group}.{key}"] = repr(v)
            raw[key] = None


def _check_nvlink(view: dict[str, Any], invalid: dict[str, str]) -> None:
    nv = view.get("nvlink")
    if nv is None:
        view["nvlink"] = {"supported": None, "links": []}
        return
    if not isinstance(nv, dict):
        invalid["nvlink"] = repr(nv)
        view["nvlink"] = {"supported": None, "links": []}
        return
    if nv.get("supported") is not None and BOOL.problem(nv["supported"]):
        invalid["nvlink.supported"] = repr(nv["supported"])
        nv["supported"] = None
    if nv.get("all_inactive") is not None and BOOL.problem(nv["all_inactive"]):
        invalid["nvlink.all_inactive"] = repr(nv["all_inactive"])
        nv["all_inactive"] = None
    links = nv.get("links")
    if links is None:
        nv["links"] = []
        return
    if not isinstance(links, list):
        invalid["nvlink.links"] = repr(links)
        nv["links"] = []
        return
    kept = []
    for i, lk in enumerate(links):
        if not isinstance(lk, dict) or lk.get("link") is None or LINK_NUMBER.problem(lk.get("link")):
            invalid[f"nvlink.links[{i}]"] = repr(lk)
            continue
        n = int(lk["link"])
        lk["link"] = n
        state = lk.get("state")
        if state is not None and not (isinstance(state, str) and (state in LINK_STATES or _UNKNOWN_STATE.match(state))):
            invalid[f"nvlink.links[{n}].state"] = repr(state)
            lk["state"] = None
        for key, kind in LINK_FIELDS.items():
            v = lk.get(key)
            if v is not None and kind.problem(v):
                invalid[f"nvlink.links[{n}].{key}"] = repr(v)
                lk[key] = None
        kept.append(lk)
    nv["links"] = kept
