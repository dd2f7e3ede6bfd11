"""The `dcgmi diag -j` parser and the mapping to gpucheck results, on every fixture in
tests/fixtures/dcgm (documents WRITTEN BY HAND from DCGM's documented output format, not captured;
see tests/fixtures/dcgm/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.eud.dcgm_parse import DcgmParseError, map_results, parse_diag
from gpucheck.core.result import Action, Status

FIX = Path(__file__).resolve().parent / "fixtures" / "dcgm"


def load(name):
    return (FIX / name).read_text()


def by_subject(results):
    out = {}
    for r in results:
        assert r.subject not in out, f"duplicate subject {r.subject}"
        out[r.subject] = r
    return out


def test_every_fixture_is_labelled_as_hand_written():
    for f in FIX.glob("*.json"):
        text = f.read_text()
        if f.name.startswith("malformed"):
            continue
        doc = json.loads(text[text.find("{"):])
        assert doc["_fixture"].startswith("written by hand") and "not captured" in doc["_fixture"], f.name


def test_v3_all_pass():
    doc = parse_diag(load("v3_r3_all_pass.json"))
    assert doc.format == "3.x" and doc.version == "3.3.5" and doc.driver == "550.90.07"
    assert doc.serials == {0: "1650123000001", 1: "1650123000002"}
    assert len(doc.tests) == 9 + 6 * 2
    res = by_subject(map_results(doc))
    assert all(r.status == Status.PASS and r.action == Action.NONE for r in res.values())
    assert res["node/Persistence Mode"].gpu is None
    assert res["gpu1/GPU Memory"].gpu == 1 and res["gpu1/GPU Memory"].summary == "DCGM GPU Memory (Hardware): pass"
    tp = res["gpu0/Targeted Power"]
    assert tp.summary == "DCGM Targeted Power (Stress): pass; GPU 0 max power 698.4 W"
    assert "DCGM info: GPU 0 max power 698.4 W" in tp.evidence
    assert tp.metrics["dcgm_status"] == "Pass"
    assert [(t.metric, t.op, t.limit, t.status) for t in tp.thresholds] == [
        ("dcgm_status", "==", "Fail", Status.FAIL), ("dcgm_status", "==", "Warn", Status.WARN)]


def test_v3_memory_failure_on_one_gpu():
    res = by_subject(map_results(parse_diag(load("v3_r3_memory_fail_gpu1.json"))))
    bad = res["gpu1/GPU Memory"]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN and bad.gpu == 1
    assert bad.summary == ("DCGM GPU Memory (Hardware): fail: Found 4 faulty memory elements on GPU 1 "
                           "[DCGM category hardware_memory, severity isolate]")
    assert bad.evidence[0] == ("DCGM: Found 4 faulty memory elements on GPU 1 [DCGM_FR_FAULTY_MEMORY (52), "
                               "category hardware_memory, severity isolate]")
    assert bad.metrics["dcgm_error_id"] == 52 and bad.metrics["dcgm_errors"] == 1
    assert res["gpu0/GPU Memory"].status == Status.PASS
    assert [s for s, r in res.items() if r.status != Status.PASS] == ["gpu1/GPU Memory"]


def test_v3_skips_software_setup_and_warnings():
    doc = parse_diag(load("v3_r2_skips_and_warnings.json"))
    res = by_subject(map_results(doc))
    # persistence mode off: a software_config error, but DCGM's severity isolate makes it a fail
    pm = res["node/Persistence Mode"]
    assert pm.status == Status.FAIL and pm.action == Action.DRAIN
    assert "Persistence mode for GPU 0 is disabled." in pm.summary  # DCGM 3.x's "warnings" key in deployment
    assert res["gpu1/PCIe"].status == Status.FAIL and res["gpu1/PCIe"].action == Action.DRAIN
    assert "DCGM_FR_PCIE_H_REPLAY_VIOLATION" in res["gpu1/PCIe"].evidence[0]
    assert res["gpu0/PCIe"].status == Status.PASS
    for g in (0, 1):
        d = res[f"gpu{g}/Diagnostic"]
        assert d.status == Status.SKIP
        assert d.summary == "DCGM Diagnostic (Hardware): skipped by DCGM: The Diagnostic test is skipped for this GPU."
        mb = res[f"gpu{g}/Memory Bandwidth"]
        assert mb.status == Status.SKIP and mb.summary.endswith("Memory bandwidth test is not supported on this SKU")
    # A DCGM warning is printed as "Fail"; its category says the test could not run as configured.
    tp = res["gpu0/Targeted Power"]
    assert tp.status == Status.ERROR and tp.action == Action.INVESTIGATE
    assert "could not run properly (not a hardware verdict)" in tp.summary
    assert "Enforced power limit on GPU 0 set to 500.0" in tp.summary
    assert res["gpu1/Targeted Power"].status == Status.PASS


def test_v4_entities_summaries_and_error_specific_actions():
    doc = parse_diag(load("v4_r3_mixed.json"))
    assert doc.format == "4.x" and doc.version == "4.2.3" and doc.driver == "570.124.06"
    assert doc.serials == {0: "1650123000001", 1: "1650123000002"}
    res = by_subject(map_results(doc))
    remap = res["gpu1/software"]
    assert remap.status == Status.FAIL and remap.action == Action.RESET_GPU  # a pending remap is applied by a reset
    assert remap.summary.endswith("row remappings are pending [DCGM_FR_PENDING_ROW_REMAP]")
    assert res["gpu0/software"].status == Status.PASS
    assert res["gpu0/memory"].status == Status.PASS and "DCGM info: Allocated 79.1 GB" in res["gpu0/memory"].evidence
    assert res["gpu0/pulse_test"].status == Status.SKIP and res["gpu1/pulse_test"].status == Status.SKIP
    ts = res["gpu0/targeted_stress"]
    assert ts.status == Status.FAIL and ts.action == Action.INVESTIGATE  # severity monitor: can still work
    assert "Max stress level of 1510.3" in ts.summary
    # the test summary's global warning is its own node-level result: DCGM restored a GPU setting
    restored = res["node/targeted_stress"]
    assert restored.status == Status.WARN and restored.gpu is None
    assert "Had to restore GPU state" in restored.summary and "DCGM_FR_HAD_TO_RESTORE_STATE" in restored.summary
    # summaries that only repeat the entity results do not become results
    assert "node/memory" not in res and "node/targeted_power" not in res


def test_v2_string_warnings_without_error_ids():
    doc = parse_diag(load("v2_r2_memory_mismatch.json"))
    assert doc.format == "2.x" and doc.version is None
    res = by_subject(map_results(doc))
    gp = res["node/Graphics Processes"]
    assert gp.status == Status.ERROR and "[a deployment (software) test]" in gp.summary
    mm = res["gpu1/GPU Memory"]
    assert mm.status == Status.FAIL and mm.action == Action.DRAIN and "[a hardware test]" in mm.summary
    assert mm.evidence == ["DCGM: A memory mismatch was detected on GPU 1, but no error was reported by CUDA or NVML."]
    assert res["gpu0/GPU Memory"].status == Status.PASS


def test_runtime_error_document():
    doc = parse_diag(load("v4_runtime_error.json"))
    assert doc.runtime_error == "Error: Diagnostic could not be run while DCGM is paused." and doc.tests == []


def test_text_before_the_document_is_ignored():
    a = parse_diag(load("v3_prefixed_warning_line.json"))
    b = parse_diag(load("v3_r3_all_pass.json"))
    assert [(t.name, t.gpu, t.status) for t in a.tests] == [(t.name, t.gpu, t.status) for t in b.tests]


def test_gpu_ids_are_mapped_by_serial():
    doc = parse_diag(load("v3_r3_memory_fail_gpu1.json"))
    res = by_subject(map_results(doc, gpu_map={0: 1, 1: 0}))
    bad = res["gpu0/GPU Memory"]
    assert bad.gpu == 0 and bad.status == Status.FAIL
    assert "DCGM GPU 1 is gpucheck GPU 0 (matched by serial)" in bad.evidence


@pytest.mark.parametrize("text, reason", [
    ("", "dcgmi printed nothing"),
    ("Error: unable to establish a connection to the specified host: localhost", "no JSON object"),
    (load("malformed_truncated.json"), "does not parse"),
    ("[1, 2]", "no JSON object"),
    ('{"something": "else"}', "no 'DCGM Diagnostic' or 'DCGM GPU Diagnostic' key (keys: something)"),
    ('{"DCGM GPU Diagnostic": []}', "is a list, not an object"),
    ('{"DCGM GPU Diagnostic": {}}', "has no 'test_categories' and no 'runtime_error'"),
    ('{"DCGM GPU Diagnostic": {"test_categories": {}}}', "'test_categories' is a dict"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"results": []}]}]}}',
     "a test without a name"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "t", "results": {}}]}]}}',
     "'results' is not a list"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "t", "results": '
     '[{"gpu_id": "0"}]}]}]}}', "a result without a status"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "t", "results": '
     '[{"gpu_id": "0", "status": "Maybe"}]}]}]}}', "unknown DCGM status 'Maybe'"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "t", "results": '
     '[{"gpu_id": "zero", "status": "Pass"}]}]}]}}', "bad GPU id 'zero'"),
    ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "X", "tests": [{"name": "t", "results": '
     '[{"gpu_id": "0", "status": "Fail", "warnings": 5}]}]}]}}', "'warnings' is a int"),
    ('{"iterations": [], "Overall Result": "Pass"}', "an --iterations document"),
])
def test_malformed_or_partial_output_raises_with_the_reason(text, reason):
    with pytest.raises(DcgmParseError) as e:
        parse_diag(text)
    assert reason in str(e.value)


def test_nvvs_style_status_words_and_warn():
    text = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Stress", "tests": [
        {"name": "SM Stress", "results": [{"gpu_ids": "0,1", "status": "WARN", "warnings": ["clocks throttled"]},
                                          {"gpu_ids": "2", "status": "SKIPPED"}, {"gpu_ids": "3", "status": ""}]}]}]}})
    res = by_subject(map_results(parse_diag(text)))
    assert res["gpu0/SM Stress"].status == Status.WARN and res["gpu1/SM Stress"].status == Status.WARN
    assert res["gpu0/SM Stress"].summary == "DCGM SM Stress (Stress): warn: clocks throttled"
    assert res["gpu2/SM Stress"].status == Status.SKIP and "DCGM gave no reason" in res["gpu2/SM Stress"].summary
    # an empty status with nothing else: nothing examined, an error (it was a skip, and the node passed)
    assert res["gpu3/SM Stress"].status == Status.ERROR and "DCGM gave no status" in res["gpu3/SM Stress"].summary


@pytest.mark.parametrize("status", [None, "", "  "])
def test_a_result_without_a_status_is_judged_from_its_error_text_and_severity(status):
    """dcgmi's v3/v4 result shape (tests/fixtures/dcgm/real) with the status null or empty: DCGM
    still says "Found 4 faulty memory elements", severity isolate. It used to be a plain skip, so
    the run passed."""
    faulty = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 2, "status": status,
              "warnings": [{"warning": "Found 4 faulty memory elements on GPU 2", "error_category": 10,
                            "error_severity": 2}]}
    silent = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 3, "status": status}
    text = json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [faulty, silent]}]}]}})
    res = by_subject(map_results(parse_diag(text)))
    r = res["gpu2/memory"]
    assert r.status == Status.FAIL and r.action == Action.DRAIN
    assert "Found 4 faulty memory elements" in r.summary and "severity isolate" in r.summary
    assert "DCGM wrote no status (null or empty): judged from its error text and severity" in r.evidence
    r = res["gpu3/memory"]
    assert r.status == Status.ERROR and r.summary.startswith("DCGM memory (Hardware): DCGM gave no status")


def test_fail_reading_prefers_the_strongest_error():
    def doc(*warnings):
        return json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
            {"name": "memory", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
                                            "status": "Fail", "warnings": list(warnings)}]}]}]}})

    def w(eid, cat, sev, text="x"):
        return {"warning": text, "error_id": eid, "error_category": cat, "error_severity": sev}

    (r,) = map_results(parse_diag(doc(w(51, 6, 1), w(80, 10, 2))))  # CUDA API error + failed row remap
    assert r.status == Status.FAIL and r.action == Action.RMA and "[DCGM_FR_ROW_REMAP_FAILURE]" in r.summary
    (r,) = map_results(parse_diag(doc(w(51, 6, 1))))  # only the CUDA API error: could not judge
    assert r.status == Status.ERROR
    (r,) = map_results(parse_diag(doc(w(44, 16, 2))))  # internal error, but DCGM says isolate
    assert r.status == Status.FAIL and r.action == Action.DRAIN
    (r,) = map_results(parse_diag(doc(w(3, 13, 6))))  # severity reset
    assert r.status == Status.FAIL and r.action == Action.RESET_GPU
    (r,) = map_results(parse_diag(doc(w(200, 99, 3))))  # ids DCGM may add later
    assert r.status == Status.FAIL and r.action == Action.DRAIN
    assert r.evidence == ["DCGM: x [error id 200, category unknown (99), severity unknown]"]


def test_error_ids_follow_dcgm_errors_h():
    """dcgmError_t values (dcgmlib/dcgm_errors.h) at known anchors, up to the last id before
    DCGM_FR_ERROR_SENTINEL (112); a later id is named by number, never by a wrong name."""
    from gpucheck.eud.dcgm_parse import ERROR_NAMES, DcgmWarning

    anchors = {4: "VOLATILE_DBE_DETECTED", 29: "PERSISTENCE_MODE", 52: "FAULTY_MEMORY", 58: "MEMORY_MISMATCH",
               63: "TARGET_POWER", 77: "HAD_TO_RESTORE_STATE", 80: "ROW_REMAP_FAILURE", 85: "PENDING_ROW_REMAP",
               98: "PCIE_H_REPLAY_VIOLATION", 101: "XID_ERROR", 109: "SXID_ERROR",
               110: "GFLOPS_THRESHOLD_VIOLATION", 111: "NAN_VALUE"}
    assert {i: ERROR_NAMES[i] for i in anchors} == anchors and len(ERROR_NAMES) == 112
    assert DcgmWarning("x", 111).error_name == "DCGM_FR_NAN_VALUE (111)"
    assert DcgmWarning("x", 112).error_name == "error id 112"


def test_a_deployment_fail_without_any_error_is_not_a_finding():
    """dcgmi 3.x prints a deployment test it did not run as "Fail" with no error (Diag.cpp
    HelperJsonAddBasicTests): could not judge, not a drain. With an error it is a finding."""
    def doc(result):
        return json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
            {"name": "Inforom", "results": [result]}]}]}})

    (r,) = map_results(parse_diag(doc({"status": "Fail"})))
    assert r.status == Status.ERROR and r.action == Action.INVESTIGATE and "without any error" in r.summary
    (r,) = map_results(parse_diag(doc({"status": "Fail", "gpu_id": 0, "warnings": [
        {"warnings": "A corrupt InfoROM has been detected in GPU 0.", "error_id": 9, "error_category": 15,
         "error_severity": 2}]})))
    assert r.status == Status.FAIL and r.action == Action.DRAIN and "corrupt InfoROM" in r.summary
