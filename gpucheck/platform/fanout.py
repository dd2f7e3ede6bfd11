"""Run one command per node at once: over ssh (ClusterShell's ssh worker), or with srun.

`run_nodes(commands, mode="ssh", ...)` takes {node: shell command} and returns {node: NodeRun}:
plain data (stdout, stderr, exit code, whether the per-node timeout killed it, wall time). The
fan-out (how many nodes run at once) and the per-node timeout are ClusterShell's own: one Task,
one worker per distinct command, the task-wide fanout bounding all of them together.

ssh: ClusterShell starts the `ssh` client, so the user's ~/.ssh/config, keys, agent and
ProxyJump apply as they do for `ssh`. Defaults come from ClusterShell's clush.conf (the files of
ClusterShell.Defaults.config_paths, $CLUSTERSHELL_CFGDIR last): ssh_path, ssh_options,
ssh_user, connect_timeout, fanout; explicit arguments win.

srun: a local `srun --nodes=1 --ntasks=1 --nodelist=NODE ...` per node (ClusterShell's exec
worker substitutes the node name into a shell command line, where it stands single-quoted), so
every node has its own exit code, output and timeout. Inside an allocation the steps run in it
(`--overlap`); outside one each srun gets its own job.

Node names: run_nodes refuses (ValueError) a name that gpucheck.platform.nodeset would not accept
(letters, digits, `-`, `_`, `.`; not starting with `-`), so no name carries shell syntax or
passes for an ssh option. ClusterShell builds the ssh command line itself and puts its own
options right before the host, so no `--` can go there: the name check is what keeps a host
from being read as an option.

Output: at most MAX_OUTPUT_BYTES of a node's standard output are kept (NodeRun.truncated tells
that more came) and the last MAX_STDERR_BYTES of its standard error; a node's buffers are
released as soon as it is reported.

The fan-out runs in a thread of its own (a ClusterShell Task is bound to its thread), so several
sweeps in one process never share task state.

Stopping: every local command (the ssh client, the shell around srun) runs in a session of its
own (`setsid`, util-linux) and is tracked by gpucheck.platform.processes, so what kills it reaches its
whole process group and not only the client: a per-node timeout or an abort sends SIGKILL to
the group (ClusterShell's signal), a stop (SIGTERM/SIGINT inside processes.stop_on_signals)
SIGTERM and SIGKILL after processes.GRACE_S. On a stop the task is aborted (no further node
starts) and run_nodes raises processes.Interrupted with the NodeRuns of the nodes that had
answered before it as `partial`; nodes cut short are not reported (`on_done` is not called for
them). In ssh and srun modes the commands' standard input stays open and is never written, so
the remote side sees it close when the session ends (the sweep's remote command uses that:
gpucheck.fleet.sweep.die_with_session; `session_stdin` tells whether options such as ssh -n take
that away).
"""

from __future__ import annotations

import configparser
import functools
import math
import shlex
import shutil
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, TypedDict

from . import processes
from .nodeset import check_node_name
from .processes import Interrupted, stopping

DEFAULT_FANOUT = 64
MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # a verdict of an 8-GPU node is about 80 KB
MAX_STDERR_BYTES = 64 * 1024


@dataclass
class NodeRun:
    node: str
    rc: int | None  # None when the per-node timeout killed the command
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0
    via: str = "ssh"  # ssh | srun | exec
    command: str = ""
    truncated: bool = False  # stdout went past MAX_OUTPUT_BYTES: the rest was dropped


@dataclass
class SshSettings:
    """How to reach nodes over ssh. None means: take clush.conf's value, else ssh's default."""

    ssh_path: str | None = None
    ssh_options: str | None = None
    ssh_user: str | None = None
    connect_timeout_s: float | None = None


@dataclass
class SrunSettings:
    srun_path: str = "srun"
    extra_args: list[str] = field(default_factory=list)


class RunnerSettings(TypedDict):
    """How run_nodes reaches the nodes: its `ssh` and `srun` keyword arguments (**settings)."""

    ssh: SshSettings
    srun: SrunSettings


def clush_config() -> dict[str, str]:
    """clush.conf's [Main] values that matter here (later files win, as in clush itself)."""
    from ClusterShell.Defaults import config_paths

    parser = configparser.ConfigParser()
    try:
        parser.read(config_paths("clush.conf"))
    except configparser.Error:
        return {}
    if not parser.has_section("Main"):
        return {}
    keys = ("ssh_path", "ssh_options", "ssh_user", "connect_timeout", "fanout")
    return {k: parser.get("Main", k) for k in keys if parser.has_option("Main", k)}


