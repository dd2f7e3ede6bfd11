"""`gpucheck nccl run` (one node's ranks of a collective test) and `gpucheck nccl pairs NODESET`.

Parse, call, render, exit: the rendezvous policy is gpucheck.nccl.topology, a node's run
gpucheck.nccl.node, the pairs gpucheck.nccl.pairs_run and gpucheck.nccl.pairs."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

import click

from ..core.inject import InjectionError, parse_injection
from .numbers import (DURATION, MAX_BUSBW_GBS, MAX_ITERS, MAX_LOCAL_RANKS, MAX_NODES, MAX_PAIR_ROUNDS, MAX_RANKS,
                      SIZES, Count, FiniteFloat)
from .run import parse_duration

def _usage(msg: str, hint: str | None = None) -> click.BadParameter:
    return click.BadParameter(msg, param_hint=hint)


def parse_corrupt(texts: tuple[str, ...] | list[str], *, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """--inject corrupt:rank=N[,op=..,iter=..,index=..] -> spec dict (None without --inject)."""
    from ..nccl.bandwidth import normalize_op

    if not texts:
        return None
    if len(texts) > 1:
        raise _usage("only one --inject is supported here", "--inject")
    try:
        inj = parse_injection(texts[0])
    except InjectionError as e:
        raise _usage(str(e), "--inject") from None
    if inj.kind != "corrupt":
        raise _usage(f"{inj.text}: only 'corrupt' is honoured by the collective tests", "--inject")
    extra = set(inj.params) - set(keys) - {"op", "iter", "index"}
    if extra:
        raise _usage(f"{inj.text}: unknown parameter(s) {', '.join(sorted(extra))} "
                     f"(use {', '.join(keys)}, op, iter, index)", "--inject")
    out: dict[str, Any] = {"text": inj.text}
    for k, v in inj.params.items():
        out[k] = v
    if "op" in out:
        try:
            out["op"] = normalize_op(str(out["op"]))
        except ValueError as e:
            raise _usage(str(e), "--inject") from None
    for k in ("rank", "iter", "index"):
        if k in out and not isinstance(out[k], int):
            raise _usage(f"{inj.text}: {k} must be an integer", "--inject")
    return out


def _check_corrupt_targets(corrupt: dict[str, Any], ops: list[str], iters: int) -> None:
    """An injection that could never fire is a usage error, not a silent pass."""
    if corrupt.get("op") and corrupt["op"] not in ops:
        raise _usage(f"{corrupt['text']}: {corrupt['op']} is not run (--ops {','.join(ops)})", "--inject")
    if not 0 <= int(corrupt.get("iter", 0)) < iters:
        raise _usage(f"{corrupt['text']}: iter must be 0-{iters - 1} (timed iterations)", "--inject")


def _sweep_options(default_ops: str):
    def deco(f):
        opts = [
            click.option("--ops", default=default_ops, show_default=True,
                         help="Collectives, comma-separated: all_reduce, all_gather, all_to_all."),
            click.option("--sizes", "sizes_text", type=SIZES, default=None,
                         help="Sizes per rank buffer, e.g. 1M,16M or 1M-1G (doubling). Default for run: "
                              "1M-256M on GPUs, 64K,1M on CPUs; for pairs: 64M,256M (nccl), 1M,16M (gloo), "
                              "16M,64M (auto)."),
            click.option("--iters", type=Count(1, MAX_ITERS), default=5, show_default=True,
                         help="Timed iterations per size."),
            click.option("--warmup", type=Count(0, MAX_ITERS), default=1, show_default=True,
                         help="Untimed (but verified) iterations per size."),
            click.option("--timeout", "timeout_text", type=DURATION, default="30s", show_default=True,
                         help="Per collective: past it the rank waited for is named and the test fails."),
            click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True,
                         help="auto: NCCL where CUDA works, else gloo."),
            click.option("--ifname", default=None, metavar="IFACE",
                         help="Network interface for gloo/NCCL sockets (sets GLOO_SOCKET_IFNAME); default: the "
                              "interface that routes to the other hosts."),
            click.option("--nproc-per-node", type=Count(1, MAX_LOCAL_RANKS), default=1, show_default=True,
                         help="Ranks per node (one per GPU)."),
        ]
        for o in reversed(opts):
            f = o(f)
        return f
    return deco


def _sweep(ops: str, sizes_text: str | None) -> tuple[list[str], list[int] | None]:
    from ..nccl.bandwidth import parse_ops, parse_sizes

    try:
        op_list = parse_ops(ops)
    except ValueError as e:
        raise _usage(str(e), "--ops") from None
    sizes = None
    if sizes_text:
        try:
            sizes = parse_sizes(sizes_text)
        except ValueError as e:
            raise _usage(str(e), "--sizes") from None
    return op_list, sizes


def _durations(**texts: str | None) -> dict[str, float | None]:
    out = {}
    for name, text in texts.items():
        try:
            out[name] = parse_duration(text) if text else None
        except click.BadParameter as e:
            raise _usage(str(e.message), f"--{name.replace('_', '-')}") from None
    return out


@click.group("nccl")
def nccl_group() -> None:
    """Collective-communication tests (all-reduce, all-gather, all-to-all) with busbw and data
    verification: `run` is one node's part of a test, `pairs` tests node pairs across a cluster."""


