"""Start `gpucheck nccl run` on a group of hosts and collect the ranks' events.

A launcher is an argv template with placeholders, applied to each host:

- ``{host}``: the node name; ``{addr}``: its address (``--addr host=ip``, else the name);
- ``{cmd}``: the per-rank command spliced in as separate arguments (``ip netns exec {host} {cmd}``);
- ``{qcmd}``: the same command as one shell-quoted argument, for a remote shell
  (``ssh -o BatchMode=yes -- {host} {qcmd}``, the default).

The template is split like a shell command line (shlex) and run without a local shell. A word
that is one placeholder becomes that value (``{cmd}``: its arguments). A word that holds a
placeholder among other text (``--nodelist={host}``, or the script of ``sh -c 'true {host};
exec {qcmd}'``) may be shell text for a shell the launcher starts, so the values go in
shell-quoted (``{cmd}``/``{qcmd}``: the command as shell words), and a placeholder inside a
quoted string or after a backslash within such a word is refused (validate(): quoting cannot
protect it there; gpucheck.fleet.placeholders). Host names and addresses are checked where
they are parsed (gpucheck.fleet.nodeset; parse_addrs), so no value starts with ``-`` or holds
shell syntax.

The rendezvous is on the group's first host. Its rank binds a free port and prints a
``listening`` event; the launcher writes that port to the other ranks' standard input (they were
started with ``--master-port stdin`` and import torch meanwhile). Every process is killed (its
process group, SIGKILL) at the group's deadline; a host that gives no result is reported with
its stderr tail.

``srun`` (inside a Slurm allocation) is a different shape: one job step per group,
``srun --nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=... gpucheck nccl run ...``; each
task takes its rank from SLURM_PROCID and the rendezvous is the step's first node on
``--master-port`` (`port_base` + the group's index, since no port can be relayed to a step).
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import processes
from ..fleet.nodeset import NodeSetError, check_node_name, node_name_problem
from ..fleet.placeholders import quoted_placeholder, refusal, substitute
from ..processes import kill_group
from .report import merge, parse_events

DEFAULT_SSH = "ssh -o BatchMode=yes -o ConnectTimeout=10 -- {host} {qcmd}"
SRUN = "srun"
PLACEHOLDERS = ("{host}", "{addr}", "{cmd}", "{qcmd}")


@dataclass
class Launcher:
    template: str = DEFAULT_SSH
    addrs: dict[str, str] = field(default_factory=dict)
    program: list[str] = field(default_factory=lambda: ["gpucheck"])  # how hosts start gpucheck
    port_base: int = 29600

    @property
    def is_srun(self) -> bool:
        return self.template.strip() == SRUN

    def addr(self, host: str) -> str:
        return self.addrs.get(host, host)

    def argv(self, host: str, cmd: list[str]) -> list[str]:
        """The argv that starts `cmd` on `host` (call validate() first)."""
        check_node_name(host, what="launcher")
        whole = {"{host}": [host], "{addr}": [self.addr(host)], "{cmd}": list(cmd), "{qcmd}": [shlex.join(cmd)]}
        # inside a longer word the values are shell words: the command's arguments each quoted
        inside = {"{host}": shlex.quote(host), "{addr}": shlex.quote(self.addr(host)), "{cmd}": shlex.join(cmd),
                  "{qcmd}": shlex.join(cmd)}
        out: list[str] = []
        for tok in shlex.split(self.template):
            if tok in whole:
                out.extend(whole[tok])
            else:
                out.append(substitute(tok, inside, quote=False))
        return out

    def validate(self) -> None:
        if self.is_srun:
            return
        try:
            toks = shlex.split(self.template)
        except ValueError as e:
            raise ValueError(f"launcher template {self.template!r}: {e}") from None
        if not any("{cmd}" in t or "{qcmd}" in t for t in toks):
            raise ValueError(f"launcher template {self.template!r} has no {{cmd}} or {{qcmd}}")
        for tok in toks:
            hit = None if tok in PLACEHOLDERS else quoted_placeholder(tok, PLACEHOLDERS)
            if hit:
                raise ValueError(refusal("launcher template", self.template, hit))


def parse_addrs(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """['h1=10.0.0.1', ...] -> {'h1': '10.0.0.1'}. HOST is a node name (gpucheck.fleet.nodeset's
    rule), ADDRESS an IPv4/IPv6 address or a host name by the same rule."""
    out: dict[str, str] = {}
    for item in items:
        host, eq, addr = (x.strip() for x in item.partition("="))
        if not eq or not host or not addr:
            raise ValueError(f"bad --addr {item!r} (want HOST=ADDRESS)")
        try:
            check_node_name(host, what=f"--addr {item!r}")
        except NodeSetError as e:
            raise ValueError(str(e)) from None
        if not _is_address(addr):
            raise ValueError(f"--addr {item!r}: {addr!r} is not an IP address or a host name")
        out[host] = addr
    return out


def _is_address(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return node_name_problem(text) is None


def run_args(*, ops: list[str], sizes: list[int], iters: int, warmup: int, timeout_s: float,
             backend: str, ifname: str | None = None, nproc_per_node: int = 1) -> list[str]:
    """The measurement options shared by every rank of a group."""
    a = ["--ops", ",".join(ops), "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
         "--warmup", str(warmup), "--timeout", f"{timeout_s:g}", "--backend", backend]
    if ifname:
        a += ["--ifname", ifname]
    if nproc_per_node != 1:
        a += ["--nproc-per-node", str(nproc_per_node)]
    return a


@dataclass
class _Proc:
    host: str
    rank: int
    argv: list[str]
    popen: subprocess.Popen | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: deque = field(default_factory=lambda: deque(maxlen=20))
    error: str | None = None
    threads: list[threading.Thread] = field(default_factory=list)


def run_group(
    hosts: list[str],
    launcher: Launcher,
    args: list[str],
    *,
    deadline_s: float,
    index: int = 0,
    corrupt: dict[str, str] | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    nproc_per_node: int = 1,
) -> dict[str, Any]:
    """Run one collective across `hosts` (node rank = position) and merge the ranks' events.

    `corrupt` maps a host to the --inject text its ranks get. Returns report.merge()'s outcome plus
    'launch_errors' {host: why} for hosts that gave no result. Each host's process leads a session
    of its own, tracked by gpucheck.processes: a stop (SIGTERM/SIGINT of the command) ends them,
    and run_group raises Interrupted instead of returning what the stopped ranks left."""
    world_nodes = len(hosts)
    master = launcher.addr(hosts[0])
    procs: list[_Proc] = []
    if launcher.is_srun:
        port = launcher.port_base + index
        cmd = [*launcher.program, "nccl", "run", "--master-addr", master, "--master-port", str(port),
               "--peer-hosts", ",".join(hosts), *args]
        argv = ["srun", f"--nodes={world_nodes}", f"--ntasks={world_nodes}", "--ntasks-per-node=1",
                f"--nodelist={','.join(hosts)}", "--kill-on-bad-exit=0", *cmd]
        procs.append(_Proc(",".join(hosts), -1, argv))
    else:
        for node_rank, host in enumerate(hosts):
            cmd = [*launcher.program, "nccl", "run", "--master-addr", master,
                   "--master-port", "0" if node_rank == 0 else "stdin",
                   "--host-label", host, "--peer-hosts", ",".join(hosts), *args]
            if nproc_per_node == 1:
                cmd += ["--rank", str(node_rank), "--world-size", str(world_nodes)]
            else:
                cmd += ["--node-rank", str(node_rank), "--nnodes", str(world_nodes)]
            if corrupt and host in corrupt:
                cmd += ["--inject", corrupt[host]]
            procs.append(_Proc(host, node_rank, launcher.argv(host, cmd)))

    port_box: dict[str, int] = {}
    port_known = threading.Event()

    def read_out(p: _Proc) -> None:
        assert p.popen is not None and p.popen.stdout is not None
        for raw in p.popen.stdout:
            for ev in parse_events(raw):
                p.events.append(ev)
                if ev.get("event") == "listening" and not port_known.is_set():
                    port_box["port"] = int(ev["port"])
                    port_known.set()
                if on_event is not None:
                    on_event(p.host, ev)

    def read_err(p: _Proc) -> None:
        assert p.popen is not None and p.popen.stderr is not None
        for raw in p.popen.stderr:
            line = raw.rstrip()
            if line and not line.startswith("frame #"):
                p.stderr.append(line[:300])

    t_end = time.monotonic() + deadline_s
    try:
        for p in procs:
            try:
                p.popen = processes.start(p.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, bufsize=1)
            except OSError as e:
                p.error = f"cannot start {p.argv[0]}: {e.strerror or e}"
                continue
            for target in (read_out, read_err):
                th = threading.Thread(target=target, args=(p,), daemon=True)
                th.start()
                p.threads.append(th)
        # relay the rendezvous port to the other hosts
        if not launcher.is_srun:
            while not port_known.is_set() and time.monotonic() < t_end:
                if procs[0].popen is None or procs[0].popen.poll() is not None:
                    break
                port_known.wait(0.1)
            for p in procs[1:]:
                if p.popen is None or p.popen.stdin is None:
                    continue
                try:
                    if port_known.is_set():
                        p.popen.stdin.write(f"{port_box['port']}\n")
                    p.popen.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
        for p in procs:
            if p.popen is None:
                continue
            try:
                p.popen.wait(timeout=max(0.0, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.error = f"no result within {deadline_s:.0f} s (killed)"
                _kill(p.popen)
    finally:
        for p in procs:
            if p.popen is not None and p.popen.poll() is None:
                _kill(p.popen)
            if p.popen is not None:
                try:
                    p.popen.wait(timeout=5)
                    processes.untrack(p.popen.pid)
                except subprocess.TimeoutExpired:
                    pass
            for th in p.threads:
                th.join(timeout=2)
    processes.check_stop()  # ranks stopped by a signal gave no result worth judging

    reports = [ev for p in procs for ev in p.events if ev.get("event") == "result"]
    world = world_nodes * nproc_per_node
    launch_errors: dict[str, str] = {}
    for p in procs:
        if any(ev.get("event") == "result" for ev in p.events):
            continue
        why = p.error or (f"exited with code {p.popen.returncode} without a result" if p.popen else "not started")
        tail = [ln for ln in p.stderr if ln.strip()][-3:]
        launch_errors[p.host] = why + (f": {' | '.join(tail)}" if tail else "")
    outcome = merge(reports, world)
    hosts_by_rank = outcome.get("hosts") or []
    for i, h in enumerate(hosts_by_rank):
        if h is None and i // nproc_per_node < len(hosts):
            hosts_by_rank[i] = hosts[i // nproc_per_node]
    outcome["launch_errors"] = launch_errors
    outcome["nodes"] = list(hosts)
    return outcome


def _kill(popen: subprocess.Popen) -> None:
    if not kill_group(popen.pid):
        try:
            popen.kill()
        except ProcessLookupError:
            pass
