"""Parse `dcgmi diag -j` output and map each DCGM test to gpucheck results. Pure: no subprocess.

The JSON documents differ between DCGM releases; this parser reads the three shapes below and
normalises them into `DiagDoc` (tests x entities, each with DCGM's status, warnings with error ids,
and info). Sources (NVIDIA/DCGM on GitHub, Apache-2.0):

- DCGM 2.x, dcgmi/Diag.cpp `HelperJsonBuildOutput` (2022): root key "DCGM GPU Diagnostic" ->
  "test_categories" [{"category", "tests": [{"name", "results": [{"gpu_ids": "0", "status",
  "warnings": "<text>", "info": "<text>"}]}]}]; deployment tests have one result and no GPU id.
- DCGM 3.x, dcgmi/Diag.cpp (2024, dcgmDiagResponse_v10): same root and nesting; results carry
  "gpu_id": "0" and "warnings": [{"warning", "error_id", "error_category", "error_severity"}]
  (deployment results spell the text key "warnings" and give "gpu_id" as a number); "info" is a
  string; top level adds "version", "Driver Version Detected", "GPU Device IDs",
  "GPU Device Serials" {"0": serial}.
- DCGM 4.x, dcgmi/Diag.cpp (2025, dcgmDiagResponse_v12) and testing/python3/dcgm_diag_schema.json:
  root key "DCGM Diagnostic" -> "test_categories" [{"category", "tests": [{"name": "memory",
  "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status", "warnings":
  [{"warning", "error_id", "error_category", "error_severity"}], "info": ["..."]}],
  "test_summary": {"status", "warnings", "info"}}]}], plus "entity_groups" [{"entity_group",
  "entity_group_id", "entities": [{"entity_id", "serial_num", "device_id"}]}] and "metadata"
  {"version", "Driver Version Detected"}; test names are plugin names (software, pcie, memory,
  targeted_stress, targeted_power, memory_bandwidth, diagnostic, pulse_test, memtest, eud, ...).
- A run that could not start prints {"<root>": {"runtime_error": "...", "version": "..."}}
  (`HelperDisplayFailureMessage`).

Status words: dcgmi writes "Pass", "Skip" and "Fail" (`HelperDisplayDiagResult`: a DCGM *warn*
result is printed as "Fail" in JSON by 3.x and 4.x); NVVS-style documents use PASS/FAIL/WARN/SKIPPED.
A not-run test has no result entry, except in the Deployment category, where dcgmi 3.x writes a
not-run test as "Fail" without any error (HelperJsonAddBasicTests). A result whose status is null or
empty is judged from what it says (_status_of): an error text, id, category or severity makes it a
Fail read like any other, nothing at all makes it `unknown`, an error (never a skip that passes). Text before the JSON object (dcgmi can
print a warning line first) is cut off the way DCGM's own tests do (first "{" to last "}").

Error ids, categories and severities are those of dcgmlib/dcgm_errors.h (dcgmError_t,
dcgmErrorCategory_t, dcgmErrorSeverity_t).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..core.result import ACTION_ORDER, Action, Key, Result, Rule, Status, evaluate

CHECK_ID = "eud.dcgm"

ROOT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")

# dcgm_errors.h dcgmError_t, by value (names only; see DCGM for the messages).
ERROR_NAMES = (
    "OK", "UNKNOWN", "UNRECOGNIZED", "PCI_REPLAY_RATE", "VOLATILE_DBE_DETECTED", "VOLATILE_SBE_DETECTED",
    "PENDING_PAGE_RETIREMENTS", "RETIRED_PAGES_LIMIT", "RETIRED_PAGES_DBE_LIMIT", "CORRUPT_INFOROM",
    "CLOCK_THROTTLE_THERMAL", "POWER_UNREADABLE", "CLOCK_THROTTLE_POWER", "NVLINK_ERROR_THRESHOLD",
    "NVLINK_DOWN", "NVSWITCH_FATAL_ERROR", "NVSWITCH_NON_FATAL_ERROR", "NVSWITCH_DOWN", "NO_ACCESS_TO_FILE",
    "NVML_API", "DEVICE_COUNT_MISMATCH", "BAD_PARAMETER", "CANNOT_OPEN_LIB", "DENYLISTED_DRIVER",
    "NVML_LIB_BAD", "GRAPHICS_PROCESSES", "HOSTENGINE_CONN", "FIELD_QUERY", "BAD_CUDA_ENV", "PERSISTENCE_MODE",
    "LOW_BANDWIDTH", "HIGH_LATENCY", "CANNOT_GET_FIELD_TAG", "FIELD_VIOLATION", "FIELD_THRESHOLD",
    "FIELD_VIOLATION_DBL", "FIELD_THRESHOLD_DBL", "UNSUPPORTED_FIELD_TYPE", "FIELD_THRESHOLD_TS",
    "FIELD_THRESHOLD_TS_DBL", "THERMAL_VIOLATIONS", "THERMAL_VIOLATIONS_TS", "TEMP_VIOLATION",
    "THROTTLING_VIOLATION", "INTERNAL", "PCIE_GENERATION", "PCIE_WIDTH", "ABORTED", "TEST_DISABLED",
    "CANNOT_GET_STAT", "STRESS_LEVEL", "CUDA_API", "FAULTY_MEMORY", "CANNOT_SET_WATCHES", "CUDA_UNBOUND",
    "ECC_DISABLED", "MEMORY_ALLOC", "CUDA_DBE", "MEMORY_MISMATCH", "CUDA_DEVICE", "ECC_UNSUPPORTED",
    "ECC_PENDING", "MEMORY_BANDWIDTH", "TARGET_POWER", "API_FAIL", "API_FAIL_GPU", "CUDA_CONTEXT", "DCGM_API",
    "CONCURRENT_GPUS", "TOO_MANY_ERRORS", "NVLINK_CRC_ERROR_THRESHOLD", "NVLINK_ERROR_CRITICAL",
    "ENFORCED_POWER_LIMIT", "MEMORY_ALLOC_HOST", "GPU_OP_MODE", "NO_MEMORY_CLOCKS", "NO_GRAPHICS_CLOCKS",
    "HAD_TO_RESTORE_STATE", "L1TAG_UNSUPPORTED", "L1TAG_MISCOMPARE", "ROW_REMAP_FAILURE", "UNCONTAINED_ERROR",
    "EMPTY_GPU_LIST", "DBE_PENDING_PAGE_RETIREMENTS", "UNCORRECTABLE_ROW_REMAP", "PENDING_ROW_REMAP",
    "BROKEN_P2P_MEMORY_DEVICE", "BROKEN_P2P_WRITER_DEVICE", "NVSWITCH_NVLINK_DOWN", "EUD_BINARY_PERMISSIONS",
    "EUD_NON_ROOT_USER", "EUD_SPAWN_FAILURE", "EUD_TIMEOUT", "EUD_ZOMBIE", "EUD_NON_ZERO_EXIT_CODE",
    "EUD_TEST_FAILED", "FILE_CREATE_PERMISSIONS", "PAUSE_RESUME_FAILED", "PCIE_H_REPLAY_VIOLATION",
    "GPU_EXPECTED_NVLINKS_UP", "NVSWITCH_EXPECTED_NVLINKS_UP", "XID_ERROR", "SBE_VIOLATION", "DBE_VIOLATION",
    "PCIE_REPLAY_VIOLATION", "SBE_THRESHOLD_VIOLATION", "DBE_THRESHOLD_VIOLATION",
    "PCIE_REPLAY_THRESHOLD_VIOLATION", "CUDA_FM_NOT_INITIALIZED", "SXID_ERROR", "GFLOPS_THRESHOLD_VIOLATION",
    "NAN_VALUE",
)
# dcgmErrorCategory_t
CATEGORY_NAMES = {
    0: "none", 1: "perf_threshold", 2: "perf_violation", 3: "software_config", 4: "software_library",
    5: "software_xid", 6: "software_cuda", 7: "software_eud", 8: "software_other", 9: "hardware_thermal",
    10: "hardware_memory", 11: "hardware_nvlink", 12: "hardware_nvswitch", 13: "hardware_pcie",
    14: "hardware_power", 15: "hardware_other", 16: "internal_other",
}
# dcgmErrorSeverity_t
SEVERITY_NAMES = {0: "none", 1: "monitor", 2: "isolate", 3: "unknown", 4: "triage", 5: "config", 6: "reset"}

# gpucheck's reading of a DCGM "Fail" by error category: (status, default action). Hardware,
# performance and Xid categories are a hardware verdict (fail); software/internal categories mean
# DCGM could not run its test properly (error: could not judge), unless DCGM's severity says
# isolate or reset. The action is then refined by DCGM's severity and error id (_fail_verdict).
CATEGORY_VERDICT: dict[str, tuple[Status, Action]] = {
    "hardware_memory": (Status.FAIL, Action.DRAIN),
    "hardware_pcie": (Status.FAIL, Action.DRAIN),
    "hardware_nvlink": (Status.FAIL, Action.DRAIN),
    "hardware_nvswitch": (Status.FAIL, Action.DRAIN),
    "hardware_thermal": (Status.FAIL, Action.DRAIN),
    "hardware_power": (Status.FAIL, Action.DRAIN),
    "hardware_other": (Status.FAIL, Action.DRAIN),
    "perf_threshold": (Status.FAIL, Action.DRAIN),
    "perf_violation": (Status.FAIL, Action.DRAIN),
    "software_xid": (Status.FAIL, Action.DRAIN),
    "software_config": (Status.ERROR, Action.INVESTIGATE),
    "software_library": (Status.ERROR, Action.INVESTIGATE),
    "software_cuda": (Status.ERROR, Action.INVESTIGATE),
    "software_eud": (Status.ERROR, Action.INVESTIGATE),
    "software_other": (Status.ERROR, Action.INVESTIGATE),
    "internal_other": (Status.ERROR, Action.INVESTIGATE),
}
# Error ids whose remedy is known more precisely than their category's (NVIDIA's memory-error
# guidance: a pending remap or retirement is applied by a GPU reset; a failed remap or too many
# retired pages is an RMA case).
ERROR_ACTION: dict[str, Action] = {
    "PENDING_PAGE_RETIREMENTS": Action.RESET_GPU,
    "DBE_PENDING_PAGE_RETIREMENTS": Action.RESET_GPU,
    "PENDING_ROW_REMAP": Action.RESET_GPU,
    "VOLATILE_DBE_DETECTED": Action.RESET_GPU,
    "ROW_REMAP_FAILURE": Action.RMA,
    "RETIRED_PAGES_LIMIT": Action.RMA,
    "RETIRED_PAGES_DBE_LIMIT": Action.RMA,
}
# Errors that are a note about the run rather than a finding: DCGM_FR_HAD_TO_RESTORE_STATE says a
# test left a GPU setting changed and DCGM restored it (nvvs NvvsDevice::RestoreState).
ERROR_STATUS: dict[str, tuple[Status, Action]] = {
    "HAD_TO_RESTORE_STATE": (Status.WARN, Action.INVESTIGATE),
}
# Deployment (software) tests of DCGM 2.x/3.x whose failure is about the node's software setup,
# not its hardware: used when a Fail carries no error category (DCGM 2.x).
SOFTWARE_TESTS = frozenset({
    "denylist", "blacklist", "nvml library", "cuda main library", "cuda toolkit library",
    "permissions and os blocks", "persistence mode", "environment variables", "graphics processes",
})


class DcgmParseError(ValueError):
    """dcgmi's output is not a diag document this parser understands (the reason is the text)."""


