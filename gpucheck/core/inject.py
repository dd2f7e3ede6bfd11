"""Fault injection specs (`--inject bitflip:gpu=1`, `--inject slow:gpu=2,factor=0.7`).

Injection exists to prove that every detector fires. It is always explicit: every injected fault
is listed in the verdict, and every result it touched carries it in `injected`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


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


# What a check's injection parse gives the worker of one GPU: its arguments, the injection texts
# (listed on its results), and a usage problem (None when every injection could be honoured).
InjectionArgs = tuple[dict[str, Any], list[str], "str | None"]


def injections_for_gpu(injections: Iterable[Injection], gpu: int, kinds: Iterable[str],
                       parse: Callable[[Injection, dict[str, Any]], None]) -> InjectionArgs:
    """The one parse loop of every check's --inject: for each injection of `kinds` that targets
    `gpu`, in order, its text, and parse(injection, args) putting what it asks for into `args`.
    The first one `parse` refuses (ValueError or TypeError, naming what is wrong) stops the loop
    with the problem "--inject TEXT: why"."""
    wanted = tuple(kinds)
    args: dict[str, Any] = {}
    texts: list[str] = []
    for inj in injections:
        if inj.kind not in wanted or not inj.targets_gpu(gpu):
            continue
        texts.append(str(inj))
        try:
            parse(inj, args)
        except (TypeError, ValueError) as e:
            return args, texts, f"--inject {inj}: {e}"
    return args, texts, None


def fraction(inj: Injection, key: str, default: float) -> float:
    """A parameter in (0, 1] (a slow-down factor); ValueError naming it otherwise."""
    f = float(inj.get(key, default))
    if not 0.0 < f <= 1.0:
        raise ValueError(f"{key} must be in (0, 1], not {f}")
    return f


def choice(inj: Injection, key: str, default: str, allowed: Iterable[str]) -> str:
    """A parameter from a fixed set; ValueError naming the set otherwise."""
    options = tuple(allowed)
    value = str(inj.get(key, default))
    if value not in options:
        raise ValueError(f"{key} must be one of {', '.join(options)}, not {value!r}")
    return value
