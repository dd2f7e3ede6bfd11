"""A worker's settings from the plain arguments the parent sends it (BurnConfig, PoetConfig,
MemtestConfig .from_args)."""

from __future__ import annotations

from typing import Any, Callable, Iterable


def set_given(cfg: object, args: dict[str, Any], cast: Callable[[Any], Any], keys: Iterable[str]) -> None:
    """Each of `keys` that `args` gives (present and not None) onto `cfg`, through `cast`; the
    others keep their defaults."""
    for key in keys:
        if args.get(key) is not None:
            setattr(cfg, key, cast(args[key]))
