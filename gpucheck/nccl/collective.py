"""The per-rank measurement loop: rendezvous, sweep, verify, time; never hang.

`run_rank(spec, emit, get_port)` runs inside one rank's process (a child started by
gpucheck.nccl.procs). It imports torch itself. For every collective and size it runs `warmup`
untimed and `iters` timed iterations; before each iteration every rank fills its input with the
verifiable pattern of gpucheck.nccl.patterns, the ranks meet at a barrier (outside the timing),
the collective runs (timed: CUDA events on a GPU, perf_counter on the CPU), and the rank checks
its own output on the device. After the iterations of one size the ranks all-gather their
per-iteration times and verification results, so every rank's report holds every rank's numbers:
a slow rank is visible and a corruption is named with the rank that saw it.

Never hang: every collective runs under the process group's timeout (`timeout_s`), and a
watchdog thread ends the process with a `timeout` report when one collective is in flight longer
than timeout_s + WATCHDOG_GRACE_S (for backends whose own timeout does not fire). Each rank
publishes its host label and a heartbeat (collective step, beat counter) in the rendezvous store;
when a collective fails or times out, the survivors read the heartbeats to name the rank they were
waiting for: a rank whose heartbeat stopped (dead or frozen process), else the rank furthest
behind in the sequence of collectives, else rank 0 when the store itself is gone.

A job that never formed (the store could not be reached, the process group could not connect
its ranks: a host name that resolves to 127.0.0.1, the wrong interface) is not a timeout of a
peer: the result is an `error` with failure kind `rendezvous` and no rank is blamed; only a
rank that joined the store and then stopped its heartbeat (died, froze) is named.

Steps (run_rank): setup, rendezvous, sweep (with the verification of every iteration),
teardown. What goes wrong without deciding the result (a heartbeat that stops, a version that
cannot be read, a host label that cannot be fetched, a process group that cannot be destroyed)
is sent as a `warning` event and listed in the result's `warnings`.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, TypedDict, Union, cast

from .bandwidth import algbw_gbs, align_size, busbw_factor, format_size, median
from .patterns import Patterns

SCHEMA = "gpucheck.nccl.run"
SCHEMA_VERSION = 1
HEARTBEAT_S = 0.25
WATCHDOG_GRACE_S = 5.0
CULPRIT_LIMIT_S = 4.0
# Memory for the buffers of one batch of back-to-back iterations.
BATCH_BYTES_CPU = 64 << 20
BATCH_BYTES_CUDA = 4 << 30  # how long the survivors may spend naming the rank they waited for
KEY = "gpucheck/"  # prefix of gpucheck's own keys in the rendezvous store

# Per-size stats exchanged with one all-gather: per-iteration times, then these fields.
_EXTRA = ("bad_iters", "first_iter", "index", "nbad", "expected", "got", "src_rank")


# -- the events a rank sends (schema gpucheck.nccl.run: `gpucheck nccl run` prints them, one JSON
# line each, and the parent reads them back) ----------------------------------------------------
class ErrorRow(TypedDict):
    """One rank's wrong elements at one size (the first iteration that had any)."""

    rank: int
    host: str | None
    bad_iters: int
    iter: int
    index: int
    nbad: int
    expected: float | None
    got: float | None
    src_rank: int | None  # the rank the wrong data came from, where known


class SizeRow(TypedDict):
    """One collective at one size, every rank's numbers (_exchange)."""

    op: str
    bytes: int
    count: int
    ranks: int
    iters: int
    warmup: int
    time_s: float | None  # median over iterations of the slowest rank's time
    algbw_gbs: float | None
    busbw_gbs: float | None
    rank_time_s: list[float | None]  # per rank: median iteration
    rank_min_s: list[float | None]  # per rank: fastest iteration
    verified: int
    errors: list[ErrorRow]


