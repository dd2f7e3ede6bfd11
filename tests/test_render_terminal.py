"""What an operator sees on a terminal (issue 17): the check x GPU grid, folded causes, the node
line, -v's full table, the sweep grid and its large-fleet summary, the nccl-tests table,
`telemetry show`, and the rule that no rich call ever reads markup or emoji codes in data."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import sys
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.core.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
sys.path.insert(0, str(ROOT / "tests"))

import report_inputs  # noqa: E402

# Any emoji rich could have made of ":ab:", ":smile:", ":thumbs_up:" (and any other pictograph).
EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF]")
HOSTILE = "[bold red]x[/bold red] :smile: :ab: :thumbs_up: [link=http://e.vil]y[/link] \\[z]"


def verdict_of(snapshot: str, *extra: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["run", "--json", "--no-history", "--snapshot", str(SNAPS / snapshot), *extra])
    return json.loads(out.getvalue())


def rendered(verdict: dict, columns: int, monkeypatch, *, verbose: bool = False) -> list[str]:
    """gpucheck.render.terminal.print_verdict (the entry point kept from before the grid) at a width,
    of the verdict document `verdict` (read with Verdict.from_json)."""
    from gpucheck.render.terminal import print_verdict

    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    buf = io.StringIO()
    print_verdict(Verdict.from_json(verdict), file=buf, **({"verbose": True} if verbose else {}))
    return buf.getvalue().splitlines()


def with_path(verdict: dict, path: str) -> dict:
    v = copy.deepcopy(verdict)
    v["source"]["path"] = path
    v["duration_s"] = 0.2
    return v


def test_healthy_8_gpu_node_fits_26_lines_at_80_columns(monkeypatch):
    """The issue's node: 174 lines at 80 columns before, one row per check now (15 lines until
    issue 24 added five level-1 checks (pcie.aer, fabric.nvswitch, net.ports, net.flaps,
    gdr.peermem), which skip on this recording, made before they existed, each naming what to add),
    and the marks' legend (issue 26)."""
    v = with_path(verdict_of("h100-healthy.json"), "tests/fixtures/snapshots/h100-healthy.json")
    lines = rendered(v, 80, monkeypatch)
    assert len(lines) <= 26, "\n".join(lines)
    assert all(len(ln) <= 80 for ln in lines)
    assert lines == [
        "gpu-h100-017  8 x NVIDIA H100 80GB HBM3  driver 550.90.07",
        "check           node gpu0 gpu1 gpu2 gpu3 gpu4 gpu5 gpu6 gpu7",
        "clocks          .    ok   ok   ok   ok   ok   ok   ok   ok",
        "ecc             .    ok   ok   ok   ok   ok   ok   ok   ok",
        "fabric.nvswitch skip .    .    .    .    .    .    .    .",
        "gdr.peermem     skip .    .    .    .    .    .    .    .",
        "inventory       ok   ok   ok   ok   ok   ok   ok   ok   ok",
        "memory-remap    .    ok   ok   ok   ok   ok   ok   ok   ok",
        "net.flaps       skip .    .    .    .    .    .    .    .",
        "net.ports       skip .    .    .    .    .    .    .    .",
        "nvlink          .    ok   ok   ok   ok   ok   ok   ok   ok",
        "pcie            .    ok   ok   ok   ok   ok   ok   ok   ok",
        "pcie.aer        skip .    .    .    .    .    .    .    .",
        "recovery-action .    ok   ok   ok   ok   ok   ok   ok   ok",
        "repro.bitwise   skip .    .    .    .    .    .    .    .",
        "xid             skip .    .    .    .    .    .    .    .",
        "marks: skip does not apply here (why below); . no result here",
        "skipped: fabric.nvswitch,pcie.aer (not in this capture (record with gpucheck",
        "  telemetry dump)); gdr.peermem (kernel modules not in this capture (add",
        "  /proc/modules)); net.flaps (kernel log not in this capture (add dmesg));",
        "  net.ports (RDMA ports not in this capture (add ibstat or",
        "  /sys/class/infiniband)); repro.bitwise (judging a recorded snapshot",
        "  (--snapshot): compute checks need this node's live GPUs); xid (snapshot has no",
        "  kernel log)",
        "gpu-h100-017: PASS (level 1 quick, 0.2 s; 57 pass, 7 skip)  exit code 0",
        "  from snapshot tests/fixtures/snapshots/h100-healthy.json (synthetic)",
    ]


