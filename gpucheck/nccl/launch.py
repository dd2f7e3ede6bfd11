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
protect it there; gpucheck.platform.placeholders). Host names and addresses are checked where
they are parsed (gpucheck.platform.nodeset; parse_addrs), so no value starts with ``-`` or holds
shell syntax.

The rendezvous is on the group's first host. Its rank binds a free port and prints a
``listening`` event; the launcher writes that port to the other ranks' standard input (they were
started with ``--master-port stdin`` and import torch meanwhile). Every rank's standard input is
its session: the launcher holds it open, writing nothing but that port line, until the group is
over, and every rank runs with ``--session-stdin``, so an end-of-file (this process stopped,
killed or its launcher client gone, an ssh connection dropped) stops the ranks on the host at
any moment from their start on, instead of leaving them to their ``--deadline``. Every rank
also gets the hosts' addresses (``--peer-addrs``), from which it picks its network interface
when none is given.
A launcher that ends without a result (exit 255: ssh could not reach the host; 127: no
gpucheck there) ends the group at once, and that host is named; every process is killed (its
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
from typing import TYPE_CHECKING, Any, Callable, cast

from ..platform import processes
from ..platform.nodeset import NodeSetError, check_node_name, node_name_problem
from ..platform.placeholders import quoted_placeholder, refusal, substitute
from ..platform.processes import kill_group
from .report import merge, parse_events

if TYPE_CHECKING:  # pragma: no cover
    from .collective import ListeningEvent, NcclEvent, RankReport
    from .report import Outcome

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
        if _ssh_without_stdin(toks):
            raise ValueError(f"launcher template {self.template!r}: ssh -n, -f or StdinNull gives the remote "
                             "`nccl run` no standard input, where it reads the rendezvous port and the end of "
                             "its session")


def _ssh_without_stdin(toks: list[str]) -> bool:
    """Whether an `ssh` word of the template is given options that replace the remote command's
    standard input with /dev/null (the options before its destination: `--` or a placeholder)."""
    from ..platform.fanout import ssh_reads_no_stdin

    for i, tok in enumerate(toks):
        if tok.rsplit("/", 1)[-1] != "ssh":
            continue
        opts = []
        for word in toks[i + 1:]:
            if word == "--" or any(ph in word for ph in PLACEHOLDERS):
                break
            opts.append(word)
        if ssh_reads_no_stdin(shlex.join(opts)):
            return True
    return False


def parse_addrs(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """['h1=10.0.0.1', ...] -> {'h1': '10.0.0.1'}. HOST is a node name (gpucheck.platform.nodeset's
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
             backend: str, ifname: str | None = None, nproc_per_node: int = 1, force: bool = False) -> list[str]:
    """The measurement options shared by every rank of a group (`force`: load GPUs in use)."""
    a = ["--ops", ",".join(ops), "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
         "--warmup", str(warmup), "--timeout", f"{timeout_s:g}", "--backend", backend]
    if ifname:
        a += ["--ifname", ifname]
    if nproc_per_node != 1:
        a += ["--nproc-per-node", str(nproc_per_node)]
    if force:
        a.append("--force")
    return a


UNREACHABLE_RC = 255  # ssh's status when it could not connect (refused, no route, name, host key, auth)
CANNOT_START = {126: "cannot execute gpucheck", 127: "gpucheck not found"}
POLL_S = 0.05


@dataclass
class _Proc:
    host: str
    rank: int
    argv: list[str]
    popen: subprocess.Popen | None = None
    events: "list[NcclEvent]" = field(default_factory=list)
    stderr: deque = field(default_factory=lambda: deque(maxlen=20))
    error: str | None = None
    unreachable: bool = False
    stopped: bool = False  # ended by us because another host of the group could not take part
    threads: list[threading.Thread] = field(default_factory=list)

    def has_result(self) -> bool:
        return any(ev.get("event") == "result" for ev in self.events)

    def ended(self) -> bool:
        return self.popen is None or self.popen.poll() is not None

    def tail(self) -> str:
        lines = [ln for ln in self.stderr if ln.strip()][-3:]
        return f": {' | '.join(lines)}" if lines else ""


def run_group(
    hosts: list[str],
    launcher: Launcher,
    args: list[str],
    *,
    deadline_s: float,
    index: int = 0,
    corrupt: dict[str, str] | None = None,
    on_event: "Callable[[str, NcclEvent], None] | None" = None,
    nproc_per_node: int = 1,
) -> "Outcome":
    """Run one collective across `hosts` (node rank = position) and merge the ranks' events.

    `corrupt` maps a host to the --inject text its ranks get. Returns report.merge()'s outcome plus
    'launch_errors' {host: why} for hosts that gave no result, 'unreachable' (the hosts whose
    launcher exited 255: ssh could not connect) and 'stopped' (hosts whose processes were ended
    because another host could not take part). A launcher that exits without a result while the
    others run (an unreachable host, gpucheck missing there) ends the group at once: its peers
    would only wait for it until their rendezvous timeout. Each host's process leads a session
    of its own, tracked by gpucheck.platform.processes: a stop (SIGTERM/SIGINT of the command) ends them,
    and run_group raises Interrupted instead of returning what the stopped ranks left."""
    group = _Group(hosts, launcher, args, deadline_s=deadline_s, index=index, corrupt=corrupt, on_event=on_event,
                   nproc_per_node=nproc_per_node)
    try:
        group.start()
        group.supervise()
    finally:
        group.cleanup()
    processes.check_stop()  # ranks stopped by a signal gave no result worth judging
    return group.outcome()


class _Group:
    """The processes of one group test and their supervision."""

    def __init__(self, hosts: list[str], launcher: Launcher, args: list[str], *, deadline_s: float, index: int,
                 corrupt: dict[str, str] | None, on_event: "Callable[[str, NcclEvent], None] | None",
                 nproc_per_node: int):
        self.hosts = list(hosts)
        self.launcher = launcher
        self.deadline_s = deadline_s
        self.on_event = on_event
        self.nproc_per_node = nproc_per_node
        self.procs = self._procs(args, index, corrupt or {})
        self.port: int | None = None
        self.port_known = threading.Event()
        self.relayed = launcher.is_srun
        self.t_end = time.monotonic() + deadline_s

    def _procs(self, args: list[str], index: int, corrupt: dict[str, str]) -> list[_Proc]:
        lau, hosts = self.launcher, self.hosts
        master = lau.addr(hosts[0])
        addrs = ",".join(lau.addr(h) for h in hosts)
        if lau.is_srun:
            port = lau.port_base + index
            cmd = [*lau.program, "nccl", "run", "--master-addr", master, "--master-port", str(port),
                   "--peer-hosts", ",".join(hosts), "--peer-addrs", addrs, *args]
            argv = ["srun", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1",
                    f"--nodelist={','.join(hosts)}", "--kill-on-bad-exit=0", *cmd]
            return [_Proc(",".join(hosts), -1, argv)]
        out = []
        for node_rank, host in enumerate(hosts):
            cmd = [*lau.program, "nccl", "run", "--master-addr", master,
                   "--master-port", "0" if node_rank == 0 else "stdin", "--session-stdin",
                   "--host-label", host, "--peer-hosts", ",".join(hosts), "--peer-addrs", addrs, *args]
            if self.nproc_per_node == 1:
                cmd += ["--rank", str(node_rank), "--world-size", str(len(hosts))]
            else:
                cmd += ["--node-rank", str(node_rank), "--nnodes", str(len(hosts))]
            if host in corrupt:
                cmd += ["--inject", corrupt[host]]
            out.append(_Proc(host, node_rank, lau.argv(host, cmd)))
        return out

    # -- running ------------------------------------------------------------------------------
    def _read_out(self, p: _Proc) -> None:
        assert p.popen is not None and p.popen.stdout is not None
        for raw in p.popen.stdout:
            for ev in parse_events(raw):
                p.events.append(ev)
                if ev.get("event") == "listening" and not self.port_known.is_set():
                    self.port = int(cast("ListeningEvent", ev)["port"])
                    self.port_known.set()
                if self.on_event is not None:
                    self.on_event(p.host, ev)

    @staticmethod
    def _read_err(p: _Proc) -> None:
        assert p.popen is not None and p.popen.stderr is not None
        for raw in p.popen.stderr:
            line = raw.rstrip()
            if line and not line.startswith("frame #"):
                p.stderr.append(line[:300])

    def start(self) -> None:
        for p in self.procs:
            try:
                p.popen = processes.start(p.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, bufsize=1)
            except OSError as e:
                p.error = f"cannot start {p.argv[0]}: {e.strerror or e}"
                continue
            for target in (self._read_out, self._read_err):
                th = threading.Thread(target=target, args=(p,), daemon=True)
                th.start()
                p.threads.append(th)

    def supervise(self) -> None:
        """Relay the rendezvous port, wait for every process; a process that ends without a
        result (or cannot start) ends the group; the deadline kills what is left."""
        while not all(p.ended() for p in self.procs):
            if not self.relayed and self.port_known.is_set():
                self._relay()
            failed = next((p for p in self.procs if self._failed(p)), None)
            if failed is not None:
                self._stop_others(failed)
                return
            if time.monotonic() >= self.t_end:
                for p in self.procs:
                    if not p.ended():
                        p.error = f"no result within {self.deadline_s:.0f} s (killed)"
                        _kill(p.popen)
                return
            time.sleep(POLL_S)
        for p in self.procs:  # every process ended: name those that gave no result
            self._failed(p)

    def _relay(self) -> None:
        """Write the port rank 0 announced to the other hosts (they read it on stdin). Their
        standard input stays open: it is the session their `--session-stdin` watches."""
        self.relayed = True
        for p in self.procs[1:]:
            if p.popen is None or p.popen.stdin is None:
                continue
            try:
                p.popen.stdin.write(f"{self.port}\n")
                p.popen.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def _failed(self, p: _Proc) -> bool:
        """Has `p` ended (or not started) without a result? Sets its error on the first look."""
        if p.error is not None:
            return not p.stopped
        if not p.ended() or p.popen is None:
            return False
        for th in p.threads:  # its last lines may still be on their way
            th.join(timeout=1.0)
        if p.has_result():
            return False
        rc = p.popen.returncode
        if rc == UNREACHABLE_RC:
            p.unreachable = True
            p.error = f"unreachable (launcher exit {rc})"
        elif rc in CANNOT_START:
            p.error = f"{CANNOT_START[rc]} (exit {rc})"
        else:
            p.error = f"exited with code {rc} without a result"
        return True

    def _stop_others(self, failed: _Proc) -> None:
        for p in self.procs:
            if p is not failed and not p.ended() and not p.has_result():
                p.stopped = True
                _kill(p.popen)

    def cleanup(self) -> None:
        """Kill what is left, reap it, then close every standard input: the end of the
        sessions, which a remote `nccl run --session-stdin` takes as the order to stop (over
        ssh, killing the local client is what closes it there)."""
        for p in self.procs:
            if p.popen is not None and p.popen.poll() is None:
                _kill(p.popen)
            if p.popen is not None:
                try:
                    p.popen.wait(timeout=5)
                    processes.untrack(p.popen.pid)
                except subprocess.TimeoutExpired:
                    pass
                _close_stdin(p.popen)
            for th in p.threads:
                th.join(timeout=2)

    # -- the outcome --------------------------------------------------------------------------
    def outcome(self) -> "Outcome":
        reports = [cast("RankReport", ev) for p in self.procs for ev in p.events if ev.get("event") == "result"]
        launch_errors: dict[str, str] = {}
        for p in self.procs:
            if p.has_result() or p.stopped:
                continue
            why = p.error or "not started"
            launch_errors[p.host] = why + p.tail()
        outcome = merge(reports, len(self.hosts) * self.nproc_per_node)
        hosts_by_rank = outcome.get("hosts") or []
        for i, h in enumerate(hosts_by_rank):
            if h is None and i // self.nproc_per_node < len(self.hosts):
                hosts_by_rank[i] = self.hosts[i // self.nproc_per_node]
        outcome["launch_errors"] = launch_errors
        outcome["unreachable"] = [p.host for p in self.procs if p.unreachable]
        outcome["stopped"] = [p.host for p in self.procs if p.stopped]
        outcome["nodes"] = list(self.hosts)
        return outcome


def _close_stdin(popen: subprocess.Popen) -> None:
    if popen.stdin is not None:
        try:
            popen.stdin.close()
        except OSError:  # the rest of a port line that could not be written
            pass


def _kill(popen: subprocess.Popen | None) -> None:
    if popen is None:
        return
    if not kill_group(popen.pid):
        try:
            popen.kill()
        except ProcessLookupError:
            pass


def describe(launcher: Launcher, hosts: list[str], args: list[str]) -> str:
    """The command line that starts the first host's part of a group test (for people)."""
    procs = _Group(hosts, launcher, args, deadline_s=0.0, index=0, corrupt=None, on_event=None,
                   nproc_per_node=1).procs
    return shlex.join(procs[0].argv) if procs else ""
