"""Collectives across real "hosts": 4 network namespaces on a bridge, gloo over veth.

Bandwidth and verification across 2 and 4 hosts, a rate-limited host named by `nccl pairs` over
random rounds, injected corruption caught and attributed, and a killed or frozen peer turned into
a timeout verdict. Root only; every namespace and process is removed afterwards (by PID).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402

from gpucheck.nccl import launch as L  # noqa: E402
from gpucheck.nccl.bandwidth import busbw_factor  # noqa: E402
from gpucheck.nccl.collective import CULPRIT_LIMIT_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m", "gpucheck.cli.main"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
TIMEOUT_S = 3  # per-collective timeout of these tests

pytestmark = pytest.mark.root

_why_not = netns.usable()
if _why_not:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=f"network namespaces: {_why_not}")]


@pytest.fixture(scope="module")
def lab():
    with netns.running_lab(4, ENV["PYTHONPATH"]) as lab:
        yield lab


def _launcher(lab) -> L.Launcher:
    return L.Launcher("ip netns exec {host} {cmd}", addrs=dict(lab.addrs), program=list(PY))


def _args(ops=("all_reduce",), sizes=(256 << 10,), iters=3):
    return L.run_args(ops=list(ops), sizes=list(sizes), iters=iters, warmup=1, timeout_s=TIMEOUT_S,
                      backend="gloo", ifname=netns.IFACE)


@pytest.mark.parametrize("n", [2, 4])
def test_bandwidth_and_verification_across_hosts(lab, n):
    hosts = lab.hosts[:n]
    out = L.run_group(hosts, _launcher(lab), _args(ops=("all_reduce", "all_gather", "all_to_all")), deadline_s=120)
    assert out["status"] == "ok", (out["summary"], out["launch_errors"])
    assert out["hosts"] == hosts and out["launch_errors"] == {}
    assert out["ranks"] == {r: "ok" for r in range(n)}
    assert [r["op"] for r in out["results"]] == ["all_reduce", "all_gather", "all_to_all"]
    for r in out["results"]:
        assert r["ranks"] == n and r["errors"] == [] and r["verified"] == 4
        assert r["time_s"] > 0 and len(r["rank_time_s"]) == n
        assert r["algbw_gbs"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * busbw_factor(r["op"], n))


def test_injected_corruption_is_caught_and_attributed(lab):
    hosts = lab.hosts
    out = L.run_group(hosts, _launcher(lab), _args(), deadline_s=120, corrupt={hosts[2]: "corrupt:rank=2"})
    assert out["status"] == "fail"
    f = out["failure"]
    assert (f["kind"], f["rank"], f["host"], f["op"]) == ("corruption", 2, hosts[2], "all_reduce")
    assert out["summary"].startswith(f"data corruption in all_reduce on rank 2 (host {hosts[2]}): size 256K")
    assert out["injected"] == ["corrupt:rank=2"]
    assert set(out["ranks"].values()) == {"fail"}  # every rank saw it in the exchanged results


def test_corrupting_host_is_named_by_pairs(lab):
    hosts = lab.hosts
    r = subprocess.run([*PY, "nccl", "pairs", ",".join(hosts), "--strategy", "ring", "--json",
                        "--launcher", "ip netns exec {host} {cmd}", "--program", " ".join(PY),
                        "--ifname", netns.IFACE, "--backend", "gloo", "--sizes", "1M", "--iters", "2",
                        "--timeout", f"{TIMEOUT_S}s", "--inject", f"corrupt:host={hosts[1]}",
                        *[a for h in hosts for a in ("--addr", f"{h}={lab.addrs[h]}")]],
                       capture_output=True, text=True, env=ENV, timeout=180)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bad"] == [hosts[1]] and doc["suspects"] == []
    for p in doc["pairs"]:
        if hosts[1] in p["nodes"]:
            assert p["verdict"] == "fail" and f"(host {hosts[1]})" in p["summary"]
        else:  # two good pairs measured two at a time: no median, their bandwidth is not judged
            assert p["verdict"] == "unjudged"
    assert doc["unjudged_pairs"] == 2


def test_rate_limited_host_is_named_over_random_rounds(lab):
    hosts = lab.hosts
    slow = hosts[2]
    lab.shape(slow, "50mbit")
    try:
        r = subprocess.run([*PY, "nccl", "pairs", ",".join(hosts), "--strategy", "random", "--rounds", "3",
                            "--seed", "3", "--json", "--launcher", "ip netns exec {host} {cmd}",
                            "--program", " ".join(PY), "--ifname", netns.IFACE, "--backend", "gloo",
                            "--sizes", "1M", "--iters", "3", "--timeout", f"{TIMEOUT_S * 4}s",
                            *[a for h in hosts for a in ("--addr", f"{h}={lab.addrs[h]}")]],
                           capture_output=True, text=True, env=ENV, timeout=300)
    finally:
        lab.unshape(slow)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    verdicts = {s["node"]: s["verdict"] for s in doc["node_scores"]}
    assert doc["bad"] == [slow], verdicts
    assert verdicts == {h: ("bad" if h == slow else "ok") for h in hosts}
    assert len(doc["rounds"]) == 3 and len(doc["pairs"]) == 6
    for p in doc["pairs"]:
        assert p["verdict"] == ("slow" if slow in p["nodes"] else "ok"), p


def _start_pair(lab, iters=10 ** 6):
    """Two `nccl run` ranks on hosts 1 and 2 (rank 0 binds a free port; rank 1 reads it)."""
    h0, h1 = lab.hosts[:2]
    base = ["nccl", "run", "--world-size", "2", "--master-addr", lab.addrs[h0], "--peer-hosts", f"{h0},{h1}",
            "--sizes", "64K", "--iters", str(iters), "--timeout", f"{TIMEOUT_S}s", "--backend", "gloo",
            "--ifname", netns.IFACE]
    kw = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    p0 = lab.popen(h0, [*PY, *base, "--rank", "0", "--master-port", "0", "--host-label", h0], **kw)
    p1 = lab.popen(h1, [*PY, *base, "--rank", "1", "--master-port", "stdin", "--host-label", h1], **kw)
    first = json.loads(p0.stdout.readline())
    assert first["event"] == "listening"
    p1.stdin.write(f"{first['port']}\n")
    p1.stdin.close()
    p1.stdin = None  # written and closed: communicate() must not flush it
    assert json.loads(p1.stdout.readline())["event"] == "ready"
    return (p0, p1), (h0, h1)


def _result(proc, limit):
    out, _ = proc.communicate(timeout=limit)  # raises (test fails) if it does not end by itself
    res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return proc.returncode, [e for e in res if e["event"] == "result"]


@pytest.mark.parametrize("victim,how", [(1, "kill"), (0, "kill"), (1, "freeze")])
def test_dead_or_frozen_peer_gives_a_timeout_verdict(lab, victim, how):
    procs, hosts = _start_pair(lab)
    try:
        survivor = 1 - victim
        time.sleep(0.5)  # mid-run: the sweep is iterating
        if how == "kill":
            os.kill(procs[victim].pid, signal.SIGKILL)  # the rank process dies with it (PDEATHSIG)
        else:
            top = psutil.Process(procs[victim].pid)
            for p in [top, *top.children(recursive=True)]:
                p.send_signal(signal.SIGSTOP)
        # the collective timeout, the time to name the culprit, and process start/stop slack
        code, results = _result(procs[survivor], TIMEOUT_S + CULPRIT_LIMIT_S + 20)
        assert code == 1
        (res,) = results
        assert res["status"] == "fail" and res["failure"]["kind"] == "timeout"
        assert res["failure"]["rank"] == victim and res["failure"]["host"] == hosts[victim]
        assert res["summary"].startswith(f"timeout waiting for rank {victim} on host {hosts[victim]}")
    finally:
        for p in procs:
            lab.kill(p)
