"""`gpucheck hang`: which rank hung the job? (docs/hang.md)

    gpucheck hang NODESET --match REGEX     the job's processes on these nodes (ssh, or --srun)
    gpucheck hang --job JOBID               the nodes and processes of a running Slurm job
    gpucheck hang --local --match REGEX     this node only (--json: its gpucheck.hang.node document)
    gpucheck hang --from FILE ...           analyse recorded node documents

Exit codes: 1 suspect ranks found, 0 every rank agrees (then only `gpucheck bisect` can localize
the hang), 3 stacks could not be collected from some nodes or ranks (named), 2 usage error.
The logic lives in gpucheck.hang; this module parses options, renders, and exits.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from typing import TYPE_CHECKING

import click

from ..app import UsageError, _check_writable
from ..core.state import atomic_write_text
from ..platform.messages import say_error
from ..platform.safeio import describe_error, read_input
from .numbers import DURATION, MAX_NODES, Count
from .run import parse_duration

if TYPE_CHECKING:  # pragma: no cover
    from ..hang.model import Source
    from ..platform.fanout import RunnerSettings

DEFAULT_NODE_TIMEOUT = "2m"
DEFAULT_DUMP_TIMEOUT = "10s"


def _duration(text: str | None, param: str) -> float | None:
    try:
        return parse_duration(text)
    except click.BadParameter as e:
        raise click.BadParameter(e.message, param_hint=param) from None


def _check_sources(nodeset, job, local, from_files, match) -> None:
    modes = [m for m, on in (("NODESET", nodeset), ("--local", local), ("--from", from_files)) if on]
    if len(modes) > 1:
        raise click.UsageError(f"give one of NODESET, --job, --local and --from, not {' and '.join(modes)}")
    if from_files:
        if job or match:
            raise click.UsageError("--from analyses recorded documents: --job and --match do not apply")
        return
    if not (nodeset or job or local):
        raise click.UsageError("say where to look: NODESET --match REGEX, --job JOBID, --local or --from FILE")
    if bool(match) == bool(job):
        raise click.UsageError("select the job's processes with exactly one of --match REGEX and --job JOBID")
    if match is not None:
        try:
            re.compile(match)
        except re.error as e:
            raise click.BadParameter(f"{match!r}: {e}", param_hint="--match") from None


def _topology_source(topology: str | None, groups_file: str | None):
    """A function world_size -> Topology (or None), checked now so that a bad option is exit 2."""
    from ..hang import topology as T

    if topology and groups_file:
        raise click.UsageError("give --topology or --groups, not both")
    try:
        if topology:
            spec = T.parse_spec(topology)
            return lambda world: T.megatron(spec, world)
        if groups_file:
            loaded = T.load_groups(groups_file)
            return lambda world: loaded
    except T.TopologyError as e:
        raise click.BadParameter(str(e), param_hint="--topology" if topology else "--groups") from None
    return None


def _local_args(match, job, dump_timeout_s, native, py_spy, flight_prefix, no_flight) -> list[str]:
    args = ["--match", match] if match is not None else ["--job", job]
    args += ["--dump-timeout", f"{dump_timeout_s:g}s"]
    if native:
        args.append("--native")
    if py_spy:
        args += ["--py-spy", py_spy]
    if no_flight:
        args.append("--no-flight-recorder")
    elif flight_prefix:
        args += ["--flight-recorder", flight_prefix]
    return args


@click.command("hang")
@click.argument("nodeset", required=False)
@click.option("--job", metavar="JOBID", help="A running Slurm job: its nodes (scontrol) and its processes.")
@click.option("--match", metavar="REGEX", help="The job's processes: command lines matching REGEX.")
@click.option("--local", is_flag=True, help="This node only (with --json: its gpucheck.hang.node document).")
@click.option("--from", "from_files", multiple=True, metavar="FILE",
              help="Analyse recorded node documents (--record, or --local --json output); repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the gpucheck.hang JSON document instead of the table.")
@click.option("--topology", metavar="SPEC", help="Megatron rank order, e.g. tp=8,pp=4[,cp=2][,dp=N][,order=tp-cp-dp-pp].")
@click.option("--groups", "groups_file", metavar="FILE", help='Parallel groups: JSON {"tp": [[0,1,...], ...], ...}.')
@click.option("--flight-recorder", "flight_prefix", metavar="PREFIX",
              help="Flight-recorder dump prefix on the nodes (<PREFIX><rank>); default: each process's "
                   "TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE, else /tmp/nccl_trace_rank_.")
@click.option("--no-flight-recorder", "no_flight", is_flag=True, help="Do not read flight-recorder dumps.")
@click.option("--dump-timeout", "dump_timeout_text", type=DURATION, default=DEFAULT_DUMP_TIMEOUT, show_default=True,
              metavar="DURATION", help="Per-process limit for one py-spy dump.")
@click.option("--native", is_flag=True,
              help="Also C/C++ frames (py-spy --native): PAUSES each process while it is read; off by default.")
@click.option("--py-spy", "py_spy", metavar="PATH", help="py-spy on the nodes (default: PATH, then next to Python).")
@click.option("--record", "record_path", metavar="FILE", help="Write the nodes' documents to FILE (for --from).")
@click.option("--node", "node_name", metavar="NAME", help="--local: this node's name in the document.")
@click.option("--remote-cmd", default="gpucheck", show_default=True, metavar="CMD",
              help="How to start gpucheck on the nodes (shell text).")
@click.option("--fanout", type=Count(1, MAX_NODES), default=None, help="Nodes at once (default: clush.conf's, else 64).")
@click.option("--timeout", "timeout_text", type=DURATION, default=DEFAULT_NODE_TIMEOUT, show_default=True, metavar="DURATION",
              help="Per-node time limit; a node past it is 'timeout'.")
@click.option("--srun", "use_srun", is_flag=True, help="Run with srun (with --job: inside the job's allocation).")
@click.option("--srun-arg", "srun_args", multiple=True, metavar="ARG", help="Extra srun argument (repeatable).")
@click.option("--ssh-options", metavar="OPTS", help="Extra ssh options (before clush.conf's).")
@click.option("--ssh-user", metavar="USER", help="ssh user.")
@click.option("--connect-timeout", "connect_timeout_text", type=DURATION, metavar="DURATION", help="ssh connect timeout.")
@click.option("--scontrol", metavar="PATH", help="scontrol for --job (default: PATH and the usual places).")
def hang_command(**kw) -> int:
    """Which rank hung the job? Dump every rank's Python stacks (py-spy), group ranks by stack,
    name the outliers, their nodes and (with a topology) the nodes to evict.

    Exit 1 suspects found, 0 every rank agrees (use `gpucheck bisect` then), 3 some nodes or ranks
    could not be collected, 2 usage error.
    """
    try:
        return _hang(**kw)
    except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise
    except Exception as e:  # gpucheck's own failure is "could not judge", never a suspect (exit 1)
        say_error(f"could not judge: internal error: {type(e).__name__}: {e}", "gpucheck hang")
        return 3


def _hang(nodeset, job, match, local, from_files, as_json, topology, groups_file, flight_prefix, no_flight,
          dump_timeout_text, native, py_spy, record_path, node_name, remote_cmd, fanout, timeout_text,
          use_srun, srun_args, ssh_options, ssh_user, connect_timeout_text, scontrol) -> int:
    from ..hang.slurmjob import JobUsageError, valid_job_id

    _check_sources(nodeset, job, local, from_files, match)
    if job is not None:
        try:
            job = valid_job_id(job)
        except JobUsageError as e:
            raise click.BadParameter(str(e), param_hint="--job") from None
    make_topology = _topology_source(topology, groups_file)
    dump_timeout_s = _duration(dump_timeout_text, "--dump-timeout")
    if node_name is not None:
        from ..hang.collect import NODE_NAME

        if not local:
            raise click.UsageError("--node names this node in a --local run")
        if not NODE_NAME.fullmatch(node_name):
            raise click.BadParameter(f"{node_name!r} is not a host name", param_hint="--node")
    if record_path and (local or from_files):
        raise click.UsageError("--record saves what a fan-out collected: give NODESET or --job")
    if record_path:
        _check_record_path(record_path)
    if local:
        return _local(match, job, node_name, dump_timeout_s, native, py_spy, flight_prefix, no_flight, as_json,
                      make_topology)
    if from_files:
        results, source = _load_files(from_files), {"from": list(from_files)}
        return _finish(results, None, make_topology, source, as_json, None, time.time())
    started = time.time()
    nodes, source = _nodes(nodeset, job, scontrol)
    from ..hang.collect import FanoutPlan

    plan = FanoutPlan(nodes=nodes, local_args=_local_args(match, job, dump_timeout_s, native, py_spy, flight_prefix,
                                                         no_flight),
                      remote_cmd=remote_cmd, mode="srun" if use_srun else "ssh", fanout=fanout,
                      timeout_s=_duration(timeout_text, "--timeout"))
    settings = _runner_settings(job if use_srun else None, srun_args, ssh_options, ssh_user, connect_timeout_text)
    results, interrupted = _fan_out(plan, settings)
    if record_path:
        _record(record_path, results)
    return _finish(results, interrupted, make_topology, {**source, "match": match, "mode": plan.mode}, as_json,
                   "job", started)


def _nodes(nodeset: str | None, job: str | None, scontrol: str | None) -> tuple[list[str], "Source"]:
    from ..platform.nodeset import NodeSetError, fold, parse_nodeset

    if nodeset:
        try:
            nodes = parse_nodeset(nodeset)
        except NodeSetError as e:
            raise click.BadParameter(str(e), param_hint="NODESET") from None
        return nodes, {"nodeset": fold(nodes), "job": job}
    from ..fleet.slurm import default_runner, find_scontrol
    from ..hang.slurmjob import JobLookupError, JobUsageError, job_info

    try:
        info = job_info(job, runner=default_runner, scontrol=find_scontrol(scontrol))
    except JobUsageError as e:
        raise click.BadParameter(str(e), param_hint="--job") from None
    except JobLookupError as e:
        say_error(f"could not judge: {e}", "gpucheck hang")
        raise click.exceptions.Exit(3) from None
    return info.nodes, {"nodeset": fold(info.nodes), "job": job}


def _runner_settings(job, srun_args, ssh_options, ssh_user, connect_timeout_text) -> "RunnerSettings":
    from ..platform.fanout import SrunSettings, SshSettings

    extra = list(srun_args) + ([f"--jobid={job}"] if job else [])
    return {"ssh": SshSettings(ssh_options=ssh_options, ssh_user=ssh_user,
                               connect_timeout_s=_duration(connect_timeout_text, "--connect-timeout")),
            "srun": SrunSettings(extra_args=extra)}


def _fan_out(plan, settings):
    """The fan-out, with SIGTERM/SIGINT turned into a stop that keeps what was collected."""
    from ..platform.fanout import run_nodes
    from ..hang.collect import collect_nodes, on_signals, raise_interrupted

    armed = [True]

    def handler(signum: int) -> None:
        if armed[0]:
            armed[0] = False
            raise_interrupted(signum)

    with on_signals(handler):
        try:
            return collect_nodes(plan, runner=run_nodes, **settings)
        finally:
            armed[0] = False


def _local(match, job, node_name, dump_timeout_s, native, py_spy, flight_prefix, no_flight, as_json,
           make_topology) -> int:
    from ..hang import local as L
    from ..hang.collect import from_doc, on_signals
    from ..hang.pyspy import Children
    from ..platform.interrupts import INTERRUPTS

    opts = L.LocalOptions(match=match, job=job, node=node_name, dump_timeout_s=dump_timeout_s, native=native,
                          py_spy=py_spy, flight=not no_flight, flight_prefix=flight_prefix)
    children = Children()
    started = time.time()
    caught: list[str] = []

    def stop(signum: int) -> None:
        caught.append(signal.Signals(signum).name)
        children.stop_all()

    with on_signals(stop):
        if early := INTERRUPTS.take():  # arrived while the command started
            stop(signal.Signals[early])
        doc = L.collect_node(opts, children)
    if as_json:  # the node document (what a fan-out reads); the exit code is the judged one all the same
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    interrupted = (caught or ["signal"])[0] if doc["status"] == "interrupted" else None
    return _finish([from_doc(doc["node"], doc, doc["duration_s"])], interrupted, make_topology,
                   {"local": doc["node"], "match": match, "job": job}, None if as_json else False, "local", started)


def _load_files(paths) -> list:
    """The recorded node documents of every --from file: regular files only (a FIFO or a device
    is refused, never waited on or read without end), at most safeio.LIMITS["hang"] bytes each."""
    from ..hang.collect import load_recorded

    results = []
    for path in paths:
        try:
            text = read_input(path, "hang").decode("utf-8")
            results += load_recorded(path, text)
        except OSError as e:
            raise click.BadParameter(f"{path}: {describe_error(e, path)}", param_hint="--from") from None
        except UnicodeDecodeError:
            raise click.BadParameter(f"{path}: not UTF-8 text", param_hint="--from") from None
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--from") from None
    return results


def _check_record_path(path: str) -> None:
    import os
    import stat

    try:
        _check_writable(path, "--record")
    except UsageError as e:
        raise click.BadParameter(str(e).removeprefix("--record "), param_hint="--record") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise click.BadParameter(f"{path}: exists and is not a regular file", param_hint="--record")


def _record(path: str, results) -> None:
    docs = [r.doc for r in results if r.doc is not None]
    try:
        atomic_write_text(path, json.dumps(docs, separators=(",", ":")) + "\n")
    except OSError as e:
        say_error(f"--record {path}: {e.strerror or e}", "gpucheck hang")


def _finish(results, interrupted, make_topology, source, as_json: bool | None, scope, started) -> int:
    """Judge the ranks of `results`, print the hang document (as_json) or the table (False) or
    nothing (None), and return the judged exit code."""
    from ..hang.analysis import analyze, document
    from ..hang.topology import TopologyError

    ranks = [r for res in results for r in res.ranks]
    topo = None
    if make_topology is not None and ranks:
        try:
            topo = make_topology(_world_size(ranks))
        except TopologyError as e:
            raise click.BadParameter(str(e), param_hint="--topology/--groups") from None
    report = analyze(ranks, [r.outline() for r in results], topology=topo, scope=scope or "job")
    doc = document(report, source=source, started=started, interrupted=interrupted)
    if as_json is None:  # judged only: `--local --json` printed its node document
        pass
    elif as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        from ..hang.render import print_report

        print_report(doc)
    return int(doc["exit_code"])


def _world_size(ranks) -> int:
    worlds = {r.get("world_size") for r in ranks if r.get("world_size")}
    return worlds.pop() if len(worlds) == 1 else max(r["rank"] for r in ranks) + 1
