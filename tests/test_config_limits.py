"""Config values are range-checked: NaN, inf, a wrong type, a negative or out-of-range number in
any [checks.X] key (every key of every registered check, so a new threshold is covered the day it
is added), [run] or [node] is exit 2 with one line naming the file and the key."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from gpucheck.cli.main import main
from gpucheck.core.config import Config, ConfigError, conventional_limit, kind_of, limit_of, load_config
from gpucheck.tests_suite.registry import all_checks

SNAPS = Path(__file__).parent / "fixtures" / "snapshots"
HEALTHY = str(SNAPS / "h100-healthy.json")
SPECS = [c.spec for c in all_checks()]
KEYS = [(s.id, k) for s in SPECS for k in s.defaults]


def toml_value(v: Any) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return json.dumps(v)


def wrong_values(kind: str) -> list[Any]:
    """NaN, inf and values of the wrong type for a setting of `kind` (its Limit's)."""
    bad: list[Any] = [math.nan, math.inf, -math.inf]
    bad.append({"bool": 1, "int": "x", "real": "x", "str": 1, "list": "x"}[kind])
    if kind == "int":
        bad += [2.5, True]
    if kind == "real":
        bad.append(False)
    if kind == "list":
        bad.append([[1]])
    return bad


def run_with_config(tmp_path: Path, capsys, text: str, *extra: str) -> tuple[int, str, str]:
    cfg = tmp_path / "site.toml"
    cfg.write_text(text)
    rc = main(["run", "--config", str(cfg), "--snapshot", HEALTHY, "--no-history", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_usage_error(rc: int, out: str, err: str, tmp_path: Path, key: str) -> None:
    assert rc == 2 and out == "", (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(tmp_path / "site.toml") in lines[0] and key in lines[0], lines[0]


CASES = [(cid, key, bad) for cid, key in KEYS
         for bad in wrong_values(limit_of(next(s for s in SPECS if s.id == cid), key).kind)]


@pytest.mark.parametrize("cid,key,bad", CASES, ids=[f"{c}.{k}={b!r}" for c, k, b in CASES])
def test_every_check_setting_rejects_nan_inf_and_wrong_types_with_exit_2(tmp_path, capsys, cid, key, bad):
    rc, out, err = run_with_config(tmp_path, capsys, f'[checks."{cid}"]\n{key} = {toml_value(bad)}\n',
                                   "--check", "inventory")
    assert_usage_error(rc, out, err, tmp_path, f"checks.{cid}.{key}")


@pytest.mark.parametrize("cid,key", KEYS, ids=[f"{c}.{k}" for c, k in KEYS])
def test_every_check_setting_takes_its_default_and_declares_a_limit_it_fits(cid, key):
    spec = next(s for s in SPECS if s.id == cid)
    default = spec.defaults[key]
    Config(path=Path("site.toml"), checks={cid: {key: default}}).validate_checks(SPECS)
    limit = limit_of(spec, key)
    assert limit.kind == kind_of(default) or (limit.kind, kind_of(default)) == ("real", "int")
    if limit.kind in ("int", "real"):  # a number below every allowed one is refused
        below = (limit.low - 1) if limit.low is not None else None
        if below is not None:
            with pytest.raises(ConfigError, match=f"checks.{cid}.{key}: expected"):
                Config(path=Path("site.toml"), checks={cid: {key: below}}).validate_checks(SPECS)


@pytest.mark.parametrize("text,key", [
    ("[run]\nskip = [1, 2]\n", "run.skip"),  # a traceback before
    ("[run]\ntimeout = nan\n", "run.timeout"),  # ran with no whole-run limit before
    ("[run]\ntimeout = -5\n", "run.timeout"),
    ("[run]\ntimeout = inf\n", "run.timeout"),
    ("[run]\nlevel = 7\n", "run.level"),
    ("[run]\nlevel = 2.0\n", "run.level"),
    ("[run]\nstate_dir = ''\n", "run.state_dir"),
    ("[node]\nexpected_gpus = -1\n", "node.expected_gpus"),
    ("[node]\nexpected_gpus = nan\n", "node.expected_gpus"),
    ("[checks.ecc]\nvolatile_uncorrected_fail = nan\n", "checks.ecc.volatile_uncorrected_fail"),
    ("[checks.ecc]\nvolatile_uncorrected_fail = -1\n", "checks.ecc.volatile_uncorrected_fail"),
    ("[checks.ecc]\nvolatile_uncorrected_fail = inf\n", "checks.ecc.volatile_uncorrected_fail"),
    ("[checks.clocks]\nthermal_margin_c = -3\n", "checks.clocks.thermal_margin_c"),
    ("[checks.memory-remap]\nretired_pages_fail = 0\n", "checks.memory-remap.retired_pages_fail"),
    ("[checks.\"burn.gemm\"]\nsku_fail_fraction = 1.5\n", "checks.burn.gemm.sku_fail_fraction"),
    ("[checks.burn.gemm]\npeer_warn_fraction = 2\n", "checks.burn.gemm.peer_warn_fraction"),
    ("[checks.\"eud.memtest\"]\nfraction_level2 = 0\n", "checks.eud.memtest.fraction_level2"),
    ("[checks.xid]\nsince = \"@nan\"\n", "checks.xid.since"),
    ("[checks.xid]\nsource = \"carrier-pigeon\"\n", "checks.xid.source"),
    ("[checks.xid]\nignore_xids = [\"79\"]\n", "checks.xid.ignore_xids"),
    ("[checks.pcie]\nreplay_min_window_s = 0\n", "checks.pcie.replay_min_window_s"),
])
def test_the_reproduced_bad_values_are_exit_2_through_gpucheck_run(tmp_path, capsys, text, key):
    rc, out, err = run_with_config(tmp_path, capsys, text, "--check", "ecc")
    assert_usage_error(rc, out, err, tmp_path, key)


def test_a_nan_dbe_threshold_no_longer_makes_a_double_bit_ecc_node_healthy(tmp_path, capsys):
    cfg = tmp_path / "site.toml"
    cfg.write_text("[checks.ecc]\nvolatile_uncorrected_fail = nan\n")
    rc = main(["run", "--config", str(cfg), "--snapshot", str(SNAPS / "h100-ecc-dbe.json"), "--no-history",
               "--check", "ecc"])
    assert rc == 2 and "checks.ecc.volatile_uncorrected_fail" in capsys.readouterr().err


def test_good_values_and_the_dotted_table_form_are_accepted(tmp_path, capsys):
    text = ("[run]\ntimeout = 30\nskip = [\"pcie\"]\n[node]\nexpected_gpus = 8\n"
            "[checks.ecc]\ncorrected_volatile_warn = 5000\n[checks.clocks]\nthermal_margin_c = 7.5\n"
            "[checks.burn.gemm]\nsku_warn_fraction = 0.6\n[checks.\"eud.memtest\"]\nfraction_level2 = 0.2\n")
    rc, out, err = run_with_config(tmp_path, capsys, text, "--check", "ecc", "--json")
    assert rc == 0, err
    cfg = load_config(tmp_path / "site.toml")
    cfg.validate_checks(SPECS)
    assert cfg.check_overrides("burn.gemm") == {"sku_warn_fraction": 0.6}
    assert cfg.check_overrides("eud.memtest") == {"fraction_level2": 0.2}


def test_the_convention():
    assert conventional_limit("peer_fail_fraction", 0.25).high == 1
    assert conventional_limit("hw_fail_share", 0.05).high == 1
    assert conventional_limit("startup_timeout_s", 120.0).above is True
    assert conventional_limit("duration_s_level2", 30.0).above is True
    assert conventional_limit("crc_rate_warn_per_s", 1.0).above is False  # a rate, not seconds
    assert conventional_limit("files", []).item is None and conventional_limit("blocks", [1, 2]).item == "int"


def test_list_defaults_shows_the_ranges(capsys):
    assert main(["list", "--json", "--defaults"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ecc"]["ranges"]["volatile_uncorrected_fail"] == "an integer >= 0"
    assert rows["burn.gemm"]["ranges"]["sku_warn_fraction"] == "a number from 0 to 1"
