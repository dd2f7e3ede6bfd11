"""The network readers and checks on synthetic data (what no real capture shows: a sysfs tree with
PCI topology, counter series between runs, unreadable sources). Synthetic: every tree and line
here is made by the test, modelled on the real captures in tests/fixtures/net."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks
from gpucheck.core.state import State
from gpucheck.platform.kernlog.netevents import parse_net_line
from gpucheck.platform.kernlog.netscan import NetScan
from gpucheck.platform.kernlog.sources.linefilter import iter_relevant_lines
from gpucheck.platform.net.ports import read_ib_ports
from gpucheck.platform.net.record import collect_net, from_text, replay_net
from gpucheck.platform.net.tree import DirTree, Unreadable
from gpucheck.platform.telemetry.snapshot import SnapshotError, validate_snapshot
from gpucheck.platform.telemetry.replay import replay_snapshot
from gpucheck.tests_suite import gdr_peermem, net_flaps, net_ports

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
NET = ROOT / "tests" / "fixtures" / "net"
P, W, F, E, S = Status.PASS, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def nic(sys_root: Path, pci_path: str, dev: str, *, state="4: ACTIVE", phys="5: LinkUp",
        rate="400 Gb/sec (4X NDR)", layer="InfiniBand", counters=None, netdev=None) -> None:
    """A NIC under sys/devices/<pci_path> with its class/infiniband link, as the kernel lays it out."""
    pci = sys_root / "devices" / pci_path
    ib = pci / "infiniband" / dev
    write(ib / "hca_type", "MT4129")
    port = ib / "ports" / "1"
    for name, value in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", layer)):
        write(port / name, value)
    for name, value in (counters or {"symbol_error": "0", "link_downed": "0", "port_rcv_errors": "0"}).items():
        write(port / "counters" / name, value)
    write(pci / "numa_node", "0")
    if netdev:
        write(pci / "net" / netdev / "dev_port", "0")
    os.symlink(pci, ib / "device")
    (sys_root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    os.symlink(ib, sys_root / "class" / "infiniband" / dev)


def gpu(sys_root: Path, pci_path: str) -> str:
    pci = sys_root / "devices" / pci_path
    write(pci / "vendor", "0x10de")
    write(pci / "class", "0x030200")
    write(pci / "device", "0x2330")
    bus = pci_path.rsplit("/", 1)[-1]
    (sys_root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    os.symlink(pci, sys_root / "bus" / "pci" / "devices" / bus)
    return bus


SW0 = "pci0000:00/0000:00:01.0/0000:01:00.0"  # a PCIe switch under root port 00:01.0
SW1 = "pci0000:40/0000:40:01.0/0000:41:00.0"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """Two GPUs, a rail NIC under each GPU's switch, and a management NIC (same type) that is down."""
    sys_root = tmp_path / "sys"
    gpus = [gpu(sys_root, f"{SW0}/0000:02:00.0/0000:03:00.0"), gpu(sys_root, f"{SW1}/0000:42:00.0/0000:43:00.0")]
    nic(sys_root, f"{SW0}/0000:02:04.0/0000:04:00.0", "mlx5_0", netdev="ibp4s0")
    nic(sys_root, f"{SW1}/0000:42:04.0/0000:44:00.0", "mlx5_1", netdev="ibp68s0")
    nic(sys_root, "pci0000:80/0000:80:02.0/0000:81:00.0", "mlx5_2", state="1: DOWN", phys="3: Disabled",
        rate="40 Gb/sec (4X QDR)", netdev="eno1")
    write(tmp_path / "proc" / "modules", "nvidia_peermem 16384 0 - Live 0x0 (OE)\nmlx5_ib 483328 0 - Live 0x0")
    (tmp_path / "gpus").write_text(json.dumps(gpus))
    return tmp_path


def net_of(node: Path) -> dict:
    return collect_net(node / "sys", json.loads((node / "gpus").read_text()))