@nccl_group.command("run")
@click.option("--rank", type=Count(0, MAX_RANKS - 1), default=None, help="This process's rank (else RANK or SLURM_PROCID).")
@click.option("--world-size", type=Count(1, MAX_RANKS), default=None, help="Number of ranks (else WORLD_SIZE or SLURM_NTASKS).")
@click.option("--local-rank", type=Count(0, MAX_LOCAL_RANKS - 1), default=None, help="GPU index of this rank (else LOCAL_RANK/SLURM_LOCALID).")
@click.option("--node-rank", type=Count(0, MAX_NODES - 1), default=None, help="With --nproc-per-node: this node's index.")
@click.option("--nnodes", type=Count(1, MAX_NODES), default=None, help="With --nproc-per-node: number of nodes.")
@click.option("--master-addr", default=None, help="Rendezvous host (rank 0's node; else MASTER_ADDR or the "
                                                  "first node of SLURM_NODELIST).")
@click.option("--master-port", default=None,
              help="Rendezvous port; on rank 0, 0 or none binds a free port and prints it; 'stdin' reads it.")
@click.option("--host-label", default=None, help="This host's name in messages (default: SLURMD_NODENAME or hostname).")
@click.option("--peer-hosts", default=None, help="Host of each node rank, comma-separated (for messages).")
@click.option("--peer-addrs", default=None,
              help="Address of each node rank, comma-separated (to pick the interface without --ifname).")
@click.option("--inject", "injections", multiple=True, metavar="SPEC",
              help="corrupt:rank=N[,op=OP,iter=K,index=I]: rank N corrupts one element of its output once.")
@click.option("--deadline", "deadline_text", default=None,
              help="Hard limit for the whole run (default: estimated from the sweep).")
@click.option("--force", is_flag=True,
              help="Start on GPUs that a job is using (NVML lists its processes) instead of refusing (exit 3).")
@click.option("--json", "as_json", is_flag=True,
              help="JSON lines even on a terminal (without a terminal they are the default).")
@click.option("--session-stdin", is_flag=True,
              help="Standard input is the session of the launcher that started this command (what `nccl pairs` "
                   "and `bisect --builtin` pass): an end-of-file there stops every rank (exit 3).")
