"""The load-test guard: a GPU that a job is using is not loaded.

Before a load check (burn.gemm, poet.ortho, repro.bitwise, eud.memtest, eud.bandwidth,
eud.power, eud.dcgm, nccl.intra, `gpucheck nccl run`) starts loading GPU N, it reads the
processes NVML lists on N (compute, graphics, MPS clients: gpucheck.platform.telemetry.nvml.
read_gpu_processes). gpucheck's own processes (this process and its descendants: the workers of
a previous check) are not a job.

- Busy: the GPU is not loaded; its result is a `skip` with `unexamined=True` naming the PIDs,
  process names and memory ("GPU 2 is in use by PID 4711 (python), 5 GiB: not loaded; --force to
  load it anyway"), so the run exits 3. The other GPUs are still tested.
- The process list could not be read (NVML not working, no permission, a lost GPU, NVML not
  answering): the same, with the reason: a GPU is never assumed idle.
- `--force` (ctx.force): loaded anyway, and the GPU's results say so in their evidence.
- `--device cpu` has no GPU to protect: no guard, nothing said.

The processes come from the run's telemetry source (`ctx.telemetry.gpu_processes`: live NVML
read in a bounded thread, a replay's recording, or a fake one in tests).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypedDict

from ..core.result import Result, Status

if TYPE_CHECKING:  # pragma: no cover
    from ..core.check import Context
    from ..platform.telemetry.source import TelemetrySource
    from .targets import WorkerTarget

FORCE_HINT = "--force to load it anyway"
READ_TIMEOUT_S = 15.0  # a hung driver must not hang the check: past this, "could not read"
SUMMARY_PROCESSES = 3  # processes named in a summary; the evidence lists every one

# -- reading ----------------------------------------------------------------------------------------
def read_processes(indices: list[int], *, timeout_s: float = READ_TIMEOUT_S,
                   cancel: threading.Event | None = None) -> Mapping[int, Any]:
    """{index: GpuProcesses} for every index, from live NVML, never raising or hanging."""
    from ..platform.telemetry.source import LiveTelemetry

    return LiveTelemetry(process_timeout_s=timeout_s).gpu_processes(indices, cancel=cancel)


def own_pids() -> set[int]:
    """This process and its descendants: gpucheck's own, never a job."""
    pids = {os.getpid()}
    try:
        import psutil  # noqa: PLC0415

        pids.update(p.pid for p in psutil.Process().children(recursive=True))
    except Exception:  # noqa: BLE001 - psutil missing or /proc racing: this process at least
        pass
    return pids


# -- describing ----------------------------------------------------------------------------------
def memory_text(b: int | None) -> str:
    if b is None:
        return "memory not reported"
    if b < 1 << 30:
        return f"{b / (1 << 20):.0f} MiB"
    return f"{b / (1 << 30):.3g} GiB"


def process_text(p: Any) -> str:
    """'PID 4711 (python), 5 GiB'."""
    return f"PID {p.pid} ({p.name or 'name not readable'}), {memory_text(p.used_memory_bytes)}"


def _processes_text(procs: list[Any]) -> str:
    shown = [process_text(p) for p in procs[:SUMMARY_PROCESSES]]
    more = len(procs) - len(shown)
    return "; ".join(shown) + (f" and {more} more process(es)" if more > 0 else "")


@dataclass
class GpuState:
    """One GPU as the guard sees it: idle, busy (the job's processes) or unreadable (why)."""

    gpu: int
    busy: list[Any] = field(default_factory=list)  # GpuProcess of other processes
    unreadable: str | None = None
    evidence: list[str] = field(default_factory=list)

    @property
    def in_use(self) -> bool:
        return bool(self.busy) or self.unreadable is not None

    def why(self) -> str:
        """What stops this GPU from being loaded (without the consequence)."""
        if self.unreadable is not None:
            return f"its running processes could not be read ({self.unreadable}), so a job may be using it"
        return f"in use by {_processes_text(self.busy)}"


def gpu_state(gpu: int, read: Any, own: set[int]) -> GpuState:
    """Judge one GPU's GpuProcesses (None: the reader gave nothing for it: unreadable)."""
    st = GpuState(gpu)
    if read is None or not read.readable:
        st.unreadable = str(read.failure) if read is not None and read.failure else "no answer for this GPU"
        return st
    for p in read.processes:
        kinds = "+".join(p.kinds)
        line = f"PID {p.pid} ({p.name or 'name not readable'}): {kinds} context, {memory_text(p.used_memory_bytes)}"
        if p.pid in own:
            st.evidence.append(f"not counted (gpucheck's own process): {line}")
        else:
            st.busy.append(p)
            st.evidence.append(line)
    st.evidence.extend(read.notes)
    return st


