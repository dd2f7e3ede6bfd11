"""gpucheck.platform.telemetry.nvsmi: nvidia-smi -q / -q -x captures -> snapshots, spelling by spelling.

The inputs here are real captures (tests/fixtures/nvsmi, each with its .source) or lines cut from
them and changed in one place, to show one spelling of another driver generation or one hostile
input; every changed line is written out in the test that uses it. The verdicts on the whole real
captures are in tests/test_nvsmi_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.platform.telemetry import nvsmi
from gpucheck.platform.telemetry.fields import GROUP_FIELDS, TOP_FIELDS
from gpucheck.platform.telemetry.nvml import NOT_IN_FORMAT
from gpucheck.platform.telemetry.nvsmi import NOT_IN_CAPTURE, TEXT, XML, CaptureError, convert, detect
from gpucheck.platform.telemetry.snapshot import SnapshotError, load_snapshot, validate_snapshot
from gpucheck.platform.telemetry.throttle import reason_names

FIX = Path(__file__).parent / "fixtures" / "nvsmi"
H100 = (FIX / "h100-x8-565-healthy.txt").read_text()
H200 = (FIX / "h200-550-healthy.txt").read_text()
A100_XML = (FIX / "a100-mig-535-telegraf-1of4.xml").read_text()


def gpu0(text: str) -> dict:
    return convert(text, "t")["gpus"][0]


def edit(base: str, old: str, new: str) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


# -- detection ---------------------------------------------------------------------------------------
def test_detects_text_xml_fragments_and_not_json_or_garbage():
    assert detect(H100) == TEXT and detect(A100_XML) == XML
    assert detect((FIX / "remap-pending-excerpt-gpud80.txt").read_text()) == TEXT  # four lines, no header
    assert detect('{"kind": "gpucheck.snapshot"}') is None
    assert detect("hello\nworld\n") is None and detect("") is None
    assert detect("$ nvidia-smi -q -x\n" + A100_XML) == XML  # a prompt line before the document


# -- the whole capture -------------------------------------------------------------------------------
def test_h100_capture_maps_every_field_like_the_live_reader():
    snap = convert(H100, "h100")
    validate_snapshot(snap)
    assert snap["synthetic"] is False and snap["driver_version"] == "565.57.01"
    assert snap["cuda_driver_version"] == "12.7" and snap["captured_at"] == "2024-11-14T07:00:14"
    assert len(snap["gpus"]) == 8 and [g["index"] for g in snap["gpus"]] == list(range(8))
    g = snap["gpus"][5]
    assert g["pci_bus_id"] == "0000:ab:00.0" and g["pci_device_id"] == "0x2330"
    assert g["uuid"] == "GPU-52378fbc-3124-3895-13b6-1dd179563e0f" and g["serial"] == "1654323021387"
    assert (g["architecture"], g["architecture_id"]) == ("hopper", 9)
    assert g["ecc_mode"] == {"current": True, "pending": True} and g["mig_mode"] == {"current": False, "pending": False}
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert g["retired_pages"] == {"single_bit": None, "double_bit": None, "pending": None}  # N/A: not supported
    assert g["ecc_errors"]["sram_threshold_exceeded"] is False and g["ecc_errors"]["volatile_uncorrected"] == 0
    assert g["pcie"] == {"link_gen": 5, "link_gen_max": 5, "link_gen_gpu_max": 5, "link_width": 16,
                         "link_width_max": 16, "replay_counter": 4}
    assert g["clocks"]["throttle_reasons"] == 0x1 and g["clocks"]["throttle_reason_names"] == ["gpu_idle"]
    assert g["power"] == {"usage_w": 85.27, "limit_w": 700.0}
    assert (g["recovery_action"], g["recovery_action_name"]) == (0, "none")
    # Only NVLink is missing: nvidia-smi -q prints no link state.
    assert g["errors"] == {"nvlink": NOT_IN_FORMAT} and g["state"] == "ok"
    assert set(TOP_FIELDS) <= set(g) and all(set(GROUP_FIELDS[k]) <= set(g[k]) for k in GROUP_FIELDS)
    json.dumps(snap)


def test_tlimit_form_gives_the_thresholds_from_the_margins():
    """R535+ prints thresholds as T.Limit margins: GPU 0 is at 30 C with 57 C of margin; slowdown
    engages at margin -2, shutdown at -8, max operating at 0."""
    t = gpu0(H100)["temperature"]
    assert t == {"gpu_c": 30.0, "slowdown_c": 89.0, "shutdown_c": 95.0, "gpu_max_c": 87.0}
    notes = gpu0(H100)["capture"]["notes"]
    assert any("slowdown_c = 89 C from the T.Limit form" in n for n in notes)


def test_absolute_thresholds_are_read_as_printed():
    t = gpu0(A100_XML)["temperature"]
    assert t == {"gpu_c": 27.0, "slowdown_c": 89.0, "shutdown_c": 92.0, "gpu_max_c": 85.0}


def test_xml_spellings_and_mig_not_supported_remapped_rows():
    g = gpu0(A100_XML)
    assert g["name"] == "NVIDIA A100-SXM4-80GB" and g["pci_device_id"] == "0x20b2"
    assert g["mig_mode"] == {"current": True, "pending": True} and g["persistence_mode"] is False
    # <remapped_rows>N/A</remapped_rows>: the whole group is not supported (MIG instances active)
    assert g["remapped_rows"] == {"correctable": None, "uncorrectable": None, "pending": None, "failure": None}
    assert not any(k.startswith("remapped_rows") for k in g["errors"])
    assert g["clocks"]["throttle_reasons"] == 0 and g["power"]["limit_w"] == 500.0
    # 535 prints no SRAM threshold flag and no recovery action: not in this capture, never "fine"
    # (the driver predates both lines: not carried by its format, judged a skip naming it)
    assert g["errors"]["ecc_errors.sram_threshold_exceeded"] == NOT_IN_FORMAT
    assert g["errors"]["recovery_action"] == NOT_IN_FORMAT


def test_older_xml_spellings_throttle_reasons_and_power_readings():
    g = gpu0((FIX / "a100-mig-510-netdata.xml").read_text())
    assert g["clocks"]["throttle_reasons"] == 0  # <clocks_throttle_reasons>, a value wrapped over two lines
    assert g["power"] == {"usage_w": 66.92, "limit_w": 400.0}  # <power_readings><enforced_power_limit>
    assert g["ecc_errors"]["volatile_uncorrected"] is None and g["ecc_errors"]["aggregate_uncorrected"] == 0
    assert g["errors"]["pcie.link_gen_gpu_max"] == NOT_IN_FORMAT  # 510 prints no device max


# -- spellings of one value ----------------------------------------------------------------------------
HW = "        HW Slowdown                       : Not Active\n"


@pytest.mark.parametrize("old,new,check", [
    # pre-R535 name of the section
    ("    Clocks Event Reasons\n", "    Clocks Throttle Reasons\n",
     lambda g: g["clocks"]["throttle_reasons"] == 1 and "clocks.throttle_reasons" not in g["errors"]),
    # an active HW slowdown
    (HW, "        HW Slowdown                       : Active\n",
     lambda g: g["clocks"]["throttle_reason_names"] == ["gpu_idle", "hw_slowdown"]),
    # the brackets of newer drivers
    ("        Current                           : Enabled\n        Pending                           : Enabled\n"
     "    ECC Errors", "        Current                           : [N/A]\n        Pending                           : [N/A]\n"
     "    ECC Errors", lambda g: g["ecc_mode"] == {"current": None, "pending": None} and "ecc_mode.current" not in g["errors"]),
    ("        Power Draw                        : 74.58 W\n",
     "        Power Draw                        : Requested functionality has been deprecated\n",
     lambda g: g["power"]["usage_w"] is None and "power.usage_w" not in g["errors"]),
    ("        Power Draw                        : 74.58 W\n", "        Power Draw                        : [Insufficient Permissions]\n",
     lambda g: g["errors"]["power.usage_w"] == "no_permission"),
    ("        Power Draw                        : 74.58 W\n", "        Power Draw                        : [Unknown Error]\n",
     lambda g: g["errors"]["power.usage_w"] == "other"),
    ("        Power Draw                        : 74.58 W\n", "        Power Draw                        : lots W\n",
     lambda g: g["errors"]["power.usage_w"] == "other" and any("lots W" in n for n in g["capture"]["notes"])),
    ("            DRAM Uncorrectable            : 0\n        Aggregate",
     "            DRAM Uncorrectable            : 3\n        Aggregate",
     lambda g: g["ecc_errors"]["volatile_uncorrected"] == 3 and g["ecc_errors"]["sram_volatile_uncorrected"] == 0),
    ("            SRAM Uncorrectable SEC-DED    : 0\n            DRAM Correctable              : 0\n            DRAM Uncorrectable            : 0\n        Aggregate",
     "            SRAM Uncorrectable SEC-DED    : 2\n            DRAM Correctable              : 0\n            DRAM Uncorrectable            : 0\n        Aggregate",
     lambda g: g["ecc_errors"]["sram_volatile_uncorrected"] == 2 and g["ecc_errors"]["volatile_uncorrected"] == 2),
    ("        Pending                           : No\n        Remapping Failure Occurred        : No\n",
     "        Pending                           : Yes\n        Remapping Failure Occurred        : No\n",
     lambda g: g["remapped_rows"]["pending"] is True),
    ("    Remapped Rows\n        Correctable Error                 : 0\n        Uncorrectable Error               : 0\n"
     "        Pending                           : No\n        Remapping Failure Occurred        : No\n",
     "    Remapped Rows                         : N/A\n",
     lambda g: g["remapped_rows"]["pending"] is None and not [k for k in g["errors"] if k.startswith("remapped")]),
])
def test_one_spelling(old, new, check):
    assert check(gpu0(edit(H200, old, new)))


def test_the_ecc_counters_of_r535_without_the_sram_split():
    """R535/R545 print "SRAM Uncorrectable" whole and no threshold flag (the della H100 form)."""
    text = edit(H200, "            SRAM Uncorrectable Parity     : 0\n            SRAM Uncorrectable SEC-DED    : 0\n",
                "            SRAM Uncorrectable            : 1\n")
    g = gpu0(text)
    assert g["ecc_errors"]["sram_volatile_uncorrected"] == 1 and g["ecc_errors"]["volatile_uncorrected"] == 1
    assert g["ecc_errors"]["sram_aggregate_uncorrected"] == 0  # the aggregate lines still split


def test_gpu_states_from_the_capture():
    lost = gpu0(edit(H200, "        GPU Current Temp                  : 28 C\n", "        GPU Current Temp                  : [GPU is lost]\n"))
    assert lost["state"] == "lost" and lost["error"]["kind"] == "gpu_lost" and "GPU is lost" in lost["error"]["message"]
    reset = gpu0(edit(H200, "        Reset Required                    : No\n", "        Reset Required                    : Yes\n"))
    assert reset["state"] == "reset_required" and "Reset Required: Yes" in reset["error"]["message"]
    drain = gpu0(edit(H200, "        Drain and Reset Recommended       : No\n", "        Drain and Reset Recommended       : Yes\n"))
    assert drain["state"] == "reset_required"


@pytest.mark.parametrize("word,value,name", [("None", 0, "none"), ("Reset", 1, "gpu_reset"),
                                             ("Reboot", 2, "node_reboot"), ("Drain and Reset", 4, "drain_and_reset")])
def test_recovery_action_words(word, value, name):
    g = gpu0(edit(H100, "    GPU Recovery Action                   : None\n", f"    GPU Recovery Action                   : {word}\n"))
    assert (g["recovery_action"], g["recovery_action_name"]) == (value, name)


def test_throttle_bits_agree_with_the_reason_names():
    for name, bit in nvsmi._THROTTLE_BITS.items():
        assert reason_names(bit) == [name]


# -- partial, quoted, wrapped, cut -------------------------------------------------------------------
def test_a_capture_of_fewer_gpus_than_attached_adds_gpus_not_in_the_capture():
    snap = convert(A100_XML, "telegraf")
    assert [g["index"] for g in snap["gpus"]] == [0, 1, 2, 3]
    missing = snap["gpus"][1]
    assert missing["errors"]["ecc_errors"] == NOT_IN_CAPTURE and missing["errors"]["nvlink"] == NOT_IN_CAPTURE
    assert missing["errors"]["uuid"] == NOT_IN_CAPTURE and missing["uuid"] is None
    assert any("holds 1 of the 4 attached GPUs" in w for w in snap["capture"]["warnings"])


def test_a_text_capture_cut_inside_a_gpu_section():
    start = H100.index("GPU 00000000:2A:00.0")
    end = H100.index("        Tx Throughput", start)  # the paste ends inside GPU 1's PCI section
    cut = H100[:end]
    snap = convert(cut, "cut")
    assert len(snap["gpus"]) == 8
    g1 = snap["gpus"][1]
    assert g1["uuid"] == "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd" and g1["pcie"]["link_width"] == 16
    assert g1["errors"]["temperature.gpu_c"] == NOT_IN_CAPTURE and g1["errors"]["remapped_rows.pending"] == NOT_IN_CAPTURE
    assert snap["gpus"][0]["errors"] == {"nvlink": NOT_IN_FORMAT}  # the whole first GPU is judged
    w = " | ".join(snap["capture"]["warnings"])
    assert "GPU 1 (0000:2a:00.0):" in w and "holds 2 of the 8 attached GPUs" in w


def test_a_quoted_and_fenced_capture_reads_the_same():
    quoted = "```\n" + "".join("> " + ln + "\n" for ln in H200.splitlines()) + "```\n"
    a, b = convert(H200, "a"), convert(quoted, "b")
    assert a["gpus"] == b["gpus"]
    assert any("quoted" in w for w in b["capture"]["warnings"])


def test_a_wrapped_line_is_reported_and_the_rest_still_reads():
    wrapped = edit(H100, "        Atomic Caps Outbound              : FETCHADD_32 FETCHADD_64 SWAP_32 SWAP_64 CAS_32 CAS_64 \n",
                   "        Atomic Caps Outbound              : FETCHADD_32 FETCHADD_64 SWAP_32\nSWAP_64 CAS_32 CAS_64\n")
    snap = convert(wrapped, "w")
    assert snap["gpus"][0] == convert(H100, "w")["gpus"][0]
    assert any("1 line(s) of the GPU sections could not be read" in w for w in snap["capture"]["warnings"])


def test_a_fragment_without_any_header_is_one_gpu_judged_on_what_it_holds():
    snap = convert((FIX / "remap-pending-excerpt-gpud80.txt").read_text(), "gpud80")
    g = snap["gpus"][0]
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 4, "pending": True, "failure": None}
    assert g["errors"]["remapped_rows.failure"] == NOT_IN_CAPTURE and g["errors"]["uuid"] == NOT_IN_CAPTURE
    assert snap["captured_at"] == "unknown" and snap["driver_version"] is None
    assert any("starts inside a GPU section" in w for w in snap["capture"]["warnings"])


def test_a_cut_xml_document_is_read_to_its_last_complete_gpu():
    cut = A100_XML[:A100_XML.index("</nvidia_smi_log>")]  # the closing tag lost
    snap = convert(cut, "cut.xml")
    assert snap["gpus"][0]["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert any("cut short" in w for w in snap["capture"]["warnings"])
    with pytest.raises(CaptureError, match="holds no complete <gpu>"):
        convert(A100_XML[:5000], "cut2.xml")


# -- hostile input --------------------------------------------------------------------------------------
def test_xml_entities_are_refused_never_expanded():
    bomb = ('<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>\n'
            '<nvidia_smi_log><gpu id="00000000:01:00.0"><product_name>&c;</product_name></gpu></nvidia_smi_log>')
    with pytest.raises(CaptureError, match="entities"):
        convert(bomb, "bomb.xml")
    ext = ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
           '<nvidia_smi_log><gpu id="00000000:01:00.0"><product_name>&e;</product_name></gpu></nvidia_smi_log>')
    with pytest.raises(CaptureError, match="entities"):
        convert(ext, "ext.xml")


def test_deeply_nested_xml_and_huge_values_never_crash():
    deep = "<nvidia_smi_log><gpu id=\"00000000:01:00.0\">" + "<a>" * 5000 + "x" + "</a>" * 5000 + "</gpu></nvidia_smi_log>"
    snap = convert(deep, "deep.xml")
    assert snap["gpus"][0]["errors"]["uuid"] == NOT_IN_CAPTURE
    huge = edit(H200, "    Product Name                          : NVIDIA H200\n",
                "    Product Name                          : " + "H" * 2_000_000 + "\n")
    assert len(gpu0(huge)["name"]) == 2_000_000


def test_a_file_that_is_neither_is_a_one_line_error(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("this is not a capture\n")
    with pytest.raises(SnapshotError, match="neither a gpucheck snapshot nor an nvidia-smi -q capture"):
        load_snapshot(f)
    g = tmp_path / "nogpu.txt"
    g.write_text("==============NVSMI LOG==============\n\nDriver Version : 550.90.12\nAttached GPUs : 0\n")
    with pytest.raises(SnapshotError, match="without any GPU section"):
        load_snapshot(g)


def test_load_snapshot_converts_a_capture_and_refuses_a_fifo(tmp_path):
    import os

    snap = load_snapshot(FIX / "h200-550-healthy.txt")
    assert snap["gpus"][0]["name"] == "NVIDIA H200" and snap["capture"]["format"] == TEXT
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SnapshotError, match="not a regular file"):
        load_snapshot(fifo)


# -- what the format does not carry (formatgaps) ------------------------------------------------------
def _h200_text() -> str:
    return (FIX / "h200-550-healthy.txt").read_text()


def test_a_line_the_driver_predates_is_not_in_format_a_cut_one_of_a_newer_driver_is_not_in_capture():
    g = convert(_h200_text())["gpus"][0]  # R550: no GPU Recovery Action line (printed from R565)
    assert g["errors"]["recovery_action"] == NOT_IN_FORMAT
    assert "driver 550.90.12 predates it" in g["capture"]["not_carried"]["recovery_action"]
    newer = convert(_h200_text().replace("Driver Version                            : 550.90.12",
                                         "Driver Version                            : 570.86.15"))["gpus"][0]
    assert newer["errors"]["recovery_action"] == NOT_IN_CAPTURE and "recovery_action" not in newer.get(
        "capture", {}).get("not_carried", {})
    unknown = convert("\n".join(line for line in _h200_text().splitlines() if "Driver Version" not in line))
    assert unknown["gpus"][0]["errors"]["recovery_action"] == NOT_IN_CAPTURE  # no version: never "predates"


def test_nvlink_is_never_in_an_nvidia_smi_q_capture_whatever_the_driver():
    for text in (_h200_text(), (FIX / "remap-pending-excerpt-gpud80.txt").read_text()):
        g = convert(text)["gpus"][0]
        assert g["errors"]["nvlink"] == NOT_IN_FORMAT
        assert g["capture"]["not_carried"]["nvlink"] == "capture has no NVLink state: add `nvidia-smi nvlink -s`"


def test_a_gpu_counted_but_not_in_the_capture_is_not_in_capture_not_a_format_gap():
    snap = load_snapshot(FIX / "a100-mig-535-telegraf-1of4.xml")
    assert snap["gpus"][1]["errors"]["nvlink"] == NOT_IN_CAPTURE


def test_a_line_present_but_unreadable_is_an_error_never_a_format_gap():
    """"Format does not carry" (skip) against "field present but unreadable" (error): R565 prints
    the GPU Recovery Action; one that reads [Unknown Error] is a failed read."""
    from gpucheck.core.check import Context
    from gpucheck.core.levels import Level
    from gpucheck.core.runner import run_checks
    from gpucheck.tests_suite.registry import all_checks

    text = (FIX / "h100-x8-565-healthy.txt").read_text().replace(
        "GPU Recovery Action                   : None", "GPU Recovery Action                   : [Unknown Error]", 1)
    snap = convert(text)
    assert snap["gpus"][0]["errors"]["recovery_action"] == "other"
    assert "recovery_action" not in snap["gpus"][0]["capture"].get("not_carried", {})
    out = run_checks([c for c in all_checks() if c.id == "recovery-action"], Context(level=Level.QUICK, snapshot=snap),
                     install_signal_handlers=False)
    assert {(r.subject, r.status.value) for r in out.results if r.subject in ("gpu0", "gpu1")} == {
        ("gpu0", "error"), ("gpu1", "pass")}