@_sweep_options("all_reduce")
def run_command(rank, world_size, local_rank, node_rank, nnodes, master_addr, master_port, host_label,
                peer_hosts, peer_addrs, injections, deadline_text, force, as_json, session_stdin, ops, sizes_text,
                iters, warmup, timeout_text, backend, ifname, nproc_per_node) -> int:
    """Run this node's ranks of a collective test; on a terminal print nccl-tests' table, else
    (or with --json) one JSON line per event.

    Events: {"event": "listening", "port": P} (rank 0, once the rendezvous store is up),
    {"event": "ready"} per rank, {"event": "warning", ...} for what went wrong without deciding
    the result, and {"event": "result", ...} per rank with the measurements (per collective
    and size: time, algbw, busbw, per-rank times, verification errors) or the failure ("timeout
    waiting for rank N on host H", "data corruption in OP on rank N ...", "the rendezvous
    never formed: ..."). A GPU that a job is using is not loaded: every rank of this invocation
    reports an error (failure kind "busy") naming the processes, and the exit code is 3, unless
    --force. With --session-stdin, an end-of-file on standard input (the launcher's session
    ended) stops every rank: each reports an error, "the session that started these ranks
    ended". Exit 0 verified, 1 fail, 2 usage, 3 could not judge.

    Without --rank/--world-size, --node-rank/--nnodes, torchrun or srun: this node alone, one
    rank per local GPU (nccl-tests' -g N with all of them), or --nproc-per-node ranks.
    """
    from ..nccl import node as N
    from ..nccl.topology import TopologyError, resolve_topology

    opts = dict(rank=rank, world_size=world_size, local_rank=local_rank, node_rank=node_rank, nnodes=nnodes,
                master_addr=master_addr, master_port=master_port, nproc_per_node=nproc_per_node,
                local_gpus=lambda: _local_gpus(backend), nproc_given=_given("nproc_per_node"))
    try:
        topo = resolve_topology(opts, os.environ)
    except TopologyError as e:
        raise (_usage(str(e), e.hint) if e.hint else click.UsageError(str(e))) from None
    op_list, sizes = _sweep(ops, sizes_text)
    sizes = sizes or _default_sizes(backend)
    times = _durations(timeout=timeout_text, deadline=deadline_text)
    corrupt = parse_corrupt(injections, keys=("rank",))
    if corrupt is not None:
        corrupt.setdefault("rank", topo.ranks[0])
        if not 0 <= int(corrupt["rank"]) < topo.world:
            raise _usage(f"--inject {corrupt['text']}: no rank {corrupt['rank']} in a world of {topo.world}")
        _check_corrupt_targets(corrupt, op_list, iters)
    cfg = N.NodeSettings(ops=op_list, sizes=sizes, iters=iters, warmup=warmup, timeout_s=times["timeout"],
                         backend=backend, deadline_s=times["deadline"], ifname=ifname,
                         host_label=host_label or os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                         peer_hosts=[h for h in (peer_hosts or "").split(",") if h],
                         peer_addrs=[h for h in (peer_addrs or "").split(",") if h], corrupt=corrupt, force=force)
    stdin = N.StdinWatch(want_port=topo.master_port == "stdin" and 0 not in topo.ranks, session=session_stdin).start()
    lock = threading.Lock()
    from ..render.nccl_table import RunView

    view = None if as_json or not sys.stdout.isatty() else RunView()

    def emit(ev: dict[str, Any]) -> None:
        with lock:
            if view is not None:
                view.event(ev)
                return
            sys.stdout.write(json.dumps(ev, separators=(",", ":")) + "\n")
            sys.stdout.flush()

    return N.run_node(topo, cfg, emit=emit, note=lambda line: click.echo(line, err=True),
                      port_source=stdin.port if stdin.want_port else None,
                      on_finish=None if view is None else view.finish,
                      session_ended=stdin.ended if session_stdin else None)


def _given(param: str) -> bool:
    """Whether the command line gave `param` (not its default)."""
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(param) is ParameterSource.COMMANDLINE


def _local_gpus(backend: str) -> tuple[int, str]:
    """How many GPUs this node has for a test on it alone (NVML's count), and how that reads."""
    if backend == "gloo":
        return 0, "--backend gloo runs on CPUs: no GPU count to go by"
    from ..platform.telemetry.nvml import NvmlSession

    with NvmlSession() as nvml:
        count = nvml.device_count() if nvml.ok else None
        if count is None:
            return 0, f"no GPU count (NVML: {nvml.error.kind if nvml.error else 'nvmlDeviceGetCount failed'})"
    return count, f"{count} GPU(s) on this node"


def _default_sizes(backend: str) -> list[int]:
    from ..nccl.bandwidth import parse_sizes
    from ..nccl.node import uses_gpus

    return parse_sizes("1M-256M" if uses_gpus(backend) else "64K,1M")


# -- pairs --------------------------------------------------------------------------------------
def parse_nodeset(text: str, what: str = "NODESET") -> list[str]:
    """gpucheck.platform.nodeset's parse (names checked, size bounded); a bad one is a usage error."""
    from ..platform.nodeset import NodeSetError, parse_nodeset as parse

    try:
        return parse(text)
    except NodeSetError as e:
        raise _usage(str(e), what) from None


def launcher_of(nodes: list[str], launcher: str | None, addrs: tuple[str, ...], program: str):
    """The --launcher/--addr/--program options as a checked gpucheck.nccl.launch.Launcher."""
    import shlex

    from ..nccl import launch as L

    try:
        addr_map = L.parse_addrs(addrs)
    except ValueError as e:
        raise _usage(str(e), "--addr") from None
    unknown = [h for h in addr_map if h not in nodes]
    if unknown:
        raise _usage(f"{', '.join(unknown)} not in the node set", "--addr")
    lau = L.Launcher(template=launcher or L.DEFAULT_SSH, addrs=addr_map, program=shlex.split(program))
    try:
        lau.validate()
    except ValueError as e:
        raise _usage(str(e), "--launcher") from None
    return lau


@nccl_group.command("pairs")
@click.argument("nodeset")
@click.option("--strategy", type=click.Choice(["ring", "random", "suspects"]), default="random", show_default=True)
@click.option("--rounds", type=Count(1, MAX_PAIR_ROUNDS), default=3, show_default=True,
              help="random: rounds of pairings; suspects: good partners per suspect.")