def test_sysfs_reader_reads_ports_netdev_pci_path_and_the_gpus(node):
    net = net_of(node)
    assert net["error"] is None and [p["key"] for p in net["ports"]] == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1"]
    p0 = net["ports"][0]
    assert (p0["state"], p0["phys_state"], p0["rate_gbps"], p0["width"], p0["speed"]) == ("ACTIVE", "LinkUp", 400, "4X", "NDR")
    assert p0["netdev"] == "ibp4s0" and p0["pci_bus_id"] == "0000:04:00.0" and p0["numa_node"] == 0
    assert p0["pci_chain"] == ["0000:00:01.0", "0000:01:00.0", "0000:02:04.0", "0000:04:00.0"]
    assert net["gpu_pci_chains"]["0000:03:00.0"][:2] == ["0000:00:01.0", "0000:01:00.0"]
    assert net["modules"] == {"loaded": ["mlx5_ib", "nvidia_peermem"], "error": None}


def test_rails_come_from_the_gpus_switches_so_a_management_nic_down_does_not_drain(node):
    results = net_ports.judge_net(net_of(node), dict(net_ports.DEFAULTS), {}, None)
    assert {r.subject: r.status for r in results} == {"mlx5_0/1": P, "mlx5_1/1": P, "other ports": P}
    assert "the NICs under the GPUs' PCIe switches" in results[0].evidence[-1]
    # the same down NIC named a rail in the config fails the node; a configured rail that is gone too
    cfg = {**net_ports.DEFAULTS, "rails": ["mlx5_0", "mlx5_2", "mlx5_9"]}
    out = {r.subject: (r.status, r.action) for r in net_ports.judge_net(net_of(node), cfg, {}, None)}
    assert out["mlx5_2/1"] == (F, Action.DRAIN) and out["mlx5_9"] == (F, Action.DRAIN)
    assert out["mlx5_0/1"] == (P, Action.NONE) and out["other ports"] == (P, Action.NONE)


def test_a_lone_slow_or_narrow_rail_fails_against_the_majority(node):
    # synthetic: no real capture of 7x 400 + 1x 200 was found (fixtures24 INDEX)
    for dev, rate in (("mlx5_3", "400 Gb/sec (4X NDR)"), ("mlx5_4", "200 Gb/sec (2X NDR)")):
        nic(node / "sys", f"{SW0}/0000:02:0{dev[-1]}.0/0000:0{dev[-1]}:00.0", dev, rate=rate)
    out = {r.subject: r for r in net_ports.judge_net(net_of(node), dict(net_ports.DEFAULTS), {}, None)}
    slow = out["mlx5_4/1"]
    assert (slow.status, slow.action) == (F, Action.INVESTIGATE)
    assert "200.0 Gb/s, below the 400.0 Gb/s majority of the node's active rails (3 of 4" in slow.summary
    assert "2X width, below 4X" in slow.summary
    assert all(out[k].status == P for k in ("mlx5_0/1", "mlx5_1/1", "mlx5_3/1"))


def test_error_counters_rising_between_runs_warn_saturated_ones_are_not_new(node):
    net = net_of(node)
    first = net_ports.judge_net(net, dict(net_ports.DEFAULTS), {}, 1000.0)
    history = {r.metrics["port"]: (r.metrics, None) for r in first if "port" in r.metrics}
    later = copy.deepcopy(net)
    later["ports"][0]["counters"].update(symbol_error=7, port_rcv_errors=3)
    later["ports"][1]["counters"].update(symbol_error=65535)  # saturated 16-bit counter
    out = {r.subject: r for r in net_ports.judge_net(later, dict(net_ports.DEFAULTS), history, 1600.0)}
    r0, r1 = out["mlx5_0/1"], out["mlx5_1/1"]
    assert (r0.status, r0.metrics["error_counter_growth"]) == (W, 10)
    assert "symbol_error +7" in r0.summary and "port_rcv_errors +3" in r0.summary
    assert (r1.status, r1.metrics["error_counter_growth"]) == (P, 0)
    assert any("symbol_error saturated at 65535" in e for e in r1.evidence)
    # without a previous reading: counters since driver load, no delta, said so
    (r,) = [x for x in net_ports.judge_net(later, dict(net_ports.DEFAULTS), {}, 1600.0) if x.subject == "mlx5_0/1"]
    assert r.status == P and any("no previous reading" in e for e in r.evidence)


