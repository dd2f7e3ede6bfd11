"""The network checks on real captures (tests/fixtures/net, each with its .source): every capture
kind read through gpucheck.platform.net.captures (the rows `gpucheck judge` uses), judged by the
same functions as a live run, with the verdict its .source states."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpucheck.core.result import Action, Status
from gpucheck.platform.kernlog.netscan import scan_recorded
from gpucheck.platform.kernlog.timeparse import parse_timestamp
from gpucheck.platform.net.captures import NET_CAPTURE_KINDS
from gpucheck.tests_suite import gdr_peermem, net_flaps, net_ports

FIX = Path(__file__).parent / "fixtures" / "net"
P, W, F, E, S = Status.PASS, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP


def read_capture(path: Path) -> dict:
    head = b"" if path.is_dir() else path.read_bytes()[:65536]
    kinds = [(name, read) for name, detect, read in NET_CAPTURE_KINDS if detect(head, path)]
    assert len(kinds) == 1, (path, [k for k, _ in kinds])
    return kinds[0][1](path)["net"]


def ports_results(path: Path, **params):
    return net_ports.judge_net(read_capture(path), {**net_ports.DEFAULTS, **params}, {}, None)


def failing(results) -> dict[str, tuple[Status, Action]]:
    return {r.subject: (r.status, r.action) for r in results if r.status != P}


# capture -> the subjects that do not pass (subject -> status, action); every other result passes
PORTS = {
    "ibstat/azhpc-diagnostics-59-state-initializing-flattened.txt": {"mlx5_ib0/1": (F, Action.DRAIN)},
    "ibstat/gpud-a100-all-active.txt": {},
    "ibstat/gpud-azure-a100-ibpanic-partial.txt": {"capture": (W, Action.INVESTIGATE)},
    "ibstat/gpud-h100-ib-ndr-400-all-active.txt": {},
    "ibstat/gpud-h100-ib-some-down.txt": {},
    "ibstat/gpud-h100-roce-400-all-active.txt": {},
    "ibstat/gpud-h100-roce-some-down.txt": {"mlx5_5/1": (F, Action.DRAIN), "mlx5_11/1": (F, Action.DRAIN)},
    "ibstat/gpud-pr482-ndr-port-down-polling.txt": {"mlx5_10/1": (F, Action.DRAIN)},
    "ibstat/gpud-pr99-cx6dx-down-disabled-partial.txt": {"mlx5_8/1": (F, Action.DRAIN)},
    "ibstat/network-operator-249-sriov-vf-down-linkup.txt": {"mlx5_7/1": (F, Action.DRAIN)},
    "ibstatus/azhpc-diagnostics-an0-eth40-plus-ib-hdr200.txt": {},
    "ibstatus/gpud-azure-a100-hdr200-plus-eth40.txt": {},
    "ibstatus/nccl-1935-ib-rails-down-disabled-tabs.txt": {k: (F, Action.DRAIN) for k in
                                                           ("mlx5_11/1", "mlx5_3/1", "mlx5_4/1", "mlx5_5/1")},
    "ibstatus/nccl-489-hdr-port-active-second-down-disabled.txt": {"mlx5_1/1": (F, Action.DRAIN)},
    "ibv_devinfo/deepep-60-cx7-port-down-partial.txt": {"mlx5_0/1": (F, Action.DRAIN)},
    "ibv_devinfo/ucx-2534-old-format-device-ports-partial.txt": {},
    "ibv_devinfo/ucx-9908-cx6-hdr-vv-port1-active-port2-disabled.txt": {"mlx5_1/1": (F, Action.DRAIN)},
    "rdma_link/3fs-263-soft-roce-rxe.txt": {"node": (S, Action.NONE)},
    "rdma_link/3fs-283-cx6dx-roce-healthy.txt": {},
    "sysfs/gcm-learn_good.json": {},
    "sysfs/gcm-learn_ib_intf_bad_rate.json": {},
    "sysfs/gcm-learn_stuck_ib_intf.json": {"mlx5_6/1": (F, Action.DRAIN), "mlx5_8/1": (F, Action.DRAIN)},
    "sysfs/gpud-h100-sys-class-infiniband.json": {},
    "sysfs/node-exporter-sys-class-infiniband.json": {},
    "sysfs/procfs-sys-class-infiniband.json": {"other ports": (W, Action.INVESTIGATE)},
    "sysfs/azhpc-diagnostics-endure-port.json": {"mlx4_0/1": (E, Action.NONE)},
}


def test_every_port_capture_is_in_the_table():
    on_disk = {str(p.relative_to(FIX)) for sub in ("ibstat", "ibstatus", "ibv_devinfo", "rdma_link", "sysfs")
               for p in (FIX / sub).iterdir() if p.suffix != ".source"}
    assert on_disk == set(PORTS)


@pytest.mark.parametrize("name", sorted(PORTS))
def test_net_ports_on_real_captures(name):
    results = ports_results(FIX / name)
    assert failing(results) == PORTS[name]
    assert all(r.status != P or r.summary for r in results)


def test_the_rails_and_their_reasons_are_named():
    results = ports_results(FIX / "ibstat/gpud-h100-ib-some-down.txt")
    rails = sorted(r.subject for r in results if r.metrics.get("rail"))
    assert rails == ["mlx5_0/1", "mlx5_10/1", "mlx5_11/1", "mlx5_3/1", "mlx5_4/1", "mlx5_5/1", "mlx5_6/1",
                     "mlx5_9/1"]
    other = next(r for r in results if r.subject == "other ports")
    assert "mlx5_2/1 DOWN/Disabled" in other.summary and "3 not active" in other.summary
    assert "largest class of alike ports (8 x MT4129 InfiniBand" in other.evidence[0]


def test_a_slow_node_is_found_only_against_a_configured_rate_and_says_so():
    path = FIX / "sysfs/gcm-learn_ib_intf_bad_rate.json"
    plain = ports_results(path)
    assert {r.status for r in plain} == {P}
    rail = next(r for r in plain if r.subject == "mlx5_0/1")
    assert rail.metrics["rate_gbps"] == 100.0 and "100 Gb/sec (4X EDR)" in rail.summary
    assert "expected rate 100 Gb/s: majority of the node's active rails (8 of 8; no expected_rate_gbps configured)" \
        in rail.evidence
    configured = ports_results(path, expected_rate_gbps=200)
    assert {r.subject: r.status for r in configured if r.metrics.get("rail")} == {
        f"mlx5_{i}/1": F for i in (0, 1, 2, 3, 6, 7, 8, 9)}
    assert "below the 200.0 Gb/s configured expected_rate_gbps" in configured[0].summary


def test_not_available_counters_are_none_never_zero():
    net = read_capture(FIX / "sysfs/node-exporter-sys-class-infiniband.json")
    i40 = next(p for p in net["ports"] if p["device"] == "i40iw0")
    assert i40["counters"]["symbol_error"] is None and i40["counters"]["link_downed"] is None
    mlx4 = next(p for p in net["ports"] if p["key"] == "mlx4_0/1")
    assert mlx4["counters"]["port_xmit_wait"] == 4294967295


def test_an_unknown_physical_state_is_never_linkup():
    net = read_capture(FIX / "sysfs/procfs-sys-class-infiniband.json")
    mlx5 = next(p for p in net["ports"] if p["key"] == "mlx5_0/1")
    assert mlx5["phys_state"] == "unknown" and mlx5["phys_state_text"] == "4: ACTIVE"
    (endure,) = [r for r in ports_results(FIX / "sysfs/azhpc-diagnostics-endure-port.json")]
    assert endure.status == E and "phys_state '0: <unknown>' does not parse" in endure.summary


# -- net.flaps on real kernel logs -------------------------------------------------------------------
def flaps_of(name: str, now_iso: str, net=None):
    now = parse_timestamp(now_iso)
    lines = (FIX / name).read_text(errors="replace").splitlines()
    scan = scan_recorded({"source": "file", "lines": lines, "error": None, "boot_time": None}, now)
    return net_flaps.judge_flaps(net, scan, dict(net_flaps.DEFAULTS), {}, now)


def test_flaps_on_real_logs():
    (eth1,) = flaps_of("journal/cubecos-733-journal-mlx5-link-up-repeated.log", "2026-03-27T15:40:00")
    assert (eth1.subject, eth1.status, eth1.metrics["flaps"]) == ("eth1", W, 4)
    (ib6,) = flaps_of("journal/azurehpc-nhc-1dev-6flap-syslog.log", "2026-08-17T07:00:00")
    assert (ib6.subject, ib6.status, ib6.action, ib6.metrics["flaps"]) == ("ib6", F, Action.DRAIN, 6)
    (quiet,) = flaps_of("journal/azurehpc-nhc-0flap-syslog.log", "2026-08-17T07:00:00")
    assert quiet.status == P and "no link flap" in quiet.summary
    boot = flaps_of("kernlog/gpud-h100-boot-dmesg-decode-iso-mlx5-excerpt.log", "2025-01-17T16:00:00")
    assert {r.status for r in boot} == {P} and not any(r.subject.startswith("ata") for r in boot)


def test_flaps_outside_the_window_are_not_counted_and_unknown_times_are():
    (late,) = flaps_of("journal/azurehpc-nhc-1dev-6flap-syslog.log", "2026-08-17T09:00:00")
    assert late.status == P and late.metrics["flaps"] == 0
    lines = [f"[  +0.00{i}] mlx5_core 0000:01:00.0 ib0: Link {'down' if i % 2 == 0 else 'up'}" for i in range(6)]
    scan = scan_recorded({"source": "file", "lines": lines, "error": None, "boot_time": None}, time.time())
    (r,) = net_flaps.judge_flaps(None, scan, dict(net_flaps.DEFAULTS), {}, time.time())
    assert (r.status, r.metrics["flaps"]) == (F, 3)  # relative stamps: time unknown, never old


# -- gdr.peermem on real kernel logs -----------------------------------------------------------------
PEERMEM = {
    "kernlog/gpud-h100-peermem-invalid-context-xid48-63-94.log": (S, 0),
    "kernlog/nv-peer-memory-8-unknown-symbol-err22.log": (F, 14),
    "kernlog/nv-peer-memory-84-modprobe-unknown-symbol-ctime.log": (F, 5),
    "kernlog/gpu-operator-2868-gb300-nvidia-peermem-unknown-symbol-ctime.log": (F, 10),
    "kernlog/gpud-h100-boot-dmesg-decode-iso-mlx5-excerpt.log": (S, 0),
}


@pytest.mark.parametrize("name", sorted(PEERMEM))
def test_peermem_on_real_logs(name):
    lines = (FIX / name).read_text(errors="replace").splitlines()
    scan = scan_recorded({"source": "file", "lines": lines, "error": None, "boot_time": None}, time.time())
    r = gdr_peermem.judge_peermem(None, None, scan, dict(gdr_peermem.DEFAULTS))
    assert (r.status, r.metrics.get("load_errors", 0)) == PEERMEM[name]
    if r.status == F:
        assert "module state not in this capture" in r.summary and "Unknown symbol" in "".join(r.evidence)


def test_peermem_runtime_errors_are_reported_not_judged():
    lines = (FIX / "kernlog/gpud-h100-peermem-invalid-context-xid48-63-94.log").read_text().splitlines()
    scan = scan_recorded({"source": "file", "lines": lines, "error": None, "boot_time": None}, time.time())
    alone = gdr_peermem.judge_peermem(None, None, scan, dict(gdr_peermem.DEFAULTS))
    assert alone.status == S and "30 nvidia_peermem error line(s) (reported, not judged)" in alone.evidence
    net = read_capture(FIX / "ibstat/gpud-h100-ib-ndr-400-all-active.txt")
    net["modules"] = {"loaded": ["nvidia_peermem"], "error": None}
    r = gdr_peermem.judge_peermem(net, True, scan, dict(gdr_peermem.DEFAULTS))
    assert r.status == P and r.metrics["runtime_errors"] == 30
    assert "30 other nvidia_peermem error line(s) (reported, not judged)" in r.summary
