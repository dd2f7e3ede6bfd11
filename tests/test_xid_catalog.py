"""The catalog is complete, consistent, and encodes the buckets the issue asks for."""

from __future__ import annotations

import pytest

from gpucheck.xid import catalog
from gpucheck.xid.judge import classify
from gpucheck.platform.kernlog.parse import XidEvent
from gpucheck.core.result import Action


def test_rows_cover_1_to_172_once_each():
    xids = [r[0] for r in catalog.XID_ROWS]
    assert xids == list(range(1, 173))
    assert all(r[1] and r[2] for r in catalog.XID_ROWS)


def test_every_entry_has_a_valid_severity_and_action():
    for xid, e in catalog.CATALOG.items():
        assert e.severity in catalog.SEVERITIES, xid
        Action(e.action)  # raises for a word outside the vocabulary
        assert e.bucket in catalog.BUCKET_VERDICT, xid
    for sev, act in list(catalog.BUCKET_VERDICT.values()) + list(catalog.RECOVERY_ACTIONS.values()):
        assert sev in catalog.SEVERITIES
        Action(act)
    for xid, over in catalog.OVERRIDES.items():
        assert xid in catalog.CATALOG and set(over) <= {"severity", "action", "note"}


# (xid, NVIDIA's immediate bucket, gpucheck severity, gpucheck action) as the issue lists them
EXPECTED = [
    (8, "RESTART_APP", "app", "restart-app"),
    (13, "RESTART_APP", "app", "restart-app"),
    (31, "RESTART_APP", "app", "restart-app"),
    (32, "RESTART_APP", "app", "restart-app"),
    (38, "IGNORE", "info", "none"),
    (43, "IGNORE", "info", "none"),
    (44, "IGNORE", "info", "none"),
    (45, "WORKFLOW_XID_45", "info", "none"),
    (46, "RESET_GPU", "critical", "reset-gpu"),
    (48, "WORKFLOW_XID_48", "critical", "reset-gpu"),
    (62, "RESET_GPU", "critical", "reset-gpu"),
    (63, "IGNORE", "info", "none"),
    (64, "RESET_GPU", "critical", "reset-gpu"),
    (68, "RESTART_APP", "app", "restart-app"),
    (69, "RESTART_APP", "app", "restart-app"),
    (74, "WORKFLOW_NVLINK_ERR", "critical", "reset-gpu"),
    (79, "RESTART_BM", "critical", "reboot"),
    (92, "IGNORE", "warning", "investigate"),
    (94, "RESTART_APP", "warning", "restart-app"),
    (95, "RESET_GPU", "critical", "reset-gpu"),
    (109, "RESET_GPU", "critical", "reset-gpu"),
    (110, "RESET_GPU", "critical", "reset-gpu"),
    (119, "RESET_GPU", "critical", "reset-gpu"),
    (120, "RESET_GPU", "critical", "reset-gpu"),
    (136, "RESET_GPU", "critical", "reset-gpu"),
    (140, "RESET_GPU", "critical", "reset-gpu"),
    (143, "RESET_GPU", "critical", "reset-gpu"),
    (155, "RESET_GPU", "critical", "reset-gpu"),
    (156, "RESET_GPU", "critical", "reset-gpu"),
    (158, "RESET_GPU", "critical", "reset-gpu"),
] + [(x, "WORKFLOW_NVLINK5_ERR", "critical", "reset-gpu") for x in range(144, 151)]


@pytest.mark.parametrize("xid,bucket,severity,action", EXPECTED)
def test_issue_buckets(xid, bucket, severity, action):
    e = catalog.lookup(xid)
    assert (e.bucket, e.severity, e.action) == (bucket, severity, action)
    assert e.known


def test_catalog_names_match_nverror_mnemonics():
    assert catalog.lookup(79).mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert catalog.lookup(48).mnemonic == "ROBUST_CHANNEL_GPU_ECC_DBE"
    assert catalog.lookup(119).mnemonic == "GSP_RPC_TIMEOUT"
    assert catalog.lookup(154).mnemonic == "GPU_RECOVERY_ACTION_CHANGED"


def test_unknown_numbers_are_kept_as_warnings():
    e = catalog.lookup(999)
    assert not e.known and e.mnemonic == "unknown Xid 999"
    assert (e.severity, e.action) == ("warning", "investigate")


def ev(xid: int, text: str = "", **kw) -> XidEvent:
    return XidEvent(xid, "0000:3b:00", None, f"NVRM: Xid (PCI:0000:3b:00): {xid}, {text}", text=text, **kw)


@pytest.mark.parametrize("label,code,severity,action", [
    ("None", 0, "info", "none"),
    ("GPU Reset Required", 1, "critical", "reset-gpu"),
    ("PF FLR", 1, "critical", "reset-gpu"),
    ("Node Reboot Required", 2, "critical", "reboot"),
    ("Drain P2P", 3, "critical", "drain"),
    ("Drain and Reset", 4, "critical", "drain"),
    ("Something New", 2, "critical", "reboot"),  # unknown label: the code decides
    ("Something New", 99, "warning", "investigate"),
])
def test_xid154_action_comes_from_the_text(label, code, severity, action):
    c = classify(ev(154, recovery={"from_code": 0, "from_label": "None", "to_code": code, "to_label": label}))
    assert (c.severity, c.action) == (severity, action)


def test_nvlink5_nonfatal_is_a_warning_fatal_a_reset():
    fatal = classify(ev(149, nvlink={"unit": "NETIR_LINK_EVT", "fatal": True, "link": 0}))
    nonfatal = classify(ev(144, nvlink={"unit": "SAW_MVB", "fatal": False, "link": 0}))
    assert (fatal.severity, fatal.action) == ("critical", "reset-gpu")
    assert (nonfatal.severity, nonfatal.action) == ("warning", "investigate")
    assert "SAW_MVB" in nonfatal.note and "link 0" in nonfatal.note


def test_ignore_list_turns_an_xid_informational():
    c = classify(ev(79), ignore=[79])
    assert (c.severity, c.action) == ("info", "none") and "ignore_xids" in c.note
