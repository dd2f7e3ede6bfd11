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

A bad file is a ConfigError naming the file and the key (exit 2): an unknown key, a value of the
wrong kind, a number that is NaN or infinite or outside the key's range. The range of every check
setting is data next to the check's defaults (`CheckSpec.limits`, a `Limit` per key) or, where
the check declares none, `conventional_limit`: the default's kind, a number >= 0, a fraction or
share at most 1, a time in seconds above 0. `validate_checks` applies them in one place.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .levels import Level

DEFAULT_PATH = Path("/etc/gpucheck/config.toml")
_BOM = "\ufeff"  # a UTF-8 byte order mark, as Python decodes it


class ConfigError(Exception):
    pass


# -- what a setting may hold ------------------------------------------------------------------------
KINDS = ("bool", "int", "real", "str", "list")


@dataclass(frozen=True)
class Limit:
    """The values one setting may take. Every number must be finite (never NaN or inf).

    kind: bool, int (an integer), real (any number), str or list; None: the kind of the default.
    low/high: inclusive bounds of a number (of each item of a list of numbers); None: no bound.
    above: low is exclusive (the value must be > low); below: high is exclusive (< high).
    item: the kind of a list's items (int, real or str); None: the kind of the default's items.
    choices: the strings allowed (of a str, or of each item of a list of strings).
    nonempty: a str must not be empty.
    parse: a function that raises ValueError (naming what is allowed) for a bad str or item.
    words: how to say what is allowed, where the above do not say it (a parsed str).
    """

    kind: str | None = None
    low: float | None = 0
    high: float | None = None
    above: bool = False
    below: bool = False
    item: str | None = None
    choices: tuple[str, ...] = ()
    nonempty: bool = False
    parse: Callable[[Any], Any] | None = None
    words: str = ""

    def describe(self, kind: str) -> str:
        """The allowed values in words, for messages and `gpucheck list --defaults`."""
        if self.words:
            return self.words
        if kind == "bool":
            return "true or false"
        if kind == "list":
            return f"a list of {self._scalar(self.item or 'str', plural=True)}"
        return self._scalar(kind, plural=False)

    def _scalar(self, kind: str, *, plural: bool) -> str:
        if kind == "str":
            if self.choices:
                return ("strings, each one of " if plural else "one of ") + ", ".join(self.choices)
            return "strings" if plural else ("a non-empty string" if self.nonempty else "a string")
        what = ("integers" if plural else "an integer") if kind == "int" else ("numbers" if plural else "a number")
        if self.low is not None and self.high is not None:
            return (f"{what} from {self.low:g}{' (exclusive)' if self.above else ''} "
                    f"to {self.high:g}{' (exclusive)' if self.below else ''}")
        if self.low is not None:
            return f"{what} {'>' if self.above else '>='} {self.low:g}"
        if self.high is not None:
            return f"{what} {'<' if self.below else '<='} {self.high:g}"
        return f"finite {what}"


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "real"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    raise TypeError(f"no setting kind for {type(value).__name__}")


def _names_fraction(key: str) -> bool:
    words = key.split("_")
    return "fraction" in words or "share" in words


def _names_seconds(key: str) -> bool:
    """A key whose unit is seconds: a word `s` (duration_s_level2, timeout_s), not a rate (per_s)."""
    words = key.split("_")
    return any(w == "s" and (i == 0 or words[i - 1] != "per") for i, w in enumerate(words))


def conventional_limit(key: str, default: Any) -> Limit:
    """The limit of a setting its check does not declare: the default's kind; a number >= 0; a
    fraction or share (the word in the key) at most 1; a time in seconds (a word `s`) > 0; a
    list's items of the kind of the default's first item."""
    kind = kind_of(default)
    if kind in ("int", "real"):
        if _names_fraction(key):
            return Limit(kind, 0, 1)
        if _names_seconds(key):
            return Limit(kind, 0, above=True)
        return Limit(kind, 0)
    if kind == "list":
        return Limit("list", item=kind_of(default[0]) if default else None)
    return Limit(kind)


def limit_of(spec: Any, key: str) -> Limit:
    """The limit of `key` of a CheckSpec: the one it declares, else the convention."""
    declared = (getattr(spec, "limits", None) or {}).get(key)
    default = spec.defaults[key]
    if declared is None:
        return conventional_limit(key, default)
    if declared.kind is None:
        return replace(declared, kind=kind_of(default))
    return declared


