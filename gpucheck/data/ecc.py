"""Whether a GPU model ships with ECC on: the data the inventory check's ECC rule reads.

A data-centre GPU (H100, H200, GH200, A100, A10, ...) ships with ECC enabled; ECC disabled there
was turned off by someone, and the node fails inventory (`require_ecc`). A GeForce or TITAN
consumer board ships with ECC off (the RTX 4090's GDDR6X ECC can be switched on, but its default
is off; the TITAN V has none NVML can switch): ECC disabled is its normal state, a note, never a
fault. A name no row matches is judged as required by `require_ecc` (a fail when ECC is off).

Sources: the real captures in tests/fixtures/nvsmi (8x GeForce RTX 4090 on R535 with "ECC Mode
Current: Disabled", gpud test data; H100/H200/GH200/A100/A10 captures with ECC Enabled), and
NVIDIA's data-centre product pages (ECC on by default on the Tesla/data-centre line).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import first_match, name_matches


@dataclass(frozen=True)
class EccClass:
    name: str  # the class in words, for the result
    pattern: str  # regex searched in the NVML device name
    ships_with_ecc: bool  # ECC enabled as shipped

    def matches(self, device_name: str) -> bool:
        return name_matches(self.pattern, device_name)


# Order matters: the first row whose pattern matches wins.
ECC_CLASSES: tuple[EccClass, ...] = (
    EccClass("GeForce consumer GPU", r"\bGeForce\b", ships_with_ecc=False),
    EccClass("TITAN consumer GPU", r"\bTITAN\b", ships_with_ecc=False),
    EccClass("data-centre GPU",
             r"\b(GB|GH|[ABHLT])\d{1,3}[A-Z]?\b|\bTesla\b|\b[PV]100\b|\bA800\b|\bH800\b|\bH20\b",
             ships_with_ecc=True),
)


def ecc_class(device_name: str | None) -> EccClass | None:
    """The row for an NVML device name ("NVIDIA GeForce RTX 4090"), or None for an unknown model."""
    return first_match(ECC_CLASSES, device_name)
