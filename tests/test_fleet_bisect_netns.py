"""`gpucheck bisect --builtin allreduce` end to end: four "hosts" in network namespaces on a bridge
(tests/netns.py), one of them rate-limited with tbf; the built-in group test runs gloo
all-gather and all-reduce with data verification across each group and the bitwise check on
every node; reference pairs give the bandwidth its reference and name the slow host. Root only;
every namespace and process is removed afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402

from gpucheck.platform.nodeset import fold  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m", "gpucheck"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

pytestmark = pytest.mark.root
_why = netns.usable()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=f"network namespaces: {_why}")]


@pytest.fixture(scope="module")
def lab():
    with netns.running_lab(4, ENV["PYTHONPATH"]) as lab:
        yield lab


def _bisect(lab, *args: str) -> subprocess.CompletedProcess:
    hosts = lab.hosts
    return subprocess.run(
        [*PY, "bisect", ",".join(hosts), "--builtin", "allreduce", "--launcher", "ip netns exec {host} {cmd}",
         "--program", " ".join(PY), "--backend", "gloo", "--sizes", "1M", "--iters", "3", "--timeout", "20s",
         "--test-timeout", "120s", "--bitwise-arg=--device=cpu", "--bitwise-arg=--workers=1",
         *[a for h in hosts for a in ("--addr", f"{h}={lab.addrs[h]}")], *args],
        capture_output=True, text=True, env=ENV, timeout=600)


def test_builtin_binary_with_defaults_names_the_rate_limited_host_and_its_reference(lab):
    """The issue's case: binary, no --min-busbw, no --slow-limit, no --ifname. Old: the first
    group had no reference, so the group with a 50 Mbit/s host passed (`ok ... busbw 0.00516
    GB/s`, notes empty, exit 0)."""
    hosts = lab.hosts
    slow = hosts[2]
    lab.shape(slow, "50mbit")
    try:
        r = _bisect(lab)
    finally:
        lab.unshape(slow)
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-3000:])
    out = r.stdout
    assert out.rstrip().endswith(f"bad nodes: {slow}")
    assert "bandwidth reference all_gather: " in out and "bandwidth reference all_reduce: " in out
    # round 1 (two pairs) has no median yet; round 2 re-pairs the slow pair's hosts, two at a time
    # again, so all four pairs give the reference
    assert "(median of 4 pairs measured 2 at a time)" in out
    assert f"FAIL {fold([hosts[0], slow])} (" in out and "slow: all_gather busbw" in out
    assert f"BAD {slow}:" in out and "partners fine in their other pairs" in out


def test_builtin_grid_json_records_the_pairs_the_reference_and_the_rows(lab):
    hosts = lab.hosts
    slow = hosts[2]
    lab.shape(slow, "50mbit")
    try:
        r = _bisect(lab, "--strategy", "grid", "--group-size", "2", "--json")
    finally:
        lab.unshape(slow)
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert [b["node"] for b in doc["bad_nodes"]] == [slow] and doc["verified"] and doc["exit_code"] == 1
    pairs = [t for t in doc["records"] if t["phase"] in ("pairs", "re-pair")]
    assert [t["nodes"] for t in pairs] == [fold(hosts[:2]), fold(hosts[2:]), fold([hosts[0], slow]),
                                           fold([hosts[1], hosts[3]])]
    assert {t["concurrency"] for t in pairs} == {2}
    slow_pair = pairs[2]
    ref = slow_pair["metrics"]["all_reduce_reference_gbs"]
    assert not slow_pair["healthy"] and slow_pair["metrics"]["all_reduce"] < 0.5 * ref
    refs = doc["bandwidth"]["references"]
    assert {x["op"] for x in refs} == {"all_gather", "all_reduce"} and refs[0]["concurrency"] == 2
    assert doc["bandwidth"]["unjudged"] == [] and doc["bandwidth"]["bad"] == [slow]
    # the grid ran over the other three hosts (the rows), never with the slow one
    assert all(slow not in t["nodes"] for t in doc["records"] if t["phase"] in ("rows", "columns", "verify"))
    assert "round 2 (re-pair): 2 test(s), 1 failed" in r.stderr  # printed live


def test_builtin_names_a_host_that_cannot_start(lab, tmp_path):
    """A host whose gpucheck is missing: its launcher exits 127 at once, the pair ends at once
    (its partner is not left waiting for the rendezvous), and the re-pair with a known-good
    host confirms it."""
    hosts = lab.hosts
    wrapper = tmp_path / "gpucheck-on"
    wrapper.write_text("#!/bin/sh\n"
                       f'[ "$(ip netns identify $$)" = "{hosts[1]}" ] && exec /opt/nowhere/gpucheck "$@"\n'
                       f'exec {" ".join(PY)} "$@"\n')
    wrapper.chmod(0o755)
    r = _bisect(lab, "--program", str(wrapper), "--no-bitwise", "--json")
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads(r.stdout)
    (bad,) = doc["bad_nodes"]
    assert bad["node"] == hosts[1] and doc["verified"]
    assert any("gpucheck not found (exit 127)" in e for e in bad["evidence"]), bad["evidence"]
    first = next(t for t in doc["records"] if t["phase"] == "pairs" and not t["healthy"])
    assert first["duration_s"] < 15  # not the 20 s collective timeout: the group ended when the launcher did
