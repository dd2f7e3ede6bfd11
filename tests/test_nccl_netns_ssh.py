"""Collectives across "hosts" reached over real ssh, as on a cluster: four network namespaces on a
bridge (tests/netns.py with names=True), each running its own sshd; in each, the host's own
name and this machine's hostname resolve to 127.0.0.1 (as on many installs) and the other
hosts' names to their addresses; the ssh client runs in a fifth namespace. `nccl pairs` and
`bisect --builtin` are run with host names only: no --addr, no --ifname.

- a healthy fleet measures every pair (old: gloo bound the address the hostname resolves to,
  127.0.0.1, so every pair failed "Connection refused" and the rank-0 host was blamed);
- a host whose sshd is stopped is "unreachable" at once (old: a rendezvous "timeout" after the
  full collective timeout, per pair);
- a rendezvous that cannot form (every rank on the loopback interface) is a setup error, exit 3,
  no node blamed.
Root only; namespaces, sshd and every process are removed afterwards (by PID)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402
from sshd_harness import sshd_unavailable  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m", "gpucheck"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
PROGRAM = f"env PYTHONPATH={ROOT} {sys.executable} -m gpucheck"  # sshd passes no environment on

pytestmark = pytest.mark.root
_why = netns.usable() or sshd_unavailable()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=_why)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with netns.running_ssh_lab(4, ENV["PYTHONPATH"], tmp_path_factory.mktemp("ssh")) as lab:
        yield lab


def _pairs(lab, *args: str, timeout_s: int = 20) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([*PY, "nccl", "pairs", ",".join(lab.hosts), "--strategy", "ring", "--json",
                        "--launcher", lab.ssh_launcher(lab.ssh_root), "--program", PROGRAM, "--backend", "gloo",
                        "--sizes", "1M", "--iters", "2", "--timeout", f"{timeout_s}s", *args],
                       capture_output=True, text=True, env=ENV, timeout=600)
    return r, time.monotonic() - t0


def test_names_that_resolve_to_loopback_need_no_ifname(lab):
    # names only; shared cores make 1 MB pairs noisy: only a tenth of the median is "slow" here
    r, _ = _pairs(lab, "--slow-limit", "0.1")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert [p["verdict"] for p in doc["pairs"]] == ["ok"] * 4 and doc["bad"] == [] and doc["broken"] is None
    assert doc["ops"] == ["all_gather", "all_reduce"]
    assert all(set(p["op_busbw_gbs"]) == {"all_gather", "all_reduce"} for p in doc["pairs"])
    assert [r["how"] for r in doc["references"]] == ["median of 4 pairs measured 2 at a time"] * 2


def test_a_host_whose_sshd_is_stopped_is_unreachable_at_once(lab):
    down = lab.hosts[3]
    lab.stop_sshd(down)
    try:
        r, wall = _pairs(lab, "--slow-limit", "0.1", timeout_s=60)
    finally:
        lab.start_sshd(down, lab.ssh_root)
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert doc["unreachable"] == [down] and doc["bad"] == [] and doc["suspects"] == []
    for p in doc["pairs"]:
        if down in p["nodes"]:
            assert p["verdict"] == "fail" and p["blamed"] == [down] and p["unreachable"] == [down]
            assert "unreachable (launcher exit 255)" in p["summary"] and "Connection refused" in p["summary"]
        else:
            assert p["status"] == "ok"
    # old: each pair with the host waited for the rendezvous until the 60 s collective timeout
    assert wall < 60


def test_a_rendezvous_that_never_forms_is_a_setup_error(lab):
    """Every rank on the loopback interface: the peers refuse each other's connections. That
    is the setup, not a node: exit 3, no node blamed, the reason and the command shown."""
    r, _ = _pairs(lab, "--ifname", "lo", timeout_s=5)
    assert r.returncode == 3, (r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert doc["bad"] == [] and doc["suspects"] == [] and doc["unreachable"] == []
    assert {p["status"] for p in doc["pairs"]} == {"error"}
    assert doc["broken"].startswith("every pair (4) failed the same way: the rendezvous never formed")
    assert "nccl run" in doc["command"] and "--ifname lo" in doc["command"]


def test_bisect_builtin_over_ssh_names_the_unreachable_host(lab):
    down = lab.hosts[1]
    lab.stop_sshd(down)
    try:
        r = subprocess.run([*PY, "bisect", ",".join(lab.hosts), "--builtin", "allreduce", "--launcher",
                            lab.ssh_launcher(lab.ssh_root), "--program", PROGRAM, "--backend", "gloo", "--sizes", "1M",
                            "--iters", "2", "--timeout", "60s", "--no-bitwise", "--slow-limit", "0.1", "--json"],
                           capture_output=True, text=True, env=ENV, timeout=600)
    finally:
        lab.start_sshd(down, lab.ssh_root)
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads(r.stdout)
    (bad,) = doc["bad_nodes"]
    assert bad["node"] == down and any("unreachable (launcher exit 255)" in e for e in bad["evidence"])
    assert all(t["duration_s"] < 60 for t in doc["records"])  # nothing waited for the collective timeout
