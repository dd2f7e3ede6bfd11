"""Copy bandwidth measurement (eud.bandwidth): plain data, no judgement.

`copybw_worker(args, chan)` is the worker target (gpucheck.workers.pool). One worker measures
every GPU of the node, one GPU at a time (GPUs behind one PCIe switch share its uplink: measured
together they would look slow), then every ordered pair of GPUs:

- H2D and D2H: `h2d_bytes` between a pinned host buffer and the GPU (torch `copy_`,
  non_blocking: one copy-engine transfer each), `repeats` timed transfers after `warmup`
  untimed ones, each timed with CUDA events; the median is the GPU's number. The host buffer is
  fresh anonymous memory (mmap), first touched by this thread alone (a memset, not a torch op:
  torch's CPU thread pool keeps the CPU affinity its threads were created with) while the thread
  is pinned to the GPU's local CPUs (sysfs `local_cpulist` of its PCI device), then page-locked
  with cudaHostRegister, so it lives on the GPU's NUMA node (what nvbandwidth's CPU affinity
  control and Azure's per-NUMA test achieve). sched_setaffinity on one's own thread needs no
  privilege; a CPU set the process may not use (cgroup cpuset) is reported, not fatal.
  While the H2D transfers run, NVML's current PCIe link generation and width are read (NVML is
  opened and the GPU's handle found, by UUID where known, before the transfers are queued, so
  the read lands while they run): the link state under load, not the idle state a snapshot sees.
- D2D: a copy of `d2d_bytes` within the GPU's memory; counted as bytes read plus bytes written.
- P2P: for each ordered pair (src, dst) that can access each other (torch.cuda.
  can_device_access_peer), a copy of `p2p_bytes` from a buffer on src to one on dst, timed on
  src's stream (torch issues cross-device copies there), bytes transferred once. Pairs without
  peer access are listed as such, not measured (the copy would be staged through the host).

On `--device cpu` each CPU worker number stands in for a GPU and every "transfer" is a host
memcpy between two host tensors (timed with perf_counter): the whole path runs in tests, and the
results say that the numbers are host memory bandwidth.

Fault injection: `slow` ({gpu: factor}) multiplies that GPU's measured bandwidths (and those of
the pairs it is in) by the factor, after measuring; the result lists it.

torch is imported only inside the worker (and by benchmarks that call `measure` directly).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.results import (CopyBwBrief, CopyBwGpu, CopyBwPair, CopyBwResult, CopyMeasure, LinkUnderLoad,
                                   NumaPlacement, SetupError)

MiB = 1 << 20


class CopyBwTarget(TypedDict):
    """A GPU the copy-bandwidth worker measures."""

    gpu: int  # NVML index (or the CPU worker's number)
    uuid: str | None  # to find its CUDA device (and NVML handle) by UUID
    bus_id: str | None  # its PCI device: the local CPUs and NUMA node (sysfs)
    name: str | None


class _CopyBwArgsOptional(TypedDict, total=False):
    h2d_bytes: int
    d2d_bytes: int
    p2p_bytes: int
    repeats: int
    warmup: int
    p2p: bool  # measure every ordered GPU pair
    numa_affinity: bool  # host buffers on the GPU's NUMA node
    slow: dict[int, float]  # the slow injection: GPU -> factor on its measured bandwidths


class CopyBwArgs(_CopyBwArgsOptional):
    """copybw_worker's arguments (measure: a size or count not given has its default)."""

    gpus: list[CopyBwTarget]


def copybw_worker(args: CopyBwArgs, chan: Any) -> "CopyBwResult | SetupError":
    """Worker target: measure every GPU in args["gpus"] and every pair; return plain data."""
    try:
        import torch  # noqa: PLC0415 - in the worker only
    except ImportError as e:
        return {"setup_error": f"ImportError: {e}"}
    if chan.device == "cuda" and not torch.cuda.is_available():
        return {"setup_error": f"torch {torch.__version__} sees no CUDA device (CPU-only build, or the driver "
                               "is not usable)"}
    if chan.device == "cpu":
        torch.set_num_threads(1)
    chan.heartbeat(force=True)
    return measure(torch, chan.device, args, chan)


