"""Fault injection specs (`--inject bitflip:gpu=1`, `--inject slow:gpu=2,factor=0.7`).

Injection exists to prove that every detector fires. It is always explicit: every injected fault
is listed in the verdict, and every result it touched carries it in `injected`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class InjectionError(ValueError):
    pass


@dataclass(frozen=True)
class Injection:
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    def targets_gpu(self, gpu: int | None) -> bool:
        want = self.params.get("gpu")
        return want is None or (gpu is not None and int(want) == int(gpu))

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    def __str__(self) -> str:
        return self.text or self.kind


def _coerce(v: str) -> Any:
    """An int, a finite float, or the text itself; InjectionError for 'nan' and 'inf' (a NaN
    factor or delay would make the fault a no-op that still shows as injected)."""
    for conv in (int, float):
        try:
            number = conv(v)
        except ValueError:
            continue
        if not math.isfinite(number):
            raise InjectionError(f"bad --inject value {v!r}: not a finite number")
        return number
    return v


def parse_injection(text: str) -> Injection:
    """Parse `kind[:key=value[,key=value...]]`."""
    text = text.strip()
    if not text:
        raise InjectionError("empty --inject")
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    if not kind.replace("-", "").replace("_", "").isalnum():
        raise InjectionError(f"bad --inject kind {kind!r}")
    params: dict[str, Any] = {}
    if rest:
        for part in rest.split(","):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise InjectionError(f"bad --inject parameter {part!r} in {text!r} (want key=value)")
            params[key.strip().lower()] = _coerce(value.strip())
    return Injection(kind, params, text)
