"""What a capture's format does not carry: fields `nvidia-smi -q` (or `-q -x`) never prints, or
that the capture's driver predates. Plain data and one lookup; no judgement here.

A field a capture lacks is one of two things, and gpucheck tells them apart:

- the format does not carry it (nvidia-smi -q prints no NVLink state at all; a driver older than
  the first branch that prints a line cannot print it): failure kind `not_in_format` (gpucheck.platform.telemetry.nvml.NOT_IN_FORMAT), judged a
  plain `skip` that names what to add to the capture (docs/judge.md). On a live node the same
  field would be read from NVML, or be "not supported" by that driver: nothing is wrong with the
  node, the capture just cannot say;
- the format carries it but the capture does not hold it (a half-pasted or cut capture, a driver
  new enough to print it): `not_in_capture`, judged like any unread field (`error` where a fail
  rule needs it). The default whenever the driver version is unknown.

`printed_from` is the oldest driver branch seen printing the line in the real captures of
tests/fixtures/nvsmi, each newer capture printing it and
each older one not: R460 has no "Product Architecture", R510 no "Device Max" PCIe generation, R535
no "SRAM Threshold Exceeded", R560 no "GPU Recovery Action". A capture from a driver at or above
it that lacks the line is cut, never "not carried".
"""

from __future__ import annotations

import re
from dataclasses import dataclass


TEXT, XML = "nvidia-smi -q", "nvidia-smi -q -x"
DUMP = "record `gpucheck telemetry dump` on the node"


@dataclass(frozen=True)
class FormatGap:
    """One field (or group) a capture format does not carry, and what to add to judge it."""

    fields: tuple[str, ...]  # snapshot fields (docs/snapshot.md) or a group ("nvlink")
    what: str  # in words, for "capture has no <what>"
    add: str  # what to add to the capture (a driver gap: more words after its first branch)
    printed_from: int | None = None  # None: the format never prints it; else the first driver branch that does
    old_ecc_layout: bool = False  # carried except in the pre-Ampere "Single Bit / Double Bit" ECC layout

    def hint(self, driver: str | None) -> str:
        if self.printed_from is not None and driver is not None:
            return f"capture has no {self.what}: driver {driver} predates it (printed from R{self.printed_from}{self.add})"
        return f"capture has no {self.what}: {self.add}"


GAPS: tuple[FormatGap, ...] = (
    FormatGap(("nvlink",), "NVLink state", "add `nvidia-smi nvlink -s`"),
    FormatGap(("recovery_action",), "GPU Recovery Action", ": NVML field 230", printed_from=565),
    FormatGap(("ecc_errors.sram_threshold_exceeded",), "SRAM Threshold Exceeded flag", "", printed_from=550),
    FormatGap(("pcie.link_gen_gpu_max",), "device maximum PCIe generation", "", printed_from=535),
    FormatGap(("architecture", "architecture_id"), "Product Architecture", "", printed_from=510),
    FormatGap(("ecc_errors.sram_volatile_uncorrected", "ecc_errors.sram_aggregate_uncorrected",
               "ecc_errors.sram_threshold_exceeded"), "SRAM error totals",
              "its ECC section is in the Single Bit / Double Bit layout: " + DUMP, old_ecc_layout=True),
)


def driver_branch(version: str | None) -> int | None:
    """"550.90.12" -> 550; None for a version that is absent or does not read."""
    m = re.match(r"\s*(\d{3,4})\.", version or "")
    return int(m.group(1)) if m else None


def gap_for(field: str, fmt: str, driver: str | None, old_ecc_layout: bool) -> str | None:
    """The hint for `field` when a capture of format `fmt` from `driver` cannot carry it, else
    None (the field is then simply not in this capture). `old_ecc_layout`: the GPU's ECC Errors
    section is in the Single Bit / Double Bit layout."""
    if fmt not in (TEXT, XML):
        return None
    branch = driver_branch(driver)
    for gap in GAPS:
        if field not in gap.fields:
            continue
        if gap.old_ecc_layout:
            if old_ecc_layout:
                return gap.hint(None)
        elif gap.printed_from is None:
            return gap.hint(None)
        elif branch is not None and branch < gap.printed_from:
            return gap.hint(driver)
    return None