def test_counter_history_goes_through_the_state_directory(node, tmp_path):
    snap = json.loads((SNAPS / "h100-healthy.json").read_text())
    snap["net"] = net_of(node)
    state = State(tmp_path / "state")
    check = [c for c in net_ports.CHECKS]
    out = run_checks(check, Context(level=Level.QUICK, snapshot=snap, state=state), install_signal_handlers=False)
    state.append_history({"schema": "gpucheck.verdict", "time": snap["captured_at"],
                          "results": [r.to_dict() for r in out.results]})
    later = copy.deepcopy(snap)
    later["captured_at"] = "2025-06-02T10:25:00Z"
    later["net"]["ports"][0]["counters"]["symbol_error"] = 5
    out = run_checks(check, Context(level=Level.QUICK, snapshot=later, state=state), install_signal_handlers=False)
    assert {(r.subject, r.status) for r in out.results if r.status != P} == {("mlx5_0/1", W)}


def test_link_downed_growth_is_flaps_and_a_saturated_counter_is_not(node):
    net = net_of(node)
    first = net_flaps.judge_flaps(net, NetScan(), dict(net_flaps.DEFAULTS), {}, 1000.0)
    history = {r.metrics["port"]: (r.metrics, None) for r in first}
    later = copy.deepcopy(net)
    later["ports"][0]["counters"]["link_downed"] = 3
    later["ports"][1]["counters"]["link_downed"] = 255
    out = {r.subject: r for r in net_flaps.judge_flaps(later, NetScan(), dict(net_flaps.DEFAULTS), history, 1600.0)}
    assert (out["mlx5_0/1"].status, out["mlx5_0/1"].action, out["mlx5_0/1"].metrics["flaps"]) == (F, Action.DRAIN, 3)
    assert out["mlx5_1/1"].status == P and any("saturated at 255" in e for e in out["mlx5_1/1"].evidence)


def test_kernel_log_flaps_map_to_ports_by_netdev_and_non_rails_only_warn(node):
    net = net_of(node)
    lines = [f"2025-06-02T10:0{i}:00+00:00 host kernel: mlx5_core 0000:81:00.0 eno1: Link {'down' if i % 2 else 'up'}"
             for i in range(8)]
    from gpucheck.platform.kernlog.netscan import events_of
    from gpucheck.platform.kernlog.sources.base import Chunk, ReadResult
    read = ReadResult(source="file", chunks=[Chunk("file", lines)])
    out = {r.subject: r for r in net_flaps.judge_flaps(net, events_of(read), dict(net_flaps.DEFAULTS), {},
                                                        1748858400.0)}  # 2025-06-02T10:00:00Z + 1h
    assert (out["mlx5_2/1"].status, out["mlx5_2/1"].metrics["flaps"], out["mlx5_2/1"].metrics["rail"]) == (W, 4, False)
    assert out["mlx5_0/1"].status == P


def test_unreadable_sources_are_errors_never_pass(node):
    class Broken(DirTree):
        def listdir(self, rel):
            raise Unreadable(f"{rel}: Input/output error")

    net = read_ib_ports(Broken(node / "sys"))
    assert net["error"] and "Input/output error" in net["error"]
    (r,) = net_ports.judge_net({**net, "modules": {"loaded": None, "error": None}}, dict(net_ports.DEFAULTS), {}, None)
    assert r.status == E and "could not judge" in r.summary
    live = net_of(node)
    live["modules"] = {"loaded": None, "error": "cannot read /proc/modules: Permission denied"}
    r = gdr_peermem.judge_peermem(live, True, NetScan(), dict(gdr_peermem.DEFAULTS))
    assert r.status == E and "Permission denied" in r.summary
    out = net_flaps.judge_flaps(net_of(node), NetScan(error="cannot read the kernel log: denied"),
                                dict(net_flaps.DEFAULTS), {}, 1000.0)
    assert {r.status for r in out} == {E} and "could not read the kernel log" in out[0].summary


