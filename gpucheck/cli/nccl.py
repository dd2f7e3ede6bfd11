"""`gpucheck nccl run` (one node's ranks of a collective test) and `gpucheck nccl pairs NODESET`."""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import click

from .numbers import FiniteFloat
from .run import parse_duration

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NO_JUDGEMENT = 0, 1, 2, 3


def _usage(msg: str, hint: str | None = None) -> click.BadParameter:
    return click.BadParameter(msg, param_hint=hint)


# -- topology: who am I in the job ---------------------------------------------------------------
@dataclass
class Topology:
    ranks: list[int]  # global ranks this invocation runs
    local_ranks: list[int]  # CUDA device index of each
    world: int
    master_addr: str
    master_port: int | str | None  # int, "stdin", or None (rank 0 binds a free port)
    agent_store: bool = False
    source: str = "options"


def _int(v: Any, what: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise _usage(f"{what} must be an integer, not {v!r}") from None


def first_slurm_node(nodelist: str) -> str:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError

    try:
        ns = NodeSet(nodelist, resolver=RESOLVER_NOGROUP)  # Slurm's list names nodes, never @groups
    except NodeSetParseError as e:
        raise _usage(f"bad Slurm node list {nodelist!r}: {e}") from None
    if len(ns) == 0:
        raise _usage(f"empty Slurm node list {nodelist!r}")
    return next(iter(ns))


def resolve_topology(opts: Mapping[str, Any], env: Mapping[str, str]) -> Topology:
    """Rank, world and rendezvous from the options, else torchrun's, else Slurm's environment."""
    nproc = int(opts.get("nproc_per_node") or 1)
    port_opt = opts.get("master_port")
    port: int | str | None
    if port_opt is None:
        port = None
    elif str(port_opt).strip().lower() == "stdin":
        port = "stdin"
    else:
        port = _int(port_opt, "--master-port")
        if not 0 <= port < 65536:
            raise _usage(f"--master-port {port} is not a TCP port")
    addr = opts.get("master_addr")
    if opts.get("rank") is not None or opts.get("world_size") is not None:
        if opts.get("rank") is None or opts.get("world_size") is None:
            raise _usage("--rank and --world-size go together")
        if nproc != 1:
            raise _usage("with --nproc-per-node use --node-rank and --nnodes, not --rank/--world-size")
        rank, world = int(opts["rank"]), int(opts["world_size"])
        local = [int(opts.get("local_rank") or 0)]
        ranks, source = [rank], "options"
    elif opts.get("node_rank") is not None or opts.get("nnodes") is not None:
        if opts.get("node_rank") is None or opts.get("nnodes") is None:
            raise _usage("--node-rank and --nnodes go together")
        nr, nn = int(opts["node_rank"]), int(opts["nnodes"])
        world = nn * nproc
        ranks = [nr * nproc + i for i in range(nproc)]
        local = list(range(nproc))
        if not 0 <= nr < nn:
            raise _usage(f"--node-rank {nr} is outside 0..{nn - 1}")
        source = "options"
    elif env.get("RANK") is not None and env.get("WORLD_SIZE") is not None:
        ranks = [_int(env["RANK"], "RANK")]
        world = _int(env["WORLD_SIZE"], "WORLD_SIZE")
        local = [_int(env.get("LOCAL_RANK", "0"), "LOCAL_RANK")]
        addr = addr or env.get("MASTER_ADDR")
        if port is None and env.get("MASTER_PORT"):
            port = _int(env["MASTER_PORT"], "MASTER_PORT")
        source = "torchrun"
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        if nproc != 1:
            raise _usage("--nproc-per-node does not apply under torchrun (it starts the ranks)")
        return _checked(Topology(ranks, local, world, addr or "127.0.0.1", port, agent, source))
    elif env.get("SLURM_PROCID") is not None and env.get("SLURM_NTASKS") is not None:
        ranks = [_int(env["SLURM_PROCID"], "SLURM_PROCID")]
        world = _int(env["SLURM_NTASKS"], "SLURM_NTASKS")
        local = [_int(env.get("SLURM_LOCALID", "0"), "SLURM_LOCALID")]
        if not addr:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if not nodelist:
                raise _usage("under srun without --master-addr, SLURM_NODELIST is needed")
            addr = first_slurm_node(nodelist)
        if port is None:
            if env.get("MASTER_PORT"):
                port = _int(env["MASTER_PORT"], "MASTER_PORT")
            else:  # every task of the step computes the same port
                port = 20000 + _int(env.get("SLURM_JOB_ID", "0"), "SLURM_JOB_ID") % 20000
        source = "slurm"
        if nproc != 1:
            raise _usage("--nproc-per-node does not apply under srun (it starts the tasks)")
    else:
        raise _usage("no rank given: use --rank/--world-size (or --node-rank/--nnodes), "
                     "or run under torchrun or srun")
    return _checked(Topology(ranks, local, world, addr or "127.0.0.1", port, False, source))


def _checked(t: Topology) -> Topology:
    if t.world < 2:
        raise _usage(f"a collective test needs at least 2 ranks (world size {t.world})")
    for r in t.ranks:
        if not 0 <= r < t.world:
            raise _usage(f"rank {r} is outside 0..{t.world - 1}")
    if 0 not in t.ranks and not t.agent_store and t.master_port in (None, 0):
        raise _usage("ranks other than 0 need --master-port (a number, or 'stdin' to read it)")
    return t


def parse_corrupt(texts: tuple[str, ...] | list[str], *, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """--inject corrupt:rank=N[,op=..,iter=..,index=..] -> spec dict (None without --inject)."""
    from ..inject import InjectionError, parse_injection
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


def _sweep_options(f):
    opts = [
        click.option("--ops", default="all_reduce", show_default=True,
                     help="Collectives, comma-separated: all_reduce, all_gather, all_to_all."),
        click.option("--sizes", "sizes_text", default=None,
                     help="Sizes per rank buffer, e.g. 1M,16M or 1M-1G (doubling). Default for run: "
                          "1M-256M on GPUs, 64K,1M on CPUs; for pairs: 64M,256M (nccl), 1M,16M (gloo), "
                          "16M,64M (auto)."),
        click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True,
                     help="Timed iterations per size."),
        click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
                     help="Untimed (but verified) iterations per size."),
        click.option("--timeout", "timeout_text", default="30s", show_default=True,
                     help="Per collective: past it the rank waited for is named and the test fails."),
        click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True,
                     help="auto: NCCL where CUDA works, else gloo."),
        click.option("--ifname", default=None, metavar="IFACE",
                     help="Network interface for gloo/NCCL sockets (sets GLOO_SOCKET_IFNAME)."),
        click.option("--nproc-per-node", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Ranks per node (one per GPU)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _sweep(ops: str, sizes_text: str | None, backend: str) -> tuple[list[str], list[int] | None]:  # noqa: ARG001
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


def _default_sizes(backend: str) -> list[int]:
    from ..nccl.bandwidth import parse_sizes

    if backend == "nccl" or (backend == "auto" and _cuda_likely()):
        return parse_sizes("1M-256M")
    return parse_sizes("64K,1M")


def _cuda_likely() -> bool:
    return os.path.exists("/dev/nvidiactl") and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != ""


@click.group("nccl")
def nccl_group() -> None:
    """Collective-communication tests (all-reduce, all-gather, all-to-all) with busbw and data
    verification: `run` is one node's part of a test, `pairs` tests node pairs across a cluster."""


@nccl_group.command("run")
@click.option("--rank", type=int, default=None, help="This process's rank (else RANK or SLURM_PROCID).")
@click.option("--world-size", type=int, default=None, help="Number of ranks (else WORLD_SIZE or SLURM_NTASKS).")
@click.option("--local-rank", type=int, default=None, help="GPU index of this rank (else LOCAL_RANK/SLURM_LOCALID).")
@click.option("--node-rank", type=int, default=None, help="With --nproc-per-node: this node's index.")
@click.option("--nnodes", type=int, default=None, help="With --nproc-per-node: number of nodes.")
@click.option("--master-addr", default=None, help="Rendezvous host (rank 0's node; else MASTER_ADDR or the "
                                                  "first node of SLURM_NODELIST).")
@click.option("--master-port", default=None,
              help="Rendezvous port; on rank 0, 0 or none binds a free port and prints it; 'stdin' reads it.")
@click.option("--host-label", default=None, help="This host's name in messages (default: SLURMD_NODENAME or hostname).")
@click.option("--peer-hosts", default=None, help="Host of each node rank, comma-separated (for messages).")
@click.option("--inject", "injections", multiple=True, metavar="SPEC",
              help="corrupt:rank=N[,op=OP,iter=K,index=I]: rank N corrupts one element of its output once.")
@click.option("--deadline", "deadline_text", default=None,
              help="Hard limit for the whole run (default: estimated from the sweep).")
@click.option("--force", is_flag=True,
              help="Start on GPUs that a job is using (NVML lists its processes) instead of refusing (exit 3).")
@click.option("--json", "as_json", is_flag=True,
              help="JSON lines even on a terminal (without a terminal they are the default).")
@_sweep_options
def run_command(rank, world_size, local_rank, node_rank, nnodes, master_addr, master_port, host_label,
                peer_hosts, injections, deadline_text, force, as_json, ops, sizes_text, iters, warmup, timeout_text,
                backend, ifname, nproc_per_node) -> int:
    """Run this node's ranks of a collective test; on a terminal print nccl-tests' table, else
    (or with --json) one JSON line per event.

    Events: {"event": "listening", "port": P} (rank 0, once the rendezvous store is up),
    {"event": "ready"} per rank, and {"event": "result", ...} per rank with the measurements
    (per collective and size: time, algbw, busbw, per-rank times, verification errors) or the
    failure ("timeout waiting for rank N on host H", "data corruption in OP on rank N ...").
    A GPU that a job is using is not loaded: every rank of this invocation reports an error
    (failure kind "busy") naming the processes, and the exit code is 3, unless --force.
    Exit 0 verified, 1 fail, 2 usage, 3 could not judge.
    """
    from ..nccl.collective import RankSpec
    from ..nccl.report import merge

    opts = dict(rank=rank, world_size=world_size, local_rank=local_rank, node_rank=node_rank, nnodes=nnodes,
                master_addr=master_addr, master_port=master_port, nproc_per_node=nproc_per_node)
    topo = resolve_topology(opts, os.environ)
    op_list, sizes = _sweep(ops, sizes_text, backend)
    sizes = sizes or _default_sizes(backend)
    try:
        timeout_s = parse_duration(timeout_text)
        deadline = parse_duration(deadline_text) if deadline_text else None
    except click.BadParameter as e:
        raise _usage(str(e.message)) from None
    corrupt = parse_corrupt(injections, keys=("rank",))
    if corrupt is not None:
        corrupt.setdefault("rank", topo.ranks[0])
        if not 0 <= int(corrupt["rank"]) < topo.world:
            raise _usage(f"--inject {corrupt['text']}: no rank {corrupt['rank']} in a world of {topo.world}")
        _check_corrupt_targets(corrupt, op_list, iters)
    label = host_label or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    peers = [h for h in (peer_hosts or "").split(",") if h]
    per_rank_hosts: list[str] = []
    if peers:
        per_node = max(1, topo.world // len(peers))
        per_rank_hosts = [peers[min(r // per_node, len(peers) - 1)] for r in range(topo.world)]
    specs = [
        RankSpec(rank=r, world=topo.world, ops=op_list, sizes=sizes, local_rank=lr,
                 master_addr=topo.master_addr,
                 master_port=_spec_port(r, topo),
                 host=label, peer_hosts=per_rank_hosts, backend=backend, iters=iters, warmup=warmup,
                 timeout_s=timeout_s, corrupt=corrupt, agent_store=topo.agent_store, ifname=ifname)
        for r, lr in zip(topo.ranks, topo.local_ranks)
    ]
    if deadline is None:
        deadline = _estimate_deadline(op_list, sizes, iters, warmup, timeout_s, backend)

    port_source = None
    if topo.master_port == "stdin" and any(s.master_port is None for s in specs):
        port_source = _stdin_port()
    lock = threading.Lock()
    notes: list[str] = []
    from ..render.nccl_table import RunView

    view = None if as_json or not sys.stdout.isatty() else RunView()

    def emit(ev: dict[str, Any]) -> None:
        if notes and ev.get("event") == "result":
            ev = {**ev, "notes": [*ev.get("notes", []), *notes]}
        with lock:
            if view is not None:
                view.event(ev)
                return
            sys.stdout.write(json.dumps(ev, separators=(",", ":")) + "\n")
            sys.stdout.flush()

    if backend == "nccl" or (backend == "auto" and _cuda_likely()):  # gloo ranks run on the CPU
        refused = _refuse_busy_gpus(specs, topo.local_ranks, force=force, emit=emit, notes=notes)
        if refused:
            return EXIT_NO_JUDGEMENT
    from ..nccl.procs import run_ranks

    reports = run_ranks(specs, deadline_s=deadline, on_event=emit, port_source=port_source)
    for rep in reports:  # results that no child sent (killed, crashed) are synthesized: print them
        if rep.get("synthesized"):
            emit(rep)
    status = merge(reports, topo.world)["status"] if len(reports) == topo.world else \
        ("ok" if all(r.get("status") == "ok" for r in reports) else
         "fail" if any(r.get("status") == "fail" for r in reports) else "error")
    if view is not None:
        view.finish(reports, topo.world, status)
    return {"ok": EXIT_OK, "fail": EXIT_FAIL}.get(status, EXIT_NO_JUDGEMENT)


def _refuse_busy_gpus(specs: list[Any], local_ranks: list[int], *, force: bool, emit, notes: list[str]) -> bool:
    """The load-test guard (gpucheck.busy) for this invocation's GPUs: when one is in use (or
    whether it is cannot be read), emit an error result for every rank (failure kind "busy",
    which report.merge turns into a could-not-judge group, blaming no host) and return True.
    With --force, the notes go to stderr and into every result event."""
    from ..busy import guard_ranks
    from ..nccl.collective import base_report

    refusals, forced = guard_ranks(local_ranks, force=force, environ=os.environ)
    for line in forced:
        notes.append(line)
        click.echo(f"gpucheck nccl run: {line}", err=True)
    if not refusals:
        return False
    detail = "; ".join(refusals)
    for spec in specs:
        rep = base_report(spec)
        rep.update(summary=f"not started: {detail}",
                   failure={"kind": "busy", "rank": spec.rank, "host": rep["host"], "detail": detail})
        emit(rep)
    click.echo(f"gpucheck nccl run: not started: {detail}", err=True)
    return True


def _spec_port(rank: int, topo: Topology) -> int | None:
    """Rank 0 hosts the store (on the given port, or a free one: 0); the others connect to the
    given port, or wait for it (None) from the local rank 0 or standard input."""
    port = topo.master_port if isinstance(topo.master_port, int) else None
    if rank == 0 and not topo.agent_store:
        return port or 0
    return port or None


def _estimate_deadline(ops: list[str], sizes: list[int], iters: int, warmup: int, timeout_s: float,
                       backend: str) -> float:
    rate = 5e9 if backend == "nccl" else 5e7
    per_op = sum((iters + warmup) * (3.0 * s / rate + 0.01) for s in sizes)
    return 60.0 + 2 * timeout_s + per_op * len(ops)


def _stdin_port():
    box: dict[str, int] = {}

    def read() -> None:
        line = sys.stdin.readline()
        try:
            box["port"] = int(line.strip())
        except ValueError:
            return

    threading.Thread(target=read, name="port-from-stdin", daemon=True).start()
    return lambda: box.get("port")


# -- pairs --------------------------------------------------------------------------------------
def parse_nodeset(text: str, what: str = "NODESET") -> list[str]:
    """gpucheck.fleet.nodeset's parse (names checked, size bounded); a bad one is a usage error."""
    from ..fleet.nodeset import NodeSetError, parse_nodeset as parse

    try:
        return parse(text)
    except NodeSetError as e:
        raise _usage(str(e), what) from None


@nccl_group.command("pairs")
@click.argument("nodeset")
@click.option("--strategy", type=click.Choice(["ring", "random", "suspects"]), default="random", show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="random: rounds of pairings; suspects: good partners per suspect.")
@click.option("--seed", type=int, default=None, help="Seed of the random pairings (reproducible runs).")
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
@click.option("--pair-timeout", "pair_timeout_text", default=None,
              help="Hard limit for one pair's test (default: estimated from the sweep).")
@click.option("--slow-limit", type=FiniteFloat(0.0, 1.0, min_open=True), default=0.7, show_default=True,
              help="A pair is slow below this fraction of the reference busbw.")
@click.option("--min-busbw", type=FiniteFloat(min=0.0, min_open=True), default=None,
              help="Expected busbw in GB/s (default reference: the median of the measured pairs).")
@click.option("--fanout", type=click.IntRange(min=1), default=64, show_default=True,
              help="Pairs running at once.")
@click.option("--inject", "injections", multiple=True, metavar="SPEC",
              help="corrupt:host=H[,op=..]: H's rank corrupts one element in each of its pairs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_sweep_options
def pairs_command(nodeset, strategy, rounds, seed, good_text, suspects_text, launcher, addrs, program,
                  pair_timeout_text, slow_limit, min_busbw, fanout, injections, as_json, ops, sizes_text,
                  iters, warmup, timeout_text, backend, ifname, nproc_per_node) -> int:
    """Two-node collectives over pairs of NODESET; name the nodes that are bad.

    Every pair runs `gpucheck nccl run` on its two nodes (over ssh, a launcher template, or srun),
    with the rendezvous on the pair's first node. Output: a per-pair table, a per-node score and
    the nodes judged bad with their evidence. Exit 1 when a node is bad or suspect, 0 when all
    are healthy, 2 on usage errors, 3 when nothing could be measured or SIGTERM/SIGINT stopped it
    (the pairs measured before are reported).
    """
    import shlex

    from ..nccl import launch as L
    from ..nccl import pairs as P
    from ..nccl.bandwidth import parse_sizes
    from ..processes import Interrupted, stop_on_signals

    nodes = parse_nodeset(nodeset)
    if len(nodes) < 2:
        raise _usage(f"{nodeset!r} has {len(nodes)} node(s); pairs need at least 2", "NODESET")
    good = parse_nodeset(good_text, "--good") if good_text else []
    suspects = parse_nodeset(suspects_text, "--suspects") if suspects_text else []
    op_list, sizes = _sweep(ops, sizes_text, backend)
    # The hosts' kind is not known here: the same sizes for every pair, by the backend asked for.
    sizes = sizes or parse_sizes({"nccl": "64M,256M", "gloo": "1M,16M"}.get(backend, "16M,64M"))
    try:
        timeout_s = parse_duration(timeout_text)
        pair_deadline = parse_duration(pair_timeout_text) if pair_timeout_text else None
    except click.BadParameter as e:
        raise _usage(str(e.message)) from None
    try:
        addr_map = L.parse_addrs(addrs)
    except ValueError as e:
        raise _usage(str(e), "--addr") from None
    lau = L.Launcher(template=launcher or L.DEFAULT_SSH, addrs=addr_map, program=shlex.split(program))
    try:
        lau.validate()
    except ValueError as e:
        raise _usage(str(e), "--launcher") from None
    corrupt = parse_corrupt(injections, keys=("host",))
    if corrupt is not None:
        if corrupt.get("host") not in nodes:
            raise _usage(f"--inject {corrupt['text']}: host= must name one of the nodes", "--inject")
        _check_corrupt_targets(corrupt, op_list, iters)

    if strategy == "ring":
        plan = P.ring_rounds(nodes)
    elif strategy == "random":
        plan = P.random_rounds(nodes, rounds, seed)
    else:
        if not good:
            raise _usage("--strategy suspects needs --good NODESET", "--good")
        unknown = [n for n in [*good, *suspects] if n not in nodes]
        if unknown:
            raise _usage(f"{', '.join(unknown)} not in {nodeset}", "--good/--suspects")
        sus = suspects or [n for n in nodes if n not in good]
        plan = P.suspect_rounds(sus, good, rounds)
        if not plan:
            raise _usage("no suspect to pair with a good node", "--suspects")

    args = L.run_args(ops=op_list, sizes=sizes, iters=iters, warmup=warmup, timeout_s=timeout_s,
                      backend=backend, ifname=ifname, nproc_per_node=nproc_per_node)
    if pair_deadline is None:
        pair_deadline = _estimate_deadline(op_list, sizes, iters, warmup, timeout_s, backend) + 30.0
    run = functools.partial(run_plan, plan, lau, args, deadline_s=pair_deadline, fanout=fanout, op=op_list[0],
                            corrupt=corrupt, nproc_per_node=nproc_per_node, progress=None if as_json else _progress)
    with stop_on_signals():  # SIGTERM/SIGINT: stop every pair's processes, print what was measured
        interrupted = None
        try:
            outcomes = run()
        except Interrupted as e:
            outcomes, interrupted = list(e.partial or []), e.signame
        judgement = P.judge_pairs(outcomes, nodes, slow_limit=slow_limit, min_busbw=min_busbw)
        code = EXIT_NO_JUDGEMENT if (interrupted or judgement.measured == 0) else \
            EXIT_FAIL if (judgement.bad or judgement.suspects) else EXIT_OK
        doc = pairs_document(judgement, nodes=nodes, strategy=strategy, plan=plan, op=op_list[0], code=code,
                             injected=[corrupt["text"]] if corrupt else [], interrupted=interrupted)
        if as_json:
            click.echo(json.dumps(doc, indent=2))
        else:
            print_pairs(doc)
    return code


def _progress(msg: str) -> None:
    click.echo(msg, err=True)


def run_plan(plan, lau, args, *, deadline_s: float, fanout: int, op: str, corrupt: dict[str, Any] | None,
             nproc_per_node: int = 1, progress=None):
    """Run every round's pairs (concurrently within a round) and build PairOutcomes.

    On a stop (SIGTERM/SIGINT) raises Interrupted with the outcomes of the pairs that finished
    before it as `partial`: the pairs it cut short are left out, and no further round starts."""
    from concurrent.futures import ThreadPoolExecutor

    from ..nccl import launch as L
    from ..nccl.pairs import PairOutcome
    from ..processes import Interrupted, stopping

    outcomes: list[PairOutcome] = []
    index = 0
    for rnd, pairs in enumerate(plan, start=1):
        if stopping():
            raise Interrupted(stopping(), partial=outcomes)
        if progress:
            progress(f"round {rnd}/{len(plan)}: " + ", ".join(f"{a}+{b}" for a, b in pairs))
        jobs = []
        with ThreadPoolExecutor(max_workers=min(fanout, max(1, len(pairs)))) as pool:
            for a, b in pairs:
                cmap = None
                if corrupt and corrupt.get("host") in (a, b):
                    rank = [a, b].index(corrupt["host"]) * nproc_per_node
                    spec = [f"rank={rank}"] + [f"{k}={corrupt[k]}" for k in ("op", "iter", "index") if k in corrupt]
                    cmap = {corrupt["host"]: "corrupt:" + ",".join(spec)}
                jobs.append(((a, b), pool.submit(L.run_group, [a, b], lau, args, deadline_s=deadline_s,
                                                 index=index, corrupt=cmap, nproc_per_node=nproc_per_node)))
                index += 1
            for (a, b), fut in jobs:
                hit = corrupt is not None and corrupt.get("host") in (a, b)
                try:
                    group = fut.result()
                except Interrupted:
                    continue  # the round ends below
                outcomes.append(pair_outcome(rnd, (a, b), group, op, injected=[corrupt["text"]] if hit else []))
        if stopping():
            raise Interrupted(stopping(), partial=outcomes)
    return outcomes


def pair_outcome(rnd: int, nodes: tuple[str, str], group: dict[str, Any], op: str,
                 injected: list[str] | None = None):
    from ..nccl.pairs import PairOutcome
    from ..nccl.report import largest

    status = group.get("status")
    failure = group.get("failure") or {}
    launch_errors = group.get("launch_errors") or {}
    if status == "ok":
        row = largest(group.get("results", []), op)
        if row is None:
            return PairOutcome(rnd, nodes, "error", summary=f"no {op} measurement", injected=injected or [])
        return PairOutcome(rnd, nodes, "ok", busbw_gbs=row["busbw_gbs"], algbw_gbs=row["algbw_gbs"],
                           time_s=row["time_s"], bytes=row["bytes"], summary=group.get("summary", ""),
                           injected=injected or [])
    if status == "fail":
        blamed: list[str] = []
        if failure.get("kind") in ("timeout", "exit") and failure.get("host") in nodes:
            blamed = [failure["host"]]
        summary = group.get("summary", "")
        if launch_errors:
            summary += "; " + "; ".join(f"{h}: {w}" for h, w in launch_errors.items())
        return PairOutcome(rnd, nodes, "fail", summary=summary, blamed=blamed, failure=failure,
                           injected=injected or [])
    # error: no rank ran the test. When only some hosts could not start, those hosts are the
    # problem (unreachable, gpucheck missing); when none started, nothing is known.
    if launch_errors and len(launch_errors) < len(nodes):
        summary = "; ".join(f"{h}: {w}" for h, w in launch_errors.items())
        return PairOutcome(rnd, nodes, "fail", summary=summary, blamed=sorted(launch_errors), failure=failure,
                           injected=injected or [])
    summary = group.get("summary", "") or "no result"
    if launch_errors:
        summary = "; ".join(f"{h}: {w}" for h, w in launch_errors.items())
    return PairOutcome(rnd, nodes, "error", summary=summary, failure=failure, injected=injected or [])


def pairs_document(j, *, nodes, strategy, plan, op, code, injected, interrupted=None) -> dict[str, Any]:
    """The `gpucheck.nccl.pairs` document. `interrupted`: the signal that stopped the run; the
    pairs and the judgement then cover only the pairs measured before it (exit 3)."""
    return {
        "schema": "gpucheck.nccl.pairs",
        "version": 1,
        "nodes": list(nodes),
        "strategy": strategy,
        "op": op,
        "rounds": [[list(p) for p in r] for r in plan],
        "reference_busbw_gbs": j.reference_gbs,
        "reference": j.reference_kind,
        "pairs": [{**pj.outcome.to_dict(), "verdict": pj.verdict,
                   "relative": None if pj.relative is None else round(pj.relative, 3)} for pj in j.pairs],
        "node_scores": [s.to_dict() for s in j.nodes.values()],
        "bad": j.bad,
        "suspects": j.suspects,
        "injected": list(injected),
        "interrupted": interrupted,
        "pairs_planned": sum(len(r) for r in plan),
        "exit_code": code,
    }


def print_pairs(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from ..render.console import make_console

    con = make_console(sys.stdout)  # no markup, no emoji: node names and summaries print as they are
    t = Table(title=f"{doc['op']} per pair", header_style="bold")
    for col in ("round", "pair", "busbw GB/s", "algbw GB/s", "x ref", "verdict", "note"):
        t.add_column(col, overflow="fold")
    for p in doc["pairs"]:
        t.add_row(str(p["round"]), " + ".join(p["nodes"]),
                  "-" if p["busbw_gbs"] is None else f"{p['busbw_gbs']:.4g}",
                  "-" if p["algbw_gbs"] is None else f"{p['algbw_gbs']:.4g}",
                  "-" if p["relative"] is None else f"{p['relative']:.2f}",
                  p["verdict"].upper(), "" if p["verdict"] in ("ok", "slow") else p["summary"])
    con.print(t)
    n = Table(title="per node", header_style="bold")
    for col in ("node", "pairs", "bad", "score", "verdict", "evidence"):
        n.add_column(col, overflow="fold")
    for s in doc["node_scores"]:
        n.add_row(s["node"], str(s["pairs"]), str(s["bad_pairs"]), "-" if s["score"] is None else f"{s['score']:.2f}",
                  s["verdict"].upper(), "; ".join(s["evidence"]) if s["verdict"] != "ok" else "")
    con.print(n)
    ref = doc["reference_busbw_gbs"]
    con.print(f"reference: {'-' if ref is None else f'{ref:.4g} GB/s'} ({doc['reference']})")
    if doc["bad"]:
        con.print("bad nodes: " + ",".join(doc["bad"]))
    if doc["suspects"]:
        con.print("suspect nodes: " + ",".join(doc["suspects"]))
    if not doc["bad"] and not doc["suspects"] and not doc["interrupted"]:
        con.print("no bad node")
    if doc["interrupted"]:
        con.print(f"interrupted by {doc['interrupted']}: {len(doc['pairs'])} of {doc['pairs_planned']} pair(s) "
                  "measured; the judgement above covers only those")
    con.print(f"exit code {doc['exit_code']}")