class Failure(TypedDict, total=False):
    """Why a rank's (or the job's) result is not ok. `kind`: corruption, timeout, rendezvous,
    exit, cancelled, busy or error; the other keys as the kind has them."""

    kind: str
    rank: int | None  # the rank blamed (None: none could be named)
    host: str | None
    what: str  # timeout: the collective in flight
    detail: str
    trace: list[str]  # error: the last lines of the traceback
    summary: str
    reported_by: int  # timeout (report.merge): the survivor that named the rank
    op: str  # corruption: where, and the rank's ErrorRow
    bytes: int
    bad_iters: int
    iter: int
    index: int
    nbad: int
    expected: float | None
    got: float | None
    src_rank: int | None


class _ReportExtras(TypedDict, total=False):
    warnings: list[str]  # what went wrong without deciding the result
    gpu_name: str  # nccl: the rank's GPU
    synthesized: bool  # written by the supervisor for a rank that sent nothing (gpucheck.nccl.procs)
    notes: list[str]  # the invocation's notes (gpucheck.nccl.node)


class RankReport(_ReportExtras):
    """A rank's result event: every rank's numbers (the ranks exchange them) and its own view of
    a failure."""

    event: str  # "result"
    schema: str  # SCHEMA
    version: int  # SCHEMA_VERSION
    rank: int
    world: int
    host: str
    hosts: list[str | None]  # each rank's host label, where known
    backend: str | None
    device: str | None
    versions: dict[str, str]  # torch, nccl
    status: str  # ok, fail or error
    summary: str
    failure: Failure | None
    results: list[SizeRow]
    injected: list[str]
    duration_s: float | None


class ListeningEvent(TypedDict):
    """Rank 0 hosts the rendezvous store at `port`."""

    event: str  # "listening"
    rank: int
    host: str
    port: int


class ReadyEvent(TypedDict):
    """The rank joined the process group."""

    event: str  # "ready"
    rank: int
    host: str
    backend: str


class WarningEvent(TypedDict):
    """Something went wrong that does not decide the result."""

    event: str  # "warning"
    rank: int
    step: str
    detail: str


NcclEvent = Union[RankReport, ListeningEvent, ReadyEvent, WarningEvent]


@dataclass
class RankSpec:
    rank: int
    world: int
    ops: list[str]
    sizes: list[int]
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = 0  # 0 on rank 0: bind a free port and announce it; None: ask get_port()
    host: str = ""  # this rank's host label, used in messages
    peer_hosts: list[str] = field(default_factory=list)  # host label of each rank, when known
    backend: str = "auto"  # auto | gloo | nccl
    device: str = "auto"  # auto | cpu | cuda
    iters: int = 5
    warmup: int = 1
    timeout_s: float = 30.0
    corrupt: dict[str, Any] | None = None  # the --inject corrupt parameters: rank, op, size, iter, index, text
    agent_store: bool = False  # torchrun's agent hosts the store at master_addr:master_port
    ifname: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PeerTimeout(Exception):
    """A collective failed or timed out because of another rank."""

    def __init__(self, rank: int | None, host: str | None, detail: str, what: str):
        self.rank, self.host, self.detail, self.what = rank, host, detail, what
        super().__init__(timeout_summary(rank, host, what))


def timeout_summary(rank: int | None, host: str | None, what: str = "") -> str:
    where = f" in {what}" if what else ""
    if rank is None and host is None:
        return f"timeout waiting for peers{where} (no rank identified)"
    if rank is None:
        return f"timeout waiting for host {host}{where}"
    return f"timeout waiting for rank {rank} on host {host or 'unknown'}{where}"


def corruption_summary(op: str, rank: int, host: str | None, size: int, index: int,
                       expected: float | None, got: float | None, src: int | None) -> str:
    src_txt = f", data from rank {src}" if src is not None and src != rank else ""
    return (f"data corruption in {op} on rank {rank} (host {host or 'unknown'}): size {format_size(size)}, "
            f"first bad index {index}{src_txt} (expected {_num(expected)}, got {_num(got)})")


