"""The GPU reader: one GPU's snapshot entry from an NVML session (live NVML, or a replay).

`read_gpu(session, index)` makes the NVML calls, maps each failure (gpucheck.platform.telemetry.nvml) and
fills a GpuEntry (gpucheck.platform.telemetry.model, docs/snapshot.md):
- a value NVML does not support on this GPU/driver is None (never 0, never "healthy");
- a read that failed for another reason is None too, and the entry's "errors" map names the field
  and the failure kind (no_permission, other, not_in_capture, ...);
- a GPU that NVML reports lost / reset-required stops being read: its "state" says so and its
  "error" holds NVML's message;
- an answer the reader does not understand (a binding that returned something unexpected) is a
  failed read (kind other) of the fields still unread in that section, never "not supported".

Every enum value it passes comes from pynvml's constants (session.enum); a constant this pynvml
does not define makes the call "not supported by this pynvml".
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from ..pci import normalize_bus_id
from . import enums
from . import nvml as N
from ..fabric import nvmlfabric
from .model import GpuEntry, NvLinkLink
from .throttle import reason_names

_STATE_OF_KIND = {N.GPU_LOST: "lost", N.RESET_REQUIRED: "reset_required"}
_READ_WHOLE = ("ecc_mode", "mig_mode", "remapped_rows")  # groups read by one NVML call: one field in `errors`


def empty_gpu(index: int) -> GpuEntry:
    """A GPU entry with every field present and unread (None)."""
    return {
        "index": index,
        "state": "ok",
        "error": None,
        "uuid": None,
        "name": None,
        "serial": None,
        "pci_bus_id": None,
        "pci_device_id": None,
        "architecture": None,
        "architecture_id": None,
        "persistence_mode": None,
        "ecc_mode": {"current": None, "pending": None},
        "mig_mode": {"current": None, "pending": None},
        "ecc_errors": {
            "volatile_corrected": None,
            "volatile_uncorrected": None,
            "aggregate_corrected": None,
            "aggregate_uncorrected": None,
            "sram_volatile_uncorrected": None,
            "sram_aggregate_uncorrected": None,
            "sram_threshold_exceeded": None,
        },
        "remapped_rows": {"correctable": None, "uncorrectable": None, "pending": None, "failure": None},
        "retired_pages": {"single_bit": None, "double_bit": None, "pending": None},
        "temperature": {"gpu_c": None, "slowdown_c": None, "shutdown_c": None, "gpu_max_c": None},
        "clocks": {"sm_mhz": None, "sm_max_mhz": None, "throttle_reasons": None, "throttle_reason_names": None},
        "power": {"usage_w": None, "limit_w": None},
        "pcie": {
            "link_gen": None,
            "link_gen_max": None,
            "link_gen_gpu_max": None,
            "link_width": None,
            "link_width_max": None,
            "replay_counter": None,
        },
        "nvlink": {"supported": None, "links": []},
        "recovery_action": None,
        "recovery_action_name": None,
        "fabric": None,
        "errors": {},
    }


class _Gone(Exception):
    def __init__(self, failure: N.NvmlFailure):
        super().__init__(str(failure))
        self.failure = failure


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def read_gpu(s: N.NvmlSession, index: int) -> GpuEntry:
    g = empty_gpu(index)
    try:
        h = s.handle(index)
    except N.NvmlCallError as e:
        g["state"] = _STATE_OF_KIND.get(e.failure.kind, "error")
        g["error"] = e.failure.to_dict()
        return g
    r = _Reader(s, g, h)
    sections: tuple[tuple[Callable[[], None], tuple[str, ...]], ...] = (
        (r.identity, ("uuid", "name", "serial", "pci_bus_id", "architecture")),
        (r.modes, ("persistence_mode", "ecc_mode", "mig_mode")),
        (r.memory, ("ecc_errors", "remapped_rows", "retired_pages")),
        (r.thermal_clocks, ("temperature", "clocks", "power")),
        (r.pcie, ("pcie",)),
        (r.fabric, ("fabric",)),
        (r.fields_and_nvlink, ("recovery_action", "nvlink")),
    )
    try:
        for read_section, fields in sections:
            try:
                read_section()
            except (_Gone, KeyboardInterrupt):
                raise
            except Exception:  # noqa: BLE001 - an answer the reader did not expect is a failed read
                _unread_after_crash(g, fields)
    except _Gone as e:
        g["state"] = _STATE_OF_KIND[e.failure.kind]
        g["error"] = e.failure.to_dict()
        s.forget(index)
    return g


def _unread_after_crash(g: GpuEntry, fields: tuple[str, ...]) -> None:
    """A section of the reader raised (an NVML binding that answered something unexpected):
    every field of it still unread is a failed read (kind other), never "not supported"."""
    errors = g["errors"]
    entry: dict[str, Any] = dict(g)  # walked by name
    for name in fields:
        value = entry.get(name)
        if name in _READ_WHOLE and isinstance(value, dict):
            if all(v is None for v in value.values()):
                errors.setdefault(name, N.OTHER)
        elif isinstance(value, dict) and name != "nvlink":
            for key, v in value.items():
                if v is None and not key.endswith("_names"):
                    errors.setdefault(f"{name}.{key}", N.OTHER)
        elif name == "nvlink" and not g["nvlink"].get("links"):
            errors.setdefault("nvlink", N.OTHER)
        elif value is None:
            errors.setdefault(name, N.OTHER)


class _Reader:
    """The sections of one GPU's read. `rd` makes one call and records its failure."""

    def __init__(self, s: N.NvmlSession, g: GpuEntry, h: Any):
        self.s = s
        self.g = g
        self.h = h
        self.errors = g["errors"]

    def rd(self, field: str, name: str, *enum_names: str, newer_enum: bool = False) -> Any:
        """One read of `field` by pynvml.<name>(handle, *values of enum_names). `newer_enum`: the
        call passes an enum value older drivers may not know (they answer INVALID_ARGUMENT),
        which means not supported by this driver."""
        try:
            args = [self.s.enum(e) for e in enum_names]
            return self.s.call(name, self.h, *args)
        except N.NvmlCallError as e:
            err = e.failure
        if err.kind in _STATE_OF_KIND:
            raise _Gone(err)
        if newer_enum and err.code is not None and err.code == self.s.const("NVML_ERROR_INVALID_ARGUMENT"):
            return None
        if err.kind != N.NOT_SUPPORTED:
            self.errors[field] = err.kind
        return None

    def identity(self) -> None:
        g, rd = self.g, self.rd
        v = rd("uuid", "nvmlDeviceGetUUID")
        g["uuid"] = None if v is None else N.text(v)
        v = rd("name", "nvmlDeviceGetName")
        g["name"] = None if v is None else N.text(v)
        v = rd("serial", "nvmlDeviceGetSerial")
        g["serial"] = None if v is None else N.text(v)
        pci = rd("pci_bus_id", "nvmlDeviceGetPciInfo")
        if pci is not None:
            bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
            g["pci_bus_id"] = normalize_bus_id(N.text(bus)) if bus is not None else None
            if g["pci_bus_id"] is None:  # NVML answered, but with no PCI address we can read
                self.errors["pci_bus_id"] = N.OTHER
            dev_id = getattr(pci, "pciDeviceId", None)
            if isinstance(dev_id, int):
                g["pci_device_id"] = f"{(dev_id >> 16) & 0xFFFF:#06x}"
        arch = rd("architecture", "nvmlDeviceGetArchitecture")
        if arch is not None:
            g["architecture_id"] = int(arch)
            g["architecture"] = enums.names_by_value(self.s.nvml, enums.ARCHITECTURES).get(int(arch), "unknown")

    def modes(self) -> None:
        g, rd = self.g, self.rd
        v = rd("persistence_mode", "nvmlDeviceGetPersistenceMode")
        g["persistence_mode"] = None if v is None else bool(v)
        v = rd("ecc_mode", "nvmlDeviceGetEccMode")
        if v is not None:
            g["ecc_mode"] = {"current": bool(v[0]), "pending": bool(v[1])}
        v = rd("mig_mode", "nvmlDeviceGetMigMode")
        if v is not None:
            g["mig_mode"] = {"current": bool(v[0]), "pending": bool(v[1])}

    def memory(self) -> None:
        g, rd = self.g, self.rd
        e = g["ecc_errors"]
        unc, cor = "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_MEMORY_ERROR_TYPE_CORRECTED"
        vol, agg = "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"
        e["volatile_uncorrected"] = _int(rd("ecc_errors.volatile_uncorrected", "nvmlDeviceGetTotalEccErrors", unc, vol))
        e["volatile_corrected"] = _int(rd("ecc_errors.volatile_corrected", "nvmlDeviceGetTotalEccErrors", cor, vol))
        e["aggregate_uncorrected"] = _int(rd("ecc_errors.aggregate_uncorrected", "nvmlDeviceGetTotalEccErrors", unc, agg))
        e["aggregate_corrected"] = _int(rd("ecc_errors.aggregate_corrected", "nvmlDeviceGetTotalEccErrors", cor, agg))
        sram = "NVML_MEMORY_LOCATION_SRAM"  # Turing+
        e["sram_volatile_uncorrected"] = _int(rd("ecc_errors.sram_volatile_uncorrected",
                                                 "nvmlDeviceGetMemoryErrorCounter", unc, vol, sram, newer_enum=True))
        e["sram_aggregate_uncorrected"] = _int(rd("ecc_errors.sram_aggregate_uncorrected",
                                                  "nvmlDeviceGetMemoryErrorCounter", unc, agg, sram, newer_enum=True))
        self.sram_status()
        v = rd("remapped_rows", "nvmlDeviceGetRemappedRows")
        if v is not None:
            corr, unc_rows, pending, failure = v
            g["remapped_rows"] = {"correctable": int(corr), "uncorrectable": int(unc_rows), "pending": bool(pending),
                                  "failure": bool(failure)}
        cause_sbe, cause_dbe = ("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
                                "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")
        sbe = rd("retired_pages.single_bit", "nvmlDeviceGetRetiredPages", cause_sbe)
        dbe = rd("retired_pages.double_bit", "nvmlDeviceGetRetiredPages", cause_dbe)
        pend = rd("retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus")
        g["retired_pages"] = {
            "single_bit": None if sbe is None else len(sbe),
            "double_bit": None if dbe is None else len(dbe),
            "pending": None if pend is None else bool(pend),
        }

    def sram_status(self) -> None:
        """SRAM status (R550+, needs root): the field-diag RMA threshold flag, and the SRAM
        counters where the location-based counter could not be read."""
        e = self.g["ecc_errors"]
        status_cls = self.s.constant("c_nvmlEccSramErrorStatus_v1_t", None)
        if status_cls is None:
            return
        st = status_cls()
        if self._sram_call(st) is None:
            return
        e["sram_threshold_exceeded"] = bool(st.bThresholdExceeded)
        # Where the location-based counter gave nothing, the status has it: read after all.
        if e["sram_volatile_uncorrected"] is None:
            e["sram_volatile_uncorrected"] = int(st.volatileUncParity) + int(st.volatileUncSecDed)
            self.errors.pop("ecc_errors.sram_volatile_uncorrected", None)
        if e["sram_aggregate_uncorrected"] is None:
            e["sram_aggregate_uncorrected"] = int(st.aggregateUncParity) + int(st.aggregateUncSecDed)
            self.errors.pop("ecc_errors.sram_aggregate_uncorrected", None)

    def _sram_call(self, st: Any) -> Any:
        field = "ecc_errors.sram_threshold_exceeded"
        try:
            return self.s.call("nvmlDeviceGetSramEccErrorStatus", self.h, ctypes.byref(st))
        except N.NvmlCallError as e:
            if e.failure.kind in _STATE_OF_KIND:
                raise _Gone(e.failure) from None
            if e.failure.kind != N.NOT_SUPPORTED:
                self.errors[field] = e.failure.kind
            return None

    def thermal_clocks(self) -> None:
        g, rd = self.g, self.rd
        t = g["temperature"]
        t["gpu_c"] = _int(rd("temperature.gpu_c", "nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"))
        t["slowdown_c"] = _int(rd("temperature.slowdown_c", "nvmlDeviceGetTemperatureThreshold",
                                  "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"))
        t["shutdown_c"] = _int(rd("temperature.shutdown_c", "nvmlDeviceGetTemperatureThreshold",
                                  "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"))
        t["gpu_max_c"] = _int(rd("temperature.gpu_max_c", "nvmlDeviceGetTemperatureThreshold",
                                 "NVML_TEMPERATURE_THRESHOLD_GPU_MAX", newer_enum=True))
        c = g["clocks"]
        c["sm_mhz"] = _int(rd("clocks.sm_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"))
        c["sm_max_mhz"] = _int(rd("clocks.sm_max_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"))
        mask = rd("clocks.throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None and "clocks.throttle_reasons" not in self.errors:  # not supported: pre-R535 name
            mask = rd("clocks.throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        c["throttle_reasons"] = _int(mask)
        c["throttle_reason_names"] = None if mask is None else reason_names(int(mask))
        p = g["power"]
        mw = rd("power.usage_w", "nvmlDeviceGetPowerUsage")
        p["usage_w"] = None if mw is None else round(int(mw) / 1000.0, 3)
        mw = rd("power.limit_w", "nvmlDeviceGetEnforcedPowerLimit")
        p["limit_w"] = None if mw is None else round(int(mw) / 1000.0, 3)

    def pcie(self) -> None:
        p, rd = self.g["pcie"], self.rd
        p["link_gen"] = _int(rd("pcie.link_gen", "nvmlDeviceGetCurrPcieLinkGeneration"))
        p["link_gen_max"] = _int(rd("pcie.link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"))
        p["link_gen_gpu_max"] = _int(rd("pcie.link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"))
        p["link_width"] = _int(rd("pcie.link_width", "nvmlDeviceGetCurrPcieLinkWidth"))
        p["link_width_max"] = _int(rd("pcie.link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"))
        p["replay_counter"] = _int(rd("pcie.replay_counter", "nvmlDeviceGetPcieReplayCounter"))

    def fabric(self) -> None:
        """NVML's GPU fabric info (platform.fabric.nvmlfabric): the v3 struct through
        nvmlDeviceGetGpuFabricInfoV (health included), else the first struct through
        nvmlDeviceGetGpuFabricInfo (a driver before the V call); not supported by either: None."""
        v3, version = self.s.constant("c_nvmlGpuFabricInfo_v3_t", None), self.s.const("nvmlGpuFabricInfo_v3")
        v1 = self.s.constant("c_nvmlGpuFabricInfo_t", None)
        tries = ([(v3, "nvmlDeviceGetGpuFabricInfoV")] if v3 is not None and version is not None else []) + (
            [(v1, "nvmlDeviceGetGpuFabricInfo")] if v1 is not None else [])
        failure: N.NvmlFailure | None = None
        for cls, call in tries:
            st = cls()
            if cls is v3:
                st.version = version
            try:
                self.s.call(call, self.h, ctypes.byref(st))
            except N.NvmlCallError as e:
                if e.failure.kind in _STATE_OF_KIND:
                    raise _Gone(e.failure) from None
                failure = e.failure
                older = e.failure.code is not None and e.failure.code == self.s.const("NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
                if e.failure.kind == N.NOT_SUPPORTED or older:  # older: a driver without the v3 struct
                    continue
                break
            self.g["fabric"] = nvmlfabric.decode(self.s.nvml, st)
            return
        if failure is not None and failure.kind != N.NOT_SUPPORTED:
            self.errors["fabric"] = failure.kind

    def fields_and_nvlink(self) -> None:
        """The NvLink link count and the GPU Recovery Action (field values), then the links."""
        s, g = self.s, self.g
        wanted = (("nvlink.link_count", "NVML_FI_DEV_NVLINK_LINK_COUNT"),
                  ("recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"))
        ids = {field: s.const(const) for field, const in wanted}  # None: not in this pynvml
        asked = [(field, fid) for field, fid in ids.items() if fid is not None]
        got: dict[str, Any] = {}
        try:
            values = s.field_values(self.h, [fid for _, fid in asked]) if asked else []
        except N.NvmlCallError as e:
            if e.failure.kind in _STATE_OF_KIND:
                raise _Gone(e.failure) from None
            values = [(None, e.failure)] * len(asked)
        for (field, _), (value, err) in zip(asked, values):
            if err is not None and err.kind in _STATE_OF_KIND:
                raise _Gone(err)
            if err is not None and err.kind != N.NOT_SUPPORTED:
                self.errors[field] = err.kind
            got[field] = value
        ra = got.get("recovery_action")
        if ra is not None:
            g["recovery_action"] = int(ra)
            g["recovery_action_name"] = enums.names_by_value(s.nvml, enums.RECOVERY_ACTIONS).get(int(ra), "unknown")
        lc = got.get("nvlink.link_count")
        self.nvlink(None if lc is None else int(lc))

    def _link_read(self, field: str, name: str, *args: Any) -> tuple[Any, N.NvmlFailure | None]:
        v, err = self.s.read(name, self.h, *args)
        if err is not None and err.kind in _STATE_OF_KIND:
            raise _Gone(err)
        return v, err

    def nvlink(self, link_count: int | None) -> None:
        """Each link's state and error counters; without a link count, links are probed until
        NVML says the index is invalid (NVML_NVLINK_MAX_LINKS at most)."""
        s = self.s
        states = enums.names_by_value(s.nvml, enums.NVLINK_STATES)
        counters = enums.resolve(s.nvml, enums.NVLINK_COUNTERS)
        invalid = s.const("NVML_ERROR_INVALID_ARGUMENT")
        links: list[NvLinkLink] = []
        failed = False
        probe = link_count is None
        for link in range(link_count if link_count is not None else (s.const("NVML_NVLINK_MAX_LINKS") or 0)):
            state, err = self._link_read(f"nvlink.links[{link}].state", "nvmlDeviceGetNvLinkState", link)
            if err is not None:
                if probe and err.code is not None and err.code == invalid:
                    break  # past this GPU's last link
                if err.kind == N.NOT_SUPPORTED:
                    if not probe:
                        links.append(_unread_link(link, None))
                    continue
                self.errors[f"nvlink.links[{link}].state"] = err.kind
                failed = True
                continue
            entry = _unread_link(link, states.get(int(state), f"unknown_{int(state)}"))
            for key in enums.NVLINK_COUNTER_KEYS:
                v: Any = None
                if key in counters:
                    v, cerr = self._link_read("", "nvmlDeviceGetNvLinkErrorCounter", link, counters[key])
                    if cerr is not None and cerr.kind != N.NOT_SUPPORTED:
                        self.errors[f"nvlink.links[{link}].{key}"] = cerr.kind
                entry[key] = _int(v)  # type: ignore[literal-required]
            links.append(entry)
        judged = [lk for lk in links if lk["state"] is not None]
        supported: bool | None = True if judged else (None if failed else False)
        self.g["nvlink"] = {"supported": supported, "links": links if supported else []}


def _unread_link(link: int, state: str | None) -> NvLinkLink:
    return {"link": link, "state": state, "replay_errors": None, "recovery_errors": None, "crc_flit_errors": None,
            "crc_data_errors": None}