def _median(samples: list[float]) -> float | None:
    return statistics.median(samples) if samples else None


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def local_cpus(bus_id: str | None, sysfs_root: Path = Path("/sys")) -> tuple[set[int] | None, int | None]:
    """The CPUs and the NUMA node local to a PCI device, from sysfs (None where unknown)."""
    if not bus_id:
        return None, None
    dev = sysfs_root / "bus" / "pci" / "devices" / bus_id.lower()
    cpus = node = None
    try:
        cpus = parse_cpulist((dev / "local_cpulist").read_text()) or None
    except (OSError, ValueError):
        pass
    try:
        node = int((dev / "numa_node").read_text().strip())
        node = None if node < 0 else node
    except (OSError, ValueError):
        pass
    return cpus, node


class _Timer:
    """Times `repeats` calls of fn after `warmup` calls: CUDA events on `stream` (device copies),
    or perf_counter (host)."""

    def __init__(self, torch: Any, cuda: bool):
        self.torch = torch
        self.cuda = cuda

    def run(self, fn: Any, repeats: int, warmup: int, stream: Any = None, during: Any = None) -> list[float]:
        torch = self.torch
        for _ in range(warmup):
            fn()
        if not self.cuda:
            out = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
            if during is not None:
                during()
            return out
        evs = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(stream)
            fn()
            e.record(stream)
            evs.append((s, e))
        if during is not None:
            during()  # the transfers are queued and running: read the link now
        evs[-1][1].synchronize()
        return [s.elapsed_time(e) / 1000.0 for s, e in evs]


