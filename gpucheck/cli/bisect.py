"""`gpucheck bisect`: find the bad node(s) of a failing job's node list with group tests.

See docs/fleet.md. Parse, call, render, exit: the bisection is gpucheck.fleet.bisect (the built-in
test and its reference pairs: gpucheck.fleet.bisect.builtin). Exit codes: 0 no bad node, 1 bad
nodes found, 2 usage error, 3 could not localize (the test is broken, no single bad node explains
the failure, a node's bandwidth had no reference) or stopped by a signal. Text that came from the
nodes or the test (details, evidence, notes) is printed with its control characters made visible.
"""

from __future__ import annotations

import json
import sys

import click

from ..render.console import plain
from .numbers import DURATION, MAX_BUSBW_GBS, MAX_ITERS, MAX_NODES, SIZES, Count, FiniteFloat
from .sweep import _duration, _nodes


def bisect_options(f):
    opts = [
        click.option("--test", "test_cmd", metavar="'COMMAND {nodes}'",
                     help="Group test: a shell command that exits 0 when the group is healthy; {nodes} is the "
                          "group as a node set ({nodes_comma}: comma list, {count}: size)."),
        click.option("--builtin", type=click.Choice(["allreduce"]), default=None,
                     help="Built-in group test: collectives (--ops) with data verification, bandwidth judged "
                          "on reference pairs, plus the bitwise check."),
        click.option("--strategy", type=click.Choice(["binary", "grid"]), default="binary", show_default=True,
                     help="binary: the whole set, then split (fewest rounds; with --parallel 1 fewest tests); "
                          "grid: rows then columns."),
        click.option("--group-size", type=Count(1, MAX_NODES), default=None,
                     help="Nodes one replay needs (grid rows, confirm groups); default sqrt(N) for the grid."),
        click.option("--max-bad", type=Count(1, MAX_NODES), default=None, help="At most this many bad nodes (if known)."),
        click.option("--repeats", type=Count(1, 100), default=1, show_default=True,
                     help="Re-test each suspect this many times (and vote), for flaky tests."),
        click.option("--flake-rate", type=FiniteFloat(0.0, 0.5, max_open=True), default=0.05, show_default=True,
                     help="Assumed rate of wrong test results, for the confidence figure."),
        click.option("--parallel", type=Count(0, MAX_NODES), default=0, show_default=True,
                     help="Most tests at once (0: every disjoint group of a round; 1: one test a round, "
                          "generalized binary splitting)."),
        click.option("--test-timeout", "test_timeout_text", type=DURATION, default="30m", show_default=True, metavar="DURATION",
                     help="Per-test time limit; a test past it fails (every test past it: the test is broken)."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (rounds go to stderr)."),
        click.option("--dry-run", is_flag=True, help="Show the plan; run nothing."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def builtin_options(f):
    opts = [
        click.option("--launcher", default=None, metavar="TEMPLATE",
                     help="builtin: how to start a rank on a host ({host}, {addr}, {cmd}/{qcmd}; default ssh; 'srun')."),
        click.option("--addr", "addrs", multiple=True, metavar="HOST=ADDR", help="builtin: a host's rendezvous address."),
        click.option("--program", default="gpucheck", show_default=True, help="builtin: how hosts start gpucheck."),
        click.option("--ops", default="all_gather,all_reduce", show_default=True,
                     help="builtin: collectives, each verified and judged by its busbw."),
        click.option("--sizes", "sizes_text", type=SIZES, default="16M", show_default=True, help="builtin: message sizes."),
        click.option("--iters", type=Count(1, MAX_ITERS), default=5, show_default=True),
        click.option("--warmup", type=Count(0, MAX_ITERS), default=1, show_default=True),
        click.option("--timeout", "coll_timeout_text", type=DURATION, default="30s", show_default=True, metavar="DURATION",
                     help="builtin: per-collective timeout (a hang past it fails the group)."),
        click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True),
        click.option("--ifname", default=None, metavar="IFACE",
                     help="builtin: network interface (default: the one that routes to the other hosts)."),
        click.option("--slow-limit", type=FiniteFloat(0.0, 1.0, min_open=True), default=0.5, show_default=True,
                     help="builtin: a pair below this fraction of its round's reference busbw is slow."),
        click.option("--min-busbw", type=FiniteFloat(min=0.0, max=MAX_BUSBW_GBS, min_open=True), default=None,
                     help="builtin: every measurement below this bus bandwidth (GB/s) fails."),
        click.option("--bitwise/--no-bitwise", default=True, show_default=True,
                     help="builtin: also run the bitwise reproducibility check on every node."),
        click.option("--bitwise-arg", "bitwise_args", multiple=True, metavar="ARG",
                     help="builtin: extra `gpucheck run` argument for the bitwise check (e.g. --device)."),
        click.option("--force", is_flag=True,
                     help="builtin: load GPUs that a job is using (passed to `nccl run` and the bitwise check)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command("bisect")
@click.argument("nodeset")
@bisect_options
@builtin_options
def bisect_command(nodeset, test_cmd, builtin, strategy, group_size, max_bad, repeats, flake_rate, parallel,
                   test_timeout_text, as_json, dry_run, **builtin_kw) -> int:
    """Find the bad node(s) of a failing job's NODESET with group tests.

    Exit 0 when no bad node is found, 1 when some are (printed as a node set), 2 on usage
    errors, 3 when the tests could not localize a fault (the test is broken, no single bad node
    explains the failure, a node's bandwidth had no reference) or SIGTERM/SIGINT stopped them.
    """
    from ..fleet import bisect as B
    from ..platform.processes import stop_on_signals

    nodes = _nodes(nodeset)
    if bool(test_cmd) == bool(builtin):
        raise click.UsageError("give exactly one of --test 'COMMAND {nodes}' and --builtin allreduce")
    min_group = 2 if builtin else 1
    deadline = _duration(test_timeout_text, "--test-timeout")
    if test_cmd:
        try:
            test = B.CommandTest(test_cmd, timeout_s=deadline)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--test") from None
        screen, command = None, test_cmd
    else:
        test, screen = _builtin_test(nodes, deadline=deadline, repeats=repeats, flake_rate=flake_rate, **builtin_kw)
        command = test.command(nodes[:2])
    if dry_run:
        for line in B.plan_text(nodes, strategy=strategy, group_size=group_size, min_group=min_group,
                                repeats=repeats, max_bad=max_bad, parallel=parallel, pairs_first=bool(builtin)):
            click.echo(line)
        return 0
    out = sys.stderr if as_json else sys.stdout
    with stop_on_signals():  # SIGTERM/SIGINT: stop the running tests, print the rounds so far, exit 3
        try:
            result = B.bisect(nodes, test, strategy=strategy, group_size=group_size, min_group=min_group,
                              max_bad=max_bad, repeats=repeats, flake_rate=flake_rate, parallel=parallel,
                              on_round=lambda n, recs: _print_round(n, recs, out), screen=screen, command=command)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        return _print_bisect(result, as_json)


def _print_round(number: int, records, out) -> None:
    failed = [r for r in records if not r.healthy]
    shown = failed + [r for r in records if r.healthy][: max(0, 12 - len(failed))]
    print(f"round {number} ({records[0].phase}): {len(records)} test(s), {len(failed)} failed", file=out, flush=True)
    for r in shown:
        subject = f" [{plain(r.subject)}]" if r.subject else ""
        state = "ok  " if r.healthy else "FAIL"
        phase = f" ({r.phase})" if r.phase != records[0].phase else ""
        detail = f": {plain(r.detail)}" if r.detail else ""
        print(f"  {state} {r.label}{subject}{phase} ({r.duration_s:.1f} s){detail}",
              file=out, flush=True)
    if len(shown) < len(records):
        print(f"  ... {len(records) - len(shown)} more passed", file=out, flush=True)


def _print_bisect(result, as_json: bool) -> int:
    from ..platform.nodeset import fold

    doc = result.to_dict()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return doc["exit_code"]
    _print_bandwidth(result.bandwidth)
    for s in result.bad:
        click.echo(f"BAD {s.node}: {s.failures}/{s.runs} re-tests failed, confidence {s.confidence:.3f}")
        for line in s.evidence:
            click.echo(f"    {plain(line)}")
    for s in result.cleared:
        click.echo(f"cleared {s.node}: {s.failures}/{s.runs} re-tests failed (a wrong or flaky result in the search)")
    for note in result.notes:
        click.echo(f"note: {plain(note)}")
    click.echo(f"{result.tests} test(s) in {result.rounds} round(s) ({result.search_tests} test(s) in "
               f"{result.search_rounds} round(s) to search, the rest to confirm), {result.duration_s:.1f} s")
    if result.interrupted:
        click.echo(f"interrupted by {result.interrupted}: the bisection did not finish, no node was judged")
    elif result.broken:
        click.echo(f"the group test is broken: {plain(result.broken)}")
        click.echo(f"command: {plain(result.command)}")
        click.echo("no node was judged")
    elif not result.verified:
        found = f" (found failing: {fold(result.bad_nodes)})" if result.bad else ""
        click.echo(f"no single bad node explains the failure: the nodes not reported bad do not pass together"
                   f"{found}; could not localize the fault")
    elif result.bad:
        click.echo(f"bad nodes: {fold(result.bad_nodes)}")
    elif result.unexplained:
        click.echo(f"no bad node found, but the failure is not explained: {plain(result.unexplained)}")
    elif result.unjudged:
        click.echo(f"bandwidth not judged for {fold(result.unjudged)}: no reference pair (give --min-busbw)")
    else:
        click.echo("no bad node: the group test passes")
    return doc["exit_code"]


def _print_bandwidth(bw) -> None:
    """The reference the pairs were judged against (the first round's, per collective)."""
    if not bw:
        return
    first: dict[str, dict] = {}
    for r in bw["references"]:
        first.setdefault(r["op"], r)
    for op, r in first.items():
        value = "none" if r["busbw_gbs"] is None else f"{r['busbw_gbs']:.4g} GB/s busbw"
        click.echo(f"bandwidth reference {op}: {value} ({r['how']})")
    if first:
        click.echo(f"pairs are compared only with pairs measured as many at once; a pair below "
                   f"{bw['slow_limit']:g} x the reference is slow")


def _builtin_test(nodes, *, deadline, repeats, flake_rate, launcher, addrs, program, ops, sizes_text, iters, warmup,
                  coll_timeout_text, backend, ifname, slow_limit, min_busbw, bitwise, bitwise_args, force):
    from ..fleet.bisect.builtin import make_builtin
    from ..nccl.bandwidth import parse_ops, parse_sizes
    from .nccl import launcher_of

    try:
        sizes = parse_sizes(sizes_text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sizes") from None
    try:
        op_list = parse_ops(ops)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--ops") from None
    lau = launcher_of(nodes, launcher, addrs, program)
    return make_builtin(lau, ops=op_list, sizes=sizes, iters=iters, warmup=warmup,
                        timeout_s=_duration(coll_timeout_text, "--timeout"), backend=backend, ifname=ifname,
                        deadline_s=deadline, slow_limit=slow_limit, min_busbw=min_busbw, bitwise=bitwise,
                        bitwise_args=list(bitwise_args), force=force, repeats=repeats, flake_rate=flake_rate)