# -- the guard --------------------------------------------------------------------------------------
@dataclass
class Guard:
    """What a load check may load: `loaded` GPUs; `skipped` results for the GPUs it must not
    load; `notes` per GPU that --force loaded although in use (for the evidence)."""

    loaded: list[int] = field(default_factory=list)
    skipped: list[Result] = field(default_factory=list)
    notes: dict[int, list[str]] = field(default_factory=dict)
    everywhere: list[str] = field(default_factory=list)  # --force notes about no GPU in particular

    def annotate(self, results: list[Result]) -> list[Result]:
        """Add the --force notes to the results of those GPUs (to the node's results when the
        check has no result for the GPU itself). Returns `results`."""
        for g, lines in self.notes.items():
            mine = [r for r in results if r.gpu == g] or [r for r in results if r.gpu is None]
            for r in mine:
                r.evidence.extend(line for line in lines if line not in r.evidence)
        for r in results:
            r.evidence.extend(line for line in self.everywhere if line not in r.evidence)
        return results


def skip_result(check_id: str, st: GpuState) -> Result:
    if st.unreadable is not None:
        summary = f"GPU {st.gpu}: {st.why()}: not loaded; {FORCE_HINT}"
    else:
        summary = f"GPU {st.gpu} is {st.why()}: not loaded; {FORCE_HINT}"
    r = Result(check_id, Status.SKIP, summary, gpu=st.gpu, unexamined=True, evidence=list(st.evidence))
    if st.unreadable is None:
        r.metric("processes", len(st.busy), "count")
        known = [p.used_memory_bytes for p in st.busy if p.used_memory_bytes is not None]
        if known:
            r.metric("process_memory_bytes", sum(known), "B")
    return r


def guard_gpus(gpus: list[int], *, check_id: str, force: bool, telemetry: "TelemetrySource | None" = None,
               cancel: threading.Event | None = None) -> Guard:
    """Read the processes of `gpus` from `telemetry` (None: live NVML) and split them into loaded
    and skipped (see the module)."""
    if not gpus:
        return Guard()
    if telemetry is not None:
        read = telemetry.gpu_processes(list(gpus), cancel=cancel)
    else:
        read = read_processes(list(gpus), cancel=cancel)
    own = own_pids()
    guard = Guard()
    for g in gpus:
        st = gpu_state(g, read.get(g), own)
        if not st.in_use:
            guard.loaded.append(g)
        elif force:
            guard.loaded.append(g)
            guard.notes[g] = [f"--force: loaded although GPU {g} is {st.why()}", *st.evidence]
        else:
            guard.skipped.append(skip_result(check_id, st))
    return guard


def unknown_gpus(check_id: str, *, force: bool, why: str) -> Guard:
    """For a check that would load GPUs it cannot name (NVML lists none, DCGM finds its own):
    nothing is known to be free. A node-level unexamined skip, or with --force a note."""
    problem = f"cannot tell whether the GPUs are in use: {why}"
    if force:
        return Guard(everywhere=[f"--force: loaded although {problem}"])
    return Guard(skipped=[Result(check_id, Status.SKIP, f"{problem}: not loaded; {FORCE_HINT}", unexamined=True)])


def guard_context(ctx: "Context", device: str, check_id: str, gpus: list[int]) -> Guard:
    """guard_gpus with the run's --force, telemetry source and cancel event; no guard on CPU
    workers."""
    if device == "cpu":
        return Guard(loaded=list(gpus))
    return guard_gpus(gpus, check_id=check_id, force=ctx.force, telemetry=ctx.telemetry, cancel=ctx.cancel)


def guarded_targets(ctx: "Context", device: str, check_id: str, verb: str = "tested"
                    ) -> tuple[list["WorkerTarget"], list[Result], Guard]:
    """workers.targets.worker_targets, less the GPUs in use: (targets, skip results, guard)."""
    from .targets import worker_targets

    targets, results = worker_targets(ctx, device, check_id, verb)
    guard = guard_context(ctx, device, check_id, [t["gpu"] for t in targets])
    loaded = set(guard.loaded)
    return [t for t in targets if t["gpu"] in loaded], results + guard.skipped, guard


