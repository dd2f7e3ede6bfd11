"""A session over gpucheck's replay backend (gpucheck.platform.telemetry.replay) for one recorded GPU entry,
that logs the reader's NVML calls and can fail one of them.

`read_gpu(SnapshotNvml(entry), index)` gives the entry back through the production reader and the
production replay (the tests check that first), so that making one call fail (`fail=`) shows
exactly what the reader records for that failed read. The log holds each call made on a GPU
handle as (NVML function name, its integer arguments after the handle); each field of
nvmlDeviceGetFieldValues is logged and failed as ("field", id).
"""

from __future__ import annotations

from typing import Any

from gpucheck.platform.telemetry import nvml as N
from gpucheck.platform.telemetry.replay import NVMLError_Replayed, ReplayNvml
from gpucheck.platform.telemetry.model import KIND, VERSION

Call = tuple[Any, ...]
UNKNOWN = N.code("NVML_ERROR_UNKNOWN")


def recording_of(gpu: dict[str, Any]) -> dict[str, Any]:
    """A minimal recording holding one GPU entry."""
    return {"kind": KIND, "version": VERSION, "synthetic": True, "source": "synthetic: one GPU entry", "host": "t",
            "captured_at": "2025-01-01T00:00:00Z", "nvml": {"ok": True, "error": None}, "driver_version": "550.90.07",
            "cuda_driver_version": "12.4", "nvml_version": "12.550.90.07", "pci_nvidia_devices": [], "gpus": [gpu]}


class CallLog(ReplayNvml):
    """ReplayNvml that logs the calls made on a GPU handle and fails `fail` (NVML_ERROR_UNKNOWN)."""

    def __init__(self, doc: dict[str, Any], fail: Call | None = None):
        super().__init__(doc)
        self.fail = fail
        self.calls: list[Call] = []

    def answer(self, name: str, *args: Any) -> Any:
        if not args or not isinstance(args[0], int) or name == "nvmlDeviceGetHandleByIndex":
            return super().answer(name, *args)  # not a call on a GPU handle (a handle is its index)
        if name == "nvmlDeviceGetFieldValues":
            out = super().answer(name, *args)
            for v in out:
                self.calls.append(("field", v.fieldId))
                if ("field", v.fieldId) == self.fail:
                    v.nvmlReturn = UNKNOWN
            return out
        call = (name, *(a for a in args[1:] if isinstance(a, int)))
        self.calls.append(call)
        if call == self.fail:
            raise NVMLError_Replayed(UNKNOWN, "injected failure")
        return super().answer(name, *args)


class SnapshotNvml(N.NvmlSession):
    """An NvmlSession over the replay of one GPU entry (see the module)."""

    def __init__(self, gpu: dict[str, Any], fail: Call | None = None, replay: type[CallLog] = CallLog):
        self.replay = replay(recording_of(gpu), fail)
        super().__init__(N.Library(lambda: self.replay))

    @property
    def calls(self) -> list[Call]:
        return self.replay.calls
