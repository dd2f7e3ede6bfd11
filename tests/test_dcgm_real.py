"""Real `dcgmi diag -j` documents (tests/fixtures/dcgm/real, provenance in each .source), judged
through the same code as dcgmi's live output: the eud.dcgm check runs a stand-in `dcgmi` (a
shell script on PATH) that prints the real document, so the subprocess path, the parser and the
mapping to results are all exercised; plus the parser's view of each document."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.tests_suite.eud_dcgm import DcgmOptions, dcgm_check
from gpucheck.eud.dcgm_parse import map_results, parse_diag
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks

REAL = Path(__file__).parent / "fixtures" / "dcgm" / "real"

STAND_IN = """#!/bin/sh
# stand-in dcgmi: prints a real dcgmi diag -j document (tests/test_dcgm_real.py)
echo "$*" >> "$REAL_DCGMI_LOG"
case "$1" in
discovery) echo "GPUs found."; exit 0 ;;
diag) cat "$REAL_DCGMI_DOC"; exit 0 ;;
esac
exit 2
"""

S, E, P = Status.SKIP, Status.ERROR, Status.PASS
DEPLOYMENT = ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS-related Blocks",
              "Persistence Mode", "Environmental Variables", "Page Retirement/Row Remap", "Graphics Processes",
              "Inforom"]

# file -> (DCGM level asked, GPUs, DCGM version, driver, {subject: (status, action)})
CASES: dict[str, tuple[int, int, str, str | None, dict[str, tuple[Status, Action]]]] = {
    "dcgm-3.1.0-r1-8gpu-nvidia-dcgm-test.json": (
        1, 8, "3.1.0", None,
        {**{f"node/{t}": (P, Action.NONE) for t in DEPLOYMENT},
         **{f"gpu{g}/software": (P, Action.NONE) for g in range(8)}}),
    "dcgm-4.2.3-gb10-level1-persistence-off.json": (
        1, 1, "4.2.3", "580.82.09", {"gpu0/software": (E, Action.INVESTIGATE)}),
    "dcgm-4.2.3-gb10-level2-partial-skip.json": (
        2, 1, "4.2.3", "580.82.09",
        {"gpu0/software": (E, Action.INVESTIGATE), "gpu0/memory": (S, Action.NONE), "gpu0/pcie": (S, Action.NONE)}),
}


def test_every_real_document_is_tested_and_has_a_source():
    docs = {p.name for p in REAL.iterdir() if p.suffix == ".json"}
    assert docs == set(CASES)
    assert all((REAL / (n + ".source")).is_file() for n in docs)
    versions = {c[2].split(".")[0] for c in CASES.values()}
    assert versions == {"3", "4"}  # issue 15: DCGM 3.x and 4.x


@pytest.fixture
def dcgmi(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "dcgmi"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    log = tmp_path / "dcgmi.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("REAL_DCGMI_LOG", str(log))

    def use(name: str) -> Path:
        monkeypatch.setenv("REAL_DCGMI_DOC", str(REAL / name))
        return log

    return use


def _idle_telemetry(snapshot):
    """A fake telemetry source whose GPUs run no process (the load guard lets DCGM start)."""
    from gpucheck.platform.telemetry.fake import FakeTelemetry
    from gpucheck.platform.telemetry.nvml import GpuProcesses

    return FakeTelemetry(snapshot, processes=lambda gpus, *a, **k: {g: GpuProcesses(g, ()) for g in gpus})


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_dcgmi_document(name, dcgmi):
    level, n_gpus, version, driver, expected = CASES[name]
    log = dcgmi(name)
    snapshot = {"gpus": [{"index": i} for i in range(n_gpus)]}
    ctx = Context(level=Level.EXTENDED, config=Config(checks={"eud.dcgm": {}}), snapshot=snapshot,
                  check_options=[DcgmOptions(diag_level=level)], telemetry=_idle_telemetry(snapshot))
    results = run_checks([dcgm_check], ctx, install_signal_handlers=False).results
    assert log.read_text().splitlines()[-1] == f"diag -r {level} -j"
    got = {r.subject: (r.status, r.action) for r in results}
    assert got == expected
    assert all(any(e.startswith(f"DCGM {version} (") for e in r.evidence) for r in results)
    if driver:
        assert all(any(f"driver {driver}" in e for e in r.evidence) for r in results)
    # never a pass for what DCGM did not run, never a drain for a node setting
    assert not any(r.status == P for r in results if "skipped by DCGM" in r.summary)
    assert not any(r.action in (Action.DRAIN, Action.RMA) for r in results)


def test_the_warning_line_and_nulls_of_dcgm_3_1_are_not_errors():
    text = (REAL / "dcgm-3.1.0-r1-8gpu-nvidia-dcgm-test.json").read_text()
    assert text.lstrip().startswith("WARNING: THIS SHOULD NOT HAPPEN") and text.count("null,") == 8
    doc = parse_diag(text)
    assert doc.version == "3.1.0" and len(doc.tests) == 17
    assert {(t.status, t.status_text) for t in doc.tests} == {("pass", "PASS")}


def test_gb10_persistence_finding_is_config_not_hardware():
    doc = parse_diag((REAL / "dcgm-4.2.3-gb10-level1-persistence-off.json").read_text())
    assert doc.format == "4.x" and doc.driver == "580.82.09"
    (t,) = doc.tests
    (w,) = t.warnings
    assert (w.error_id, w.category_name, w.severity_name) == (29, "software_other", "config")
    (r,) = map_results(doc)
    assert r.status == E and "not a hardware verdict" in r.summary and "Persistence mode for GPU 0" in r.summary


def test_the_real_documents_are_labelled_by_the_version_dcgm_states_and_sentinels_are_no_serials():
    """DCGM 3.1.0's real output still writes 2.x-shaped "gpu_ids" results: the parser labelled
    it "2.x JSON" (the label reaches the evidence); and DCGM writes "<<<NOT_SUPPORTED>>>" where a
    serial is unknown, which the parser kept as GPU 0's serial."""
    for name in sorted(p.name for p in REAL.glob("*.json")):
        doc = parse_diag((REAL / name).read_text())
        if doc.version:
            assert doc.format == f"{doc.version.split('.')[0]}.x", (name, doc.format, doc.version)
        assert not any(s.startswith("<<<") for s in doc.serials.values()), (name, doc.serials)
