"""nvidia-smi captures as snapshots: `nvidia-smi -q` text and its XML form `nvidia-smi -q -x`.

The first thing a support thread asks for is `nvidia-smi -q`. `convert(text)` turns one (whole,
half-pasted, quoted or wrapped) into the snapshot dict of docs/snapshot.md, so that
`gpucheck run --snapshot nvsmi.txt` judges it with the level-1 checks unchanged. Reading only: no
judgement happens here.

Every value maps to a value or to None, by the same rules as the live NVML reader:

- a value: parsed from its text ("16x", "30 C", "100.89 W", "Yes", "Enabled", "Active", ...);
- "N/A", "[N/A]", "Not Supported", "Requested functionality has been deprecated", a section that
  is "N/A" as a whole: None, not supported (what NVML_ERROR_NOT_SUPPORTED gives live);
- "[Insufficient Permissions]", "[Unknown Error]", "ERR!", a value that does not parse: None and
  the field in the GPU's `errors` map (no_permission, other), exactly like a failed NVML read;
- "[GPU is lost]", "[GPU requires reset]", "GPU Reset Status: Reset Required: Yes" (or "Drain and
  Reset Recommended: Yes"): the GPU's `state` (lost, reset_required) with where it was read;
- a field the capture does not hold at all (an older driver's nvidia-smi does not print it, the
  section is not in a partial paste, nvidia-smi -q never prints NVLink state): None and
  `errors[field] = "not_in_capture"`, which every check judges as an unread field ("not in this
  capture"): an error where a fail rule needs it, a warning where only an advisory rule does.
  Never a silent pass.

Spellings of every driver generation seen in real captures are known: "Clocks Throttle Reasons"
(before R535) and "Clocks Event Reasons", "Power Readings" and "GPU Power Readings", absolute
temperature thresholds and the T.Limit form of R535+ (thresholds given as a margin: the absolute
threshold is the current temperature plus the margin's distance to it), "SRAM Uncorrectable" and
its R550 split into Parity and SEC-DED, the XML tags of both.

A capture that is cut short or holds fewer GPU sections than its "Attached GPUs" line is judged on
what it holds: each missing GPU is an entry whose every field is "not in this capture", and the
snapshot's `capture.warnings` says what was missing (printed by `gpucheck run` and
`gpucheck telemetry import`).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime
from typing import Any, Callable, Iterable

from ... import __version__
from ..pci import normalize_bus_id
from . import enums
from .fields import GROUP_FIELDS, TOP_FIELDS
from .formatgaps import gap_for
from .nvml import NOT_IN_FORMAT
from .model import KIND, VERSION
from .throttle import reason_names

NOT_IN_CAPTURE = "not_in_capture"  # the failure kind of a field a capture does not hold (docs/snapshot.md)
TEXT, XML = "nvidia-smi -q", "nvidia-smi -q -x"

Path = tuple[str, ...]
Tree = dict[Path, Any]  # path of lower-case keys (text) or tags (XML) -> value text, or None for a section


class CaptureError(ValueError):
    """Not an nvidia-smi capture gpucheck can read. The message is one line."""


# -- words -----------------------------------------------------------------------------------------
_NOT_SUPPORTED = {"n/a", "not supported", "requested functionality has been deprecated", "not found",
                  "not available", "unsupported"}
_FAILED = {"insufficient permissions": "no_permission", "no permission": "no_permission",
           "unknown error": "other", "err!": "other", "error": "other"}
_GONE = {"gpu is lost": "lost", "gpu requires reset": "reset_required", "gpu reset required": "reset_required"}


def _word(text: str) -> str:
    return " ".join(text.strip().strip("[]").split()).lower()


def classify(text: str) -> tuple[str, str | None]:
    """("value", None), ("na", None), ("failed", kind) or ("gone", state) for one value's text."""
    w = _word(text)
    if w in _NOT_SUPPORTED:
        return "na", None
    if w in _FAILED:
        return "failed", _FAILED[w]
    if w in _GONE:
        return "gone", _GONE[w]
    return "value", None


# -- value parsers (text of one value -> a value; ValueError when it is none) --------------------------
_NUM_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:x|c|w|mhz|mw|%|kb/s|mib|bank\(s\)|us)?\s*$", re.IGNORECASE)
_TRUE = {"yes", "enabled", "active", "on", "true"}
_FALSE = {"no", "disabled", "not active", "off", "false"}
ARCHITECTURES = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7,
                 "ada": 8, "ada lovelace": 8, "hopper": 9, "blackwell": 10}


def _number(text: str) -> float:
    m = _NUM_RE.match(text)
    if not m:
        raise ValueError(text)
    return float(m.group(1))


def _count(text: str) -> int:
    v = _number(text)
    if not v.is_integer():
        raise ValueError(text)
    return int(v)


def _bool(text: str) -> bool:
    w = _word(text)
    if w in _TRUE:
        return True
    if w in _FALSE:
        return False
    raise ValueError(text)


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError(text)
    return text.strip()


def _watts(text: str) -> float:
    return round(_number(text), 3)


def _bus(text: str) -> str:
    bus = normalize_bus_id(text)
    if bus is None:
        raise ValueError(text)
    return bus


def _device_id(text: str) -> str:
    """"0x233010DE" (text) or "233010DE" (XML): PCI device id << 16 | vendor -> "0x2330"."""
    v = int(text.strip(), 16)
    return f"{(v >> 16) & 0xFFFF:#06x}"


