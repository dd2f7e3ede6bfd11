"""Site configuration: a TOML file (/etc/gpucheck/config.toml or --config).

    [node]
    expected_gpus = 8
    expected_model = "NVIDIA H100 80GB HBM3"

    [run]
    level = 1            # default level for `gpucheck run`
    strict = false
    on_error = "pass"    # or "fail": fail-closed sites
    skip = ["pcie"]

    [checks.ecc]         # threshold overrides, keys as listed by `gpucheck list --defaults`
    corrected_volatile_warn = 1000

A bad file is a ConfigError naming the file and the key (exit 2).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_PATH = Path("/etc/gpucheck/config.toml")


class ConfigError(Exception):
    pass


_NODE_KEYS = {"expected_gpus": int, "expected_model": str}
_RUN_KEYS = {
    "level": (int, str),
    "strict": bool,
    "on_error": str,
    "skip": list,
    "timeout": (int, float),
    "state_dir": str,
}


@dataclass
class Config:
    path: Path | None = None
    node: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def expected_gpus(self) -> int | None:
        return self.node.get("expected_gpus")

    @property
    def expected_model(self) -> str | None:
        return self.node.get("expected_model")

    def check_overrides(self, check_id: str) -> dict[str, Any]:
        return dict(self.checks.get(check_id, {}))

    def validate_checks(self, specs: Iterable[Any]) -> None:
        """Every [checks.X] table must name a known check and only keys it declares."""
        by_id = {s.id: s for s in specs}
        for cid, table in self.checks.items():
            spec = by_id.get(cid)
            if spec is None:
                raise ConfigError(f"{self.path}: [checks.{cid}]: unknown check {cid!r}")
            for key, value in table.items():
                if key not in spec.defaults:
                    known = ", ".join(sorted(spec.defaults)) or "none"
                    raise ConfigError(
                        f"{self.path}: checks.{cid}.{key}: unknown key (known: {known})"
                    )
                default = spec.defaults[key]
                if not _same_kind(default, value):
                    raise ConfigError(
                        f"{self.path}: checks.{cid}.{key}: expected {type(default).__name__}, "
                        f"got {type(value).__name__} {value!r}"
                    )


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    if default is None:
        return True
    return isinstance(value, type(default))


def _check_table(path: Path, name: str, table: Any, schema: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{name}] must be a table")
    for key, value in table.items():
        if key not in schema:
            raise ConfigError(f"{path}: {name}.{key}: unknown key (known: {', '.join(sorted(schema))})")
        want = schema[key]
        if isinstance(value, bool) and want is not bool and bool not in (want if isinstance(want, tuple) else (want,)):
            raise ConfigError(f"{path}: {name}.{key}: expected {_tname(want)}, got a boolean")
        if not isinstance(value, want):
            raise ConfigError(f"{path}: {name}.{key}: expected {_tname(want)}, got {type(value).__name__} {value!r}")
    return dict(table)


def _tname(t: Any) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _read_toml(p: Path) -> dict[str, Any]:
    """The parsed file: a regular file of at most safeio.LIMITS["config"] bytes (a FIFO or a
    device is refused, never read), valid TOML; ConfigError naming the file otherwise."""
    from . import safeio

    try:
        text = safeio.read_input(p, "config").decode("utf-8")
    except PermissionError:
        raise ConfigError(f"{p}: cannot read config file (permission denied)") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {safeio.describe_error(e, str(p))}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: cannot read config file: {e}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: nested too deeply") from None


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """Load `path`, or the default path when it exists, or an empty config."""
    explicit = path is not None
    p = Path(path) if explicit else DEFAULT_PATH
    if not p.exists():
        if explicit:
            raise ConfigError(f"{p}: config file not found")
        return Config()
    raw = _read_toml(p)
    known = {"node", "run", "checks"}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{p}: {key}: unknown key (known: {', '.join(sorted(known))})")
    node = _check_table(p, "node", raw.get("node", {}), _NODE_KEYS)
    if "expected_gpus" in node and node["expected_gpus"] < 0:
        raise ConfigError(f"{p}: node.expected_gpus: must be >= 0")
    run = _check_table(p, "run", raw.get("run", {}), _RUN_KEYS)
    if "on_error" in run and run["on_error"] not in ("pass", "fail"):
        raise ConfigError(f"{p}: run.on_error: must be \"pass\" or \"fail\", got {run['on_error']!r}")
    if "level" in run:
        from .check import Level

        try:
            Level.parse(run["level"])
        except ValueError as e:
            raise ConfigError(f"{p}: run.level: {e}") from None
    checks = raw.get("checks", {})
    if not isinstance(checks, dict) or not all(isinstance(v, dict) for v in checks.values()):
        raise ConfigError(f"{p}: [checks] must hold one table per check, like [checks.ecc]")
    return Config(path=p, node=node, run=run, checks={k: dict(v) for k, v in checks.items()})
