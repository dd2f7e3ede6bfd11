"""A worker's settings from the plain arguments the parent sends it (BurnConfig, PoetConfig,
MemtestConfig .from_args)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping


def set_given(cfg: object, args: Mapping[str, object], cast: Callable[[Any], Any], keys: Iterable[str]) -> None:
    """Each of `keys` that `args` gives (present and not None) onto `cfg`, through `cast`; the
    others keep their defaults. `args`: a worker's arguments (its TypedDict, read here by the
    names of `cfg`'s fields)."""
    for key in keys:
        if args.get(key) is not None:
            setattr(cfg, key, cast(args[key]))