def _num(v: float | None) -> str:
    if v is None:
        return "?"
    return str(int(v)) if v == v and float(v).is_integer() else str(v)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def base_report(spec: RankSpec) -> RankReport:
    return {
        "event": "result",
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "rank": spec.rank,
        "world": spec.world,
        "host": spec.host or socket.gethostname(),
        "hosts": list(spec.peer_hosts),
        "backend": None,
        "device": None,
        "versions": {},
        "status": "error",
        "summary": "",
        "failure": None,
        "results": [],
        "injected": [spec.corrupt["text"]] if spec.corrupt else [],
        "duration_s": None,
    }


class _Rank:
    def __init__(self, spec: RankSpec, emit: Callable[[NcclEvent], None],
                 get_port: Callable[[float], int]):
        self.spec = spec
        self.emit = emit
        self.get_port = get_port
        self.report = base_report(spec)
        self.step = 0
        self.current: tuple[str, float] | None = None
        self.stop = threading.Event()
        self.port: int | None = None
        self.hosts: dict[int, str] = {i: h for i, h in enumerate(spec.peer_hosts)}
        self._done = threading.Lock()
        self._finished = False
        self.t0 = time.monotonic()

    # -- reporting ------------------------------------------------------------------------------
    def warn(self, step: str, error: BaseException | str) -> None:
        """Something went wrong that does not decide the result (a heartbeat that stopped, a
        version that could not be read): a `warning` event now, and a line in the report."""
        detail = error if isinstance(error, str) else _first_line(error)
        line = f"{step}: {detail}"
        self.report.setdefault("warnings", []).append(line)
        try:
            self.emit({"event": "warning", "rank": self.spec.rank, "step": step, "detail": detail})
        except Exception as e:  # the parent is gone: the warning stays in the report
            self.report["warnings"].append(f"warning event not sent: {_first_line(e)}")

    def finish(self, status: str, summary: str, failure: Failure | None = None) -> RankReport | None:
        """Seal the report once (the main loop and the watchdog may race); None if already sent."""
        with self._done:
            if self._finished:
                return None
            self._finished = True
        self.stop.set()
        self.report.update({"status": status, "summary": summary, "failure": failure,
                            "duration_s": round(time.monotonic() - self.t0, 3)})
        if self.hosts:
            self.report["hosts"] = [self.hosts.get(i) for i in range(self.spec.world)]
        return self.report

    def host_of(self, rank: int | None) -> str | None:
        if rank is None:
            return None
        return self.hosts.get(rank) or (self.spec.master_addr if rank == 0 else None)

    # -- rendezvous store -----------------------------------------------------------------------
    def _store(self, dist: Any, master: bool, timeout_s: float) -> Any:
        td = datetime.timedelta(seconds=timeout_s)
        if master:
            return dist.TCPStore(self.spec.master_addr, int(self.spec.master_port or 0), self.spec.world,
                                 True, timeout=td, wait_for_workers=False)
        return dist.TCPStore(self.spec.master_addr, int(cast(int, self.port)), self.spec.world, False, timeout=td)

    def heartbeat(self, dist: Any) -> None:
        """Publish (collective step, beat) in the store until the rank finishes. A heartbeat that
        cannot start or stops early is a warning: the peers could then take this rank for dead."""
        try:
            client = self._store(dist, False, max(2.0, HEARTBEAT_S * 8))
        except Exception as e:
            self.warn("heartbeat", f"cannot connect to the rendezvous store: {_first_line(e)}")
            return
        beat = 0
        key = f"{KEY}hb/{self.spec.rank}"
        while not self.stop.is_set():
            beat += 1
            try:
                client.set(key, f"{self.step} {beat}")
            except Exception as e:
                if not self.stop.is_set():  # the store going away at the end is no news
                    self.warn("heartbeat", f"stopped after {beat - 1} beat(s): {_first_line(e)}")
                return
            self.stop.wait(HEARTBEAT_S)

    def find_culprit(self, dist: Any) -> tuple[int | None, str | None, str]:
        """Which rank did we wait for? (rank, host, how it was found).

        The store reads run in a helper thread with a hard limit: a TCPStore client can block
        forever on a frozen (SIGSTOPped, wedged) store host."""
        box: dict[str, Any] = {}  # "beats": two readings of the heartbeats, or "err": why not
        th = threading.Thread(target=self._culprit_reads, args=(dist, box), daemon=True)
        th.start()
        th.join(CULPRIT_LIMIT_S)
        me = self.spec.rank
        if "beats" not in box:
            why = box.get("err") or f"no answer within {CULPRIT_LIMIT_S:.0f} s"
            if me == 0 and not self.spec.agent_store:
                return None, None, f"own rendezvous store failed: {why}"
            return 0, self.host_of(0), f"rendezvous store at {self.spec.master_addr}:{self.port} unresponsive ({why})"
        first, second = box["beats"]
        for r in range(self.spec.world):
            if r == me:
                continue
            if r not in first:
                return r, self.host_of(r), "rank never published a heartbeat"
            if first[r][1] == second.get(r, (None, None))[1]:
                return r, self.host_of(r), f"heartbeat of rank {r} stopped at collective step {first[r][0]}"
        behind = [(second[r][0], r) for r in second if r != me and second[r][0] < self.step]
        if behind:
            step, r = min(behind)
            return r, self.host_of(r), f"rank {r} is behind (collective step {step} < {self.step})"
        return None, None, "every rank is alive and at the same collective step"

    def _culprit_reads(self, dist: Any, box: dict[str, Any]) -> None:
        try:
            with socket.create_connection((self.spec.master_addr, int(self.port or 0)), timeout=1.0):
                pass
            client = self._store(dist, False, 2.0)
            keys = [f"{KEY}hb/{r}" for r in range(self.spec.world)]
            first = self._read_beats(client, keys)
            time.sleep(HEARTBEAT_S * 4)
            box["beats"] = (first, self._read_beats(client, keys))
        except Exception as e:
            box["err"] = _first_line(e)

    @staticmethod
    def _read_beats(client: Any, keys: list[str]) -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        for r, k in enumerate(keys):
            if client.check([k]):
                step, beat = client.get(k).decode().split()
                out[r] = (int(step), int(beat))
        return out

    # -- the watchdog ---------------------------------------------------------------------------
    def watchdog(self, dist: Any) -> None:
        limit = self.spec.timeout_s + WATCHDOG_GRACE_S
        while not self.stop.wait(0.2):
            cur = self.current
            if cur is None or time.monotonic() - cur[1] <= limit:
                continue
            rank, host, how = self.find_culprit(dist)
            rep = self.finish("fail", timeout_summary(rank, host, cur[0]), {
                "kind": "timeout", "rank": rank, "host": host, "what": cur[0],
                "detail": f"collective still in flight after {limit:.0f} s (gpucheck watchdog); {how}",
            })
            if rep is not None:
                self.emit(rep)
                os._exit(1)

    # -- collectives ----------------------------------------------------------------------------
    def call(self, what: str, fn: Callable[[], Any], dist: Any) -> Any:
        self.step += 1
        self.current = (what, time.monotonic())
        try:
            return fn()
        except Exception as e:
            self.current = None
            rank, host, how = self.find_culprit(dist)
            raise PeerTimeout(rank, host, f"{_first_line(e)}; {how}", what) from e
        finally:
            self.current = None


