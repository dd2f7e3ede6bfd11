"""Network namespaces as "hosts" for the collective tests (root only).

`Lab(n)` creates n host namespaces and one bridge namespace, all named gpck<pid>-..., joined by
veth pairs to a Linux bridge: host i has interface `gpck0` with address 10.77.<x>.<i+1>/24
(<x> from the pid, so parallel labs never share a name). Nothing is created in the root
namespace. `shape(host, rate)` puts a tbf rate limit on the host's egress (inside its namespace)
and on its ingress (the bridge side of its veth). `close()` kills every process still running
in the lab's namespaces, by PID, deletes the namespaces and checks none is left.

`Lab(n, names=True)` makes the hosts look like an ordinary cluster's: one more namespace on the
bridge, the client (`gpck<pid>-c`, 10.77.<x>.254), and for every namespace an /etc/hosts
(`/etc/netns/<ns>/hosts`, which `ip netns exec` mounts over /etc/hosts) in which each host's
own name and this machine's hostname resolve to 127.0.0.1, as on many installs, and the other
hosts' names to their addresses. `start_sshd(host, root)` runs a real sshd in a host's
namespace (port 22 there, keys and configs under `root`), `stop_sshd(host)` stops it by PID
(connections are then refused: a host whose sshd is down), and `ssh_launcher(root)` is the
`--launcher` template that runs the ssh client in the client namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

IFACE = "gpck0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def usable() -> str | None:
    """None when namespaces, a bridge, veth pairs and tbf can be used here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    probe = f"gpck{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns unusable: {r.stderr.strip()}"
    try:
        steps = [
            ["ip", "-n", probe, "link", "add", "br0", "type", "bridge"],
            ["ip", "-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb"],
            ["ip", "-n", probe, "link", "set", "va", "up"],
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "va", "root", "tbf", "rate", "100mbit",
             "burst", "32kbit", "latency", "100ms"],
        ]
        for argv in steps:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                return f"{' '.join(argv[3:6])}... failed: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class Lab:
    def __init__(self, n: int, names: bool = False):
        pid = os.getpid()
        self.prefix = f"gpck{pid}"
        self.subnet = 10 + pid % 240
        self.bridge = f"{self.prefix}-br"
        self.hosts = [f"{self.prefix}-h{i + 1}" for i in range(n)]
        self.addrs = {h: f"10.77.{self.subnet}.{i + 1}" for i, h in enumerate(self.hosts)}
        self.client = f"{self.prefix}-c" if names else None
        self.pids: list[int] = []
        self.created: list[str] = []
        self.etc_dirs: list[str] = []
        self.sshd: dict[str, subprocess.Popen] = {}
        try:
            self._build()
            if names:
                self._names()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _ip("netns", "add", self.bridge)
        self.created.append(self.bridge)
        _ip("-n", self.bridge, "link", "set", "lo", "up")
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts):
            _ip("netns", "add", h)
            self.created.append(h)
            _ip("-n", h, "link", "set", "lo", "up")
            _ip("-n", self.bridge, "link", "add", self.bridge_if(h), "type", "veth", "peer", "name", IFACE,
                "netns", h)
            _ip("-n", self.bridge, "link", "set", self.bridge_if(h), "master", "br0", "up")
            _ip("-n", h, "addr", "add", f"{self.addrs[h]}/24", "dev", IFACE)
            _ip("-n", h, "link", "set", IFACE, "up")

    def _names(self) -> None:
        """The client namespace, and an /etc/hosts per namespace (see the module's docstring)."""
        assert self.client is not None
        _ip("netns", "add", self.client)
        self.created.append(self.client)
        _ip("-n", self.client, "link", "set", "lo", "up")
        _ip("-n", self.bridge, "link", "add", "vcb", "type", "veth", "peer", "name", IFACE, "netns", self.client)
        _ip("-n", self.bridge, "link", "set", "vcb", "master", "br0", "up")
        _ip("-n", self.client, "addr", "add", f"10.77.{self.subnet}.254/24", "dev", IFACE)
        _ip("-n", self.client, "link", "set", IFACE, "up")
        me = socket.gethostname()
        for ns in [*self.hosts, self.client]:
            folder = f"/etc/netns/{ns}"
            os.makedirs(folder, exist_ok=True)
            self.etc_dirs.append(folder)
            lines = ["127.0.0.1 localhost", f"127.0.0.1 {ns} {me}"]
            lines += [f"{self.addrs[h]} {h}" for h in self.hosts if h != ns]
            with open(f"{folder}/hosts", "w") as f:
                f.write("\n".join(lines) + "\n")

    # -- sshd in a host's namespace -------------------------------------------------------------
    def _ssh_files(self, root) -> None:
        from pathlib import Path

        root = Path(root)
        for key in (root / "host_key", root / "user_key"):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                               timeout=60)
        (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
        (root / "ssh_config").write_text(
            "Host *\n  Port 22\n  User root\n"
            f"  IdentityFile {root / 'user_key'}\n  IdentitiesOnly yes\n  UserKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking no\n  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 5\n")

    def start_sshd(self, host: str, root) -> None:
        from pathlib import Path

        root = Path(root)
        self._ssh_files(root)
        cfg = root / f"sshd-{host}.conf"
        cfg.write_text(
            f"ListenAddress 0.0.0.0:22\nHostKey {root / 'host_key'}\nPidFile {root / f'sshd-{host}.pid'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "StrictModes no\nUseDNS no\nPrintMotd no\nMaxStartups 64\nLogLevel ERROR\n")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.sshd[host] = self.popen(host, ["/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)],
                                     stdout=subprocess.DEVNULL, stderr=open(root / f"sshd-{host}.log", "wb"))
        deadline = time.monotonic() + 20
        while not self.answers(host):
            if self.sshd[host].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd in {host} did not start: {(root / f'sshd-{host}.log').read_text()}")
            time.sleep(0.1)

    def stop_sshd(self, host: str) -> None:
        p = self.sshd.pop(host, None)
        if p is not None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def answers(self, host: str) -> bool:
        """Does an sshd answer on the host's port 22 (seen from the client namespace)?"""
        code = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],22),timeout=1)\n"
                " sys.exit(0 if s.recv(4).startswith(b'SSH-') else 1)\nexcept OSError:\n sys.exit(1)\n")
        r = subprocess.run(["ip", "netns", "exec", self.client or self.hosts[0], sys.executable, "-c", code,
                            self.addrs[host]], capture_output=True, timeout=30)
        return r.returncode == 0

    def ssh_launcher(self, root) -> str:
        """The `--launcher` template: ssh from the client namespace, by host name."""
        return f"ip netns exec {self.client} ssh -F {root}/ssh_config -o BatchMode=yes -- {{host}} {{qcmd}}"

    def bridge_if(self, host: str) -> str:
        return f"v{self.hosts.index(host) + 1}b"

    def shape(self, host: str, rate: str = "100mbit") -> None:
        """Rate-limit `host` both ways with tbf (this kernel has no netem)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "100ms"]
        subprocess.run(["ip", "netns", "exec", host, "tc", "qdisc", "add", "dev", IFACE, *tbf],
                       check=True, capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "exec", self.bridge, "tc", "qdisc", "add", "dev", self.bridge_if(host), *tbf],
                       check=True, capture_output=True, timeout=30)

    def unshape(self, host: str) -> None:
        subprocess.run(["ip", "netns", "exec", host, "tc", "qdisc", "del", "dev", IFACE, "root"],
                       capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "exec", self.bridge, "tc", "qdisc", "del", "dev", self.bridge_if(host), "root"],
                       capture_output=True, timeout=30)

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL a process started with popen() and every process it started, by PID."""
        pids = [proc.pid]
        try:
            import psutil

            pids += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except Exception:
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def reachable(self, src: str, dst: str) -> bool:
        """A TCP connect from src to dst's discard port: refused (or accepted) means the packets
        got there and back; a timeout means they did not."""
        code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], 9), timeout=3)\n"
                "except ConnectionRefusedError:\n pass\n")
        r = subprocess.run(["ip", "netns", "exec", src, sys.executable, "-c", code, self.addrs[dst]],
                           capture_output=True, timeout=30)
        return r.returncode == 0

    def popen(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", host, *argv], **kw)
        self.pids.append(p.pid)
        return p

    def netns_pids(self) -> list[int]:
        out: list[int] = []
        for ns in self.created:
            r = _ip("netns", "pids", ns, check=False)
            out += [int(x) for x in r.stdout.split() if x.strip().isdigit()]
        return out

    def close(self) -> None:
        for _ in range(3):
            pids = set(self.pids) | set(self.netns_pids())
            alive = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    alive.append(pid)
                except ProcessLookupError:
                    pass
            for pid in alive:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            if not self.netns_pids():
                break
            time.sleep(0.2)
        for ns in reversed(self.created):
            _ip("netns", "del", ns, check=False)
        self.created = [ns for ns in self.created if ns in self.existing()]
        for folder in self.etc_dirs:
            shutil.rmtree(folder, ignore_errors=True)

    def existing(self) -> list[str]:
        r = _ip("netns", "list", check=False)
        return [line.split()[0] for line in r.stdout.splitlines() if line.startswith(self.prefix)]


@contextlib.contextmanager
def running_lab(n: int, pythonpath: str, names: bool = False):
    """A Lab of `n` hosts for a module fixture: PYTHONPATH exported (`ip netns exec` passes the
    environment on), hosts checked reachable, and on exit everything removed and verified gone."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pythonpath
    lab = Lab(n, names=names)
    try:
        assert lab.reachable(lab.hosts[0], lab.hosts[-1])
        yield lab
    finally:
        lab.close()
        left = lab.existing()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
        assert left == [], f"namespaces left behind: {left}"


@contextlib.contextmanager
def running_ssh_lab(n: int, pythonpath: str, root):
    """running_lab with names resolving on every host and a real sshd in each (keys and the
    client's ssh_config under `root`, kept as `lab.ssh_root`); every sshd still running is
    stopped on exit."""
    with running_lab(n, pythonpath, names=True) as lab:
        for h in lab.hosts:
            lab.start_sshd(h, root)
        lab.ssh_root = root
        try:
            yield lab
        finally:
            for h in list(lab.sshd):
                lab.stop_sshd(h)
