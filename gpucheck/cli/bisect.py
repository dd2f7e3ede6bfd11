"""`gpucheck bisect`: find the bad node(s) of a failing job's node list with group tests.

See docs/fleet.md. The logic lives in gpucheck.fleet.bisect; this module parses options, prints
the rounds and the result, and maps it to an exit code (0 no bad node, 1 bad nodes found,
2 usage error, 3 could not localize or stopped by a signal).
"""

from __future__ import annotations

import json
import sys

import click

from .numbers import FiniteFloat
from .sweep import _duration, _nodes

@click.command("bisect")
@click.argument("nodeset")
@click.option("--test", "test_cmd", metavar="'COMMAND {nodes}'",
              help="Group test: a shell command that exits 0 when the group is healthy; {nodes} is the "
                   "group as a node set ({nodes_comma}: comma list, {count}: size).")
@click.option("--builtin", type=click.Choice(["allreduce"]), default=None,
              help="Built-in group test: all-reduce with data verification plus the bitwise check.")
@click.option("--strategy", type=click.Choice(["binary", "grid"]), default="binary", show_default=True,
              help="binary: fewest tests (one a round); grid: rows then columns, groups in parallel.")
@click.option("--group-size", type=click.IntRange(min=1), default=None,
              help="Nodes one replay needs (grid rows, confirm groups); default sqrt(N) for the grid.")
@click.option("--max-bad", type=click.IntRange(min=1), default=None, help="At most this many bad nodes (if known).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Re-test each suspect this many times (and vote), for flaky tests.")
@click.option("--flake-rate", type=FiniteFloat(0.0, 0.5, max_open=True), default=0.05, show_default=True,
              help="Assumed rate of wrong test results, for the confidence figure.")
@click.option("--parallel", type=click.IntRange(min=0), default=0, show_default=True,
              help="Most tests at once (0: every disjoint group of a round).")
@click.option("--test-timeout", "test_timeout_text", default="30m", show_default=True, metavar="DURATION",
              help="Per-test time limit; a test past it fails.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (rounds go to stderr).")
@click.option("--dry-run", is_flag=True, help="Show the plan; run nothing.")
@click.option("--launcher", default=None, metavar="TEMPLATE",
              help="allreduce: how to start a rank on a host ({host}, {addr}, {cmd}/{qcmd}; default ssh; 'srun').")
@click.option("--addr", "addrs", multiple=True, metavar="HOST=ADDR", help="allreduce: a host's rendezvous address.")
@click.option("--program", default="gpucheck", show_default=True, help="allreduce: how hosts start gpucheck.")
@click.option("--sizes", "sizes_text", default="16M", show_default=True, help="allreduce: message sizes.")
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--timeout", "coll_timeout_text", default="30s", show_default=True, metavar="DURATION",
              help="allreduce: per-collective timeout (a hang past it fails the group).")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True)
@click.option("--ifname", default=None, metavar="IFACE", help="allreduce: network interface for the rendezvous.")
@click.option("--slow-limit", type=FiniteFloat(0.0, 1.0, min_open=True), default=0.5, show_default=True,
              help="allreduce: a group below this fraction of the best group's bus bandwidth fails.")
@click.option("--min-busbw", type=FiniteFloat(min=0.0, min_open=True), default=None,
              help="allreduce: a group below this bus bandwidth (GB/s) fails.")
@click.option("--bitwise/--no-bitwise", default=True, show_default=True,
              help="allreduce: also run the bitwise reproducibility check on every node.")
@click.option("--bitwise-arg", "bitwise_args", multiple=True, metavar="ARG",
              help="allreduce: extra `gpucheck run` argument for the bitwise check (e.g. --device).")
