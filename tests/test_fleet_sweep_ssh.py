"""`gpucheck sweep` over a real sshd on loopback addresses (tests/sshd_harness.py): ClusterShell's
ssh worker with the ssh config named in clush.conf (CLUSTERSHELL_CFGDIR), healthy and unhealthy
nodes (recorded snapshots, fault injection), a host that refuses connections, one whose gpucheck
prints garbage, one without gpucheck, one that hangs, and the fleet's bitwise majority."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sshd_harness import SshdHarness, sshd_unavailable  # noqa: E402

from gpucheck.cli.main import main  # noqa: E402
from gpucheck.core.verdict import SCHEMA  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HOSTS = {**{f"n{i}": f"127.0.0.{i}" for i in range(1, 6)}, "b1": "127.0.0.1", "b2": "127.0.0.2", "b3": "127.0.0.1"}

pytestmark = pytest.mark.root
_why = sshd_unavailable()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=_why)]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    root = tmp_path_factory.mktemp("sshd")
    h = SshdHarness(root, HOSTS, dead={"dead": "127.0.0.9"})
    h.start()
    # What each "host" runs as gpucheck: the same checkout, except on three of them.
    wrapper = root / "node-gpucheck"
    wrapper.write_text(
        "#!/bin/sh\n"
        'addr=$(echo "$SSH_CONNECTION" | cut -d" " -f3)\n'
        'case "$addr" in\n'
        '  127.0.0.3) echo "Welcome to n3! Last login: yesterday"; exit 0;;\n'
        '  127.0.0.4) exec /opt/nowhere/bin/gpucheck "$@";;\n'
        "  127.0.0.5) exec sleep 12;;\n"
        "esac\n"
        f"PYTHONPATH={ROOT} exec {sys.executable} -m gpucheck \"$@\"\n")
    wrapper.chmod(0o755)
    h.wrapper = str(wrapper)
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture
def cfg(sshd, monkeypatch):
    for k, v in sshd.env().items():
        monkeypatch.setenv(k, v)
    return sshd


def sweep(capsys, *argv):
    rc = main(["sweep", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_mixed_fleet_over_ssh(cfg, capsys, tmp_path):
    report = tmp_path / "report.json"
    rc, out, _ = sweep(capsys, "n[1-4],dead", "--remote-cmd", cfg.wrapper, "--snapshot", str(SNAPS / "h100-healthy.json"),
                       "--node-args", f"n2=--snapshot {SNAPS / 'h100-ecc-dbe.json'}", "--report", str(report))
    assert rc == 1
    doc = json.loads(report.read_text())
    st = {n["node"]: n for n in doc["nodes"]}
    assert {n: v["status"] for n, v in st.items()} == {"dead": "unreachable", "n1": "pass", "n2": "fail",
                                                        "n3": "error", "n4": "error"}
    assert "Connection refused" in st["dead"]["reason"] and st["dead"]["verdict"] is None
    assert st["n2"]["failing"] == ["ecc:gpu3"] and st["n2"]["action"] == "reset-gpu"
    assert st["n2"]["reason"].startswith("ecc gpu3: uncorrectable")
    assert st["n3"]["reason"] == "not a verdict: Welcome to n3! Last login: yesterday"
    assert st["n4"]["reason"].startswith("gpucheck not installed") and st["n4"]["rc"] == 127
    jsonschema = pytest.importorskip("jsonschema")
    for n in ("n1", "n2"):
        jsonschema.Draft202012Validator(SCHEMA).validate(st[n]["verdict"])
    assert doc["bad"] == "dead,n[2-4]" and doc["exit_code"] == 1
    assert doc["by_status"] == {"pass": "n1", "fail": "n2", "error": "n[3-4]", "unreachable": "dead"}
    assert doc["fleet"]["bitwise"]["compared"] is False
    # the table, then the bad nodes as one node set, ready for scontrol
    assert "ecc[gpu3]" in out and "UNREACHABLE" in out and "not a verdict" in out
    assert "\nbad nodes: dead,n[2-4]\n" in out and "  fail: n2\n" in out


def test_per_node_timeout(cfg, capsys):
    rc, out, _ = sweep(capsys, "n[1,5]", "--remote-cmd", cfg.wrapper, "--snapshot", str(SNAPS / "h100-healthy.json"),
                       "--timeout", "8s", "--json")
    doc = json.loads(out)
    assert rc == 1
    assert [(n["node"], n["status"]) for n in doc["nodes"]] == [("n1", "pass"), ("n5", "timeout")]
    assert doc["nodes"][1]["reason"] == "no answer within 8 s (killed)" and doc["bad"] == "n5"


def test_healthy_fleet_exit_0(cfg, capsys):
    rc, out, _ = sweep(capsys, "n[1-2]", "--remote-cmd", cfg.wrapper, "--snapshot", str(SNAPS / "h100-healthy.json"),
                       "--level", "1", "--fanout", "1")
    assert rc == 0 and "all nodes healthy" in out and "bad nodes" not in out


def test_bitwise_outlier_found_only_by_the_fleet(cfg, capsys, tmp_path):
    """A bit flipped on n2's only GPU: n2's own verdict passes (nothing to compare with on the
    node, no reference), the fleet's majority names it."""
    report = tmp_path / "r.json"
    rc, out, _ = sweep(capsys, "b[1-3]", "--remote-cmd", cfg.wrapper, "--check", "repro.bitwise", "--device", "cpu",
                       "--run-arg=--workers=1", "--run-arg=--no-history", "--report", str(report),
                       "--node-args", "b2=--inject bitflip:gpu=0", "--ssh-options", "-oLogLevel=ERROR")
    doc = json.loads(report.read_text())
    st = {n["node"]: n for n in doc["nodes"]}
    assert st["b2"]["verdict"]["status"] == "pass"  # the node alone sees nothing
    assert [st[n]["status"] for n in ("b1", "b2", "b3")] == ["pass", "fail", "pass"]
    assert doc["fleet"]["bitwise"]["compared"] and doc["fleet"]["bitwise"]["by_node"].keys() == {"b2"}
    assert st["b2"]["fleet"][0].startswith("bitwise: digests differ from the fleet majority (2 of 3 nodes")
    assert st["b2"]["action"] == "drain"  # issue 26: corruption's action, as burn's verdict says (was investigate)
    assert rc == 1 and "bad nodes: b2" in out
