"""Sweep benchmark: `gpucheck sweep` of 64 node names served by a loopback sshd, against a plain
parallel `ssh host true` loop with the same fan-out (issue 8: the overhead of gpucheck itself).

    python benchmarks/bench_sweep.py [--nodes 64] [--fanout 64] [--rounds 3]

The node names node01..nodeNN map to 127.0.0.1-127.0.0.4 through an ssh config (tests/sshd_harness.py
starts sshd; root only). Three things are timed per round, interleaved, median over rounds:

  ssh true       a thread pool of `fanout` running `ssh -F cfg nodeXX true` for every node: the cost
                 of the ssh connections alone
  ssh gpucheck   the same pool running the sweep's exact remote command (`gpucheck run --json
                 --snapshot h100-healthy.json --no-history`) over plain ssh, output discarded: the
                 ssh connections plus gpucheck on the nodes
  gpucheck sweep the whole `gpucheck sweep` process: ClusterShell fan-out, the same remote command,
                 parsing and classifying every verdict, the fleet comparison, the report

sweep - ssh true is gpucheck's whole cost; sweep - ssh gpucheck is the sweep machinery's own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd_harness import SshdHarness, sshd_unavailable  # noqa: E402


def ssh_pool(h: SshdHarness, nodes: list[str], command: str, fanout: int) -> tuple[float, int]:
    def one(node: str) -> int:
        return subprocess.run(h.ssh_argv(node, command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL).returncode

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=fanout) as pool:
        rcs = list(pool.map(one, nodes))
    return time.perf_counter() - t0, sum(1 for rc in rcs if rc != 0)


def sweep(env: dict[str, str], nodeset: str, remote_cmd: str, snapshot: str, fanout: int,
          report: Path) -> tuple[float, int, dict]:
    argv = [sys.executable, "-m", "gpucheck", "sweep", nodeset, "--remote-cmd", remote_cmd, "--snapshot", snapshot,
            "--run-arg=--no-history", "--fanout", str(fanout), "--timeout", "300s", "--report", str(report), "--json"]
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    dt = time.perf_counter() - t0
    return dt, p.returncode, json.loads(report.read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--fanout", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    why = sshd_unavailable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    names = [f"node{i:02d}" for i in range(1, args.nodes + 1)]
    hosts = {n: f"127.0.0.{i % 4 + 1}" for i, n in enumerate(names)}
    snapshot = str(ROOT / "tests/fixtures/snapshots/h100-healthy.json")
    remote_cmd = f"env PYTHONPATH={ROOT} {sys.executable} -m gpucheck"
    remote_full = f"{remote_cmd} run --json {shlex.join(['--snapshot', snapshot, '--no-history'])}"
    nodeset = f"node[01-{args.nodes:02d}]"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        h = SshdHarness(root / "sshd", hosts, max_startups=max(256, 4 * args.nodes))
        h.start()
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT), **h.env()}
            ssh_pool(h, names[:4], "true", 4)  # warm up: host keys, page cache
            sweep(env, nodeset, remote_cmd, snapshot, args.fanout, root / "r.json")
            t_true, t_remote, t_sweep = [], [], []
            for _ in range(args.rounds):
                dt, bad = ssh_pool(h, names, "true", args.fanout)
                assert bad == 0, f"{bad} ssh true failed"
                t_true.append(dt)
                dt, bad = ssh_pool(h, names, remote_full, args.fanout)
                assert bad == 0, f"{bad} remote gpucheck runs failed"
                t_remote.append(dt)
                dt, rc, rep = sweep(env, nodeset, remote_cmd, snapshot, args.fanout, root / "r.json")
                assert rc == 0 and rep["counts"]["pass"] == args.nodes, (rc, rep["counts"])
                t_sweep.append(dt)
        finally:
            h.stop()
    m_true, m_remote, m_sweep = (statistics.median(x) for x in (t_true, t_remote, t_sweep))
    load = os.getloadavg()[0]
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()},"
          f" load {load:.1f}")
    print(f"{args.nodes} nodes, fan-out {args.fanout}, median of {args.rounds} rounds (min in brackets)")
    print(f"ssh true loop          {m_true:7.2f} s  ({min(t_true):.2f})")
    print(f"ssh + remote gpucheck  {m_remote:7.2f} s  ({min(t_remote):.2f})")
    print(f"gpucheck sweep         {m_sweep:7.2f} s  ({min(t_sweep):.2f})")
    print(f"gpucheck's whole cost (sweep - ssh true):        {m_sweep - m_true:6.2f} s"
          f" ({(m_sweep - m_true) / args.nodes * 1000:.0f} ms a node)")
    print(f"sweep machinery (sweep - ssh + remote gpucheck): {m_sweep - m_remote:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
