"""The leaf commands of gpucheck's click group, found by walking it (the tests that must cover
every command, the day one is added, take them from here)."""

from __future__ import annotations

from collections.abc import Iterator

import click


def leaf_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """(("nccl", "pairs"), its click.Command) for every command below `group` that is no group."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, (*path, name)
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command