def resolve_ssh(settings: SshSettings | None) -> SshSettings:
    settings = settings or SshSettings()
    conf = clush_config()
    timeout = settings.connect_timeout_s
    if timeout is None and conf.get("connect_timeout"):
        try:
            timeout = float(conf["connect_timeout"])
        except ValueError:
            timeout = None
    return SshSettings(
        ssh_path=settings.ssh_path or conf.get("ssh_path") or None,
        # ssh keeps the first value it sees for an option: the explicit options go first to win
        ssh_options=" ".join(x for x in (settings.ssh_options, conf.get("ssh_options")) if x) or None,
        ssh_user=settings.ssh_user or conf.get("ssh_user") or None,
        connect_timeout_s=timeout,
    )


# ssh's one-letter options that take a value (the rest of the word, or the next word).
_SSH_VALUE_FLAGS = frozenset("BbcDEeFIiJLlmOopQRSWw")


def ssh_reads_no_stdin(options: str | None) -> bool:
    """Whether ssh `options` give the remote command no standard input: -n, -f (implies -n) or
    `-o StdinNull=yes`. Options that cannot be split are read as giving it one."""
    try:
        words = shlex.split(options or "")
    except ValueError:
        return False
    i = 0
    while i < len(words):
        word, i = words[i], i + 1
        if not word.startswith("-") or word.startswith("--"):
            continue
        for k, flag in enumerate(word[1:], start=2):
            if flag in "nf":
                return True
            if flag in _SSH_VALUE_FLAGS:
                value = word[k:] or (words[i] if i < len(words) else "")
                i += 0 if word[k:] else 1
                setting, _, rest = value.replace("=", " ", 1).partition(" ")
                if flag == "o" and setting.lower() == "stdinnull" and rest.strip().lower() in ("yes", "true"):
                    return True
                break
    return False


def srun_reads_no_stdin(args: list[str]) -> bool:
    """Whether srun `args` give the task no standard input (`--input=none`, `-i none`)."""
    for i, arg in enumerate(args):
        value = None
        if arg.startswith("--input="):
            value = arg[len("--input="):]
        elif arg in ("--input", "-i"):
            value = args[i + 1] if i + 1 < len(args) else None
        elif arg.startswith("-i") and not arg.startswith("--"):
            value = arg[2:]
        if value is not None and value.strip().lower() == "none":
            return True
    return False


def session_stdin(mode: str, *, ssh: SshSettings | None = None, srun: SrunSettings | None = None) -> bool:
    """Whether the command run_nodes starts on a node reads the session's standard input, so
    that an end-of-file there means that the session ended (its local client was killed).
    run_nodes keeps the clients' standard input open and never writes it in ssh and srun modes;
    it closes it at once in exec mode. ssh options (explicit, then clush.conf's) or srun arguments
    that replace it with /dev/null make it False."""
    if mode == "ssh":
        return not ssh_reads_no_stdin(resolve_ssh(ssh).ssh_options)
    if mode == "srun":
        return not srun_reads_no_stdin(list((srun or SrunSettings()).extra_args))
    return False


def default_fanout() -> int:
    try:
        return max(1, int(clush_config().get("fanout", DEFAULT_FANOUT)))
    except ValueError:
        return DEFAULT_FANOUT


def srun_command(command: str, settings: SrunSettings, timeout_s: float | None) -> str:
    """The local command line that runs `command` (shell text) on node %h through srun."""
    mark = "@GPUCHECK_NODE@"
    argv = [settings.srun_path, "--nodes=1", "--ntasks=1", f"--nodelist={mark}", "--overlap",
            "--job-name=gpucheck", "--kill-on-bad-exit=1"]
    if timeout_s:
        # Slurm's own limit (whole minutes) backs up ClusterShell's, which only kills srun.
        argv.append(f"--time={max(1, math.ceil(timeout_s / 60) + 1)}")
    argv += [*settings.extra_args, "/bin/sh", "-c", command]
    # ClusterShell substitutes %h (the node name) and runs the line with a shell; every other %
    # must be doubled. The name stands single-quoted (names never hold a quote: check_node_name).
    return shlex.join(argv).replace("%", "%%").replace(mark, "'%h'")


_SETSID = shutil.which("setsid")


