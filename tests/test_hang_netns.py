"""`gpucheck hang` for real: a torch.distributed (gloo) training loop of 4 ranks on 4 "hosts"
(network namespaces on a bridge, tests/netns.py), each host also its own PID namespace with its
own /proc, reached over ssh (a real sshd, tests/sshd_harness.py; ClusterShell's ssh worker), and
real py-spy dumps.

- one rank stuck in data loading while the others block in all_reduce: `gpucheck hang` names
  exactly that rank and its host (and the flight recorder says it never entered the collective);
- every rank blocked in the same all_reduce (one host's link is down): exit 0, "use bisect";
- the hung rank's host unreachable: exit 3 naming it, never a clean bill for the others;
- SIGTERM while a node is slow: the ssh children are stopped, what answered is printed, exit 3.

Root only. Each host's processes run under `unshare --pid --fork --mount-proc` inside its network
namespace; the ssh "host" (127.0.0.N) enters that PID namespace with nsenter, so `hang --local`
there sees only that host's processes, as on a real machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402
from sshd_harness import SshdHarness, sshd_unavailable  # noqa: E402

from gpucheck.hang.local import ptrace_scope  # noqa: E402
from gpucheck.hang.pyspy import find_py_spy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "tests" / "hang_train.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
WORLD = 4


def _why_not() -> str | None:
    for why in (netns.usable(), sshd_unavailable()):
        if why:
            return why
    if find_py_spy() is None:
        return "py-spy is not installed (pip install '.[hang]')"
    if ptrace_scope() == 3:
        return "kernel.yama.ptrace_scope=3: py-spy cannot read any process here"
    if not (shutil.which("unshare") and shutil.which("nsenter")):
        return "unshare/nsenter (util-linux) missing"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0:
        return f"cannot give a host its own PID namespace and /proc: {probe.stderr.strip()[:200]}"
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return "torch is not installed"
    return None


pytestmark = pytest.mark.root
_why = _why_not()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=_why)]


@pytest.fixture(scope="module")
def lab():
    with netns.running_lab(WORLD, ENV["PYTHONPATH"]) as lab:
        yield lab


@pytest.fixture(scope="module")
def sshd(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("sshd")
    hosts = {h: f"127.0.0.{i + 1}" for i, h in enumerate(lab.hosts)}
    hosts[f"{lab.prefix}-slow"] = "127.0.0.6"
    h = SshdHarness(root, hosts, dead={f"{lab.prefix}-dead": "127.0.0.9"})
    h.start()
    # gpucheck "on a host": enter that host's PID and mount namespaces (its own /proc)
    wrapper = root / "node-gpucheck"
    wrapper.write_text(
        "#!/bin/sh\n"
        'addr=$(echo "$SSH_CONNECTION" | cut -d" " -f3)\n'
        '[ "$addr" = 127.0.0.6 ] && exec sleep 60\n'
        f'pid=$(cat "{root}/anchor-$addr") || exit 97\n'
        f'exec nsenter -t "$pid" -p -m env PYTHONPATH={ROOT} {sys.executable} -m gpucheck "$@"\n')
    wrapper.chmod(0o755)
    h.wrapper = str(wrapper)
    h.anchor_dir = root
    try:
        yield h
    finally:
        h.stop()


class World:
    """WORLD ranks of tests/hang_train.py, rank i on host i, each in its host's PID namespace."""

    def __init__(self, lab, sshd, tmp: Path, port: int, **env):
        self.lab, self.procs, self.out = lab, [], []
        self.fr_prefix = str(tmp / "fr_")
        base = {**ENV, "WORLD_SIZE": str(WORLD), "MASTER_ADDR": lab.addrs[lab.hosts[0]], "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": netns.IFACE, "TORCH_FR_DUMP_TEMP_FILE": self.fr_prefix, **env}
        for rank, host in enumerate(lab.hosts):
            argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(TRAIN)]
            p = lab.popen(host, argv, env={**base, "RANK": str(rank), "LOCAL_RANK": "0"}, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, bufsize=1)
            self.procs.append(p)
        self.pids = [self._rank_pid(p) for p in self.procs]
        for i, pid in enumerate(self.pids):
            (sshd.anchor_dir / f"anchor-127.0.0.{i + 1}").write_text(f"{pid}\n")

    @staticmethod
    def _rank_pid(p) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            kids = [c for c in psutil.Process(p.pid).children(recursive=True) if str(TRAIN) in " ".join(c.cmdline())]
            if kids:
                return kids[0].pid
            time.sleep(0.05)
        raise AssertionError("the rank process did not start")

    def wait_for(self, lines_by_rank: dict[int, str], timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        for rank, line in lines_by_rank.items():
            p = self.procs[rank]
            while True:
                assert time.monotonic() < deadline, f"rank {rank} never printed {line!r}"
                got = p.stdout.readline()
                assert got, f"rank {rank} exited ({p.poll()}) before printing {line!r}"
                if got.strip() == line:
                    break

    def wait_for_dumps(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(os.path.exists(f"{self.fr_prefix}{r}") for r in range(WORLD)):
            assert time.monotonic() < deadline, "the ranks wrote no flight-recorder dump"
            time.sleep(0.2)
        time.sleep(0.5)

    def alive(self) -> bool:
        return all(psutil.Process(pid).status() != psutil.STATUS_STOPPED for pid in self.pids) and \
            all(p.poll() is None for p in self.procs)

    def close(self) -> None:
        for p in self.procs:
            self.lab.kill(p)


def _port() -> int:
    return 29000 + os.getpid() % 500 + int(time.monotonic() * 10) % 400


@pytest.fixture(scope="module")
def hung_world(lab, sshd, tmp_path_factory):
    """Rank 2 stops in load_batch at step 3; ranks 0, 1 and 3 block in that step's all_reduce."""
    w = World(lab, sshd, tmp_path_factory.mktemp("hung"), _port(), HANG_RANK="2", HANG_AFTER="3", FR_AFTER="1")
    try:
        w.wait_for({0: "step 3", 1: "step 3", 3: "step 3", 2: "hanging"})
        w.wait_for_dumps()  # written once the ranks have made no progress for a second
        yield w
    finally:
        w.close()


def _hang(sshd, nodes: list[str], *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpucheck", "hang", ",".join(nodes), "--match", "hang_train\\.py",
                           "--remote-cmd", sshd.wrapper, "--timeout", "90s", *extra],
                          capture_output=True, text=True, env={**ENV, **sshd.env()}, timeout=timeout)


def _notes(sshd, lab) -> list:
    """Why the nodes read no flight-recorder dump (for a failure message)."""
    out = []
    for host in lab.hosts:
        r = subprocess.run(sshd.ssh_argv(host, f"{sshd.wrapper} hang --local --json --match hang_train"),
                           capture_output=True, text=True, timeout=60)
        try:
            out += [(host, p["rank"], p["flight_note"]) for p in json.loads(r.stdout)["processes"]]
        except ValueError:
            out.append((host, r.stdout[-300:], r.stderr[-300:]))
    return out


def test_the_rank_stuck_in_data_loading_is_named_with_its_host(lab, sshd, hung_world):
    r = _hang(sshd, lab.hosts, "--json")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr
    doc = json.loads(r.stdout)
    assert [n["status"] for n in doc["nodes"]] == ["ok"] * WORLD, doc["nodes"]
    assert doc["ranks_found"] == doc["ranks_dumped"] == WORLD and doc["world_size"] == WORLD
    assert [(s["rank"], s["node"], s["source"]) for s in doc["suspects"]] == [(2, lab.hosts[2], "stacks")]
    assert doc["suspect_nodes"] == lab.hosts[2] and doc["evict_nodes"] == lab.hosts[2]
    assert doc["suspects"][0]["why"] == "not in the collective the other 3 rank(s) wait in: load_batch (hang_train.py)"
    assert doc["suspects"][0]["frames"][0].startswith("time.sleep") or \
        doc["suspects"][0]["frames"][0].startswith("load_batch (hang_train.py:")
    healthy = doc["groups"][0]
    assert healthy["dominant"] and healthy["ranks"] == [0, 1, 3]
    assert healthy["main_frames"][0] == "all_reduce (torch/distributed/distributed_c10d.py)"
    assert doc["flight_recorder"]["ranks_with_data"] == WORLD, _notes(sshd, lab)
    (pg,) = doc["flight_recorder"]["groups"]
    assert pg["status"] == "diverged" and pg["not_entered"] == [2] and pg["entered"] == [0, 1, 3]
    assert hung_world.alive()  # nothing was stopped or killed
    # the table says the same, and the node set to drain is on a line of its own
    r = _hang(sshd, lab.hosts)
    assert r.returncode == 1 and f"\nsuspect nodes: {lab.hosts[2]}\n" in r.stdout
    assert f"rank 2 on {lab.hosts[2]} (pid 1): not in the collective" in r.stdout


def test_the_hung_ranks_host_unreachable_is_could_not_judge_naming_it(lab, sshd, hung_world):
    dead = f"{lab.prefix}-dead"
    r = _hang(sshd, [lab.hosts[0], lab.hosts[1], dead, lab.hosts[3]], "--json")
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "could-not-judge" and doc["suspects"] == [] and doc["uncollected_nodes"] == dead
    assert {n["node"]: n["status"] for n in doc["nodes"]}[dead] == "unreachable"
    assert doc["missing_ranks"] == [2] and f"{dead} ({dead}: unreachable: " in doc["summary"]


def test_sigterm_stops_the_ssh_children_and_prints_what_answered(lab, sshd, hung_world):
    slow = f"{lab.prefix}-slow"
    p = subprocess.Popen([sys.executable, "-m", "gpucheck", "hang", f"{lab.hosts[0]},{slow}", "--match",
                          "hang_train\\.py", "--remote-cmd", sshd.wrapper, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, **sshd.env()})
    try:
        deadline = time.monotonic() + 60
        ssh_children = []
        while time.monotonic() < deadline:  # wait until only the slow node's ssh is left
            ssh_children = [c for c in psutil.Process(p.pid).children(recursive=True) if c.name() == "ssh"]
            if len(ssh_children) == 1 and slow in " ".join(ssh_children[0].cmdline()):
                break
            time.sleep(0.1)
        assert len(ssh_children) == 1, "the fast node never answered"
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 3, err
    doc = json.loads(out)
    assert doc["interrupted"] == "SIGTERM" and doc["exit_code"] == 3
    assert [(n["node"], n["status"]) for n in doc["nodes"]] == [(lab.hosts[0], "ok"), (slow, "interrupted")]
    assert doc["summary"].startswith("could not judge: interrupted (SIGTERM) before every node answered")
    for c in ssh_children:
        assert not c.is_running() or c.status() == psutil.STATUS_ZOMBIE, "an ssh child outlived gpucheck"


def test_every_rank_in_the_same_collective_agrees_and_points_to_bisect(lab, sshd, tmp_path):
    w = World(lab, sshd, tmp_path, _port() + 1, STEP_SLEEP="0.2")
    try:
        w.wait_for({r: "step 3" for r in range(WORLD)})
        subprocess.run(["ip", "-n", lab.hosts[3], "link", "set", netns.IFACE, "down"], check=True, timeout=30)
        time.sleep(2)  # every rank reaches the next all_reduce and waits there
        r = _hang(sshd, lab.hosts)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr
        assert f"all {WORLD} ranks agree (every one in all_reduce (torch/distributed/distributed_c10d.py))" in r.stdout
        assert "gpucheck bisect" in r.stdout and "suspect" not in r.stdout
        assert w.alive()
    finally:
        subprocess.run(["ip", "-n", lab.hosts[3], "link", "set", netns.IFACE, "up"], timeout=30)
        w.close()
