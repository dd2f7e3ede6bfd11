"""`gpucheck judge CAPTURE...` (gpucheck.judge, gpucheck.platform.captures): each kind detected and
judged on a real capture (provenance in each fixture's .source), mixed kinds adding up, a time
series judged for changes, and exit 2 for a file that cannot be judged, named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.judge import read_captures, telemetry_of
from gpucheck.platform import captures as C

FIX = Path(__file__).parent / "fixtures"
NVSMI, DCGM, JUDGE, KERNLOG = FIX / "nvsmi", FIX / "dcgm" / "real", FIX / "judge", FIX / "kernlog" / "real"


def kind(name: str) -> C.CaptureKind:
    return next(k for k in C.kinds() if k.name == name)


def judge(capsys, *argv: str) -> tuple[int, dict, str]:
    rc = main(["judge", "--json", *argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else {}), err


def not_pass(v: dict) -> set[tuple[str, str, str]]:
    return {(r["check"], r["subject"], r["status"]) for r in v["results"] if r["status"] not in ("pass", "skip")}


# -- the nvidia-smi capture fixes, through judge -------------------------------------------------------
@pytest.mark.parametrize("name", ["h100-x8-565-healthy.txt", "h200-550-healthy.txt", "h100nvl-x2-550-healthy.txt"])
def test_a_healthy_h100_class_capture_exits_0_with_the_skips_named(capsys, name):
    rc, v, _ = judge(capsys, str(NVSMI / name))
    assert rc == 0 and v["status"] == "pass"
    nvlink = {r["summary"].split(": ", 1)[1] for r in v["results"] if r["check"] == "nvlink"}
    assert nvlink == {"capture has no NVLink state: add `nvidia-smi nvlink -s`"}


@pytest.mark.parametrize("name,failing,action", [
    ("h100-x8-565-synthetic-remap-pending-gpu3.txt", {("memory-remap", "gpu3", "fail")}, "reset-gpu"),
    ("gpud-a10-535.129.03-remap-pending.txt", {("memory-remap", "gpu0", "fail")}, "reset-gpu"),
    ("gpud-h100-x8-535.183.01-power-brake-active-one.txt", {("clocks", "gpu2", "fail")}, "investigate"),
])
def test_a_pending_remap_or_an_active_power_brake_exits_1(capsys, name, failing, action):
    rc, v, _ = judge(capsys, str(NVSMI / name))
    assert rc == 1 and v["action"] == action and not_pass(v) == failing


# -- every kind of this module on a real capture -------------------------------------------------------
@pytest.mark.parametrize("path,kind,rc_expected,faults", [
    (NVSMI / "gpud-rtx4090-x8-535.154.05-ecc-disabled.txt", "nvidia-smi -q", 0,
     {("pcie", f"gpu{i}", "warn") for i in range(8)}),  # ECC off on a GeForce: a note, no inventory fail
    (NVSMI / "a100-mig-510-netdata.xml", "nvidia-smi -q -x", 0, {("inventory", "gpu0", "warn")}),
    (JUDGE / "gpu-burn-1-aer-surprise-down-xid79.log", "kernel log (dmesg)", 1,
     {("xid", "pci:0000:02:00", "fail"), ("pcie.aer", "kernel log", "fail")}),  # Surprise Down (fatal) above the GPU
    (JUDGE / "gpud-h100-peermem-invalid-context-xid48-63-94.log", "kernel log (journal, syslog, kern.log)", 1,
     {("xid", "pci:0000:19:00", "fail")}),
    (JUDGE / "pop-os-3363-journal-aer-correctable-gpu.log", "kernel log (journal, syslog, kern.log)", 0,
     {("pcie.aer", "kernel log", "warn")}),  # 2 correctable AER reports on the GPU within 60 s
    (KERNLOG / "ogkm-688-gpu-lost-assert-dgx-a100.log", "kernel log (journal, syslog, kern.log)", 1,
     {("xid", "gpu:unknown", "fail")}),
    (KERNLOG / "gpud-1174-nvlink5-kmsg-inputs.log", "kernel log (lines)", 1, None),
    (DCGM / "dcgm-3.1.0-r1-8gpu-nvidia-dcgm-test.json", "DCGM diag JSON", 0, set()),
    (DCGM / "dcgm-4.2.3-gb10-level1-persistence-off.json", "DCGM diag JSON", 3,
     {("eud.dcgm", "gpu0/software", "error")}),
])
def test_each_kind_on_a_real_capture(capsys, path, kind, rc_expected, faults):
    assert C.detect_kind(path).name == kind
    rc, v, _ = judge(capsys, str(path))
    assert rc == rc_expected
    if faults is not None:
        assert not_pass(v) == faults


def test_a_gpucheck_snapshot_is_judged_as_run_snapshot_judges_it(capsys, tmp_path):
    """A snapshot imported from the real H100 capture (judged as converted), and a recorded one
    (the synthetic remap-failure fixture: replayed through the live reader), each exactly as
    `gpucheck run --snapshot` judges it."""
    snap = tmp_path / "node.json"
    assert main(["telemetry", "import", str(NVSMI / "h100-x8-565-healthy.txt"), "-o", str(snap)]) == 0
    capsys.readouterr()
    for path in (snap, FIX / "snapshots" / "h100-remap-failure.json"):
        assert C.detect_kind(path).name == "gpucheck snapshot"
        rc1, v, _ = judge(capsys, str(path))
        rc2 = main(["run", "--json", "--no-history", "--snapshot", str(path)])
        run = json.loads(capsys.readouterr()[0])
        assert rc1 == rc2 and [(r["check"], r["subject"], r["status"], r["summary"]) for r in v["results"]] == \
            [(r["check"], r["subject"], r["status"], r["summary"]) for r in run["results"]]
    assert rc1 == 1 and ("memory-remap", "gpu6", "fail") in not_pass(v)


def test_captures_without_gpu_telemetry_skip_the_nvml_checks_naming_what_to_add(capsys):
    rc, v, _ = judge(capsys, str(JUDGE / "pop-os-3363-journal-aer-correctable-gpu.log"))
    inv = [r for r in v["results"] if r["check"] == "inventory"]
    assert rc == 0 and [r["status"] for r in inv] == ["skip"]
    assert "add `nvidia-smi -q`" in inv[0]["summary"]


# -- several captures of one node ----------------------------------------------------------------------
def test_mixed_kinds_add_up(capsys):
    rc, v, _ = judge(capsys, str(NVSMI / "h100-x8-565-synthetic-remap-pending-gpu3.txt"),
                     str(JUDGE / "gpud-h100-peermem-invalid-context-xid48-63-94.log"),
                     str(DCGM / "dcgm-3.1.0-r1-8gpu-nvidia-dcgm-test.json"))
    assert rc == 1 and v["action"] == "drain"
    assert not_pass(v) == {("memory-remap", "gpu3", "fail"), ("xid", "pci:0000:19:00", "fail")}
    assert len(v["gpus"]) == 8 and any(r["check"] == "eud.dcgm" and r["status"] == "pass" for r in v["results"])


def test_a_series_of_nvidia_smi_captures_is_judged_for_changes_in_time_order(capsys):
    t0, t1 = NVSMI / "h100-x8-565-healthy.txt", NVSMI / "h100-x8-565-synthetic-t1-pcie-replays.txt"
    for argv in ((t0, t1), (t1, t0)):  # ordered by the captures' own Timestamps
        rc, v, _ = judge(capsys, *map(str, argv))
        pcie = next(r for r in v["results"] if r["check"] == "pcie" and r["subject"] == "gpu0")
        assert rc == 0 and pcie["status"] == "warn" and "2000 since the previous run" in pcie["summary"]
        assert v["source"]["path"] == str(t1)
    rc, v, _ = judge(capsys, str(t1))  # alone: nothing to compare with
    assert next(r for r in v["results"] if r["check"] == "pcie" and r["subject"] == "gpu0")["status"] == "pass"


def test_a_series_without_times_is_ordered_as_given():
    a = C.Capture(Path("a"), kind("nvidia-smi -q"), {"captured_at": "unknown"}, 0)
    b = C.Capture(Path("b"), kind("nvidia-smi -q"), {"captured_at": "2024-11-14T07:00:14"}, 1)
    ordered, note = C.order_series([b, a])
    assert [c.path.name for c in ordered] == ["a", "b"] and "as given on the command line" in (note or "")


def test_plan_aligns_series_on_the_last_and_puts_single_captures_last():
    nv, log = kind("nvidia-smi -q"), kind("kernel log (lines)")
    caps = [C.Capture(Path(f"t{i}"), nv, {"captured_at": f"2024-11-14T07:0{i}:00"}, i) for i in range(3)]
    caps.append(C.Capture(Path("dmesg"), log, {"kernel_log": {"lines": ["a"]}}, 3))
    caps.append(C.Capture(Path("dmesg2"), log, {"kernel_log": {"lines": ["b"]}}, 4))
    steps, _ = C.plan_steps(caps)
    assert [[c.path.name for c in s] for s in steps] == [["t0"], ["t1"], ["t2", "dmesg", "dmesg2"]]
    assert C.assemble(steps[-1]).document["kernel_log"] == {"lines": ["a", "b"]}


def test_an_unknown_top_level_key_passes_through_to_the_judged_snapshot(tmp_path):
    """Another module's kind (a `net` fragment) adds a key this module does not know: the checks
    see it in the snapshot they judge, next to the GPU part."""
    kind = C.CaptureKind("test: net fragment", lambda head, path: head.startswith(b"NETTEST"),
                         lambda path: {"net": {"source": "test", "ports": [{"state": "down"}]}})
    C.register(kind)
    try:
        f = tmp_path / "net.txt"
        f.write_text("NETTEST\n")
        with pytest.raises(ValueError, match="registered twice"):
            C.register(kind)
        caps = read_captures([str(NVSMI / "h200-550-healthy.txt"), str(f)])
        steps, _ = C.plan_steps(caps)
        snap = telemetry_of(C.assemble(steps[-1])).snapshot()
        assert snap["net"] == {"source": "test", "ports": [{"state": "down"}]} and len(snap["gpus"]) == 1
    finally:
        C._KINDS.remove(kind)


def test_two_captures_with_gpu_telemetry_judge_the_first_and_say_so(capsys, tmp_path):
    rc, v, err = judge(capsys, str(NVSMI / "h200-550-healthy.txt"), str(NVSMI / "a100-mig-510-netdata.xml"))
    assert rc == 0 and v["gpus"][0]["name"] == "NVIDIA H200"
    assert "a100-mig-510-netdata.xml: GPU telemetry also in" in err


# -- files that cannot be judged: exit 2, named -------------------------------------------------------
def test_a_file_of_no_known_kind_an_empty_one_a_missing_one_exit_2_named(capsys, tmp_path):
    junk, empty = tmp_path / "ibstat.txt", tmp_path / "empty.txt"
    junk.write_text("Port 1 is fine, said the operator\n")
    empty.write_text("")
    for path, words in ((junk, "not a capture of a known kind"), (empty, "empty file"),
                        (tmp_path / "missing.txt", "no such file")):
        rc = main(["judge", str(NVSMI / "h200-550-healthy.txt"), str(path)])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and f"{path}: {words}" in err


def test_a_capture_of_a_known_kind_that_does_not_read_exits_2(capsys, tmp_path):
    bad = tmp_path / "snap.json"
    bad.write_text('{"kind": "gpucheck.snapshot", "version": 99}')
    rc = main(["judge", str(bad)])
    assert rc == 2 and "version" in capsys.readouterr()[1]


# -- nvidia-smi nvlink -s: the NVLink state nvidia-smi -q does not carry --------------------------------
@pytest.mark.parametrize("name,rc_expected,nvlink", [
    ("azhpc-diagnostics-v100-nvlink-s-inactive-links.txt", 1,
     {("gpu0", "skip"), ("gpu1", "skip"), ("gpu2", "skip"), ("gpu3", "fail"), ("gpu4", "fail"), ("gpu5", "fail"),
      ("gpu6", "fail")}),
    ("azurehpc-nhc-a100-nvlink-all-inactive.txt", 1, {("gpu6", "fail")}),
    ("azurehpc-nhc-a100-nvlink-status-good.txt", 0, {("gpu7", "skip")}),
])
def test_nvlink_status_captures(capsys, name, rc_expected, nvlink):
    assert C.detect_kind(NVSMI / name).name == "nvidia-smi nvlink -s"
    rc, v, _ = judge(capsys, str(NVSMI / name))
    assert rc == rc_expected and {(r["subject"], r["status"]) for r in v["results"] if r["check"] == "nvlink"} == nvlink
    others = {r["summary"].split(": ", 1)[1] for r in v["results"]
              if r["check"] in ("ecc", "clocks", "pcie") and r["subject"].startswith("gpu")}
    assert others == {"capture has no GPU telemetry besides NVLink: add `nvidia-smi -q`"}


def test_nvlink_s_beside_nvidia_smi_q_judges_the_links_of_the_same_gpus(capsys, tmp_path):
    """Synthetic (written here, the real H100 capture's UUIDs with an nvlink -s layout as in the
    real azhpc-diagnostics capture): GPU 1's link 4 inactive fails it; the others skip naming the
    counters nvlink -s does not print; nothing else of the healthy capture changes."""
    snap = C.assemble(read_captures([str(NVSMI / "h100-x8-565-healthy.txt")])).document
    lines = []
    for g in snap["gpus"]:
        lines.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        lines += [f"\t Link {n}: " + ("<inactive>" if (g["index"], n) == (1, 4) else "26.562 GB/s") for n in range(18)]
    nvl = tmp_path / "nvlink-s.txt"
    nvl.write_text("\n".join(lines) + "\n")
    rc, v, _ = judge(capsys, str(NVSMI / "h100-x8-565-healthy.txt"), str(nvl))
    got = {(r["subject"], r["status"]) for r in v["results"] if r["check"] == "nvlink"}
    assert rc == 1 and got == {("gpu1", "fail")} | {(f"gpu{i}", "skip") for i in (0, 2, 3, 4, 5, 6, 7)}
    assert not_pass(v) == {("nvlink", "gpu1", "fail")}


def test_an_nvlink_s_line_that_does_not_read_exits_2(capsys, tmp_path):
    bad = tmp_path / "nvl.txt"
    bad.write_text("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: fast\n")
    rc = main(["judge", str(bad)])
    assert rc == 2 and "line 3" in capsys.readouterr()[1]


def test_gzipped_captures_are_read_like_plain_ones(capsys, tmp_path):
    import gzip

    for src in (NVSMI / "h100-x8-565-synthetic-remap-pending-gpu3.txt", JUDGE / "gpu-burn-1-aer-surprise-down-xid79.log"):
        (tmp_path / (src.name + ".gz")).write_bytes(gzip.compress(src.read_bytes()))
    rc, v, _ = judge(capsys, *(str(p) for p in sorted(tmp_path.iterdir())))
    assert rc == 1 and not_pass(v) == {("memory-remap", "gpu3", "fail"), ("xid", "pci:0000:02:00", "fail"),
                                       ("pcie.aer", "kernel log", "fail")}


# -- the fabric kinds (gpucheck.platform.fabric.captures), wired into the table ----------------------
FABRIC = FIX


def test_a_fabric_grep_alone_judges_the_fabric_and_names_what_to_add_for_the_rest(capsys):
    """nvidia-smi's Fabric sections alone (a grep): their GPUs become entries; inventory and the
    NVML checks skip naming `nvidia-smi -q`, never a warn about a driver version it cannot show."""
    path = FABRIC / "nvsmi_fabric" / "azhpc-images-506-fabric-insufficient-resources.txt"
    assert C.detect_kind(path).name == "nvidia-smi fabric"
    rc, v, _ = judge(capsys, str(path))
    assert rc == 1 and not_pass(v) == {("fabric.nvswitch", "gpu0", "fail")}
    inv = [r for r in v["results"] if r["check"] == "inventory" and r["subject"] == "node"]
    assert inv[0]["status"] == "skip" and "add `nvidia-smi -q`" in inv[0]["summary"]


def test_a_fabric_grep_fills_the_gpus_of_a_full_capture(capsys, tmp_path):
    """With a full nvidia-smi -q of the node, the grep's fabric groups go into its GPU entries by
    index (the full capture's own Fabric section is replaced, no GPU is added)."""
    grep = FABRIC / "nvsmi_fabric" / "dra-driver-626-fabric-health-unhealthy-grep.txt"
    rc, v, _ = judge(capsys, str(NVSMI / "h100-x8-565-healthy.txt"), str(grep))
    fabric = {(r["subject"], r["status"]) for r in v["results"] if r["check"] == "fabric.nvswitch"}
    assert rc == 1 and ("gpu0", "fail") in fabric and len(v["gpus"]) == 8


def test_a_fabric_manager_log_and_its_service_state_add_up(capsys, tmp_path):
    service = tmp_path / "fm-service.txt"
    service.write_text("ActiveState=active\nSubState=running\nResult=success\nLoadState=loaded\n")
    log = FABRIC / "fabricmanager" / "nvtrust-128-h20-journal-fm-started-then-stopped.log"
    rc, v, _ = judge(capsys, str(service), str(log))
    got = {r["subject"]: r["status"] for r in v["results"] if r["check"] == "fabric.nvswitch"}
    assert got == {"fabric manager service": "pass", "fabric manager log": "fail"} and rc == 1


# -- the network kinds (gpucheck.platform.net.captures), wired into the table ------------------------
NET = FIX / "net"


@pytest.mark.parametrize("path,kind_name,rc_expected", [
    (NET / "ibstat" / "gpud-h100-ib-some-down.txt", "ibstat", 0),  # frontend Ethernet ports down: not rails
    (NET / "ibstat" / "gpud-h100-roce-some-down.txt", "ibstat", 1),  # 2 of 8 rails down
    (NET / "ibstatus" / "nccl-1935-ib-rails-down-disabled-tabs.txt", "ibstatus", 1),
    (NET / "ibv_devinfo" / "deepep-60-cx7-port-down-partial.txt", "ibv_devinfo", 1),
    (NET / "rdma_link" / "3fs-283-cx6dx-roce-healthy.txt", "rdma link", 0),
    (NET / "sysfs" / "gcm-learn_stuck_ib_intf.json", "sysfs json", 1),
])
def test_each_network_kind_is_detected_and_judged_through_the_table(capsys, path, kind_name, rc_expected):
    assert C.detect_kind(path).name == kind_name
    rc, v, _ = judge(capsys, str(path))
    assert rc == rc_expected
    assert {r["check"] for r in v["results"] if r["status"] == "fail"} <= {"net.ports"}


def test_an_ibstat_cut_before_its_ports_is_never_no_rdma_hardware(capsys, tmp_path):
    cut = tmp_path / "ibstat.txt"
    cut.write_text("CA 'mlx5_0'\n\tCA type: MT4129\n")
    rc, v, _ = judge(capsys, str(cut))
    (r,) = [r for r in v["results"] if r["check"] == "net.ports"]
    assert rc == 3 and r["status"] == "error" and "mlx5_0" in r["summary"] and "no port" in r["summary"]
