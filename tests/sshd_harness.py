"""A real OpenSSH server on loopback addresses, standing in for several hosts.

`SshdHarness(root, hosts={"n1": "127.0.0.1", ...}).start()` generates a host key and a user key
in `root`, writes an sshd_config (one ListenAddress per distinct address, one port, keys only,
PidFile in `root`), starts `/usr/sbin/sshd -D -e` as a child and waits until every address
answers. It writes a user ssh config (`Host <name>` -> `HostName <addr>`, the port, the key,
no known-hosts file, BatchMode) and a ClusterShell config folder (clush.conf whose ssh_options
name that ssh config) for CLUSTERSHELL_CFGDIR. Names that map to an address where nothing
listens (127.0.0.9) stand for unreachable hosts. stop() kills sshd by its PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def sshd_unavailable() -> str | None:
    """Why the harness cannot run here, or None."""
    if not os.path.exists(SSHD):
        return "openssh-server is not installed (apt-get install openssh-server)"
    if not shutil.which("ssh"):
        return "the ssh client is not installed (apt-get install openssh-client)"
    if os.geteuid() != 0:
        return "sshd with privilege separation needs root"
    return None


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _answers(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=0.5) as s:
            s.settimeout(0.5)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


class SshdHarness:
    def __init__(self, root: Path, hosts: dict[str, str], *, port: int | None = None,
                 dead: dict[str, str] | None = None, max_startups: int = 256):
        self.root = Path(root)
        self.hosts = dict(hosts)
        self.dead = dict(dead or {})
        self.port = port or free_port()
        self.max_startups = max_startups
        self.proc: subprocess.Popen | None = None
        self.ssh_config = self.root / "ssh_config"
        self.cfgdir = self.root / "clustershell"
        self.user_key = self.root / "user_key"

    @property
    def addresses(self) -> list[str]:
        return sorted(set(self.hosts.values()))

    def env(self) -> dict[str, str]:
        return {"CLUSTERSHELL_CFGDIR": str(self.cfgdir)}

    def ssh_argv(self, host: str, command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), host, command]

    def start(self, timeout_s: float = 20.0) -> "SshdHarness":
        self.root.mkdir(parents=True, exist_ok=True)
        host_key = self.root / "host_key"
        for key in (host_key, self.user_key):
            if not key.exists():
                subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (self.root / "authorized_keys").write_text(Path(str(self.user_key) + ".pub").read_text())
        listen = "\n".join(f"ListenAddress {a}:{self.port}" for a in self.addresses)
        (self.root / "sshd_config").write_text(
            f"{listen}\n"
            f"HostKey {host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            f"MaxStartups {self.max_startups}\n"
            "MaxSessions 64\n"
            "LogLevel ERROR\n"
        )
        entries = [f"Host {name}\n  HostName {addr}\n" for name, addr in {**self.hosts, **self.dead}.items()]
        self.ssh_config.write_text(
            "".join(entries)
            + "Host *\n"
            f"  Port {self.port}\n"
            "  User root\n"
            f"  IdentityFile {self.user_key}\n"
            "  IdentitiesOnly yes\n"
            "  UserKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking no\n"
            "  BatchMode yes\n"
            "  LogLevel ERROR\n"
            "  ConnectTimeout 5\n"
        )
        self.cfgdir.mkdir(exist_ok=True)
        (self.cfgdir / "clush.conf").write_text(
            "[Main]\n"
            "fanout: 64\n"
            "connect_timeout: 5\n"
            "command_timeout: 0\n"
            f"ssh_options: -F {self.ssh_config}\n"
        )
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.root / "sshd.log", "wb"))
        deadline = time.monotonic() + timeout_s
        while not all(_answers(a, self.port) for a in self.addresses):
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited ({self.proc.returncode}): {(self.root / 'sshd.log').read_text()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd did not answer on {self.addresses} port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> "SshdHarness":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