@dataclass
class DcgmWarning:
    text: str
    error_id: int | None = None
    category: int | None = None
    severity: int | None = None

    @property
    def error_name(self) -> str | None:
        if self.error_id is None:
            return None
        if 0 <= self.error_id < len(ERROR_NAMES):
            return f"DCGM_FR_{ERROR_NAMES[self.error_id]} ({self.error_id})"
        return f"error id {self.error_id}"

    @property
    def category_name(self) -> str | None:
        return None if self.category is None else CATEGORY_NAMES.get(self.category, f"unknown ({self.category})")

    @property
    def severity_name(self) -> str | None:
        return None if self.severity is None else SEVERITY_NAMES.get(self.severity, f"unknown ({self.severity})")

    def describe(self) -> str:
        tags = [t for t in (self.error_name,
                            self.category_name and f"category {self.category_name}",
                            self.severity_name and f"severity {self.severity_name}") if t]
        return f"DCGM: {self.text}" + (f" [{', '.join(tags)}]" if tags else "")


@dataclass
class DcgmTest:
    """One test's result for one entity (a GPU, another entity, or the whole run when gpu is None)."""

    category: str
    name: str
    status: str  # pass | fail | warn | skip | not_run | unknown (null or empty, and nothing else said)
    status_text: str
    gpu: int | None = None
    entity: str | None = None  # "GPU 3", "CPU 0"; None: no entity (deployment tests, test summary)
    warnings: list[DcgmWarning] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    no_status: bool = False  # DCGM wrote a null or empty status (status: judged from its errors, else unknown)