def test_lost_gpu_grid_pinned_at_80_and_160_columns(monkeypatch):
    """Seven identical FAIL rows before; one column of FAIL and one cause line naming the checks now."""
    v = with_path(verdict_of("h100-gpu-lost.json", "--skip", "pcie.aer", "--skip", "fabric.nvswitch"), "lost.json")
    grid = [
        "check           node gpu0 gpu1 gpu2 gpu3 gpu4 gpu5 gpu6 gpu7",
        "clocks          .    ok   ok   ok   ok   ok   FAIL ok   ok",
        "ecc             .    ok   ok   ok   ok   ok   FAIL ok   ok",
        "gdr.peermem     skip .    .    .    .    .    .    .    .",
        "inventory       ok   ok   ok   ok   ok   ok   FAIL ok   ok",
        "memory-remap    .    ok   ok   ok   ok   ok   FAIL ok   ok",
        "net.flaps       skip .    .    .    .    .    .    .    .",
        "net.ports       skip .    .    .    .    .    .    .    .",
        "nvlink          .    ok   ok   ok   ok   ok   FAIL ok   ok",
        "pcie            .    ok   ok   ok   ok   ok   FAIL ok   ok",
        "recovery-action .    ok   ok   ok   ok   ok   FAIL ok   ok",
        "repro.bitwise   skip .    .    .    .    .    .    .    .",
        "xid             skip .    .    .    .    .    .    .    .",
        "marks: skip does not apply here (why below); . no result here",
    ]
    at80 = rendered(v, 80, monkeypatch)
    assert at80 == ["gpu-h100-017  7 x NVIDIA H100 80GB HBM3  1 x GPU (lost)  driver 550.90.07", *grid,
                    "FAIL  gpu5 clocks,ecc,inventory,memory-remap,nvlink,pcie,recovery-action: GPU 5:",
                    "      GPU is lost (fell off the bus or stopped answering; NVML GPU_IS_LOST)",
                    "      -> reboot",
                    "skipped: gdr.peermem (kernel modules not in this capture (add /proc/modules));",
                    "  net.flaps (kernel log not in this capture (add dmesg)); net.ports (RDMA ports",
                    "  not in this capture (add ibstat or /sys/class/infiniband)); repro.bitwise",
                    "  (judging a recorded snapshot (--snapshot): compute checks need this node's",
                    "  live GPUs); xid (snapshot has no kernel log)",
                    "gpu-h100-017: FAIL (level 1 quick, 0.2 s; 7 fail, 50 pass, 5 skip)",
                    "  action: reboot  exit code 1  from snapshot lost.json (synthetic)"]
    at160 = rendered(v, 160, monkeypatch)
    assert at160 == ["gpu-h100-017  7 x NVIDIA H100 80GB HBM3  1 x GPU (lost)  driver 550.90.07", *grid,
                     "FAIL  gpu5 clocks,ecc,inventory,memory-remap,nvlink,pcie,recovery-action: GPU 5: GPU is lost "
                     "(fell off the bus or stopped answering; NVML GPU_IS_LOST)",
                     "      -> reboot",
                     "skipped: gdr.peermem (kernel modules not in this capture (add /proc/modules)); net.flaps "
                     "(kernel log not in this capture (add dmesg)); net.ports (RDMA ports not",
                     "  in this capture (add ibstat or /sys/class/infiniband)); repro.bitwise (judging a recorded "
                     "snapshot (--snapshot): compute checks need this node's live GPUs);",
                     "  xid (snapshot has no kernel log)",
                     "gpu-h100-017: FAIL (level 1 quick, 0.2 s; 7 fail, 50 pass, 5 skip)  action: reboot  "
                     "exit code 1  from snapshot lost.json (synthetic)"]


def test_many_gpus_split_into_blocks_that_fit(monkeypatch):
    """16 GPU columns do not fit 80 columns: two blocks, each with the check column."""
    v = verdict_of("h100-healthy.json")
    extra = []
    for r in v["results"]:
        if r["gpu"] is not None:
            r2 = copy.deepcopy(r)
            r2["gpu"] += 8
            r2["subject"] = f"gpu{r2['gpu']}"
            extra.append(r2)
    v["results"] += extra
    lines = rendered(v, 80, monkeypatch)
    headers = [ln for ln in lines if ln.startswith("check ")]
    assert len(headers) == 2 and all(len(ln) <= 80 for ln in lines)
    assert "gpu0" in headers[0] and "gpu15" in headers[1] and "node" in headers[0] and "node" not in headers[1]
    assert len(rendered(v, 160, monkeypatch)) < len(lines)  # one block at 160