@click.option("--seed", type=Count(0, 2**32 - 1), default=None, help="Seed of the random pairings (reproducible runs).")
@click.option("--good", "good_text", default=None, help="Known-good nodes (suspects strategy).")
@click.option("--suspects", "suspects_text", default=None, help="Nodes to confirm (suspects strategy; default: "
                                                               "NODESET minus --good).")
@click.option("--launcher", default=None, metavar="TEMPLATE",
              help="Per-host argv template with {host} {addr} and {cmd} or {qcmd}; 'srun' inside a Slurm "
                   "allocation. Default: 'ssh -o BatchMode=yes -o ConnectTimeout=10 -- {host} {qcmd}'.")
@click.option("--addr", "addrs", multiple=True, metavar="HOST=ADDR",
              help="Rendezvous address of a host (repeatable; default: the host name).")
@click.option("--program", default="gpucheck", show_default=True,
              help="How the hosts start gpucheck, e.g. 'python3 -m gpucheck.cli.main'.")
@click.option("--pair-timeout", "pair_timeout_text", type=DURATION, default=None,
              help="Hard limit for one pair's test (default: estimated from the sweep).")
@click.option("--slow-limit", type=FiniteFloat(0.0, 1.0, min_open=True), default=0.7, show_default=True,
              help="A pair is slow below this fraction of the reference busbw.")
@click.option("--min-busbw", type=FiniteFloat(min=0.0, max=MAX_BUSBW_GBS, min_open=True), default=None,
              help="Expected busbw in GB/s (default reference: the median of the pairs measured as many at once).")
@click.option("--fanout", type=Count(1, MAX_NODES), default=64, show_default=True,
              help="Pairs running at once.")
@click.option("--inject", "injections", multiple=True, metavar="SPEC",
              help="corrupt:host=H[,op=..]: H's rank corrupts one element in each of its pairs.")
