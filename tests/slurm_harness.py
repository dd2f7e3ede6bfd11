"""A real Slurm cluster on one host: munged, slurmctld and one slurmd per node (`slurmd -N nX`).

Every path lives under one temporary folder (chmod 0755 so that munged accepts its socket
folder); SLURM_CONF points at its slurm.conf. ProctrackType=proctrack/linuxproc and
TaskPlugin=task/none need no cgroups. Each node has its own slurmd port; SlurmdSpoolDir,
SlurmdPidFile and SlurmdLogFile use %n. Teardown goes by PID: slurmd, then slurmctld, then munged.

    with SlurmHarness(root, nodes=["n1", "n2", "n3", "n4"], prolog="/path/prolog") as cl:
        cl.run(["srun", "-w", "n2", "true"], timeout=30)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"


def slurm_unavailable() -> str | None:
    for path, pkg in ((MUNGED, "munge"), (SLURMCTLD, "slurmctld"), (SLURMD, "slurmd")):
        if not os.path.exists(path):
            return f"{path} missing (apt-get install {pkg})"
    for tool in ("srun", "sbatch", "scontrol", "sinfo"):
        if not shutil.which(tool):
            return f"{tool} missing (apt-get install slurm-client)"
    if os.geteuid() != 0:
        return "slurmd must run as root (SlurmdUser=root)"
    return None


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class SlurmHarness:
    def __init__(self, root: Path, nodes: list[str], *, prolog: str | None = None,
                 epilog: str | None = None, extra_conf: str = ""):
        self.root = Path(root)
        self.nodes = list(nodes)
        self.prolog = prolog
        self.epilog = epilog
        self.extra_conf = extra_conf
        self.conf = self.root / "slurm.conf"
        self.munge_dir = self.root / "munge"
        self.socket = self.munge_dir / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}

    # -- environment --------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for k in list(env):
            if k.startswith(("SLURM_JOB", "SLURM_STEP", "SLURM_NODELIST", "SLURM_NTASKS")):
                del env[k]
        return env

    def run(self, argv: list[str], timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess:
        """Run a Slurm client command; every one under a time limit (srun waits forever on a
        drained node)."""
        return subprocess.run(["timeout", "-k", "5", str(int(timeout)), *argv], env=self.env(),
                              capture_output=True, text=True, check=check)

    # -- start/stop ---------------------------------------------------------------------------
    def _write_conf(self) -> None:
        ctld_port, *ports = _free_ports(len(self.nodes) + 1)
        lines = [
            "ClusterName=gpucheck",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/linear",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=30",
            "SchedulerParameters=defer_batch=0",
        ]
        if self.prolog:
            lines.append(f"Prolog={self.prolog}")
        if self.epilog:
            lines.append(f"Epilog={self.epilog}")
        for node, port in zip(self.nodes, ports):
            lines.append(f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=1 State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        if self.extra_conf:
            lines.append(self.extra_conf)
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env())

    def start(self, timeout_s: float = 60.0) -> "SlurmHarness":
        os.chmod(self.root, 0o755)
        for d in ("state", "spool", "run", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.munge_dir.mkdir(exist_ok=True)
        os.chmod(self.munge_dir, 0o711)  # munged wants execute for all on its socket folder
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._write_conf()
        self._spawn("munged", [MUNGED, "-F", f"--socket={self.socket}", f"--key-file={key}",
                               f"--pid-file={self.munge_dir / 'munged.pid'}",
                               f"--log-file={self.munge_dir / 'munged.log'}",
                               f"--seed-file={self.munge_dir / 'munged.seed'}"])
        self._wait(lambda: self.socket.exists(), timeout_s, "munged socket")
        self._spawn("slurmctld", [SLURMCTLD, "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run(["scontrol", "ping"], timeout=5).stdout.count("UP") > 0,
                   timeout_s, "slurmctld")
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", [SLURMD, "-D", "-N", n, "-f", str(self.conf)])
        self._wait(self.all_idle, timeout_s, "nodes idle")
        return self

    def _wait(self, cond, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}: "
                                       f"{(self.root / 'log' / (name + '.out')).read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}; sinfo: {self.sinfo_states()}")
            time.sleep(0.2)

    def stop(self) -> None:
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.pop(name, None)
            if p is None:
                continue
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)

    def __enter__(self) -> "SlurmHarness":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- queries ------------------------------------------------------------------------------
    def sinfo_states(self) -> dict[str, str]:
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        out = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1]
        return out

    def all_idle(self) -> bool:
        states = self.sinfo_states()
        return all(states.get(n) == "idle" for n in self.nodes)

    def node_info(self, node: str) -> dict[str, str]:
        """State and Reason of a node, from `scontrol show node`."""
        r = self.run(["scontrol", "show", "node", node], timeout=10)
        text = r.stdout
        state = re.search(r"\bState=(\S+)", text)
        reason = re.search(r"\bReason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$", text, re.M)
        return {"state": state.group(1) if state else "", "reason": reason.group(1).strip() if reason else ""}

    def wait_for(self, cond, timeout_s: float = 30, what: str = "condition") -> None:
        self._wait(cond, timeout_s, what)
