"""`--level` is checked before anything runs, on every command that takes one (issue 26: `sweep
--level 9` ran `gpucheck run --level 9` on every node, each refused it as a usage error, and the
sweep reported "bad nodes: n[1-2]", exit 1). The commands are found by walking the click commands."""

from __future__ import annotations

import pytest

from gpucheck.cli.main import cli, main

from cli_commands import leaf_commands

HOOKS = (("slurm", "prolog"), ("slurm", "epilog"))  # a hook's usage error is "could not judge": exit 0


WITH_LEVEL = [path for path, command in leaf_commands(cli) if any("--level" in p.opts for p in command.params)]


def test_the_walk_finds_the_commands_with_a_level():
    assert {("sweep",), ("run",), ("slurm", "resume"), ("burn",), ("eud",), ("repro", "check")} <= set(WITH_LEVEL)


@pytest.mark.parametrize("path", WITH_LEVEL, ids=[" ".join(p) for p in WITH_LEVEL])
@pytest.mark.parametrize("level", ["9", "0", "-1", "5", "nan", "99999999999", "fast"])
def test_a_level_that_does_not_exist_is_a_usage_error_before_anything_runs(path, level, capsys, monkeypatch):
    from gpucheck.platform import fanout

    def no_fan_out(*a, **kw):
        raise AssertionError("a node was run")

    monkeypatch.setattr(fanout, "run_nodes", no_fan_out)
    nodes = ["n[1-2]"] if path in (("sweep",), ("slurm", "resume")) else []
    rc = main([*path, *nodes, "--level", level])
    err = capsys.readouterr().err
    assert rc == (0 if path in HOOKS else 2), (path, level, err[-500:])
    assert "--level" in err and "use 1-4" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("level", ["1", "4", "quick", "burn-in"])
def test_the_levels_that_exist_still_parse(level):
    assert main(["sweep", "n1", "--level", level, "--help"]) == 0