def test_unexamined_skip_and_error_are_marked_and_explained(monkeypatch):
    v = verdict_of("h100-healthy.json")
    r = next(r for r in v["results"] if r["check"] == "ecc" and r["gpu"] == 2)
    r.update(status="skip", unexamined=True, summary="GPU 2 is in use by PID 4711 (python): not loaded")
    r = next(r for r in v["results"] if r["check"] == "pcie" and r["gpu"] == 4)
    r.update(status="error", summary="could not read pcie.link_width (no_permission)")
    v.update(status="error", exit_code=3)  # what such results make the verdict
    text = "\n".join(rendered(v, 120, monkeypatch))
    row = next(ln for ln in text.splitlines() if ln.startswith("ecc "))
    assert row.split()[1:] == [".", "ok", "ok", "MISS", "ok", "ok", "ok", "ok", "ok"]
    assert "ERR" in next(ln for ln in text.splitlines() if ln.startswith("pcie "))
    lines = text.splitlines()
    # the legend says what each mark that is no plain word means; `skip` and `MISS` differ in meaning
    assert ("marks: ERR could not judge; MISS not examined (exit 3); skip does not apply here (why below)"
            "; . no result here") in lines
    err = next(i for i, ln in enumerate(lines) if ln.startswith("ERR "))
    skip = next(i for i, ln in enumerate(lines) if ln.startswith("MISS "))
    assert err < skip  # errors before unexamined skips
    assert "gpu2 ecc: GPU 2 is in use by PID 4711" in lines[skip]


def test_no_emoji_no_markup_in_the_grid_or_the_full_table(monkeypatch):
    """`0000:ab:00.0` printed as `0000🆎00.0` before; markup in data was read as markup."""
    v = verdict_of("h100-healthy.json")
    v["host"] = "n1" + HOSTILE
    for r in v["results"]:
        if r["check"] == "ecc" and r["gpu"] == 3:
            r.update(status="fail", action="reset-gpu", summary="GPU 3 (0000:ab:00.0) " + HOSTILE)
    v.update(status="fail", action="reset-gpu", exit_code=1)  # what such a result makes the verdict
    for verbose in (False, True):
        text = "\n".join(rendered(v, 400, monkeypatch, verbose=verbose))
        assert not EMOJI.search(text), text
        assert HOSTILE in text and "0000:ab:00.0" in text and "n1" + HOSTILE in text
    table = "\n".join(rendered(v, 400, monkeypatch, verbose=True))
    assert "0000:5d:00.0" in table and "0000:ab:00.0): modes ok" in table  # every bus id as it is