# -- `gpucheck nccl run`: which GPU is CUDA device N? -----------------------------------------------
class NvmlDevice(TypedDict):
    """One GPU as NVML numbers it (nvml_devices)."""

    index: int
    uuid: str | None
    name: str | None


def cuda_to_nvml(local_ranks: list[int], environ: Mapping[str, str], devices: list[NvmlDevice]
                 ) -> tuple[dict[int, int], str | None]:
    """The NVML index of each local rank's CUDA device, and a problem when that cannot be told.

    `devices`: NVML's GPUs in index order ({"index", "uuid", "name"}). CUDA_VISIBLE_DEVICES
    entries are CUDA indices or (prefixes of) UUIDs; CUDA stops at the first entry it cannot use.
    A CUDA index is the NVML index when CUDA orders by PCI bus (CUDA_DEVICE_ORDER=PCI_BUS_ID) or
    when every GPU is the same model (CUDA's default fastest-first order then falls back to the
    bus order); otherwise it cannot be told. A rank past the visible devices gets no GPU (its
    rank fails by itself) and no entry."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    by_index = {int(d["index"]): d for d in devices}
    visible: list[int] = []
    by_number = cvd is None
    for entry in ([] if cvd is None else [e.strip() for e in cvd.split(",")]):
        if entry.isdigit() and int(entry) in by_index:
            visible.append(int(entry))
            by_number = True
        elif entry.startswith("GPU-"):
            hits = [d for d in devices if str(d.get("uuid") or "").startswith(entry)]
            if len(hits) != 1:
                break
            visible.append(int(hits[0]["index"]))
        elif entry.startswith("MIG-"):
            return {}, f"CUDA_VISIBLE_DEVICES names a MIG instance ({entry}): its GPU cannot be told"
        else:
            break
    if cvd is None:
        visible = sorted(by_index)
    models = {d.get("name") for d in devices if d.get("name")}
    if by_number and len(models) > 1 and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return {}, ("GPUs of different models and CUDA's fastest-first order: which GPU a CUDA index is "
                    "cannot be told (set CUDA_DEVICE_ORDER=PCI_BUS_ID)")
    return {lr: visible[lr] for lr in local_ranks if 0 <= lr < len(visible)}, None


def nvml_devices(*, timeout_s: float = READ_TIMEOUT_S) -> tuple[list[NvmlDevice] | None, str | None]:
    """NVML's GPUs as [{"index", "uuid", "name"}], or (None, why)."""
    from ..platform.telemetry.nvml import NvmlSession, text
    from ..platform.telemetry.source import bounded

    def read() -> tuple[list[NvmlDevice] | None, str | None]:
        with NvmlSession() as s:
            if not s.ok:
                return None, str(s.error)
            n = s.device_count()
            if n is None:
                return None, "NVML could not count the GPUs"
            out: list[NvmlDevice] = []
            for i in range(n):
                h, failure = s.read("nvmlDeviceGetHandleByIndex", i)
                uuid, _ = (None, None) if failure else s.read("nvmlDeviceGetUUID", h)
                name, _ = (None, None) if failure else s.read("nvmlDeviceGetName", h)
                out.append({"index": i, "uuid": None if uuid is None else text(uuid),
                            "name": None if name is None else text(name)})
            return out, None

    value, why = bounded(read, timeout_s, None)
    return (None, why) if why is not None else value


def guard_ranks(local_ranks: list[int], *, force: bool, environ: Mapping[str, str],
                devices_fn: Callable[[], tuple[list[NvmlDevice] | None, str | None]] = nvml_devices,
                telemetry: "TelemetrySource | None" = None) -> tuple[list[str], list[str]]:
    """For `gpucheck nccl run`: (refusals, notes). A refusal is one line per GPU this invocation's
    ranks would load that is in use or unreadable (none with --force: they become notes)."""
    devices, why = devices_fn()
    mapping, problem = ({}, f"cannot tell whether the GPUs are in use: {why}") if devices is None \
        else cuda_to_nvml(local_ranks, environ, devices)
    if problem is not None:
        return ([], [f"--force: {problem}"]) if force else ([f"{problem}: not loaded; {FORCE_HINT}"], [])
    gpus = sorted(set(mapping.values()))
    guard = guard_gpus(gpus, check_id="nccl.run", force=force, telemetry=telemetry)
    return [r.summary for r in guard.skipped], [guard.notes[g][0] for g in gpus if g in guard.notes]