def value_problem(value: Any, limit: Limit) -> str | None:
    """Why `value` does not fit `limit` (a phrase), or None when it does."""
    kind = limit.kind or kind_of(value)
    if kind == "list":
        if not isinstance(value, list):
            return f"expected {limit.describe(kind)}, got {_what(value)}"
        item = replace(limit, kind=limit.item or "str")
        for i, v in enumerate(value):
            why = value_problem(v, item)
            if why is not None:
                return f"item {i}: {why}"
        return None
    if not _has_kind(value, kind):
        return f"expected {limit.describe(kind)}, got {_what(value)}"
    if kind in ("int", "real"):
        if not math.isfinite(value):
            return f"expected {limit.describe(kind)}, got {value!r}"
        low_ok = limit.low is None or (value > limit.low if limit.above else value >= limit.low)
        high_ok = limit.high is None or (value < limit.high if limit.below else value <= limit.high)
        if not (low_ok and high_ok):
            return f"expected {limit.describe(kind)}, got {value!r}"
    if kind == "str":
        if (limit.choices and value not in limit.choices) or (limit.nonempty and not value.strip()):
            return f"expected {limit.describe(kind)}, got {value!r}"
        if limit.parse is not None:
            try:
                limit.parse(value)
            except ValueError as e:
                return str(e)
    return None


