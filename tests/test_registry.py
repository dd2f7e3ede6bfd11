"""The check catalog: ids unique, specs complete, and the level manifest that lets a low-level run
skip importing higher-level check modules kept true."""

from __future__ import annotations

import importlib

from gpucheck.core.levels import Level
from gpucheck.tests_suite.registry import CHECK_MODULES, MODULE_MIN_LEVEL, all_checks


def test_every_check_declares_what_it_is():
    checks = all_checks()
    assert len({c.id for c in checks}) == len(checks)
    for c in checks:
        s = c.spec
        assert s.title and s.detects, c.id
        assert isinstance(s.level, Level)
        assert s.budget_s > 0
        for key, value in s.defaults.items():  # thresholds are data a TOML config can override
            assert isinstance(value, (bool, int, float, str, list)) or value is None, (c.id, key)


def test_module_min_level_manifest_is_true():
    for name in CHECK_MODULES:
        mod = importlib.import_module(name)
        lowest = min(int(c.spec.level) for c in mod.CHECKS)
        assert MODULE_MIN_LEVEL.get(name, 1) == lowest, name


def test_level_filtered_catalog_has_every_check_of_that_level():
    full = all_checks()
    for lv in Level:
        part = {c.id for c in all_checks(max_level=int(lv))}
        assert {c.id for c in full if c.spec.level <= lv} <= part