# snapshot field -> (text paths, XML paths, parser); alternatives are tried in order (driver generations)
def _p(*keys: str) -> Path:
    return tuple(k.lower() for k in keys)


SPECS: tuple[tuple[str, tuple[Path, ...], tuple[Path, ...], Callable[[str], Any]], ...] = (
    ("name", (_p("Product Name"),), (_p("product_name"),), _text),
    ("uuid", (_p("GPU UUID"),), (_p("uuid"),), _text),
    ("serial", (_p("Serial Number"),), (_p("serial"),), _text),
    ("pci_device_id", (_p("PCI", "Device Id"),), (_p("pci", "pci_device_id"),), _device_id),
    ("persistence_mode", (_p("Persistence Mode"),), (_p("persistence_mode"),), _bool),
    ("ecc_mode.current", (_p("ECC Mode", "Current"),), (_p("ecc_mode", "current_ecc"),), _bool),
    ("ecc_mode.pending", (_p("ECC Mode", "Pending"),), (_p("ecc_mode", "pending_ecc"),), _bool),
    ("mig_mode.current", (_p("MIG Mode", "Current"),), (_p("mig_mode", "current_mig"),), _bool),
    ("mig_mode.pending", (_p("MIG Mode", "Pending"),), (_p("mig_mode", "pending_mig"),), _bool),
    ("remapped_rows.correctable", (_p("Remapped Rows", "Correctable Error"),),
     (_p("remapped_rows", "remapped_row_corr"),), _count),
    ("remapped_rows.uncorrectable", (_p("Remapped Rows", "Uncorrectable Error"),),
     (_p("remapped_rows", "remapped_row_unc"),), _count),
    ("remapped_rows.pending", (_p("Remapped Rows", "Pending"),), (_p("remapped_rows", "remapped_row_pending"),), _bool),
    ("remapped_rows.failure", (_p("Remapped Rows", "Remapping Failure Occurred"),),
     (_p("remapped_rows", "remapped_row_failure"),), _bool),
    ("retired_pages.single_bit", (_p("Retired Pages", "Single Bit ECC"),),
     (_p("retired_pages", "multiple_single_bit_retirement", "retired_count"),), _count),
    ("retired_pages.double_bit", (_p("Retired Pages", "Double Bit ECC"),),
     (_p("retired_pages", "double_bit_retirement", "retired_count"),), _count),
    ("retired_pages.pending", (_p("Retired Pages", "Pending Page Blacklist"), _p("Retired Pages", "Pending"),
                               _p("Retired Pages", "Pending Page Retirement")),
     (_p("retired_pages", "pending_blacklist"), _p("retired_pages", "pending_retirement")), _bool),
    ("temperature.gpu_c", (_p("Temperature", "GPU Current Temp"),), (_p("temperature", "gpu_temp"),), _number),
    ("clocks.sm_mhz", (_p("Clocks", "SM"),), (_p("clocks", "sm_clock"),), _number),
    ("clocks.sm_max_mhz", (_p("Max Clocks", "SM"),), (_p("max_clocks", "sm_clock"),), _number),
    ("power.usage_w", (_p("GPU Power Readings", "Power Draw"), _p("GPU Power Readings", "Instantaneous Power Draw"),
                       _p("GPU Power Readings", "Average Power Draw"), _p("Power Readings", "Power Draw")),
     (_p("gpu_power_readings", "power_draw"), _p("gpu_power_readings", "instant_power_draw"),
      _p("gpu_power_readings", "average_power_draw"), _p("power_readings", "power_draw")), _watts),
    ("power.limit_w", (_p("GPU Power Readings", "Current Power Limit"), _p("Power Readings", "Enforced Power Limit"),
                       _p("Power Readings", "Power Limit")),
     (_p("gpu_power_readings", "current_power_limit"), _p("power_readings", "enforced_power_limit"),
      _p("power_readings", "power_limit")), _watts),
    ("pcie.link_gen", (_p("PCI", "GPU Link Info", "PCIe Generation", "Current"),),
     (_p("pci", "pci_gpu_link_info", "pcie_gen", "current_link_gen"),), _count),
    ("pcie.link_gen_max", (_p("PCI", "GPU Link Info", "PCIe Generation", "Max"),),
     (_p("pci", "pci_gpu_link_info", "pcie_gen", "max_link_gen"),), _count),
    ("pcie.link_gen_gpu_max", (_p("PCI", "GPU Link Info", "PCIe Generation", "Device Max"),),
     (_p("pci", "pci_gpu_link_info", "pcie_gen", "max_device_link_gen"),), _count),
    ("pcie.link_width", (_p("PCI", "GPU Link Info", "Link Width", "Current"),),
     (_p("pci", "pci_gpu_link_info", "link_widths", "current_link_width"),), _count),
    ("pcie.link_width_max", (_p("PCI", "GPU Link Info", "Link Width", "Max"),),
     (_p("pci", "pci_gpu_link_info", "link_widths", "max_link_width"),), _count),
    ("pcie.replay_counter", (_p("PCI", "Replays Since Reset"), _p("PCI", "Replays")),
     (_p("pci", "replay_counter"),), _count),
)


# -- looking a value up ------------------------------------------------------------------------------
class Found:
    """What a capture holds for one field: `kind` value / na / failed / gone / missing."""

    def __init__(self, kind: str, text: str | None = None, detail: str | None = None, path: Path = ()):
        self.kind, self.text, self.detail, self.path = kind, text, detail, path