class RendezvousError(Exception):
    """The ranks never formed a job: the store could not be reached or the process group could
    not connect its ranks (a name that resolves to 127.0.0.1, the wrong interface, a firewall).
    A setup problem: no rank is to blame."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


@dataclass
class _Env:
    """What the setup step chose: torch, its distributed module, the backend and the device."""

    torch: Any
    dist: Any
    backend: str
    device: Any

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def run_rank(spec: RankSpec, emit: Callable[[NcclEvent], None],
             get_port: Callable[[float], int]) -> RankReport:
    """Run one rank. `emit` sends progress events (listening, ready, warning); the returned dict
    is the rank's result event. `get_port(timeout)` returns the rendezvous port when
    spec.master_port is None (the parent learns it from rank 0).

    Steps: setup (torch, backend, device), rendezvous (store, heartbeat, watchdog, process
    group), sweep (every op and size, each iteration verified), verify (the first corruption any
    rank saw), teardown (final barrier, process group destroyed)."""
    st = _Rank(spec, emit, get_port)
    try:
        env = _setup(st)
        if isinstance(env, dict):
            return env
        store = _rendezvous(st, env)
        loop = _sweep(st, env, store)
        return _teardown(st, env, loop, _first_corruption(st))
    except RendezvousError as e:
        return st.finish("error", f"the rendezvous never formed: {e.detail}",
                         {"kind": "rendezvous", "rank": spec.rank, "host": st.report["host"],
                          "detail": e.detail}) or st.report
    except PeerTimeout as e:
        return st.finish("fail", str(e), {"kind": "timeout", "rank": e.rank, "host": e.host,
                                          "what": e.what, "detail": e.detail}) or st.report
    except Exception as e:  # our own problem: could not judge
        import traceback

        trace = [ln for ln in traceback.format_exc().splitlines() if ln.strip()][-8:]
        return st.finish("error", f"collective test failed: {_first_line(e)}",
                         {"kind": "error", "detail": _first_line(e), "trace": trace}) or st.report


def _setup(st: _Rank) -> _Env | RankReport:
    """Import torch, pick the backend and the device, set the socket interface. A finished
    (error) report when this rank cannot run the test."""
    spec = st.spec
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return st.finish("error", "PyTorch not installed (pip install 'gpucheck-cluster[torch]')",
                         {"kind": "error", "detail": "import torch failed"}) or st.report
    if not dist.is_available():
        return st.finish("error", "this PyTorch build has no torch.distributed", {"kind": "error"}) or st.report
    backend = spec.backend
    if backend == "auto":
        want_cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
        backend = "nccl" if want_cuda else "gloo"
    device, why = _device(torch, dist, spec, backend)
    if device is None:
        return st.finish("error", why, {"kind": "error"}) or st.report
    if spec.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = spec.ifname
        os.environ.setdefault("NCCL_SOCKET_IFNAME", spec.ifname)
    rep = st.report
    rep["backend"], rep["device"] = backend, str(device)
    # a plain str: unpickling a TorchVersion would make the parent import torch
    rep["versions"] = {"torch": str(torch.__version__)}
    if backend == "nccl":
        try:
            v = torch.cuda.nccl.version()
            rep["versions"]["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            rep["gpu_name"] = torch.cuda.get_device_name(device)
        except Exception as e:
            st.warn("versions", f"cannot read the NCCL version or the GPU name: {_first_line(e)}")
    return _Env(torch, dist, backend, device)


def _device(torch: Any, dist: Any, spec: RankSpec, backend: str) -> tuple[Any, str]:
    """(the device, "") or (None, why not)."""
    if backend == "nccl":
        if not torch.cuda.is_available() or not dist.is_nccl_available():
            return None, "backend nccl needs CUDA and a torch build with NCCL"
        if spec.local_rank >= torch.cuda.device_count():
            return None, f"local rank {spec.local_rank} has no GPU (this host has {torch.cuda.device_count()})"
        device = torch.device("cuda", spec.local_rank)
        torch.cuda.set_device(device)
        # Make a NCCL timeout an exception in this thread rather than a torn-down process.
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        return device, ""
    if backend == "gloo":
        device = torch.device("cpu") if spec.device != "cuda" else torch.device("cuda", spec.local_rank)
        if device.type == "cpu":
            # Ranks share the host's cores: one compute thread each, or OpenMP workers of
            # different ranks spin against each other and the pattern work dominates.
            torch.set_num_threads(1)
        return device, ""
    return None, f"unknown backend {backend!r}"


def _rendezvous(st: _Rank, env: _Env) -> Any:
    """The store (rank 0 hosts it, the others connect), the heartbeat and watchdog threads,
    the process group, every rank's host label. Raises RendezvousError when the job never
    formed, PeerTimeout when a rank that joined the store died or froze meanwhile."""
    spec, dist = st.spec, env.dist
    master = spec.rank == 0 and not spec.agent_store
    try:
        if master:
            store = st._store(dist, True, spec.timeout_s)
            st.port = int(store.port)
            st.emit({"event": "listening", "rank": spec.rank, "host": st.report["host"], "port": st.port})
        else:
            st.port = int(spec.master_port) if spec.master_port else int(st.get_port(spec.timeout_s))
            store = st._store(dist, False, spec.timeout_s)
    except Exception as e:
        where = f"{spec.master_addr}:{st.port}" if st.port else spec.master_addr
        if not master and st.port and _timed_out(e):  # rank 0 announced its store, then went silent
            raise PeerTimeout(0, st.host_of(0), f"the store at {where} did not answer: {_first_line(e)}",
                              "rendezvous") from e
        what = "cannot host the rendezvous store" if master else f"cannot reach the rendezvous store at {where}"
        raise RendezvousError(f"{what}: {_first_line(e)}") from e
    store.set(f"{KEY}host/{spec.rank}", st.report["host"])
    threading.Thread(target=st.heartbeat, args=(dist,), name="gpucheck-heartbeat", daemon=True).start()
    threading.Thread(target=st.watchdog, args=(dist,), name="gpucheck-watchdog", daemon=True).start()

    def init() -> None:
        kw: dict[str, Any] = {}
        if env.backend == "nccl":
            kw["device_id"] = env.device
        dist.init_process_group(env.backend, store=dist.PrefixStore(f"{KEY}pg", store), rank=spec.rank,
                                world_size=spec.world, timeout=datetime.timedelta(seconds=spec.timeout_s), **kw)

    try:
        st.call("rendezvous", init, dist)
    except PeerTimeout as e:
        if not _peer_died(e.detail):
            raise RendezvousError(f"the process group did not connect its ranks: {e.detail}") from e
        raise
    for r in range(spec.world):
        try:
            st.hosts[r] = store.get(f"{KEY}host/{r}").decode()
        except Exception as e:
            st.warn("host labels", f"rank {r}'s host label could not be read: {_first_line(e)}")
    st.emit({"event": "ready", "rank": spec.rank, "host": st.report["host"], "backend": env.backend})
    return store


def _peer_died(how: str) -> bool:
    """Did the culprit search find a rank that joined and then died or froze (a node fault),
    rather than ranks that could not connect (setup)?"""
    return ("heartbeat of rank" in how and "stopped" in how) or "unresponsive (no answer within" in how


def _timed_out(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return "timeout" in text or "timed out" in text


def _sweep(st: _Rank, env: _Env, store: Any) -> _Loop:  # noqa: ARG001 (the store lives as long as the sweep)
    """Every collective and size: warm-up and timed iterations, each verified on the device;
    then the ranks exchange their numbers (one results row per op and size)."""
    spec, dist, torch = st.spec, env.dist, env.torch
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    loop = _Loop(st, env, all_gather)
    for op in spec.ops:
        for size in spec.sizes:
            nbytes = align_size(size, spec.world)
            times, bad = loop.one_size(op, nbytes)
            st.report["results"].append(_exchange(st, dist, torch, all_gather, env.device, op, nbytes, times, bad))
    return loop


@dataclass
class _Miscompares:
    """One rank's verification of one op and size: iterations with wrong data, wrong elements,
    and the first one (exchanged as floats: _EXTRA, NaN for None)."""

    bad_iters: int = 0
    first_iter: int | None = None
    index: int | None = None
    nbad: int = 0
    expected: float | None = None
    got: float | None = None
    src_rank: int | None = None

    def row(self) -> list[float]:
        values = (self.bad_iters, self.first_iter, self.index, self.nbad, self.expected, self.got, self.src_rank)
        return [float("nan") if v is None else float(v) for v in values]  # in the order of _EXTRA


class _Loop:
    """The iterations of one op and size: batches back to back after one barrier, then verified."""

    def __init__(self, st: _Rank, env: _Env, all_gather: Any):
        self.st, self.env = st, env
        dist = env.dist
        self.sync = env.torch.zeros(1, device=env.device)
        self.run_fn = {
            "all_reduce": lambda p, j: dist.all_reduce(p.inputs[j]),
            "all_gather": lambda p, j: all_gather(p.outputs[j], p.inputs[j]),
            "all_to_all": lambda p, j: dist.all_to_all_single(p.outputs[j], p.inputs[j]),
        }
        spec = st.spec
        corrupt = spec.corrupt or {}
        self.corrupt = corrupt
        self.c_op = corrupt.get("op") or spec.ops[0]
        self.c_size = align_size(int(corrupt.get("size") or max(spec.sizes)), spec.world)
        self.c_iter = spec.warmup + int(corrupt.get("iter", 0))

    def barrier(self) -> None:
        dist = self.env.dist
        if self.env.backend == "gloo":
            dist.barrier()  # gloo's own barrier: a 1-element all-reduce leaves the next op slower
        else:
            dist.all_reduce(self.sync)
            self.env.torch.cuda.synchronize(self.env.device)

    def one_size(self, op: str, nbytes: int) -> tuple[list[float], _Miscompares]:
        st, spec, env = self.st, self.st.spec, self.env
        total = spec.warmup + spec.iters
        slots = batch_slots(op, nbytes, spec.world, total, BATCH_BYTES_CUDA if env.cuda else BATCH_BYTES_CPU)
        pat = Patterns(env.torch, op, nbytes, spec.rank, spec.world, env.device, slots=slots)
        times: list[float] = []
        bad = _Miscompares()
        what = f"{op} {format_size(nbytes)}"
        k = 0
        while k < total:
            # A batch of iterations runs back to back after one barrier, then is verified;
            # warm-up iterations never share a batch with timed ones.
            end = min(total, k + slots) if k >= spec.warmup else min(spec.warmup, k + slots)
            batch = list(range(k, end))
            for j, it in enumerate(batch):
                pat.prepare(it, j)
            st.call(f"barrier before {what}", self.barrier, env.dist)
            dts = self._timed(pat, op, what, len(batch))
            self._verify(pat, op, nbytes, batch, dts, times, bad)
            k = end
        return times, bad

    def _timed(self, pat: Any, op: str, what: str, n: int) -> list[float]:
        st, env, run_fn = self.st, self.env, self.run_fn[op]
        if env.cuda:
            torch = env.torch
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for j in range(n):
                evs[j][0].record()
                st.call(what, lambda: run_fn(pat, j), env.dist)
                evs[j][1].record()
            st.call(what, evs[-1][1].synchronize, env.dist)  # a hung kernel shows here
            return [e0.elapsed_time(e1) / 1000.0 for e0, e1 in evs]
        dts = []
        for j in range(n):
            t = time.perf_counter()
            st.call(what, lambda: run_fn(pat, j), env.dist)
            dts.append(time.perf_counter() - t)
        return dts

    def _verify(self, pat: Any, op: str, nbytes: int, batch: list[int], dts: list[float], times: list[float],
                bad: _Miscompares) -> None:
        spec, corrupt = self.st.spec, self.corrupt
        for j, it in enumerate(batch):
            if corrupt and spec.rank == int(corrupt.get("rank", -1)) and op == self.c_op \
                    and nbytes == self.c_size and it == self.c_iter:
                pat.corrupt(int(corrupt.get("index", pat.numel // 3)), j)
            chk = pat.verify(j)
            if chk.bad:
                bad.bad_iters += 1
                bad.nbad += chk.bad
                if bad.first_iter is None:
                    bad.first_iter, bad.index, bad.expected, bad.got = it, chk.index, chk.expected, chk.got
                    bad.src_rank = chk.src_rank
            if it >= spec.warmup:
                times.append(dts[j])


def _teardown(st: _Rank, env: _Env, loop: _Loop, failure: Failure | None) -> RankReport:
    """The final barrier (no rank leaves while another still needs it), then the result."""
    st.call("final barrier", loop.barrier, env.dist)
    if failure is not None:
        return st.finish("fail", failure["summary"], failure) or st.report
    st.stop.set()
    try:
        env.dist.destroy_process_group()
    except Exception as e:
        st.warn("teardown", f"destroy_process_group failed: {_first_line(e)}")
    return st.finish("ok", _ok_summary(st.report)) or st.report


def batch_slots(op: str, nbytes: int, world: int, total: int, budget: int) -> int:
    """How many iterations of `op` at `nbytes` fit in one back-to-back batch."""
    per = nbytes if op == "all_reduce" else (nbytes // world + nbytes if op == "all_gather" else 2 * nbytes)
    return max(1, min(total, budget // max(1, per)))


def _exchange(st: _Rank, dist: Any, torch: Any, all_gather: Any, device: Any, op: str, nbytes: int,
              times: list[float], bad: _Miscompares) -> SizeRow:
    """All-gather every rank's per-iteration times and verification, and summarise one size."""
    spec = st.spec
    n = len(times)
    row = [*times, *bad.row()]
    mine = torch.tensor(row, dtype=torch.float64, device=device)
    allv = torch.empty(spec.world * len(row), dtype=torch.float64, device=device)
    st.call(f"exchange of {op} results", lambda: all_gather(allv, mine), dist)
    table = allv.view(spec.world, len(row)).cpu().tolist()
    per_iter = [max(table[r][i] for r in range(spec.world)) for i in range(n)]
    t = median(per_iter)
    errors: list[ErrorRow] = []
    for r, vals in enumerate(table):
        extra = dict(zip(_EXTRA, vals[n:]))
        if extra["bad_iters"] > 0:
            errors.append({
                "rank": r,
                "host": st.host_of(r),
                "bad_iters": int(extra["bad_iters"]),
                "iter": int(extra["first_iter"]),
                "index": int(extra["index"]),
                "nbad": int(extra["nbad"]),
                "expected": extra["expected"],
                "got": extra["got"],
                "src_rank": None if extra["src_rank"] != extra["src_rank"] else int(extra["src_rank"]),
            })
    alg = algbw_gbs(nbytes, t) if t else None
    return {
        "op": op,
        "bytes": nbytes,
        "count": nbytes // 4,
        "ranks": spec.world,
        "iters": n,
        "warmup": spec.warmup,
        "time_s": t,
        "algbw_gbs": alg,
        "busbw_gbs": None if alg is None else alg * busbw_factor(op, spec.world),
        "rank_time_s": [median(vals[:n]) for vals in table],
        "rank_min_s": [min(vals[:n]) if n else None for vals in table],
        "verified": spec.warmup + n,
        "errors": errors,
    }


def _first_corruption(st: _Rank) -> Failure | None:
    for res in st.report["results"]:
        for err in res["errors"]:
            summary = corruption_summary(res["op"], err["rank"], err["host"], res["bytes"], err["index"],
                                         err["expected"], err["got"], err["src_rank"])
            return {"kind": "corruption", "op": res["op"], "bytes": res["bytes"], **err, "summary": summary}
    return None


def _ok_summary(report: RankReport) -> str:
    parts = []
    for op in dict.fromkeys(r["op"] for r in report["results"]):
        rows = [r for r in report["results"] if r["op"] == op and r["busbw_gbs"] is not None]
        if rows:
            big = max(rows, key=lambda r: r["bytes"])
            parts.append(f"{op} {big['busbw_gbs']:.3g} GB/s busbw at {format_size(big['bytes'])}")
    return f"{report['world']} ranks, data verified; " + ", ".join(parts)