def _torch_indices(torch: Any, gpus: list[CopyBwTarget]) -> tuple[dict[int, int], str | None]:
    """NVML index -> torch device index, matched by UUID; None note when all matched."""
    count = torch.cuda.device_count()
    by_uuid: dict[str, int] = {}
    for i in range(count):
        u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        if u is not None:
            by_uuid[str(u).lower().removeprefix("gpu-")] = i
    out: dict[int, int] = {}
    unmatched = []
    for g in gpus:
        u = (g.get("uuid") or "").lower().removeprefix("gpu-")
        if u and u in by_uuid:
            out[g["gpu"]] = by_uuid[u]
        else:
            unmatched.append(g["gpu"])
    note = None
    if unmatched:
        # CUDA_DEVICE_ORDER=PCI_BUS_ID (set by the worker pool) numbers CUDA devices like NVML.
        taken = set(out.values())
        for gi in unmatched:
            if gi < count and gi not in taken:  # never two GPUs on one CUDA device
                out[gi] = gi
        note = (f"GPU(s) {unmatched} matched to CUDA devices by index, not UUID "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    return out, note


class _LinkReader:
    """Reads NVML's current PCIe link generation and width of one GPU into `box` when called.
    NVML is initialised and the handle looked up here, before the transfers are queued, so that
    the call itself is two quick reads that land while the transfers run (a first nvmlInit can
    take longer than all the timed transfers together). The handle is found by UUID where the
    GPU's UUID is known (NVML and CUDA number GPUs independently), else by NVML index."""

    def __init__(self, gpu: int, uuid: str | None = None):
        self.box: LinkUnderLoad = {}
        self._nv: Any = None
        self._h: Any = None
        try:
            from ..platform.telemetry.nvml import NvmlSession
        except ImportError as e:
            self.box["error"] = f"NVML: {e}"
            return
        nv = NvmlSession()
        if not nv.ok:
            self.box["error"] = f"NVML: {nv.error}"
            nv.close()
            return
        try:
            try:
                if not (uuid and str(uuid).upper().startswith("GPU-")):
                    raise LookupError("no GPU UUID")
                self._h = nv.call("nvmlDeviceGetHandleByUUID", str(uuid))
            except Exception:  # noqa: BLE001 - by index, as the telemetry snapshot numbers GPUs
                self._h = nv.handle(gpu)
        except Exception as e:  # noqa: BLE001 - telemetry never breaks a measurement
            self.box["error"] = f"NVML: {e}"
            nv.close()
            return
        self._nv = nv

    def __call__(self) -> None:
        if self._nv is None:
            return
        gen, err1 = self._nv.read("nvmlDeviceGetCurrPcieLinkGeneration", self._h)
        width, err2 = self._nv.read("nvmlDeviceGetCurrPcieLinkWidth", self._h)
        self.box["gen"] = None if err1 else int(gen)
        self.box["width"] = None if err2 else int(width)

    def close(self) -> None:
        if self._nv is not None:
            self._nv.close()
            self._nv = None


def _clear_cuda_error(torch: Any = None, device: Any = None) -> None:
    """Reset the CUDA runtime's last error of this thread after a runtime call made through
    torch's cudart bindings failed: those return the code and leave the error set, and torch's
    next kernel launch check (cudaGetLastError) would raise it as that kernel's failure. torch
    has no binding for cudaGetLastError, so it is called in the libcudart torch loaded (found in
    /proc/self/maps: the same library object, so the same error state). Where none is found
    (a static cudart), a one-element kernel launched here takes the error instead."""
    try:
        with open("/proc/self/maps") as f:
            path = next((line.split()[-1] for line in f if "/libcudart.so" in line), None)
        if path:
            ctypes.CDLL(path).cudaGetLastError()
            return
    except (OSError, AttributeError):
        pass
    if torch is not None:
        try:
            torch.empty(1, dtype=torch.uint8, device=device).fill_(1)
        except Exception:  # noqa: BLE001 - the stale error, raised and reset by torch's launch check
            pass


def measure(torch: Any, device: str, args: CopyBwArgs, chan: Any) -> "CopyBwResult":
    """Measure every GPU and every pair (see the module doc). `args`:
    gpus: [{"gpu", "uuid", "bus_id", "name"}], h2d_bytes, d2d_bytes, p2p_bytes, repeats, warmup,
    p2p (bool), numa_affinity (bool), slow ({gpu: factor})."""
    cuda = device == "cuda"
    gpus = list(args["gpus"])
    repeats = max(1, int(args.get("repeats", 10)))
    warmup = max(0, int(args.get("warmup", 2)))
    h2d_n = int(args.get("h2d_bytes", 256 * MiB))
    d2d_n = int(args.get("d2d_bytes", 1024 * MiB))
    p2p_n = int(args.get("p2p_bytes", 256 * MiB))
    slow = {int(k): float(v) for k, v in (args.get("slow") or {}).items()}
    timer = _Timer(torch, cuda)
    out: CopyBwResult = {"device": device, "torch": torch.__version__, "gpus": {}, "pairs": [], "notes": [],
                           "injected": [], "config": {"h2d_bytes": h2d_n, "d2d_bytes": d2d_n, "p2p_bytes": p2p_n,
                                                      "repeats": repeats, "warmup": warmup}}
    index: dict[int, int] = {g["gpu"]: g["gpu"] for g in gpus}
    if cuda:
        index, note = _torch_indices(torch, gpus)
        if note:
            out["notes"].append(note)
        out["cuda_runtime"] = getattr(torch.version, "cuda", None)
    else:
        out["notes"].append("CPU stand-in: every transfer is a host memcpy between two host buffers "
                            "(host memory bandwidth, not a GPU's)")

    def dev(g: int) -> Any:
        return torch.device("cuda", index[g]) if cuda else torch.device("cpu")

    def stream(g: int) -> Any:
        return torch.cuda.current_stream(dev(g)) if cuda else None

    for g in gpus:
        gi = g["gpu"]
        if chan.should_stop():
            out["stopped"] = chan.stop_reason
            break
        rec: CopyBwGpu = {"gpu": gi, "name": g.get("name")}
        out["gpus"][gi] = rec
        if cuda and gi not in index:
            rec["error"] = "no CUDA device for this GPU (not visible to torch)"
            continue
        chan.progress({"current": gi, "what": "h2d/d2h/d2d", "measured": _brief(out)})
        try:
            _measure_gpu(torch, cuda, g, rec, dev(gi), stream(gi), timer, h2d_n, d2d_n, repeats, warmup,
                         bool(args.get("numa_affinity", True)), chan)
        except Exception as e:  # noqa: BLE001 - a failed copy is a finding about this GPU
            rec["error"] = f"{type(e).__name__}: {e}".strip()
        if cuda:
            torch.cuda.empty_cache()
        chan.heartbeat(force=True)

    ok = [g["gpu"] for g in gpus if g["gpu"] in out["gpus"] and not out["gpus"][g["gpu"]].get("error")]
    if not args.get("p2p", True):
        out["p2p_note"] = "peer-to-peer copies not measured (p2p = false)"
    elif len(ok) < 2:
        out["p2p_note"] = f"peer-to-peer copies not measured: {len(ok)} GPU(s) measured"
    elif out.get("stopped") is None:
        _measure_pairs(torch, cuda, ok, dev, stream, timer, p2p_n, repeats, warmup, out, chan)

    for gi, f in slow.items():
        slowed = out["gpus"].get(gi)
        if slowed is None:
            continue
        for m in (slowed.get("h2d"), slowed.get("d2h"), slowed.get("d2d")):
            gbps = m.get("gbps") if m else None
            if m and gbps is not None:
                m["gbps"] = gbps * f
        for pr in out["pairs"]:
            pair_gbps = pr.get("gbps")
            if gi in (pr["src"], pr["dst"]) and pair_gbps is not None:
                pr["gbps"] = pair_gbps * f
        out["injected"].append(f"slow: GPU {gi}'s measured bandwidths (and its pairs') x {f:g}")
    return out


def _brief(out: "CopyBwResult") -> "dict[int, CopyBwBrief]":
    """The measurements so far, small: what a hung or crashed worker leaves behind."""
    b: dict[int, CopyBwBrief] = {}
    for gi, rec in out["gpus"].items():
        h2d, d2h, d2d = rec.get("h2d"), rec.get("d2h"), rec.get("d2d")
        b[gi] = {"h2d": h2d["gbps"] if isinstance(h2d, dict) else None,
                 "d2h": d2h["gbps"] if isinstance(d2h, dict) else None,
                 "d2d": d2d["gbps"] if isinstance(d2d, dict) else None}
        error = rec.get("error")
        if error:
            b[gi]["error"] = error
    return b


def _host_buffer(torch: Any, cuda: bool, n: int, cpus: set[int] | None, rec: "CopyBwGpu",
                 device: Any = None) -> tuple[Any, Any]:
    """A host buffer of n bytes on the GPU's NUMA node, page-locked for DMA: fresh anonymous
    pages, first touched by this thread (a single-threaded memset) under the GPU's CPU affinity,
    then cudaHostRegister'ed. Returns (tensor, release function)."""
    old = None
    numa: NumaPlacement = rec.setdefault("numa", {})
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            old = os.sched_getaffinity(0)  # pid 0: this thread only (Linux)
            use = cpus & old or cpus
            os.sched_setaffinity(0, use)
            numa["affinity"] = _cpulist_text(use)
        except OSError as e:
            numa["affinity_error"] = str(e)
            old = None
    try:
        # mmap: pages no one has touched yet (a heap block could reuse pages already placed);
        # the tensor keeps the mapping alive.
        host = torch.frombuffer(mmap.mmap(-1, n), dtype=torch.uint8)
        ptr = host.data_ptr()
        # First touch in this thread: the pages land on the node of the CPU that touches them.
        # Not host.fill_(): torch runs it on its intra-op threads, created earlier with another
        # affinity (sched_setaffinity changes only the calling thread).
        ctypes.memset(ptr, 0x5A, n)
        release: Any = lambda: None  # noqa: E731
        if cuda:
            with torch.cuda.device(device):
                rc = int(torch.cuda.cudart().cudaHostRegister(ptr, n, 1))  # 1: cudaHostRegisterPortable
            if rc == 0:
                numa["pinned"] = "cudaHostRegister"

                def unregister() -> None:
                    if int(torch.cuda.cudart().cudaHostUnregister(ptr)) != 0:
                        _clear_cuda_error(torch, device)

                release = unregister
            else:
                _clear_cuda_error(torch, device)  # else torch's next kernel launch reports it as its own
                host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                host.fill_(0x5A)
                numa["pinned"] = f"pin_memory (cudaHostRegister returned {rc}: NUMA placement not controlled)"
        else:
            numa["pinned"] = "host memory (CPU stand-in)"
        return host, release
    finally:
        if old is not None:
            try:
                os.sched_setaffinity(0, old)
            except OSError:
                pass


def _cpulist_text(cpus: set[int]) -> str:
    s = sorted(cpus)
    parts = []
    start = prev = s[0]
    for c in s[1:] + [None]:  # type: ignore[list-item]
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


def _result(samples: list[float], n: int, factor: float = 1.0) -> "CopyMeasure":
    med = _median(samples)
    return {"gbps": (factor * n / med / 1e9) if med else None, "bytes": n, "repeats": len(samples),
            "samples_s": [round(s, 9) for s in samples],
            "spread": round((max(samples) - min(samples)) / med, 4) if med else None}


def _measure_gpu(torch: Any, cuda: bool, g: CopyBwTarget, rec: "CopyBwGpu", device: Any, stream: Any,
                 timer: _Timer, h2d_n: int, d2d_n: int, repeats: int, warmup: int, affinity: bool,
                 chan: Any) -> None:
    cpus, node = local_cpus(g.get("bus_id")) if (cuda and affinity) else (None, None)
    rec["numa"] = {"node": node}
    host, release = _host_buffer(torch, cuda, h2d_n, cpus, rec, device)
    try:
        dbuf = torch.empty(h2d_n, dtype=torch.uint8, device=device)
        link = _LinkReader(int(g["gpu"]), g.get("uuid")) if cuda else None
        try:
            t = timer.run(lambda: dbuf.copy_(host, non_blocking=True), repeats, warmup, stream, during=link)
        finally:
            if link is not None:
                link.close()
        rec["h2d"] = _result(t, h2d_n)
        if link is not None:
            rec["link_under_load"] = link.box.copy()
        chan.heartbeat()
        t = timer.run(lambda: host.copy_(dbuf, non_blocking=True), repeats, warmup, stream)
        rec["d2h"] = _result(t, h2d_n)
        chan.heartbeat()
        del dbuf
    finally:
        try:
            if cuda:
                torch.cuda.synchronize(device)  # no transfer may still use the buffer
        finally:
            release()
        del host
    a = torch.empty(d2d_n, dtype=torch.uint8, device=device)
    b = torch.empty(d2d_n, dtype=torch.uint8, device=device)
    a.fill_(1)
    t = timer.run(lambda: b.copy_(a), repeats, warmup, stream)
    rec["d2d"] = _result(t, d2d_n, factor=2.0)
    rec["d2d"]["counted"] = "bytes read + bytes written"
    del a, b


def _measure_pairs(torch: Any, cuda: bool, ok: list[int], dev: Any, stream: Any, timer: _Timer, n: int,
                   repeats: int, warmup: int, out: "CopyBwResult", chan: Any) -> None:
    src_bufs: dict[int, Any] = {}
    dst_bufs: dict[int, Any] = {}
    try:
        for g in ok:
            src_bufs[g] = torch.empty(n, dtype=torch.uint8, device=dev(g))
            src_bufs[g].fill_(3)
            dst_bufs[g] = torch.empty(n, dtype=torch.uint8, device=dev(g))
        for s in ok:
            for d in ok:
                if s == d:
                    continue
                if chan.should_stop():
                    out["stopped"] = chan.stop_reason
                    return
                pr: CopyBwPair = {"src": s, "dst": d, "gbps": None}
                out["pairs"].append(pr)
                if cuda and not torch.cuda.can_device_access_peer(dev(s).index, dev(d).index):
                    pr["note"] = "no peer access (CUDA reports this pair cannot access each other's memory)"
                    continue
                chan.progress({"current": s, "what": f"p2p {s}->{d}", "measured": _brief(out)})
                try:
                    src, dst = src_bufs[s], dst_bufs[d]
                    t = timer.run(lambda: dst.copy_(src, non_blocking=True), repeats, warmup, stream(s))
                    pr.update(_result(t, n))
                except Exception as e:  # noqa: BLE001 - a failed peer copy is a finding about the pair
                    pr["error"] = f"{type(e).__name__}: {e}".strip()
                chan.heartbeat()
    finally:
        if cuda:  # every device the copies touched, not only the current one
            for g in ok:
                try:
                    torch.cuda.synchronize(dev(g))
                except Exception:  # noqa: BLE001 - a pair's error is already recorded
                    pass
        src_bufs.clear()
        dst_bufs.clear()