@click.option("--force", is_flag=True,
              help="Passed to `gpucheck nccl run` on the hosts: load GPUs that a job is using.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_sweep_options("all_gather,all_reduce")
def pairs_command(nodeset, strategy, rounds, seed, good_text, suspects_text, launcher, addrs, program,
                  pair_timeout_text, slow_limit, min_busbw, fanout, injections, force, as_json, ops, sizes_text,
                  iters, warmup, timeout_text, backend, ifname, nproc_per_node) -> int:
    """Two-node collectives over pairs of NODESET; name the nodes that are bad.

    Every pair runs `gpucheck nccl run` on its two nodes (over ssh, a launcher template, or srun),
    with the rendezvous on the pair's first node. Output: a per-pair table, a per-node score and
    the nodes judged bad with their evidence. Exit 1 when a node is bad, suspect or unreachable,
    0 when all are healthy, 2 on usage errors, 3 when nothing could be measured, every pair
    failed the same way (the test or the setup is broken), a node had no pair measured, a pair's
    bandwidth had no reference, or SIGTERM/SIGINT stopped it (the pairs measured before are reported).
    """
    from ..nccl import launch as L
    from ..nccl import pairs as P
    from ..nccl import pairs_run as R
    from ..nccl.bandwidth import parse_sizes
    from ..nccl.node import estimate_deadline
    from ..platform.processes import Interrupted, stop_on_signals

    nodes = parse_nodeset(nodeset)
    if len(nodes) < 2:
        raise _usage(f"{nodeset!r} has {len(nodes)} node(s); pairs need at least 2", "NODESET")
    good = parse_nodeset(good_text, "--good") if good_text else []
    suspects = parse_nodeset(suspects_text, "--suspects") if suspects_text else []
    op_list, sizes = _sweep(ops, sizes_text)
    # The hosts' kind is not known here: the same sizes for every pair, by the backend asked for.
    sizes = sizes or parse_sizes({"nccl": "64M,256M", "gloo": "1M,16M"}.get(backend, "16M,64M"))
    times = _durations(timeout=timeout_text, pair_timeout=pair_timeout_text)
    lau = launcher_of(nodes, launcher, addrs, program)
    corrupt = parse_corrupt(injections, keys=("host",))
    if corrupt is not None:
        if corrupt.get("host") not in nodes:
            raise _usage(f"--inject {corrupt['text']}: host= must name one of the nodes", "--inject")
        _check_corrupt_targets(corrupt, op_list, iters)
    try:
        plan = R.plan_rounds(strategy, nodes, rounds=rounds, seed=seed, good=good, suspects=suspects)
    except ValueError as e:
        raise _usage(*e.args) from None
    args = L.run_args(ops=op_list, sizes=sizes, iters=iters, warmup=warmup, timeout_s=times["timeout"],
                      backend=backend, ifname=ifname, nproc_per_node=nproc_per_node, force=force)
    deadline = times["pair_timeout"] or estimate_deadline(op_list, sizes, iters, warmup, times["timeout"], backend) + 30
    with stop_on_signals():  # SIGTERM/SIGINT: stop every pair's processes, print what was measured
        interrupted = None
        try:
            outcomes = R.run_plan(plan, lau, args, deadline_s=deadline, fanout=fanout, ops=op_list, corrupt=corrupt,
                                  nproc_per_node=nproc_per_node, progress=None if as_json else _progress)
        except Interrupted as e:
            outcomes, interrupted = list(e.partial or []), e.signame
        judgement = P.judge_pairs(outcomes, nodes, slow_limit=slow_limit, min_busbw=min_busbw)
        code = R.exit_code(judgement, interrupted)
        doc = R.pairs_document(judgement, nodes=nodes, strategy=strategy, plan=plan, ops=op_list, code=code,
                               injected=[corrupt["text"]] if corrupt else [], interrupted=interrupted,
                               command=L.describe(lau, list(plan[0][0]) if plan else nodes[:2], args))
        if as_json:
            click.echo(json.dumps(doc, indent=2))
        else:
            print_pairs(doc)
    return code


def _progress(msg: str) -> None:
    click.echo(msg, err=True)


def print_pairs(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from ..render.console import make_console

    con = make_console(sys.stdout)  # no markup, no emoji: node names and summaries print as they are
    t = Table(title=f"{', '.join(doc['ops'])} per pair", header_style="bold")
    for col in ("round", "pair", f"{doc['op']} busbw GB/s", "algbw GB/s", "x ref", "verdict", "note"):
        t.add_column(col, overflow="fold")
    for p in doc["pairs"]:
        note = "" if p["verdict"] == "ok" else ("slow: " + ", ".join(p["slow_ops"])) if p["verdict"] == "slow" \
            else p["summary"] if p["verdict"] != "unjudged" else "no reference: bandwidth not judged"
        t.add_row(str(p["round"]), " + ".join(p["nodes"]),
                  "-" if p["busbw_gbs"] is None else f"{p['busbw_gbs']:.4g}",
                  "-" if p["algbw_gbs"] is None else f"{p['algbw_gbs']:.4g}",
                  "-" if p["relative"] is None else f"{p['relative']:.2f}", p["verdict"].upper(), note)
    con.print(t)
    n = Table(title="per node", header_style="bold")
    for col in ("node", "pairs", "bad", "score", "verdict", "evidence"):
        n.add_column(col, overflow="fold")
    for s in doc["node_scores"]:
        n.add_row(s["node"], str(s["pairs"]), str(s["bad_pairs"]), "-" if s["score"] is None else f"{s['score']:.2f}",
                  s["verdict"].upper(), "; ".join(s["evidence"]) if s["verdict"] != "ok" else "")
    con.print(n)
    _print_pairs_verdict(con, doc)


def _print_pairs_verdict(con, doc: dict[str, Any]) -> None:
    for r in doc["references"] or [{"op": doc["op"], "busbw_gbs": None, "how": doc["reference"]}]:
        ref = "-" if r["busbw_gbs"] is None else f"{r['busbw_gbs']:.4g} GB/s"
        con.print(f"reference {r['op']}: {ref} ({r['how']})")
    if doc["broken"]:
        con.print(f"the test is broken: {doc['broken']}; no node is blamed")
        con.print(f"command (first pair, first host): {doc['command']}")
    for key, label in (("bad", "bad nodes"), ("unreachable", "unreachable nodes"), ("suspects", "suspect nodes")):
        if doc[key]:
            con.print(f"{label}: " + ",".join(doc[key]))
    if doc.get("unmeasured") and not doc["broken"]:
        con.print("not measured (no pair of theirs could be measured; could not judge them): "
                  + ",".join(doc["unmeasured"]))
    if doc["unjudged_pairs"] and not doc["broken"]:
        con.print(f"{doc['unjudged_pairs']} pair(s) without a bandwidth reference: their bandwidth was not judged "
                  "(give --min-busbw)")
    if not (doc["bad"] or doc["suspects"] or doc["unreachable"] or doc["interrupted"] or doc["exit_code"]):
        con.print("no bad node")
    if doc["interrupted"]:
        con.print(f"interrupted by {doc['interrupted']}: {len(doc['pairs'])} of {doc['pairs_planned']} pair(s) "
                  "measured; the judgement above covers only those")
    con.print(f"exit code {doc['exit_code']}")