@functools.lru_cache(maxsize=None)
def _in_own_session(worker_cls: type) -> type:
    """`worker_cls` (a ClusterShell ExecWorker: exec, ssh) whose clients run their command under
    `setsid` (a session and process group of its own), tracked by gpucheck.platform.processes while it
    runs, and killed as a group when ClusterShell kills it (per-node timeout, abort): SIGKILL,
    as ClusterShell sends to the client alone (a client ended by SIGTERM would exit "normally",
    ssh with 255, and the timeout would read as unreachable). A stop (processes) sends SIGTERM
    to the groups first. Without `setsid` on the PATH the command stays in our process group
    and only the client is signalled, as ClusterShell does."""
    base = worker_cls.SHELL_CLASS

    class GroupClient(base):  # type: ignore[misc, valid-type]
        def _build_cmd(self):
            cmd, env = super()._build_cmd()
            if _SETSID:
                cmd = [_SETSID, "/bin/sh", "-c", cmd] if isinstance(cmd, str) else [_SETSID, *cmd]
            return cmd, env

        def _start(self):
            started = super()._start()
            processes.track(self.popen.pid)
            return started

        def _close(self, abort, timeout):
            popen = self.popen
            if abort and popen is not None and popen.poll() is None:
                processes.kill_group(popen.pid, signal.SIGKILL)
            try:
                super()._close(abort, timeout)
            finally:
                if popen is not None:
                    processes.untrack(popen.pid)

    return type(f"Group{worker_cls.__name__}", (worker_cls,), {"SHELL_CLASS": GroupClient})


class _Collector:
    """ClusterShell event handler: buffers per node, reports each finished node once."""

    def __init__(self, via: str, commands: Mapping[str, str],
                 on_done: Callable[[NodeRun], None] | None):
        from ClusterShell.Event import EventHandler

        self.via = via
        self.commands = commands
        self.on_done = on_done
        self.out: dict[str, list[bytes]] = {}
        self.err: dict[str, deque[bytes]] = {}
        self.sizes: dict[tuple[str, str], int] = {}  # (node, stream) -> bytes kept
        self.truncated: set[str] = set()
        self.start: dict[str, float] = {}
        self.done: dict[str, NodeRun] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(EventHandler):
            def ev_pickup(self, worker, node):
                outer.start[str(node)] = time.monotonic()

            def ev_read(self, worker, node, sname, msg):
                outer.keep(str(node), sname, bytes(msg))

            def ev_hup(self, worker, node, rc):
                outer.finish(str(node), rc, timed_out=False)

            def ev_close(self, worker, timedout):
                if timedout:
                    for node in worker.iter_keys_timeout():
                        outer.finish(str(node), None, timed_out=True)

        self.handler = Handler()

    def keep(self, node: str, sname: str, line: bytes) -> None:
        """Buffer one line: stdout up to MAX_OUTPUT_BYTES (then mark the node truncated),
        stderr's last MAX_STDERR_BYTES."""
        key = (node, sname)
        if sname == "stderr":
            line = line[-MAX_STDERR_BYTES:]
            lines = self.err.setdefault(node, deque())
            lines.append(line)
            size = self.sizes.get(key, 0) + len(line) + 1
            while size > MAX_STDERR_BYTES and len(lines) > 1:
                size -= len(lines.popleft()) + 1
            self.sizes[key] = size
            return
        size = self.sizes.get(key, 0) + len(line) + 1
        if size > MAX_OUTPUT_BYTES:
            self.truncated.add(node)
            return
        self.out.setdefault(node, []).append(line)
        self.sizes[key] = size

    def finish(self, node: str, rc: int | None, *, timed_out: bool) -> None:
        with self.lock:
            if node in self.done or stopping() is not None:  # after a stop: cut short, no answer
                return
            run = NodeRun(
                node=node,
                rc=rc,
                stdout=b"\n".join(self.out.pop(node, [])).decode("utf-8", "replace"),
                stderr=b"\n".join(self.err.pop(node, [])).decode("utf-8", "replace"),
                timed_out=timed_out,
                duration_s=round(time.monotonic() - self.start.pop(node, time.monotonic()), 3),
                via=self.via,
                command=self.commands.get(node, ""),
                truncated=node in self.truncated,
            )
            self.sizes.pop((node, "stdout"), None)
            self.sizes.pop((node, "stderr"), None)
            self.done[node] = run
        if self.on_done is not None:
            try:
                self.on_done(run)
            except Exception:  # a display problem never loses a result
                pass