def bisect_command(nodeset, test_cmd, builtin, strategy, group_size, max_bad, repeats, flake_rate, parallel,
                   test_timeout_text, as_json, dry_run, launcher, addrs, program, sizes_text, iters, warmup,
                   coll_timeout_text, backend, ifname, slow_limit, min_busbw, bitwise, bitwise_args) -> int:
    """Find the bad node(s) of a failing job's NODESET with group tests.

    Exit 0 when no bad node is found, 1 when some are (printed as a node set), 2 on usage
    errors, 3 when the tests could not localize a fault or SIGTERM/SIGINT stopped them.
    """
    from ..fleet import bisect as B
    from ..processes import stop_on_signals

    nodes = _nodes(nodeset)
    if bool(test_cmd) == bool(builtin):
        raise click.UsageError("give exactly one of --test 'COMMAND {nodes}' and --builtin allreduce")
    min_group = 2 if builtin else 1
    if test_cmd:
        try:
            test = B.CommandTest(test_cmd, timeout_s=_duration(test_timeout_text, "--test-timeout"))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--test") from None
    else:
        test = _allreduce_test(nodes, launcher=launcher, addrs=addrs, program=program, sizes_text=sizes_text,
                               iters=iters, warmup=warmup, coll_timeout_text=coll_timeout_text, backend=backend,
                               ifname=ifname, slow_limit=slow_limit, min_busbw=min_busbw, bitwise=bitwise,
                               bitwise_args=bitwise_args, test_timeout_text=test_timeout_text)
    if dry_run:
        for line in B.plan_text(nodes, strategy=strategy, group_size=group_size, min_group=min_group,
                                repeats=repeats, max_bad=max_bad):
            click.echo(line)
        return 0

    out = sys.stderr if as_json else sys.stdout

    def on_round(number: int, records) -> None:
        failed = [r for r in records if not r.healthy]
        shown = failed + [r for r in records if r.healthy][: max(0, 12 - len(failed))]
        print(f"round {number} ({records[0].phase}): {len(records)} test(s), {len(failed)} failed", file=out,
              flush=True)
        for r in shown:
            subject = f" [{r.subject}]" if r.subject else ""
            state = "ok  " if r.healthy else "FAIL"
            print(f"  {state} {r.label}{subject} ({r.duration_s:.1f} s)" + (f": {r.detail}" if r.detail else ""),
                  file=out, flush=True)
        if len(shown) < len(records):
            print(f"  ... {len(records) - len(shown)} more passed", file=out, flush=True)

    with stop_on_signals():  # SIGTERM/SIGINT: stop the running tests, print the rounds so far, exit 3
        try:
            result = B.bisect(nodes, test, strategy=strategy, group_size=group_size, min_group=min_group,
                              max_bad=max_bad, repeats=repeats, flake_rate=flake_rate, parallel=parallel,
                              on_round=on_round)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        return _print_bisect(result, as_json)


def _print_bisect(result, as_json: bool) -> int:
    from ..fleet.nodeset import fold

    doc = result.to_dict()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return doc["exit_code"]
    for s in result.bad:
        click.echo(f"BAD {s.node}: {s.failures}/{s.runs} re-tests failed, confidence {s.confidence:.3f}")
        for line in s.evidence:
            click.echo(f"    {line}")
    for s in result.cleared:
        click.echo(f"cleared {s.node}: {s.failures}/{s.runs} re-tests failed (a wrong or flaky result in the search)")
    for note in result.notes:
        click.echo(f"note: {note}")
    click.echo(f"{result.tests} test(s) in {result.rounds} round(s) ({result.search_tests} test(s) in "
               f"{result.search_rounds} round(s) to search, the rest to confirm), {result.duration_s:.1f} s")
    if result.interrupted:
        click.echo(f"interrupted by {result.interrupted}: the bisection did not finish, no node was judged")
    elif result.bad:
        click.echo(f"bad nodes: {fold(result.bad_nodes)}")
    elif not result.verified:
        click.echo("no single bad node found, but the nodes do not pass together: could not localize the fault")
    else:
        click.echo("no bad node: the group test passes")
    return doc["exit_code"]


def _allreduce_test(nodes, *, launcher, addrs, program, sizes_text, iters, warmup, coll_timeout_text, backend,
                    ifname, slow_limit, min_busbw, bitwise, bitwise_args, test_timeout_text):
    import shlex

    from ..fleet import bisect as B
    from ..nccl import launch as L
    from ..nccl.bandwidth import parse_sizes

    try:
        sizes = parse_sizes(sizes_text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sizes") from None
    try:
        addr_map = L.parse_addrs(addrs)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--addr") from None
    unknown = [h for h in addr_map if h not in nodes]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)} not in the node set", param_hint="--addr")
    lau = L.Launcher(template=launcher or L.DEFAULT_SSH, addrs=addr_map, program=shlex.split(program))
    try:
        lau.validate()
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--launcher") from None
    coll_timeout = _duration(coll_timeout_text, "--timeout")
    args = L.run_args(ops=["all_reduce"], sizes=sizes, iters=iters, warmup=warmup, timeout_s=coll_timeout,
                      backend=backend, ifname=ifname)
    deadline = _duration(test_timeout_text, "--test-timeout")
    probe = B.BitwiseProbe(lau, extra_args=list(bitwise_args), timeout_s=deadline) if bitwise else None
    return B.AllReduceTest(lau, args, deadline_s=deadline, slow_limit=slow_limit, min_busbw=min_busbw,
                           bitwise=probe)
