"""`gpucheck telemetry show`: a snapshot (live, recorded, or imported from nvidia-smi) as one
readable line per GPU, without judging it (`gpucheck run --snapshot` judges).

    gpu-h100-017  driver 550.90.07  CUDA 12.4  NVML ok  8 GPU(s), 8 NVIDIA PCI device(s)
    gpu bus id       state name                  temp power W   SM MHz    PCIe      NVLink ECC unc ECC corr remap
    0   0000:18:00.0 ok    NVIDIA H100 80GB HBM3 31 C 118/700   1980/1980 Gen5 x16  18/18  0/0     0/0      0/0

Then one line per GPU with something to notice (a clock slowdown reason, a pending or failed row
remap, ECC or MIG mode changes pending, fields that could not be read, a lost GPU's error).
Every value is printed as it is in the snapshot (`-`: not supported or not read).
"""

from __future__ import annotations

from typing import Any, Mapping

from .console import STYLES, line, make_console, styled

_COLUMNS = ("gpu", "bus id", "state", "name", "temp", "power W", "SM MHz", "PCIe", "NVLink", "ECC unc", "ECC corr",
            "remap")
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost"})


def _v(value: Any, fmt: str = "") -> str:
    if value is None or isinstance(value, (dict, list)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and fmt:
        return format(value, fmt)
    return str(value)


def _pair(a: Any, b: Any, fmt: str = "") -> str:
    return f"{_v(a, fmt)}/{_v(b, fmt)}"


def _get(g: Mapping[str, Any], group: str, key: str) -> Any:
    part = g.get(group)
    return part.get(key) if isinstance(part, Mapping) else None


def gpu_row(g: Mapping[str, Any]) -> list[str]:
    """The columns of one GPU entry."""
    temp = _get(g, "temperature", "gpu_c")
    now = (_get(g, "pcie", "link_gen"), _get(g, "pcie", "link_width"))
    best = (_get(g, "pcie", "link_gen_max"), _get(g, "pcie", "link_width_max"))
    pcie = "-" if now == (None, None) else f"Gen{_v(now[0])} x{_v(now[1])}"
    if best != (None, None) and best != now:
        pcie += f" (max Gen{_v(best[0])} x{_v(best[1])})"
    links = _get(g, "nvlink", "links")
    if _get(g, "nvlink", "supported") is False:
        nvlink = "none"
    elif isinstance(links, list) and links:
        active = sum(1 for ln in links if isinstance(ln, Mapping) and ln.get("state") == "active")
        nvlink = f"{active}/{len(links)}"
    else:
        nvlink = "-"
    return [
        _v(g.get("index")), _v(g.get("pci_bus_id")), _v(g.get("state")), _v(g.get("name")),
        "-" if temp is None else f"{_v(temp, '.0f')} C",
        _pair(_get(g, "power", "usage_w"), _get(g, "power", "limit_w"), ".0f"),
        _pair(_get(g, "clocks", "sm_mhz"), _get(g, "clocks", "sm_max_mhz"), ".0f"),
        pcie, nvlink,
        _pair(_get(g, "ecc_errors", "volatile_uncorrected"), _get(g, "ecc_errors", "aggregate_uncorrected")),
        _pair(_get(g, "ecc_errors", "volatile_corrected"), _get(g, "ecc_errors", "aggregate_corrected")),
        _pair(_get(g, "remapped_rows", "correctable"), _get(g, "remapped_rows", "uncorrectable")),
    ]


def gpu_notes(g: Mapping[str, Any]) -> list[str]:
    """What stands out in one GPU entry, as short phrases."""
    notes = []
    if g.get("state") not in (None, "ok"):
        err: Mapping[str, Any] = g["error"] if isinstance(g.get("error"), Mapping) else {}
        notes.append(f"{g.get('state')}: {err.get('message') or err.get('kind') or 'no detail'}")
    reasons = [r for r in _get(g, "clocks", "throttle_reason_names") or [] if r not in BENIGN_REASONS]
    if reasons:
        notes.append("clock events: " + ", ".join(map(str, reasons)))
    for key, text in (("pending", "row remap pending (reset the GPU)"), ("failure", "row remap FAILED")):
        if _get(g, "remapped_rows", key):
            notes.append(text)
    if _get(g, "ecc_errors", "sram_threshold_exceeded"):
        notes.append("SRAM ECC threshold exceeded")
    for group, what in (("ecc_mode", "ECC"), ("mig_mode", "MIG")):
        cur, pend = _get(g, group, "current"), _get(g, group, "pending")
        if cur is not None and pend is not None and cur != pend:
            notes.append(f"{what} mode change pending ({_v(cur)} -> {_v(pend)})")
    if g.get("recovery_action_name") not in (None, "none"):
        notes.append(f"recovery action: {g.get('recovery_action_name')}")
    retired = _get(g, "retired_pages", "double_bit"), _get(g, "retired_pages", "single_bit")
    if any(isinstance(x, int) and x for x in retired):
        notes.append(f"retired pages: {_v(retired[0])} double-bit, {_v(retired[1])} single-bit")
    errors = g.get("errors") if isinstance(g.get("errors"), Mapping) else {}
    if errors:
        notes.append("not read: " + ", ".join(f"{k} ({v})" for k, v in errors.items()))
    return notes


def header_line(snap: Mapping[str, Any], path: str | None) -> Any:
    nvml: Mapping[str, Any] = snap["nvml"] if isinstance(snap.get("nvml"), Mapping) else {}
    err: Mapping[str, Any] = nvml["error"] if isinstance(nvml.get("error"), Mapping) else {}
    state = styled("NVML ok", STYLES["pass"]) if nvml.get("ok") else \
        styled(f"NVML unavailable: {err.get('kind')}: {err.get('message')}", STYLES["fail"])
    gpus, pci = snap.get("gpus") or [], snap.get("pci_nvidia_devices") or []
    text = line(styled(_v(snap.get("host")), "bold"), f"  driver {_v(snap.get('driver_version'))}",
                f"  CUDA {_v(snap.get('cuda_driver_version'))}  ", state,
                f"  {len(gpus)} GPU(s), {len(pci)} NVIDIA PCI device(s)")
    where = f"snapshot {path}" if path else "live"
    text.append(f"  ({where}, captured {_v(snap.get('captured_at'))}"
                + (", synthetic" if snap.get("synthetic") else "") + ")")
    return text


def show_lines(snap: Mapping[str, Any], path: str | None = None) -> list[Any]:
    """The whole view: header, one row per GPU, notes, the kernel log's size."""
    out = [header_line(snap, path)]
    gpus = [g for g in snap.get("gpus") or [] if isinstance(g, Mapping)]
    rows = [gpu_row(g) for g in gpus]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(_COLUMNS)]
    if gpus:
        out.append(styled(" ".join(f"{h:<{w}}" for h, w in zip(_COLUMNS, widths)).rstrip(), "bold"))
    for g, row in zip(gpus, rows):
        text = line()
        for i, (cell, w) in enumerate(zip(row, widths)):
            style = STYLES["fail"] if i == 2 and cell not in ("ok", "-") else None
            text.append(f"{cell:<{w}}" + (" " if i < len(row) - 1 else ""), style=style)
        text.rstrip()
        out.append(text)
    if not gpus:
        out.append(styled("no GPU listed by NVML", "dim"))
    bus_ids = {g.get("pci_bus_id") for g in gpus}
    missing = [d.get("bus_id") for d in snap.get("pci_nvidia_devices") or [] if isinstance(d, Mapping)
               and d.get("bus_id") not in bus_ids]
    if missing:
        out.append(line(styled("on the PCI bus, not in NVML:", STYLES["warn"]), " ", ", ".join(map(str, missing))))
    for g in gpus:
        for note in gpu_notes(g):
            out.append(line(styled(f"gpu{_v(g.get('index'))}", "bold"), ": ", note))
    log = snap.get("kernel_log")
    if isinstance(log, Mapping):
        lines: list[Any] = log["lines"] if isinstance(log.get("lines"), list) else []
        out.append(styled(f"kernel log: {len(lines)} NVRM/NVSwitch line(s) from {_v(log.get('source'))}"
                          + (f" ({log.get('error')})" if log.get("error") else ""), "dim"))
    return out


def print_snapshot(snap: Mapping[str, Any], path: str | None = None, file=None, *, width: int | None = None,
                   color: bool | None = None) -> None:
    console = make_console(file, width=width, color=color)
    for text in show_lines(snap, path):
        console.print(text, soft_wrap=True)  # a GPU's row is never broken: the terminal wraps it