def test_verbose_flag_prints_the_full_table(capsys):
    rc = main(["run", "-v", "--no-history", "--snapshot", str(SNAPS / "h100-healthy.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "cause / summary" in out
    assert sum("no uncorrectable ECC errors" in ln for ln in out.splitlines()) == 8  # one row per result
    rc = main(["run", "--no-history", "--snapshot", str(SNAPS / "h100-healthy.json")])
    out = capsys.readouterr().out
    assert "cause / summary" not in out and "no uncorrectable ECC errors" not in out


def test_color_only_on_a_terminal(monkeypatch):
    from gpucheck.render.terminal import print_verdict

    v = Verdict.from_json(verdict_of("h100-ecc-dbe.json"))
    plain, colored = io.StringIO(), io.StringIO()
    print_verdict(v, plain, width=100)
    print_verdict(v, colored, width=100, color=True)
    assert "\x1b[" not in plain.getvalue() and "\x1b[" in colored.getvalue()
    assert re.sub(r"\x1b\[[0-9;]*m", "", colored.getvalue()) == plain.getvalue()


# -- sweep ----------------------------------------------------------------------------------------
def sweep_parts(n: int):
    """Outcomes and the report of a sweep of n nodes (gpucheck.fleet.sweep, NodeRuns fed in)."""
    report = json.loads(report_inputs.sweep_report(n))
    from gpucheck.fleet.sweep import NodeOutcome

    outcomes = [NodeOutcome(node=e["node"], status=e["status"], reason=e["reason"], action=e["action"],
                            failing=e["failing"], fleet=e["fleet"],
                            checks=tuple(e["checks"].items()))  # the node's grid row, the fleet's findings merged
                for e in report["nodes"]]
    return outcomes, report


def test_sweep_grid_for_a_few_nodes():
    from gpucheck.render.sweep_view import print_sweep

    outcomes, report = sweep_parts(6)
    outcomes[3].reason += " " + HOSTILE
    buf = io.StringIO()
    print_sweep(outcomes, report, False, buf, width=160, color=False)
    lines = buf.getvalue().splitlines()
    # 15 checks: lettered columns with their key (issue 24 added five level-1 checks)
    assert lines[0].split() == ["node", "status", *"ABCDEFGHIJKLMNO"]
    assert lines[7:9] == ["checks: A clocks  B ecc  C fabric.nvswitch  D gdr.peermem  E inventory  F memory-remap  "
                          "G net.flaps  H net.ports  I nvlink  J pcie  K pcie.aer",
                          "  L recovery-action  M repro.bitwise  N xid  O burn.gemm"]
    # fabric.nvswitch, gdr.peermem, net.*, pcie.aer: nothing of theirs in these verdicts
    ok = ["ok", "ok", "skip", "skip", "ok", "ok", "skip", "skip", "ok", "ok", "skip", "ok"]
    assert lines[1].split() == ["gpu0001", "PASS", *ok, "skip", "skip", "ok"]
    assert lines[3].split() == ["gpu0003", "FAIL", *ok, "skip", "skip", "FAIL"]  # a fleet outlier (was WARN)
    assert lines[4].split()[:4] == ["gpu0004", "FAIL", "ok", "FAIL"]  # the ECC node
    assert lines[6].split() == ["gpu0006", "UNREACHABLE", *["."] * 15]
    assert lines[9] == "marks: skip does not apply here (why below); . no result here"  # issue 26: a legend
    text = buf.getvalue()
    assert "FAIL        gpu0004 ecc[gpu3]: ecc gpu3: uncorrectable" in text and "-> reset-gpu" in text
    assert "FAIL        gpu0003 burn.gemm[gpu3]: fleet: slow burn.gemm.tflops_bf16 gpu3: 600 TFLOP/s" in text
    assert "UNREACHABLE gpu0006: ssh: connect to host gpu0006 port 22: Connection refused  -> investigate" in text
    assert HOSTILE in text and not EMOJI.search(text)
    assert "\nbad nodes: gpu[0003-0004,0006]\n" in text and "\n  fail: gpu[0003-0004]\n" in text
    narrow = io.StringIO()
    print_sweep(outcomes, report, False, narrow, width=80, color=False)
    head = narrow.getvalue().splitlines()
    # 15 lettered columns do not fit 80 columns beside node and status: two blocks of columns
    assert head[0].split() == ["node", "status", *"ABCDEFGHIJKL"] and all(len(x) <= 80 for x in head[:18])
    assert head[7].split() == ["node", "status", "M", "N", "O"] and head[8].split() == ["gpu0001", "PASS", "skip",
                                                                                     "skip", "ok"]
    assert head[14:18] == ["checks: A clocks  B ecc  C fabric.nvswitch  D gdr.peermem  E inventory",
                           "  F memory-remap  G net.flaps  H net.ports  I nvlink  J pcie  K pcie.aer",
                           "  L recovery-action  M repro.bitwise  N xid  O burn.gemm",
                           "marks: skip does not apply here (why below); . no result here"]


@pytest.mark.slow
def test_sweep_of_many_nodes_prints_worst_causes_not_rows():
    from gpucheck.render.sweep_view import GRID_MAX_NODES, print_sweep

    outcomes, report = sweep_parts(GRID_MAX_NODES + 36)
    for o in outcomes[10:14]:  # four more unreachable nodes: one cause, their names folded
        o.status, o.reason, o.checks = "unreachable", f"ssh: connect to host {o.node} port 22: Connection refused", ()
    buf = io.StringIO()
    print_sweep(outcomes, report, False, buf, width=100, color=False)
    lines = buf.getvalue().splitlines()
    assert len(lines) < 20 and not any(ln.startswith("gpu0001") for ln in lines)
    assert lines[0] == "worst causes:"
    unreach = next(ln for ln in lines if "UNREACHABLE" in ln)
    assert "5 node(s) gpu[0011-0014,0100]: ssh: connect to host <node> port 22: Connection refused" in unreach
    assert any(ln.startswith(f"{len(outcomes)} node(s) in ") for ln in lines)
    assert any(ln.startswith("bad nodes: ") for ln in lines)


# -- nccl-tests table -----------------------------------------------------------------------------
RESULT_ROWS = [
    {"op": "all_reduce", "bytes": 1 << 20, "count": 1 << 18, "time_s": 48.21e-6, "algbw_gbs": 21.75,
     "busbw_gbs": 38.06, "errors": []},
    {"op": "all_reduce", "bytes": 1 << 16, "count": 1 << 14, "time_s": 9.5e-6, "algbw_gbs": 6.9, "busbw_gbs": 12.07,
     "errors": [{"rank": 3, "nbad": 2}]},
]


def text_of(lines) -> str:
    from gpucheck.render.console import make_console

    buf = io.StringIO()
    con = make_console(buf, width=120, color=False)
    for ln in lines:
        con.print(ln)
    return buf.getvalue()


def test_nccl_tests_table_from_a_run():
    from gpucheck.render.nccl_table import run_tables

    text = text_of(run_tables({"results": RESULT_ROWS, "world": 8, "backend": "nccl", "status": "fail",
                               "summary": "data corruption in all_reduce on rank 3"}))
    lines = text.splitlines()
    assert lines[0] == "# all_reduce: 8 ranks, nccl"
    assert lines[1].split() == ["#", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    assert lines[3].split() == ["65536", "16384", "float", "sum", "9.50", "6.90", "12.07", "2"]
    assert lines[4].split() == ["1048576", "262144", "float", "sum", "48.21", "21.75", "38.06", "0"]
    assert lines[5] == "# Avg bus bandwidth    : 25.07 GB/s"
    assert lines[6] == "FAIL: data corruption in all_reduce on rank 3"


def test_nccl_intra_table_in_the_run_view(monkeypatch):
    v = verdict_of("h100-healthy.json")
    v["results"].append({"check": "nccl.intra", "subject": "node/all_reduce", "gpu": None, "status": "pass",
                         "summary": "all_reduce 38.06 GB/s busbw", "action": "none", "thresholds": [], "evidence": [],
                         "injected": [], "duration_s": 1.0,
                         "metrics": {"ranks": {"value": 8, "unit": ""}, "backend": {"value": "nccl", "unit": ""},
                                     "sweep": {"value": [{k: r[k] for k in ("bytes", "time_s", "algbw_gbs",
                                                                            "busbw_gbs")} | {"wrong": 0}
                                                         for r in RESULT_ROWS], "unit": ""}}})
    text = "\n".join(rendered(v, 100, monkeypatch))
    assert "# all_reduce: nccl.intra, 8 ranks, nccl" in text and "# Avg bus bandwidth    : 25.07 GB/s" in text


def test_nccl_intra_sweep_counts_wrong_elements():
    """nccl.intra's sweep rows carry nccl-tests' #wrong (the ranks' bad elements at that size)."""
    from gpucheck.nccl.intra import judge

    outcome = {"status": "ok", "world": 2, "backend": "gloo",
               "results": [{**RESULT_ROWS[1], "ranks": 2, "rank_time_s": [1e-5, 1e-5], "rank_min_s": [1e-5, 1e-5]}]}
    params = {"fail_fraction": 0.5, "warn_fraction": 0.8, "baseline_warn_fraction": 0.8, "rank_spread_warn": 0.5}
    r = judge(outcome, ops=["all_reduce"], params=params, devices=[0, 1], gpu_name=None)[0]
    assert r.metrics["sweep"][0]["wrong"] == 2


# -- telemetry show -------------------------------------------------------------------------------
def test_telemetry_show_a_snapshot(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    rc = main(["telemetry", "show", str(SNAPS / "h100-gpu-lost.json")])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith("gpu-h100-017  driver 550.90.07  CUDA 12.4  NVML ok  8 GPU(s)")
    assert lines[1].split()[:4] == ["gpu", "bus", "id", "state"]
    assert lines[2].split() == ["0", "0000:18:00.0", "ok", "NVIDIA", "H100", "80GB", "HBM3", "31", "C", "118/700",
                                "1980/1980", "Gen5", "x16", "18/18", "0/0", "0/0", "0/0"]
    assert lines[7].split()[:3] == ["5", "-", "lost"]
    assert "on the PCI bus, not in NVML: 0000:ab:00.0" in out and "gpu5: lost: GPU is lost" in out
    assert not EMOJI.search(out)
    rc = main(["telemetry", "show", str(SNAPS / "h100-hw-slowdown.json")])
    assert rc == 0 and "gpu7: clock events: hw_slowdown, hw_thermal_slowdown" in capsys.readouterr().out


def test_telemetry_show_hostile_values_and_bad_files(capsys, tmp_path):
    snap = json.loads((SNAPS / "h100-healthy.json").read_text())
    snap["host"] = "h" + HOSTILE
    snap["gpus"][0]["errors"] = {"clocks.sm_mhz": "no_permission"}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(snap))
    rc = main(["telemetry", "show", str(f)])
    out = capsys.readouterr().out
    assert rc == 0 and ("h" + HOSTILE) in out and not EMOJI.search(out)
    assert "gpu0: not read: clocks.sm_mhz (no_permission)" in out
    (tmp_path / "bad.json").write_text("{}")
    assert main(["telemetry", "show", str(tmp_path / "bad.json")]) == 2
    assert main(["telemetry", "show", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "gpucheck telemetry show: error: " in err


# -- every rich call site -------------------------------------------------------------------------
def test_no_module_makes_its_own_rich_console():
    """Every console comes from gpucheck.render.console.make_console (no markup, no emoji)."""
    offenders = []
    for path in (ROOT / "gpucheck").rglob("*.py"):
        text = path.read_text()
        if path.name == "console.py" and path.parent.name == "render":
            continue
        if re.search(r"\bConsole\(|from rich.markup import|Text\.from_markup|markup=True", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_pairs_hang_list_and_live_displays_print_data_as_it_is(capsys, monkeypatch):
    from gpucheck.cli.nccl import print_pairs
    from gpucheck.hang.render import _groups_table
    from gpucheck.render.live import LiveStatus
    from gpucheck.render.burn_display import BurnDisplay

    monkeypatch.setenv("COLUMNS", "400")  # no folding: each hostile string on one line
    doc = report_inputs.pairs_document()
    doc["pairs"][0].update(verdict="fail", summary="corrupt " + HOSTILE)
    doc["node_scores"][0].update(verdict="bad", evidence=["round 1 " + HOSTILE])
    print_pairs(doc)
    _groups_table({"dominant_group": 0, "groups": [
        {"id": 0, "dominant": True, "size": 2, "ranks": [0, 1], "nodes": "n[1-2]", "main_frames": ["f (a.py:12)"],
         "distinct_frames": [], "collective_frames": [], "splits_from": None},
        {"id": 1, "dominant": False, "size": 1, "ranks": [2], "nodes": "n3", "main_frames": [HOSTILE],
         "distinct_frames": ["wait :ab: (x.py:9) " + HOSTILE], "collective_frames": [], "splits_from": "main"}]})
    out = capsys.readouterr().out
    assert out.count(HOSTILE) >= 2 and not EMOJI.search(out) and "dominant" in out
    buf = io.StringIO()
    d = BurnDisplay(file=buf)

    class _Check:
        id = "burn.gemm"

    d.started(_Check())
    d.progress("burn.gemm", "gpu1", {"dtype": ":ab: [red]x", "tflops_median": 712.4, "errors": 2})
    d.close()
    assert ":ab: [red]x" in buf.getvalue() and not EMOJI.search(buf.getvalue())
    live = LiveStatus()
    live.console.file = io.StringIO()

    class _Run:
        class status:  # noqa: N801
            value = "fail"
        check_id = ":ab: [b]"
        duration_s = 1.0

    live.finished(_Run())
    assert ":ab: [b]" in live.console.file.getvalue() and not EMOJI.search(live.console.file.getvalue())


def test_control_characters_in_data_are_shown_never_sent_to_the_terminal():
    """Data holding ESC (a node's stderr, a summary naming a process) must not drive the operator's
    terminal; rich's own colour codes still do. Each control character is shown as one visible
    character, so the styled spans of a Text stay in place."""
    import io

    from rich.table import Table
    from rich.text import Text

    from gpucheck.render.console import make_console, plain

    hostile = "x\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2Jy\x9b31m"
    assert plain(hostile) == "x␛]52;c;cm0gLXJmIH4K␇␛[2Jy\ufffd31m" and len(plain(hostile)) == len(hostile)
    buf = io.StringIO()
    con = make_console(buf, width=200, color=True)
    t = Text("FAIL ", style="bold red")
    t.append(hostile)
    table = Table()
    table.add_column("cause")
    table.add_row(hostile)
    con.print(t)
    con.print(hostile)
    con.print(table)
    out = buf.getvalue()
    assert "\x1b]52" not in out and "\x1b[2J" not in out and "\x07" not in out and "\x9b" not in out
    assert "\x1b[1;31m" in out or "\x1b[31;1m" in out  # the console's own style still reaches the terminal
    assert out.count("␛]52;c;cm0gLXJmIH4K") == 3