def lookup(tree: Tree, paths: Iterable[Path]) -> Found:
    """The first of `paths` the capture holds; a section that is "N/A" as a whole makes every field
    under it not supported; none of them at all is `missing` (not in this capture)."""
    paths = list(paths)
    for p in paths:
        v = tree.get(p)
        if isinstance(v, str):
            kind, detail = classify(v)
            return Found(kind, v, detail, p)
    for p in paths:
        for k in range(len(p) - 1, 0, -1):
            v = tree.get(p[:k])
            if isinstance(v, str) and classify(v)[0] != "value":
                kind, detail = classify(v)
                return Found(kind, v, detail, p[:k])
    return Found("missing")


# -- the text form -----------------------------------------------------------------------------------
_FENCE_RE = re.compile(r"^\s*(```|~~~)")
_QUOTE_RE = re.compile(r"^\s*>\s?")
_BANNER_RE = re.compile(r"=+\s*NVSMI LOG\s*=+")
_GPU_HEADER_RE = re.compile(r"^\s*GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_TOP_KEYS = {"timestamp", "driver version", "cuda version", "attached gpus"}


def _norm(key: str) -> str:
    return " ".join(key.split()).lower()


def clean_lines(text: str) -> tuple[list[str], list[str]]:
    """The capture's lines without what a paste adds: CR line ends, code fences, a quote prefix
    ("> " on most lines, as in a quoted mail or comment), tabs. Warnings say what was removed."""
    warnings: list[str] = []
    lines = [ln.expandtabs(4).rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    fences = [ln for ln in lines if _FENCE_RE.match(ln)]
    if fences:
        lines = [ln for ln in lines if not _FENCE_RE.match(ln)]
    nonempty = [ln for ln in lines if ln.strip()]
    quoted = [ln for ln in nonempty if _QUOTE_RE.match(ln)]
    if nonempty and len(quoted) >= 0.8 * len(nonempty):
        stripped = []
        for ln in lines:
            while _QUOTE_RE.match(ln):
                ln = _QUOTE_RE.sub("", ln, count=1)
            stripped.append(ln)
        lines = stripped
        warnings.append("the capture is quoted ('>' at the start of its lines): read without the quote marks")
    return lines, warnings


def _split_kv(content: str) -> tuple[str, str | None]:
    """"Key      : value" -> (key, value); a line without " : " -> (text, None)."""
    if " : " in content:
        key, _, value = content.partition(" : ")
        return key.strip(), value.strip()
    if content.endswith(" :"):
        return content[:-2].strip(), ""
    return content.strip(), None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def parse_block(lines: list[str], min_indent: int = 0) -> tuple[Tree, list[tuple[Path, str | None]], list[str]]:
    """One block of `Key : value` lines nested by indentation -> (first value per path, every
    (path, value) in order, lines that are neither: wrapped or cut lines, prompts). Lines indented
    less than `min_indent` (a GPU section's lines are all indented under its header) are none."""
    tree: Tree = {}
    entries: list[tuple[Path, str | None]] = []
    unparsed: list[str] = []
    stack: list[tuple[int, str]] = []
    body = [ln for ln in lines if ln.strip()]
    for i, line in enumerate(body):
        indent = _indent(line)
        if indent < min_indent:  # e.g. the rest of a long value a terminal wrapped to column 0
            unparsed.append(line.strip())
            continue
        key, value = _split_kv(line.strip())
        if value is None:
            nxt = body[i + 1] if i + 1 < len(body) else None
            if nxt is None or _indent(nxt) <= indent:  # a "section" without children: not a line we know
                unparsed.append(line.strip())
                continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(k for _, k in stack) + (_norm(key),)
        entries.append((path, value))
        tree.setdefault(path, value)
        if value is None:
            stack.append((indent, _norm(key)))
    return tree, entries, unparsed


class Block:
    """One GPU section of a capture: its PCI address (from the section line), values, processes."""

    def __init__(self, bus: str | None, tree: Tree, processes: list[dict[str, Any]], unparsed: int = 0):
        self.bus, self.tree, self.processes, self.unparsed = bus, tree, processes, unparsed


def _text_processes(entries: list[tuple[Path, str | None]]) -> list[dict[str, Any]]:
    procs: list[dict[str, Any]] = []
    for path, value in entries:
        if len(path) != 2 or path[0] != "processes" or value is None:
            continue
        if path[1] == "gpu instance id" or not procs or path[1] in procs[-1]:
            procs.append({})
        procs[-1][path[1]] = value
    return procs


def split_text(lines: list[str]) -> tuple[dict[str, str], list[Block], list[str]]:
    """(top-level values, GPU blocks, warnings). Lines before the first `GPU <bus id>` line that
    are no top-level value are a GPU section whose start was cut off (a half-pasted capture)."""
    top: dict[str, str] = {}
    starts = [i for i, ln in enumerate(lines) if _GPU_HEADER_RE.match(ln)]
    first = starts[0] if starts else len(lines)
    base = _indent(lines[first]) if starts else 0
    orphan: list[str] = []
    for ln in lines[:first]:
        if not ln.strip() or _BANNER_RE.search(ln):
            continue
        key, value = _split_kv(ln.strip())
        if value is not None and _norm(key) in _TOP_KEYS and _indent(ln) <= base:
            top[_norm(key)] = value
        else:
            orphan.append(ln)
    blocks: list[Block] = []
    warnings: list[str] = []
    if orphan:
        tree, entries, unparsed = parse_block(orphan)
        if any(p[0] in _GPU_FIRST_KEYS for p in tree):
            blocks.append(Block(None, tree, _text_processes(entries), len(unparsed)))
            warnings.append("the capture starts inside a GPU section (its 'GPU <PCI address>' line is not "
                            "in it): those lines are read as one GPU")
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        tree, entries, unparsed = parse_block(lines[start + 1:end], _indent(lines[start]) + 1)
        bus = _GPU_HEADER_RE.match(lines[start]).group("bus")  # type: ignore[union-attr]
        blocks.append(Block(bus, tree, _text_processes(entries), len(unparsed)))
    return top, blocks, warnings


# -- the XML form ------------------------------------------------------------------------------------
_ENTITY_RE = re.compile(r"<!ENTITY", re.IGNORECASE)


def _flatten(el: ET.Element) -> Tree:
    """Element -> {path of tags: text of a leaf, or None for an element with children}; first
    occurrence wins (iterative: no recursion limit on a hostile document)."""
    tree: Tree = {}
    stack: list[tuple[ET.Element, Path]] = [(el, ())]
    while stack:
        node, prefix = stack.pop()
        for child in reversed(list(node)):
            path = prefix + (str(child.tag).lower(),)
            if len(child):
                tree.setdefault(path, None)
                stack.append((child, path))
            else:
                tree.setdefault(path, (child.text or "").strip())
    return tree


def _xml_processes(gpu: ET.Element) -> list[dict[str, Any]]:
    procs = []
    for info in gpu.findall("processes/process_info"):
        procs.append({str(c.tag): (c.text or "").strip() for c in info if not len(c)})
    return procs


def parse_xml(text: str) -> tuple[dict[str, str], list[Block], list[str]]:
    """(top-level values, GPU blocks, warnings). A document cut short is read up to its last
    complete <gpu> element, with a warning."""
    if _ENTITY_RE.search(text):
        raise CaptureError("the XML declares entities, which nvidia-smi never does: refused")
    start = text.find("<")
    body = text[start:] if start >= 0 else text
    warnings: list[str] = []
    try:
        root = ET.fromstring(body)
    except ET.ParseError as e:
        end = body.rfind("</gpu>")
        try:
            if end < 0:
                raise ET.ParseError(str(e))
            root = ET.fromstring(body[:end + len("</gpu>")] + "\n</nvidia_smi_log>")
        except ET.ParseError:
            raise CaptureError(f"the XML does not parse ({e}) and holds no complete <gpu> element") from None
        warnings.append(f"the XML is cut short ({e}): read up to its last complete <gpu> element")
    if str(root.tag).lower() != "nvidia_smi_log":
        raise CaptureError(f"the XML's root is <{root.tag}>, not <nvidia_smi_log>")
    top = {}
    for tag, key in (("timestamp", "timestamp"), ("driver_version", "driver version"),
                     ("cuda_version", "cuda version"), ("attached_gpus", "attached gpus")):
        el = root.find(tag)
        if el is not None:
            top[key] = (el.text or "").strip()
    blocks = [Block(gpu.get("id"), _flatten(gpu), _xml_processes(gpu)) for gpu in root.findall("gpu")]
    return top, blocks, warnings


# -- one GPU -----------------------------------------------------------------------------------------
_GPU_FIRST_KEYS = {p[0] for _, tpaths, _, _ in SPECS for p in tpaths} | {
    "ecc errors", "temperature", "clocks event reasons", "clocks throttle reasons", "gpu reset status",
    "gpu recovery action", "processes", "product architecture", "pci", "gpu uuid"}

# ECC sums: alternatives of parts (the first alternative the capture holds whole is used)
_ECC = {
    TEXT: {
        "uncorrected": ((("dram uncorrectable",), ("sram uncorrectable",)),
                        (("dram uncorrectable",), ("sram uncorrectable parity",), ("sram uncorrectable sec-ded",)),
                        (("double bit", "total"),)),
        "corrected": ((("dram correctable",), ("sram correctable",)), (("single bit", "total"),)),
        "sram_uncorrected": ((("sram uncorrectable",),),
                             (("sram uncorrectable parity",), ("sram uncorrectable sec-ded",))),
    },
    XML: {
        "uncorrected": ((("dram_uncorrectable",), ("sram_uncorrectable",)),
                        (("dram_uncorrectable",), ("sram_uncorrectable_parity",), ("sram_uncorrectable_secded",)),
                        (("double_bit", "total"),)),
        "corrected": ((("dram_correctable",), ("sram_correctable",)), (("single_bit", "total"),)),
        "sram_uncorrected": ((("sram_uncorrectable",),),
                             (("sram_uncorrectable_parity",), ("sram_uncorrectable_secded",))),
    },
}
_ECC_BASE = {TEXT: ("ecc errors",), XML: ("ecc_errors",)}
_SRAM_THRESHOLD = {TEXT: ("ecc errors", "aggregate", "sram threshold exceeded"),
                   XML: ("ecc_errors", "aggregate", "sram_threshold_exceeded")}

# temperature thresholds: field -> (absolute path, T.Limit path) per format; the margin is ...T.Limit Temp
_TEMPS = {
    TEXT: {"shutdown_c": ("gpu shutdown temp", "gpu shutdown t.limit temp"),
           "slowdown_c": ("gpu slowdown temp", "gpu slowdown t.limit temp"),
           "gpu_max_c": ("gpu max operating temp", "gpu max operating t.limit temp")},
    XML: {"shutdown_c": ("gpu_temp_max_threshold", "gpu_temp_max_tlimit_threshold"),
          "slowdown_c": ("gpu_temp_slow_threshold", "gpu_temp_slow_tlimit_threshold"),
          "gpu_max_c": ("gpu_temp_max_gpu_threshold", "gpu_temp_max_gpu_tlimit_threshold")},
}
_TEMP_BASE = {TEXT: ("temperature",), XML: ("temperature",)}
_TLIMIT = {TEXT: "gpu t.limit temp", XML: "gpu_temp_tlimit"}

# clock-event (throttle) reasons: section spellings, and each reason's line -> gpucheck's name
_THROTTLE_SECTIONS = {TEXT: (("clocks event reasons",), ("clocks throttle reasons",)),
                      XML: (("clocks_event_reasons",), ("clocks_throttle_reasons",))}
_THROTTLE_LINES = {
    "gpu_idle": ("idle", "gpu_idle"),
    "applications_clocks_setting": ("applications clocks setting", "applications_clocks_setting"),
    "sw_power_cap": ("sw power cap", "sw_power_cap"),
    "hw_slowdown": ("hw slowdown", "hw_slowdown"),
    "hw_thermal_slowdown": ("hw thermal slowdown", "hw_thermal_slowdown"),
    "hw_power_brake_slowdown": ("hw power brake slowdown", "hw_power_brake_slowdown"),
    "sync_boost": ("sync boost", "sync_boost"),
    "sw_thermal_slowdown": ("sw thermal slowdown", "sw_thermal_slowdown"),
    "display_clock_setting": ("display clock setting", "display_clocks_setting"),
}
_THROTTLE_BITS = {name: 1 << i for i, name in enumerate(
    ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
     "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"))}

# "GPU Recovery Action" words -> gpucheck's names of nvmlDeviceGpuRecoveryAction_t (their NVML
# values come from pynvml's constants: gpucheck.platform.telemetry.enums.RECOVERY_ACTIONS)
RECOVERY_WORDS = {"none": "none", "reset": "gpu_reset", "gpu reset": "gpu_reset", "gpu reset required": "gpu_reset",
                  "reboot": "node_reboot", "node reboot": "node_reboot", "node reboot required": "node_reboot",
                  "drain p2p": "drain_p2p", "drain and reset": "drain_and_reset",
                  "recover imex domain": "recover_imex_domain", "bus reset": "bus_reset",
                  "system reboot": "system_reboot"}


def skeleton(index: int) -> dict[str, Any]:
    """A GPU entry with every field of docs/snapshot.md present and None."""
    g: dict[str, Any] = {"index": index, "state": "ok", "error": None}
    g.update({k: None for k in TOP_FIELDS})
    for group, kinds in GROUP_FIELDS.items():
        g[group] = {k: None for k in kinds}
    g["clocks"]["throttle_reason_names"] = None
    g["nvlink"] = {"supported": None, "links": []}
    g["errors"] = {}
    return g


def missing_gpu(index: int) -> dict[str, Any]:
    """A GPU the capture counts ("Attached GPUs") but holds no section of: nothing was examined."""
    g = skeleton(index)
    for key in TOP_FIELDS:
        if not key.endswith("_name") and key != "architecture_id":
            g["errors"][key] = NOT_IN_CAPTURE
    for group in (*GROUP_FIELDS, "nvlink"):
        g["errors"][group] = NOT_IN_CAPTURE
    g["capture"] = {"notes": ["this GPU is counted by 'Attached GPUs' but its section is not in the capture"]}
    return g


def _put(g: dict[str, Any], field: str, value: Any) -> None:
    group, _, key = field.partition(".")
    if key:
        g[group][key] = value
    else:
        g[group] = value


class GpuReader:
    """Reads one GPU block of a capture into a snapshot GPU entry (docs/snapshot.md)."""

    def __init__(self, index: int, block: Block, fmt: str, driver: str | None = None):
        self.g = skeleton(index)
        self.driver = driver
        self.tree, self.fmt, self.block = block.tree, fmt, block
        self.gone: list[tuple[str, str]] = []  # (state, what was read)
        self.notes: list[str] = []
        self.not_carried: dict[str, str] = {}  # field -> what to add (formatgaps)

    def find(self, text_paths: Iterable[Path], xml_paths: Iterable[Path]) -> Found:
        return lookup(self.tree, text_paths if self.fmt == TEXT else xml_paths)

    def take(self, field: str, found: Found, parse: Callable[[str], Any]) -> Any:
        """Store what `found` holds for `field`: a value, None (not supported), or a failed read."""
        if found.kind == "missing":
            self.g["errors"][field] = NOT_IN_CAPTURE
        elif found.kind == "failed":
            self.g["errors"][field] = found.detail or "other"
            self.notes.append(f"{field}: nvidia-smi printed {found.text!r}")
        elif found.kind == "gone":
            self.gone.append((found.detail or "reset_required", f"{' / '.join(found.path)}: {found.text}"))
        elif found.kind == "value":
            try:
                value = parse(found.text or "")
            except (ValueError, TypeError):
                self.g["errors"][field] = "other"
                self.notes.append(f"{field}: cannot read {found.text!r}")
                return None
            _put(self.g, field, value)
            return value
        return None

    def read(self) -> dict[str, Any]:
        for field, text_paths, xml_paths, parse in SPECS:
            self.take(field, self.find(text_paths, xml_paths), parse)
        self._identity()
        self._ecc()
        self._temperatures()
        self._throttle()
        self._recovery()
        self._reset_status()
        self._fabric()
        self.g["errors"]["nvlink"] = NOT_IN_CAPTURE  # nvidia-smi -q prints no NVLink state
        self._format_gaps()
        self._extras()
        if self.gone:
            state = "lost" if any(s == "lost" for s, _ in self.gone) else "reset_required"
            self.g["state"] = state
            self.g["error"] = {"kind": "gpu_lost" if state == "lost" else "reset_required",
                               "message": "nvidia-smi -q: " + "; ".join(w for _, w in self.gone)}
        return self.g

    def _identity(self) -> None:
        found = self.find([_p("PCI", "Bus Id")], [_p("pci", "pci_bus_id")])
        if found.kind == "missing" and self.block.bus:  # the section line names it
            found = Found("value", self.block.bus)
        self.take("pci_bus_id", found, _bus)
        arch = self.find([_p("Product Architecture")], [_p("product_architecture")])
        name = self.take("architecture", arch, lambda t: _word(t))
        if name is not None:
            arch_id = ARCHITECTURES.get(name)
            self.g["architecture"] = {8: "ada"}.get(arch_id, name) if arch_id else name
            self.g["architecture_id"] = arch_id
        elif "architecture" in self.g["errors"]:
            self.g["errors"]["architecture_id"] = self.g["errors"]["architecture"]

    def _sum(self, base: Path, alternatives: tuple[tuple[Path, ...], ...]) -> Found:
        """The sum of the parts of the first alternative the capture holds whole."""
        for parts in alternatives:
            founds = [lookup(self.tree, [base + part]) for part in parts]
            if any(f.kind == "missing" for f in founds):
                continue
            for kind in ("gone", "failed"):
                bad = [f for f in founds if f.kind == kind]
                if bad:
                    return bad[0]
            values = [f for f in founds if f.kind == "value"]
            if not values:
                return Found("na")
            try:
                return Found("value", str(sum(_count(f.text or "") for f in values)), path=values[0].path)
            except ValueError:
                return Found("value", values[0].text, path=values[0].path)  # take() reports it unreadable
        return Found("missing")

    def _ecc(self) -> None:
        table, base = _ECC[self.fmt], _ECC_BASE[self.fmt]
        for when in ("volatile", "aggregate"):
            b = base + (when,)
            self.take(f"ecc_errors.{when}_uncorrected", self._sum(b, table["uncorrected"]), _count)
            self.take(f"ecc_errors.{when}_corrected", self._sum(b, table["corrected"]), _count)
            self.take(f"ecc_errors.sram_{when}_uncorrected", self._sum(b, table["sram_uncorrected"]), _count)
        self.take("ecc_errors.sram_threshold_exceeded", lookup(self.tree, [_SRAM_THRESHOLD[self.fmt]]), _bool)

    def _temperatures(self) -> None:
        """Absolute thresholds where the capture prints them; else from the T.Limit form (R535+):
        each threshold is given as the margin at which it engages, the current margin is the
        "T.Limit Temp" line, so the threshold is the current temperature plus their difference."""
        base = _TEMP_BASE[self.fmt]
        current = self.g["temperature"]["gpu_c"]
        margin = lookup(self.tree, [base + (_TLIMIT[self.fmt],)])
        for field, (absolute, tlimit) in _TEMPS[self.fmt].items():
            found = lookup(self.tree, [base + (absolute,)])
            offset = lookup(self.tree, [base + (tlimit,)])
            if found.kind in ("missing", "na") and margin.kind == offset.kind == "value" and current is not None:
                try:
                    derived = current + _number(margin.text or "") - _number(offset.text or "")
                except ValueError:
                    self.take(f"temperature.{field}", offset, _number)  # unreadable: reported by take()
                    continue
                self.g["temperature"][field] = derived
                self.notes.append(f"temperature.{field} = {derived:g} C from the T.Limit form "
                                  f"(current {current:g} C, margin {margin.text}, threshold at margin {offset.text})")
            elif found.kind == "missing" and offset.kind != "missing":
                self.take(f"temperature.{field}", offset if offset.kind != "value" else margin, _number)
            else:
                self.take(f"temperature.{field}", found, _number)

    def _throttle(self) -> None:
        sections = _THROTTLE_SECTIONS[self.fmt]
        present = next((s for s in sections if s in self.tree), None)
        if present is None or isinstance(self.tree[present], str):  # not in the capture, or "N/A" as a whole
            self.take("clocks.throttle_reasons", lookup(self.tree, sections), int)
            return
        mask = self._throttle_mask(present)
        if mask is not None:
            self.g["clocks"]["throttle_reasons"] = mask
            self.g["clocks"]["throttle_reason_names"] = reason_names(mask)

    def _throttle_mask(self, section: Path) -> int | None:
        """The reasons' bit mask from their Active / Not Active lines. A reason the driver does not
        print (older generations) or prints as N/A is not set; without the HW Slowdown line, or with
        a line that cannot be read, the mask is not read (None, in `errors`)."""
        mask = 0
        for name, (text_key, xml_key) in _THROTTLE_LINES.items():
            key = text_key if self.fmt == TEXT else f"{section[0][:-1]}_{xml_key}"  # clocks_event_reason_...
            line = lookup(self.tree, [section + (key,)])
            if line.kind == "na" or (line.kind == "missing" and name != "hw_slowdown"):
                continue
            if line.kind == "value" and _word(line.text or "") in _TRUE | _FALSE:
                mask |= _THROTTLE_BITS[name] if _bool(line.text or "") else 0
                continue
            self.take("clocks.throttle_reasons", line, int)  # missing HW Slowdown, failed, unreadable
            return None
        return mask

    def _recovery(self) -> None:
        values = enums.resolve(enums.pynvml_module(), enums.RECOVERY_ACTIONS)

        def parse(text: str) -> int:
            name = RECOVERY_WORDS.get(_word(text))
            if name is None or name not in values:  # a word, or a value this pynvml does not know
                raise ValueError(text)
            return values[name]

        value = self.take("recovery_action", self.find([_p("GPU Recovery Action")], [_p("gpu_recovery_action")]), parse)
        if value is not None:
            self.g["recovery_action_name"] = enums.names_by_value(enums.pynvml_module(), enums.RECOVERY_ACTIONS)[value]

    def _reset_status(self) -> None:
        """GPU Reset Status (R450+): "Yes" means the driver wants this GPU reset before new work."""
        for label, xml_key in (("Reset Required", "reset_required"),
                               ("Drain and Reset Recommended", "drain_and_reset_recommended")):
            found = self.find([("gpu reset status", label.lower())], [("gpu_reset_status", xml_key)])
            if found.kind == "gone":
                self.gone.append((found.detail or "reset_required", f"GPU Reset Status: {found.text}"))
            elif found.kind == "value" and _word(found.text or "") in _TRUE:
                self.gone.append(("reset_required", f"GPU Reset Status: {label}: {found.text}"))

    def _format_gaps(self) -> None:
        """Fields this capture's format cannot carry (formatgaps): `not_in_format`, with the
        hint that names what to add kept in the GPU's `capture.not_carried`."""
        base = _ECC_BASE[self.fmt]
        old_layout = any(p[:len(base)] == base and ("single bit" in p or "single_bit" in p) for p in self.tree)
        for field, kind in sorted(self.g["errors"].items()):
            hint = gap_for(field, self.fmt, self.driver, old_layout) if kind == NOT_IN_CAPTURE else None
            if hint is not None:
                self.g["errors"][field] = NOT_IN_FORMAT
                self.not_carried[field] = hint

    def _fabric(self) -> None:
        """The Fabric section (R535+: State, Status; R550+: CliqueId, ClusterUUID; R570+: Health):
        the `fabric` group of platform.fabric.nvmlfabric in its words; "N/A": not supported."""
        state = self.find([_p("Fabric", "State")], [_p("fabric", "state")])
        if state.kind == "missing":
            self.g["errors"]["fabric"] = NOT_IN_CAPTURE
            return
        if state.kind != "value":
            self.take("fabric", state, str)  # N/A: not supported; a failed read: its kind
            return

        def words(*keys: str) -> str | None:
            found = self.find([_p("Fabric", *keys)], [_p("fabric", *(k.lower().replace(" ", "_") for k in keys))])
            return _word(found.text or "").replace(" ", "_") if found.kind == "value" else None

        clique = words("CliqueId")
        health = {k: v for k, v in (("degraded_bw", {"full": "false", "degraded": "true"}.get(words("Health", "Bandwidth")
                                                                                          or "")),
                                    ("route_recovery", words("Health", "Route Recovery in progress")),
                                    ("route_unhealthy", words("Health", "Route Unhealthy")),
                                    ("access_timeout_recovery", words("Health", "Access Timeout Recovery")))
                  if v is not None}
        uuid = self.find([_p("Fabric", "ClusterUUID")], [_p("fabric", "clusteruuid")])
        self.g["fabric"] = {"state": _word(state.text or "").replace(" ", "_"), "status": words("Status"),
                            "clique_id": int(clique) if clique is not None and clique.isdigit() else None,
                            "cluster_uuid": (uuid.text or "").strip() if uuid.kind == "value" else None,
                            "health_summary": words("Health", "Summary"), "health": health}

    def _extras(self) -> None:
        """What the capture shows that no check judges: kept under the GPU's "capture" key."""
        extra: dict[str, Any] = {}
        hist = ("remapped rows", "bank remap availability histogram") if self.fmt == TEXT else \
            ("remapped_rows", "remapped_row_histogram")
        bins = {p[-1]: v for p, v in self.tree.items() if len(p) == 3 and p[:2] == hist and isinstance(v, str)}
        if bins:
            extra["bank_remap_availability"] = bins
        proc = lookup(self.tree, [("processes",)])
        if self.block.processes:
            extra["processes"] = self.block.processes
        elif proc.kind in ("value", "na") and proc.text is not None:
            extra["processes"] = [] if _word(proc.text) in ("none", "") else proc.text
        if self.notes:
            extra["notes"] = list(self.notes)
        if self.not_carried:
            extra["not_carried"] = dict(self.not_carried)
        if extra:
            self.g["capture"] = extra


# -- the whole capture ---------------------------------------------------------------------------------
_KNOWN_KEYS = {p[-1] for _, tpaths, _, _ in SPECS for p in tpaths} | _GPU_FIRST_KEYS | {
    "clocks event reasons", "clocks throttle reasons", "remapped rows", "ecc mode", "hw slowdown",
    "gpu current temp", "dram uncorrectable", "sram uncorrectable", "reset required", "bus id"}


def detect(text: str) -> str | None:
    """TEXT or XML when `text` is an nvidia-smi capture (whole or a fragment), else None."""
    head = text.lstrip("\ufeff \t\r\n")
    if head.startswith(("{", "[")):
        return None
    if "<nvidia_smi_log" in head[:65536]:
        return XML
    known = 0
    for n, line in enumerate(head.splitlines()):
        if n > 5000:
            break
        if _BANNER_RE.search(line) or _GPU_HEADER_RE.match(line.lstrip("> ")):
            return TEXT
        key, value = _split_kv(line.lstrip("> ").strip())
        known += _norm(key) in _KNOWN_KEYS
        if known >= 2:
            return TEXT
    return None


def captured_at(timestamp: str | None) -> str:
    """nvidia-smi's "Thu Nov 14 07:00:14 2024" (the node's local time, zone not printed) as ISO
    without a zone; "unknown" when the capture has none that reads."""
    if not timestamp:
        return "unknown"
    try:
        return datetime.strptime(" ".join(timestamp.split()), "%a %b %d %H:%M:%S %Y").isoformat()
    except ValueError:
        return "unknown"


def _none_if_na(text: str | None) -> str | None:
    return None if text is None or classify(text)[0] != "value" else text.strip()


def _gpu_warnings(g: dict[str, Any]) -> list[str]:
    """What a GPU section lacks beyond what nvidia-smi -q never prints (NVLink state)."""
    missing = sorted(f for f, kind in g["errors"].items() if kind == NOT_IN_CAPTURE and f != "nvlink")
    if not missing:
        return []
    where = f"GPU {g['index']}" + (f" ({g['pci_bus_id']})" if g.get("pci_bus_id") else "")
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    return [f"{where}: {len(missing)} field(s) not in this capture: {shown}"]


def convert(text: str, where: str = "capture") -> dict[str, Any]:
    """An nvidia-smi capture (text or XML, whole or partial) -> a snapshot dict (docs/snapshot.md).
    Raises CaptureError (one line) for what is not one."""
    fmt = detect(text)
    if fmt is None:
        raise CaptureError(f"{where}: not an nvidia-smi -q capture (text or XML)")
    if fmt == XML:
        top, blocks, warnings = parse_xml(text)
    else:
        lines, warnings = clean_lines(text)
        top, blocks, more = split_text(lines)
        warnings += more
        unparsed = sum(b.unparsed for b in blocks)
        if unparsed:
            warnings.append(f"{unparsed} line(s) of the GPU sections could not be read (wrapped or cut lines?)")
    if not blocks:
        raise CaptureError(f"{where}: an nvidia-smi capture without any GPU section: nothing to judge")
    driver = _none_if_na(top.get("driver version"))
    gpus = [GpuReader(i, b, fmt, driver).read() for i, b in enumerate(blocks)]
    for g in gpus:
        warnings += _gpu_warnings(g)
    warnings += _count_warnings(top, gpus)
    return {
        "kind": KIND, "version": VERSION, "synthetic": False,
        "source": f"{fmt} capture ({where}), converted by gpucheck {__version__} (gpucheck.platform.telemetry.nvsmi)",
        "host": "unknown",  # an nvidia-smi capture does not name its host
        "captured_at": captured_at(top.get("timestamp")),
        "gpucheck_version": __version__,
        "nvml": {"ok": True, "error": None},
        "driver_version": _none_if_na(top.get("driver version")),
        "cuda_driver_version": _none_if_na(top.get("cuda version")),
        "nvml_version": None,
        "pci_nvidia_devices": [],
        "gpus": gpus,
        "capture": {"format": fmt, "timestamp": top.get("timestamp"), "attached_gpus": top.get("attached gpus"),
                    "gpu_sections": len(blocks), "warnings": warnings},
    }


def _count_warnings(top: dict[str, str], gpus: list[dict[str, Any]]) -> list[str]:
    """Compare the GPU sections with the capture's "Attached GPUs" line; append an entry for every
    GPU it counts whose section is not in the capture (every field "not in this capture")."""
    attached = top.get("attached gpus")
    if attached is None:
        return [f"no 'Attached GPUs' line: the node's GPU count is not in this capture "
                f"(judging the {len(gpus)} GPU section(s) it holds)"]
    try:
        count = int(attached.strip())
    except ValueError:
        return [f"'Attached GPUs: {attached}' does not read as a number"]
    if count > len(gpus):
        first = len(gpus)
        gpus.extend(missing_gpu(i) for i in range(first, count))
        return [f"the capture holds {first} of the {count} attached GPUs: GPU(s) {first}-{count - 1} "
                "are not in this capture (not judged: could not judge)"]
    if count < len(gpus):
        return [f"the capture holds {len(gpus)} GPU sections but says 'Attached GPUs: {count}'"]
    return []


def read_text(path: str | Any, limit: int | None = None) -> str:
    """The text of a snapshot or capture file a user named ("-": standard input), at most the
    snapshot size limit (gpucheck.platform.safeio.LIMITS): a regular file only (a FIFO or a device is
    refused, never read). Raises OSError (safeio.RefusedPath) or UnicodeDecodeError."""
    import os
    import sys

    from .. import safeio

    limit = safeio.LIMITS["snapshot"] if limit is None else limit
    if str(path) == "-":
        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:
            raise safeio.RefusedPath("-", f"too big: more than {limit} bytes (the limit for a snapshot file)")
        return data.decode("utf-8")
    return safeio.read_input(os.fspath(path), "snapshot").decode("utf-8")