def test_no_rdma_hardware_is_a_plain_skip(tmp_path):
    (tmp_path / "sys").mkdir()
    net = collect_net(tmp_path / "sys", [])
    assert net["ports"] == [] and net["error"] is None
    assert net_ports.judge_net(net, dict(net_ports.DEFAULTS), {}, None)[0].status == S
    assert gdr_peermem.judge_peermem(net, True, NetScan(), dict(gdr_peermem.DEFAULTS)).status == S
    assert net_flaps.judge_flaps(net, NetScan(), dict(net_flaps.DEFAULTS), {}, 1.0)[0].status == S


def test_peermem_loaded_missing_or_not_required(node):
    net = net_of(node)
    assert gdr_peermem.judge_peermem(net, True, NetScan(), dict(gdr_peermem.DEFAULTS)).status == P
    net["modules"]["loaded"] = ["mlx5_ib", "nvidia"]
    r = gdr_peermem.judge_peermem(net, True, NetScan(), dict(gdr_peermem.DEFAULTS))
    assert (r.status, r.action) == (F, Action.INVESTIGATE) and "not loaded" in r.summary
    relaxed = {**gdr_peermem.DEFAULTS, "require_peermem": False}
    assert gdr_peermem.judge_peermem(net, True, NetScan(), relaxed).status == P
    assert gdr_peermem.judge_peermem(net, False, NetScan(), dict(gdr_peermem.DEFAULTS)).status == S


def test_a_snapshot_records_the_files_read_and_replays_through_the_reader(node):
    net = net_of(node)
    doc = json.loads(json.dumps(net))  # what a snapshot file holds
    again = replay_net(doc)
    assert again["ports"] == net["ports"] and again["gpu_pci_chains"] == net["gpu_pci_chains"]
    # a replay reads the recorded files, not the recorded ports: a changed file changes the result
    doc["raw"]["files"]["class/infiniband/mlx5_0/ports/1/state"] = "1: DOWN\n"
    assert replay_net(doc)["ports"][0]["state"] == "DOWN"
    snap = json.loads((SNAPS / "h100-healthy.json").read_text())
    snap["net"] = doc
    validate_snapshot(snap)
    assert replay_snapshot(snap)["net"]["ports"][0]["state"] == "DOWN"
    with pytest.raises(SnapshotError, match="net.ports"):
        validate_snapshot({**snap, "net": {"ports": "mlx5_0"}})


@pytest.mark.slow
def test_run_snapshot_judges_the_recorded_net(tmp_path):
    snap = json.loads((SNAPS / "h100-healthy.json").read_text())
    snap["net"] = from_text("ibstat", (NET / "ibstat" / "gpud-h100-roce-some-down.txt").read_text())
    snap["net"]["modules"] = {"loaded": ["nvidia_peermem"], "error": None}
    path = tmp_path / "node.json"
    path.write_text(json.dumps(snap))
    argv = [sys.executable, "-m", "gpucheck", "run", "--snapshot", str(path), "--check", "net.ports",
            "--check", "gdr.peermem", "--check", "net.flaps", "--json", "--no-history"]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 1, p.stderr
    verdict = json.loads(p.stdout)
    got = {(r["check"], r["subject"], r["status"]) for r in verdict["results"] if r["status"] != "pass"}
    assert got == {("net.ports", "mlx5_5/1", "fail"), ("net.ports", "mlx5_11/1", "fail"),
                   ("net.flaps", "node", "skip")}


def test_the_line_filter_keeps_the_network_lines():
    import io
    data = (b"[1.0] ata6: SATA link down\n[2.0] mlx5_core 0000:01:00.1 eth1: Link up\n[3.0] usb 1-1: new device\n"
            b"[4.0] nvidia_peermem: Unknown symbol x (err -22)\n[5.0] ib6: lost carrier\n")
    kept = list(iter_relevant_lines(io.BytesIO(data)))
    assert kept == [b"[2.0] mlx5_core 0000:01:00.1 eth1: Link up", b"[4.0] nvidia_peermem: Unknown symbol x (err -22)",
                    b"[5.0] ib6: lost carrier"]