@dataclass
class DiagDoc:
    format: str  # "2.x" | "3.x" | "4.x"
    version: str | None = None
    driver: str | None = None
    runtime_error: str | None = None
    tests: list[DcgmTest] = field(default_factory=list)
    serials: dict[int, str] = field(default_factory=dict)  # DCGM GPU id -> serial
    notes: list[str] = field(default_factory=list)


def _norm_status(text: Any) -> str:
    s = str(text or "").strip().lower()
    if s in ("pass", "passed", "success"):
        return "pass"
    if s in ("fail", "failed", "failure", "error"):
        return "fail"
    if s in ("warn", "warning"):
        return "warn"
    if s in ("skip", "skipped"):
        return "skip"
    if s in ("", "not run", "not_run", "notrun"):
        return "not_run"
    raise DcgmParseError(f"unknown DCGM status {text!r}")


def _status_of(raw: Any, warns: list["DcgmWarning"]) -> tuple[str, str, bool]:
    """(status, status text, no status) of a result: DCGM's word, or for a null or empty one, a
    fail when DCGM still wrote an error (its text, id, category or severity: "Found 4 faulty memory
    elements", severity isolate, judged by _fail_verdict like any Fail), else `unknown`: nothing
    examined that gpucheck can tell, an error, never a skip that lets the node pass."""
    if raw is not None and str(raw).strip():
        return _norm_status(raw), str(raw), False
    said = any(w.text.strip() or w.error_id is not None or w.category is not None or w.severity is not None
               for w in warns)
    return ("fail" if said else "unknown"), "" if raw is None else str(raw), True


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v.strip())
    return None