def _has_kind(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "bool"
    if kind == "int":
        return isinstance(value, int)
    if kind == "real":
        return isinstance(value, (int, float))
    return kind == kind_of(value) if isinstance(value, (str, list, float, int)) else False


def _what(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a table"
    return f"{type(value).__name__} {value!r}"


# -- [node] and [run] -------------------------------------------------------------------------------
_NODE_LIMITS = {"expected_gpus": Limit("int", 0), "expected_model": Limit("str", nonempty=True)}
_RUN_LIMITS: dict[str, Limit | None] = {
    "level": None,  # 1-4 or a level name: _run_level
    "strict": Limit("bool"),
    "on_error": Limit("str", choices=("pass", "fail")),
    "skip": Limit("list", item="str", nonempty=True),
    "timeout": Limit("real", 0, above=True),
    "state_dir": Limit("str", nonempty=True),
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
        """Every [checks.X] table must name a known check, only keys it declares, and values
        inside each key's limit (the check's declared `limits`, else `conventional_limit`)."""
        by_id = {s.id: s for s in specs}
        self.checks = _unnest_dotted_ids(self.checks, by_id)
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
                why = value_problem(value, limit_of(spec, key))
                if why is not None:
                    raise ConfigError(f"{self.path}: checks.{cid}.{key}: {why}")


def _unnest_dotted_ids(checks: dict[str, Any], by_id: dict[str, Any]) -> dict[str, Any]:
    """[checks.burn.gemm] is TOML for checks = {"burn": {"gemm": {...}}}: read it as the table
    of check "burn.gemm" (the same as [checks."burn.gemm"]) when that check exists."""
    out: dict[str, Any] = {}
    for cid, table in checks.items():
        nested = {k: v for k, v in table.items() if f"{cid}.{k}" in by_id and isinstance(v, dict)}
        if cid in by_id or not nested:
            out.setdefault(cid, {}).update(table)
            continue
        rest = {k: v for k, v in table.items() if k not in nested}
        if rest:  # keys of a check that does not exist: reported as such
            out.setdefault(cid, {}).update(rest)
        for k, v in nested.items():
            out.setdefault(f"{cid}.{k}", {}).update(v)
    return out


def _check_table(path: Path, name: str, table: Any, limits: Mapping[str, Limit | None]) -> dict[str, Any]:
    """Unknown keys and values outside their limit are errors; a key whose limit is None is
    checked by the caller."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{name}] must be a table")
    for key, value in table.items():
        if key not in limits:
            raise ConfigError(f"{path}: {name}.{key}: unknown key (known: {', '.join(sorted(limits))})")
        limit = limits[key]
        why = None if limit is None else value_problem(value, limit)
        if why is not None:
            raise ConfigError(f"{path}: {name}.{key}: {why}")
    return dict(table)


def _run_level(path: Path, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{path}: run.level: expected 1-4 or a level name, got {_what(value)}")
    try:
        Level.parse(value)
    except ValueError as e:
        raise ConfigError(f"{path}: run.level: {e}") from None


def _read_toml(p: Path) -> dict[str, Any]:
    """The parsed file: a regular file of at most safeio.LIMITS["config"] bytes (a FIFO or a
    device is refused, never read), valid TOML; ConfigError naming the file otherwise."""
    from ..platform import safeio

    try:
        text = safeio.read_input(p, "config").decode("utf-8")
    except PermissionError:
        raise ConfigError(f"{p}: cannot read config file (permission denied)") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {safeio.describe_error(e, str(p))}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: cannot read config file: {e}") from None
    if text.startswith(_BOM):
        raise ConfigError(f"{p}: not valid TOML: it starts with a UTF-8 byte order mark (save it without one)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: nested too deeply") from None


def _config_exists(p: Path) -> bool:
    """Whether there is something at `p` to read (False: nothing, or a folder on the way is a
    file); ConfigError for any other reason it cannot be looked at (a name too long, permission
    denied on a folder, a NUL byte): every OSError is a config error, never a traceback."""
    from ..platform import safeio

    try:
        os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {safeio.describe_error(e, str(p))}") from None
    except ValueError as e:  # an embedded NUL byte
        raise ConfigError(f"{p}: cannot read config file: {e}") from None
    return True


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """Load `path`, or the default path when it exists, or an empty config."""
    explicit = path is not None
    p = Path(path) if path is not None else DEFAULT_PATH
    if not _config_exists(p):
        if explicit:
            raise ConfigError(f"{p}: config file not found")
        return Config()
    raw = _read_toml(p)
    known = {"node", "run", "checks"}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{p}: {key}: unknown key (known: {', '.join(sorted(known))})")
    node = _check_table(p, "node", raw.get("node", {}), _NODE_LIMITS)
    run = _check_table(p, "run", raw.get("run", {}), _RUN_LIMITS)
    if "level" in run:
        _run_level(p, run["level"])
    checks = raw.get("checks", {})
    if not isinstance(checks, dict) or not all(isinstance(v, dict) for v in checks.values()):
        raise ConfigError(f"{p}: [checks] must hold one table per check, like [checks.ecc]")
    return Config(path=p, node=node, run=run, checks={k: dict(v) for k, v in checks.items()})


def read_on_error(path: str | os.PathLike[str] | None) -> str | None:
    """`[run] on_error` ("pass" or "fail") of a config file, read on its own so that a site's
    fail-closed choice survives every other error in the file; None when the file (or the key)
    is missing, unreadable or not pass/fail. Never raises, never hangs.

    The file is read like any config (gpucheck.platform.safeio: a regular file only, so a FIFO or a device
    is None at once), at most safeio.LIMITS["config"] bytes; a larger one is scanned in its first
    that many bytes. A leading UTF-8 byte order mark is dropped. Valid TOML is read with tomllib
    (every spelling: [run], ["run"], run.on_error, run = {on_error = ...}); a file that is not
    valid TOML (or nested too deeply for the parser) is scanned line by line: `on_error = "fail"`
    in a [run] table (bare or quoted), or a top-level `run.on_error = "fail"` or inline
    `run = { ..., on_error = "fail" }`, makes it "fail", else "pass" if one says so."""
    text, whole = _on_error_text(Path(path) if path is not None else DEFAULT_PATH)
    if text is None:
        return None
    if whole:
        try:
            run = tomllib.loads(text).get("run")
        except (tomllib.TOMLDecodeError, RecursionError):
            pass
        else:
            value = run.get("on_error") if isinstance(run, dict) else None
            return value if value in ("pass", "fail") else None
    return scan_on_error(text)


def _on_error_text(p: Path) -> tuple[str | None, bool]:
    """(the config's text, without a byte order mark, or None when it cannot be read; whether
    that is the whole file)."""
    from ..platform import safeio

    limit = safeio.LIMITS["config"]
    try:
        fd = safeio.open_input(p)
    except (OSError, ValueError):
        return None, False
    try:
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError:
        return None, False
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    whole = len(raw) <= limit
    if not whole:  # the first `limit` bytes, up to the last whole line
        raw = raw[:limit].rpartition(b"\n")[0]
    return raw.decode("utf-8", errors="replace").removeprefix(_BOM), whole


_TOML_RUN = r"""(?:run|"run"|'run')"""
_TOML_ON_ERROR = r"""(?:on_error|"on_error"|'on_error')"""
_ON_ERROR_VALUE = r"""\s*=\s*(["']?)(pass|fail)\1(?=\s*(?:[#,}]|$))"""
_RUN_HEADER = re.compile(rf"\s*\[\s*{_TOML_RUN}\s*\]\s*(?:#.*)?")
_ON_ERROR_IN_RUN = re.compile(rf"\s*{_TOML_ON_ERROR}{_ON_ERROR_VALUE}")
_RUN_DOTTED = re.compile(rf"\s*{_TOML_RUN}\s*\.\s*{_TOML_ON_ERROR}{_ON_ERROR_VALUE}")
_RUN_INLINE = re.compile(rf"\s*{_TOML_RUN}\s*=\s*\{{(.*)")
_ON_ERROR_INLINE = re.compile(rf"(?:^|[{{,])\s*{_TOML_ON_ERROR}{_ON_ERROR_VALUE}")


def scan_on_error(text: str) -> str | None:
    """on_error of the run table found line by line in a text that is not (all) valid TOML:
    "fail" if any spelling says fail, else "pass" if one says pass, else None. The wrapper
    (scripts/slurm/gpucheck-hook.sh) reads the same spellings with awk."""
    found: set[str] = set()
    in_run, in_table = False, False
    for line in text.splitlines():
        if line.lstrip().startswith("["):
            in_run, in_table = bool(_RUN_HEADER.fullmatch(line)), True
            continue
        m = None
        if in_run:
            m = _ON_ERROR_IN_RUN.match(line)
        elif not in_table:
            m = _RUN_DOTTED.match(line)
            inline = None if m else _RUN_INLINE.match(line)
            if inline:
                m = _ON_ERROR_INLINE.search("{" + inline.group(1))
        if m:
            found.add(m.group(2))
    return "fail" if "fail" in found else ("pass" if "pass" in found else None)