@pytest.mark.parametrize("line,expected", [
    ("[1.0] ata6: SATA link down (SStatus 4 SControl 300)", None),
    ("[1.0] igb 0000:03:00.0 eno1: igb: eno1 NIC Link is Down", ("eno1", False)),
    ("[1.0] ixgbe 0000:18:00.0 ens1f0: NIC Link is Up 10 Gbps, Flow Control: RX/TX", ("ens1f0", True)),
    ("Aug 17 06:18:06 vm systemd-networkd[5398]: ib6: Gained carrier", ("ib6", True)),
    ("[1.0] mlx5_core 0000:1b:00.1 enp27s0f1np1: Link down", ("enp27s0f1np1", False)),
])
def test_link_lines(line, expected):
    ev = parse_net_line(line)
    assert (None if ev is None else (ev.iface, ev.up)) == expected


def test_a_line_whose_time_cannot_be_placed_has_no_time():
    assert parse_net_line("[  +0.000844] mlx5_core 0000:01:00.0 ib0: Link down").time is None
    assert parse_net_line("[100.5] mlx5_core 0000:01:00.0 ib0: Link down", boot_time=1000.0).time == 1100.5


def test_a_sysfs_folder_is_read_whatever_level_of_it_was_copied(node):
    from gpucheck.platform.net.captures import NET_CAPTURE_KINDS

    for folder in (node / "sys", node, node / "sys" / "class", node / "sys" / "class" / "infiniband"):
        kinds = [(name, read) for name, detect, read in NET_CAPTURE_KINDS if detect(b"", folder)]
        assert [k for k, _ in kinds] == ["sysfs folder"], folder
        net = kinds[0][1](folder)["net"]
        assert [p["key"] for p in net["ports"]] == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1"], folder
    # the whole tree: the PCI topology too, so the rails are the NICs under the GPUs' switches
    net = NET_CAPTURE_KINDS[4][2](node / "sys")["net"]
    assert {r.subject for r in net_ports.judge_net(net, dict(net_ports.DEFAULTS), {}, None)} == {
        "mlx5_0/1", "mlx5_1/1", "other ports"}
    assert not any(detect(b"", node / "proc") for _, detect, _ in NET_CAPTURE_KINDS)


def test_earlier_peermem_load_errors_warn_once_the_module_is_loaded(node):
    from gpucheck.platform.kernlog.netscan import events_of
    from gpucheck.platform.kernlog.sources.base import Chunk, ReadResult

    lines = ["[10.0] nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client",
             "[10.0] nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)"]
    scan = events_of(ReadResult(source="file", chunks=[Chunk("file", lines)]))
    r = gdr_peermem.judge_peermem(net_of(node), True, scan, dict(gdr_peermem.DEFAULTS))  # loaded now
    assert (r.status, r.action, r.metrics["load_errors"]) == (W, Action.INVESTIGATE, 2)
    assert "earlier load error(s) of nvidia_peermem" in r.summary
    net = net_of(node)
    net["modules"]["loaded"] = ["mlx5_ib"]
    r = gdr_peermem.judge_peermem(net, True, scan, dict(gdr_peermem.DEFAULTS))
    assert r.status == F and "not loaded" in r.summary and "2 load error(s) of nvidia_peermem" in r.summary


def test_link_error_recoveries_rising_warn(node):
    net = net_of(node)
    net["ports"][0]["counters"]["link_error_recovery"] = 4
    first = net_flaps.judge_flaps(net, NetScan(), dict(net_flaps.DEFAULTS), {}, 1000.0)
    history = {r.metrics["port"]: (r.metrics, None) for r in first}
    later = copy.deepcopy(net)
    later["ports"][0]["counters"]["link_error_recovery"] = 6
    (r0,) = [r for r in net_flaps.judge_flaps(later, NetScan(), dict(net_flaps.DEFAULTS), history, 1600.0)
             if r.subject == "mlx5_0/1"]
    assert (r0.status, r0.metrics["link_error_recovery_growth"]) == (W, 2) and "recoveries rising" in r0.summary