def _warnings(raw: Any) -> list[DcgmWarning]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [DcgmWarning(raw)] if raw.strip() else []
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise DcgmParseError(f"'warnings' is a {type(raw).__name__}, not a list")
    out = []
    for w in raw:
        if w is None:
            continue
        if isinstance(w, str):
            out.append(DcgmWarning(w))
            continue
        if not isinstance(w, dict):
            raise DcgmParseError(f"a warning is a {type(w).__name__}, not an object")
        text = w.get("warning", w.get("warnings", w.get("message", "")))
        out.append(DcgmWarning(str(text), _int(w.get("error_id")), _int(w.get("error_category")),
                               _int(w.get("error_severity"))))
    return out


def _info(raw: Any) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw] if raw.strip() else []
    if isinstance(raw, list):
        return [str(x) for x in raw if x is not None and str(x).strip()]
    return [str(raw)]


def extract_json(text: str) -> Any:
    """The JSON object in dcgmi's stdout (text around it, e.g. a warning line, is dropped)."""
    if not text or not text.strip():
        raise DcgmParseError("dcgmi printed nothing")
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise DcgmParseError("no JSON object in dcgmi's output")
    from ..platform.safeio import loads_json

    try:
        return loads_json(text[start:end + 1])
    except json.JSONDecodeError as e:
        raise DcgmParseError(f"dcgmi's JSON does not parse: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:  # nested too deeply: a broken or hostile document, never a RecursionError
        raise DcgmParseError(f"dcgmi's JSON does not parse: {e}") from None


def parse_diag(text: str) -> DiagDoc:
    """Parse dcgmi diag -j output. Raises DcgmParseError (with the reason) for anything else."""
    doc = extract_json(text)
    if not isinstance(doc, dict):
        raise DcgmParseError(f"dcgmi's JSON is a {type(doc).__name__}, not an object")
    if "iterations" in doc and not any(k in doc for k in ROOT_KEYS):
        raise DcgmParseError("an --iterations document (gpucheck runs one iteration)")
    root_key = next((k for k in ROOT_KEYS if k in doc), None)
    if root_key is None:
        keys = ", ".join(sorted(doc)) or "none"
        raise DcgmParseError(f"no {' or '.join(repr(k) for k in ROOT_KEYS)} key (keys: {keys})")
    root = doc[root_key]
    if not isinstance(root, dict):
        raise DcgmParseError(f"{root_key!r} is a {type(root).__name__}, not an object")
    cats = root.get("test_categories")
    fmt = "4.x" if root_key == "DCGM Diagnostic" or "metadata" in doc or "entity_groups" in doc else "3.x"
    out = DiagDoc(format=fmt)
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    out.version = meta.get("version") or doc.get("version") or root.get("version")
    out.driver = meta.get("Driver Version Detected") or doc.get("Driver Version Detected")
    if root.get("runtime_error"):
        out.runtime_error = str(root["runtime_error"]).strip()
    serials = doc.get("GPU Device Serials")
    if isinstance(serials, dict):
        for k, v in serials.items():
            index, serial = _int(k), _serial(v)
            if index is not None and serial is not None:
                out.serials[index] = serial
    for grp in doc.get("entity_groups") or []:
        if isinstance(grp, dict) and str(grp.get("entity_group", "")).upper() == "GPU":
            for e in grp.get("entities") or []:
                if not isinstance(e, dict):
                    continue
                index, serial = _int(e.get("entity_id")), _serial(e.get("serial_num"))
                if index is not None and serial:
                    out.serials[index] = serial
    if cats is None:
        if out.runtime_error:
            return out
        raise DcgmParseError(f"{root_key!r} has no 'test_categories' and no 'runtime_error'")
    if not isinstance(cats, list):
        raise DcgmParseError(f"'test_categories' is a {type(cats).__name__}, not a list")
    for cat in cats:
        if cat is None:
            continue
        if not isinstance(cat, dict):
            raise DcgmParseError("a test category is not an object")
        cname = str(cat.get("category", "unknown"))
        tests = cat.get("tests") or []
        if not isinstance(tests, list):
            raise DcgmParseError(f"category {cname!r}: 'tests' is not a list")
        for t in tests:
            if t is None:  # dcgmi 3.x leaves a null where a not-run deployment test was
                continue
            if not isinstance(t, dict) or "name" not in t:
                raise DcgmParseError(f"category {cname!r}: a test without a name")
            _parse_test(out, cname, t)
    by_version = _format_of_version(out.version)
    if by_version is not None:  # the version DCGM states wins over the shape of its JSON
        out.format = by_version
    elif fmt == "3.x" and any(isinstance(r, dict) and "gpu_ids" in r
                              for c in cats if isinstance(c, dict) for t in (c.get("tests") or []) if isinstance(t, dict)
                              for r in (t.get("results") or [])):
        out.format = "2.x"
    return out


def _format_of_version(version: Any) -> str | None:
    """"3.x" for a stated version "3.1.0" (DCGM 3.1 still writes 2.x-shaped "gpu_ids" results)."""
    m = re.match(r"\s*(\d+)\.", str(version or ""))
    return f"{m.group(1)}.x" if m else None


def _serial(value: Any) -> str | None:
    """A GPU serial as DCGM wrote it, or None for its blank sentinels ("<<<NOT_SUPPORTED>>>",
    "<<<NULL>>>", ...) and empty values: a sentinel is no serial, never one to match GPUs by."""
    text = str(value or "").strip()
    if not text or (text.startswith("<<<") and text.endswith(">>>")):
        return None
    return text


def _parse_test(out: DiagDoc, cname: str, t: dict[str, Any]) -> None:  # t: a test of dcgmi's own JSON
    name = str(t["name"])
    results = t.get("results")
    if results is None:
        results = []
    if not isinstance(results, list):
        raise DcgmParseError(f"test {name!r}: 'results' is not a list")
    n_entity = 0
    for r in results:
        if r is None:
            continue
        if not isinstance(r, dict) or "status" not in r:
            raise DcgmParseError(f"test {name!r}: a result without a status")
        warns = _warnings(r.get("warnings"))
        status, status_text, no_status = _status_of(r["status"], warns)
        info = _info(r.get("info"))
        gpus: list[int | None]
        entity = None
        if "entity_id" in r:
            group = str(r.get("entity_group") or ("GPU" if _int(r.get("entity_group_id")) == 1 else "entity"))
            eid = _int(r["entity_id"])
            entity = f"{group} {eid}"
            gpus = [eid] if group.upper() == "GPU" else [None]
        elif "gpu_id" in r or "gpu_ids" in r:
            raw = r.get("gpu_id", r.get("gpu_ids"))
            ids = [_int(x) for x in str(raw).split(",") if str(x).strip()]
            if any(i is None for i in ids):
                raise DcgmParseError(f"test {name!r}: bad GPU id {raw!r}")
            # A deployment result names the GPU of its first error, not a per-GPU result.
            gpus = ids if (ids and cname.lower() != "deployment") else [None]
        else:
            gpus = [None]
        for g in gpus:
            n_entity += 1
            out.tests.append(DcgmTest(cname, name, status, status_text, gpu=g,
                                      entity=entity if entity else (f"GPU {g}" if g is not None else None),
                                      warnings=list(warns), info=list(info), no_status=no_status))
    summ = t.get("test_summary")
    if isinstance(summ, dict) and "status" in summ:
        warns = _warnings(summ.get("warnings"))
        status, status_text, no_status = _status_of(summ["status"], warns)
        info = _info(summ.get("info"))
        # The summary is its own result when it carries what the entity results do not: errors or
        # info not tied to an entity, or the only verdict of a test without entity results.
        if n_entity == 0 or warns:
            out.tests.append(DcgmTest(cname, name, status, status_text, gpu=None, entity=None,
                                      warnings=warns, info=info, no_status=no_status))


# ---------------------------------------------------------------------------------------------
# mapping to gpucheck results


def _fail_verdict(test: DcgmTest) -> tuple[Status, Action, str]:
    """gpucheck's status and action for a DCGM Fail, and why: the strongest reading over the
    test's errors (fail outranks error, error outranks warn; then the stronger action).

    Status by DCGM's error category (CATEGORY_VERDICT): hardware, performance and Xid categories
    are a fail; software, CUDA, EUD-setup and internal categories mean DCGM's test could not run
    properly (error), unless DCGM's severity is isolate or reset. Action by DCGM's severity
    (dcgm_errors.h: isolate "cannot perform workload, GPU should be isolated" -> drain; reset
    "drain and reset GPU" -> reset-gpu; monitor "can perform workload, but needs to be monitored"
    -> investigate), then by error id where NVIDIA's remedy is specific (ERROR_ACTION)."""
    best: tuple[Status, Action, str] | None = None

    rank = {Status.WARN: 0, Status.ERROR: 1, Status.FAIL: 2}

    def score(v: tuple[Status, Action, str]) -> tuple[int, int]:
        return (rank[v[0]], ACTION_ORDER.index(v[1]))

    for w in test.warnings:
        sev, cat = w.severity_name, w.category_name
        name = ERROR_NAMES[w.error_id] if w.error_id is not None and 0 <= w.error_id < len(ERROR_NAMES) else None
        if cat is None and sev is None and name is None:
            continue
        if name in ERROR_STATUS:
            status, action = ERROR_STATUS[name]
            cand = (status, action, f"DCGM_FR_{name}")
            if best is None or score(cand) > score(best):
                best = cand
            continue
        status, action = CATEGORY_VERDICT.get(cat or "", (Status.FAIL, Action.DRAIN))
        why = f"DCGM category {cat}" if cat else "DCGM error without a category"
        if status == Status.ERROR and sev in ("isolate", "reset"):
            status, why = Status.FAIL, f"DCGM severity {sev}"
        if status == Status.FAIL:
            if sev == "isolate":
                action, why = Action.DRAIN, f"{why}, severity isolate"
            elif sev == "reset":
                action, why = Action.RESET_GPU, f"{why}, severity reset"
            elif sev == "monitor":
                action, why = Action.INVESTIGATE, f"{why}, severity monitor"
            if name in ERROR_ACTION:
                action, why = ERROR_ACTION[name], f"DCGM_FR_{name}"
        cand = (status, action, why)
        if best is None or score(cand) > score(best):
            best = cand
    if best is not None:
        return best
    if not test.warnings and test.category.strip().lower() == "deployment":
        # dcgmi 3.x writes every deployment test it did not run as "Fail" (HelperJsonAddBasicTests:
        # HelperDisplayDiagResult maps anything but Pass and Skip to "Fail"), with no error: a Fail
        # without a word is not a finding.
        return (Status.ERROR, Action.INVESTIGATE,
                "a deployment test marked Fail without any error (dcgmi writes a deployment test it did not "
                "run as Fail)")
    # No error id or category (DCGM 2.x, or a Fail without warnings): judge by the test.
    if test.name.strip().lower() in SOFTWARE_TESTS:
        return Status.ERROR, Action.INVESTIGATE, "a deployment (software) test"
    return Status.FAIL, Action.DRAIN, "a hardware test"


# DCGM's own verdict per test: a Fail is judged with DCGM's error catalog (_fail_verdict: fail,
# warn, or error for a test that could not run properly, and the action), a Warn asks for a look.
# The limit is the text this document gave the verdict (dcgmi writes "Fail", "FAIL", "Failed"...);
# of the three Fail rules only the one _fail_verdict chose applies.
RULES = (
    Rule("dcgm_status", "==", Key("fail_as_fail"), Status.FAIL, Key("fail_action"),
         "{label}: fail{first_or_none} [{why}]"),
    Rule("dcgm_status", "==", Key("fail_as_warn"), Status.WARN, Key("fail_action"),
         "{label}: warn{first_or_none} [{why}]"),
    Rule("dcgm_status", "==", Key("fail_as_error"), Status.ERROR, Key("fail_action"),
         "{label}: could not run properly (not a hardware verdict){first_or_none} [{why}]"),
    Rule("dcgm_status", "==", Key("warn_text"), Status.WARN, Action.INVESTIGATE, "{label}: warn{first}"),
    Rule("dcgm_status", "==", Key("unknown_text"), Status.ERROR, Action.INVESTIGATE,
         "{label}: DCGM gave no status (null or empty) and no error: nothing examined that gpucheck can judge"),
)
_FAIL_RULE_KEY = {Status.FAIL: "fail_as_fail", Status.WARN: "fail_as_warn", Status.ERROR: "fail_as_error"}


def _test_result(t: DcgmTest, gpu: int | None, subject: str, injected: list[str]) -> Result:
    label = f"DCGM {t.name}" + (f" ({t.category})" if t.category else "")
    first = t.warnings[0].text.strip() if t.warnings else ""
    limits: dict[str, str | Action | None] = {
        "fail_as_fail": "Fail", "fail_as_warn": None, "fail_as_error": None, "fail_action": Action.DRAIN,
        "warn_text": t.status_text if t.status == "warn" else "Warn",
        "unknown_text": t.status_text if t.status == "unknown" else None}
    facts = {"label": label, "first": f": {first}" if first else "",
             "first_or_none": f": {first}" if first else ": DCGM gave no detail", "why": ""}
    if t.status == "fail":
        status, action, facts["why"] = _fail_verdict(t)
        limits.update(fail_as_fail=None, fail_action=action)
        limits[_FAIL_RULE_KEY[status]] = t.status_text
    metrics: dict[str, str | int | None] = {"dcgm_status": t.status_text, "dcgm_errors": len(t.warnings)}
    units = {"dcgm_status": "", "dcgm_errors": "count"}
    if t.warnings and t.warnings[0].error_id is not None:
        metrics["dcgm_error_id"], units["dcgm_error_id"] = t.warnings[0].error_id, ""
    r = evaluate(CHECK_ID, RULES, metrics, limits=limits, facts=facts, units=units, gpu=gpu, subject=subject,
                 ok_summary=f"{label}: pass" + (f"; {t.info[0]}" if t.info else ""))
    if t.status in ("skip", "not_run") and r.status == Status.PASS:  # DCGM judged nothing
        reason = first or (t.info[0] if t.info else "DCGM gave no reason")
        r.status = Status.SKIP
        r.summary = (f"{label}: skipped by DCGM: {reason}" if t.status == "skip"
                     else f"{label}: not run by DCGM" + (f": {first}" if first else ""))
    r.injected = list(injected)
    return r


def map_results(doc: DiagDoc, *, gpu_map: dict[int, int] | None = None,
                injected: list[str] | None = None) -> list[Result]:
    """One gpucheck result per DCGM test and entity. `gpu_map` maps DCGM GPU ids to gpucheck GPU
    indices (by serial); unmapped ids are taken as the same index."""
    gpu_map = gpu_map or {}
    out: list[Result] = []
    for t in doc.tests:
        gpu = None if t.gpu is None else gpu_map.get(t.gpu, t.gpu)
        where = f"gpu{gpu}" if gpu is not None else ("node" if t.entity is None else t.entity.replace(" ", "").lower())
        r = _test_result(t, gpu, f"{where}/{t.name}", list(injected or []))
        r.evidence.extend(w.describe() for w in t.warnings)
        r.evidence.extend(f"DCGM info: {i}" for i in t.info)
        if t.no_status:
            r.evidence.append("DCGM wrote no status (null or empty)"
                              + (": judged from its error text and severity" if t.status == "fail" else ""))
        if t.entity and t.gpu is not None and gpu != t.gpu:
            r.evidence.append(f"DCGM {t.entity} is gpucheck GPU {gpu} (matched by serial)")
        elif t.entity and t.gpu is None:
            r.evidence.append(f"DCGM entity {t.entity}")
        out.append(r)
    return out