def run_nodes(
    commands: Mapping[str, str],
    *,
    mode: str = "ssh",
    fanout: int | None = None,
    timeout_s: float | None = None,
    ssh: SshSettings | None = None,
    srun: SrunSettings | None = None,
    on_done: Callable[[NodeRun], None] | None = None,
) -> dict[str, NodeRun]:
    """Run commands[node] on every node; return a NodeRun for every node, in `commands` order.

    mode: "ssh" (remote shell on the node), "srun" (a Slurm step on the node) or "exec" (a local
    command per node, `%h` replaced by the node name: for tests and custom launchers).
    """
    if mode not in ("ssh", "srun", "exec"):
        raise ValueError(f"unknown fan-out mode {mode!r}")
    for node in commands:
        check_node_name(node, what="fan-out")
    if not commands:
        return {}
    fanout = fanout or default_fanout()
    if fanout < 1:
        raise ValueError("fanout must be at least 1")
    if mode == "srun":
        settings = srun or SrunSettings()
        local = {n: srun_command(c, settings, timeout_s) for n, c in commands.items()}
    else:
        local = dict(commands)

    collector = _Collector(mode, commands, on_done)
    groups: dict[str, list[str]] = {}
    for node, cmd in local.items():
        groups.setdefault(cmd, []).append(node)
    box: dict[str, BaseException] = {}
    task_box: dict[str, object] = {}
    ready = threading.Event()

    def target() -> None:
        from ClusterShell.NodeSet import NodeSet
        from ClusterShell.Task import task_self, task_terminate

        try:
            task = task_self()
            task_box["task"] = task
            _set_up_task(task, mode, int(fanout), ssh)
            for cmd, nodes in groups.items():
                task.shell(cmd, nodes=NodeSet.fromlist(nodes), handler=collector.handler,
                           timeout=timeout_s, stderr=True, stdin=(mode != "exec"), tree=False,
                           remote=(mode == "ssh"))
            ready.set()
            task.resume()
        except BaseException as e:  # reported to the caller below
            box["error"] = e
        finally:
            ready.set()
            try:
                task_terminate()
            except Exception:
                pass

    th = threading.Thread(target=target, name="gpucheck-fanout", daemon=True)
    th.start()
    _wait(th, task_box, ready)
    if stopping() is not None:
        raise Interrupted(stopping(), partial={n: r for n, r in collector.done.items()})
    if "error" in box:
        raise box["error"]

    return _in_order(commands, collector.done, mode)


def _set_up_task(task, mode: str, fanout: int, ssh: SshSettings | None) -> None:
    """The ClusterShell task's fan-out, workers (clients in sessions of their own) and ssh settings."""
    task.set_info("fanout", fanout)
    # The collector keeps the output; ClusterShell's own message trees would hold every line a
    # second time.
    task.set_default("stdout_msgtree", False)
    task.set_default("stderr_msgtree", False)
    for key in ("local_worker", "distant_worker"):
        cls = task.default(key)
        if getattr(cls, "SHELL_CLASS", None) is not None:
            task.set_default(key, _in_own_session(cls))
    if mode == "ssh":
        s = resolve_ssh(ssh)
        task.set_info("ssh_path", s.ssh_path)
        task.set_info("ssh_options", s.ssh_options)
        task.set_info("ssh_user", s.ssh_user)
        task.set_info("connect_timeout", float(s.connect_timeout_s or 0))


def _in_order(commands: Mapping[str, str], done: Mapping[str, NodeRun], mode: str) -> dict[str, NodeRun]:
    """A NodeRun for every node, in `commands` order: a node the engine gave no event for is
    reported as such, never dropped."""
    out: dict[str, NodeRun] = {}
    for node in commands:
        run = done.get(node)
        if run is None:
            run = NodeRun(node=node, rc=None, stderr="no result from the fan-out engine",
                          via=mode, command=commands[node])
        out[node] = run
    return out


def _wait(th: threading.Thread, task_box: dict[str, object], ready: threading.Event) -> None:
    """Wait for the fan-out thread; abort its task on a stop (the stopper is killing the
    clients: no further node may start) or when the wait itself is interrupted."""
    try:
        while th.is_alive():
            th.join(0.1)
            if stopping() is not None:
                _abort(task_box, ready)
                th.join(10)
                return
    except BaseException:
        _abort(task_box, ready)
        th.join(10)
        raise


def _abort(task_box: dict[str, object], ready: threading.Event) -> None:
    """Abort the fan-out's task from the calling thread (ClusterShell delegates the call to the
    task's own thread): no further node starts, running clients are stopped."""
    ready.wait(5)
    task = task_box.get("task")
    if task is not None:
        try:
            task.abort(kill=True)  # type: ignore[attr-defined]
        except Exception:
            pass
