"""The worker pool: one spawned process per GPU, all at once, supervised by the parent.

Every GPU compute check (burn, POET, bitwise reproducibility, HBM pattern test) runs its GPU work
through `run_workers`. The parent never blocks on a worker: a worker that stops answering is
killed and reported, a worker that crashes is reported with its error, and the other workers'
results still arrive. gpucheck itself never hangs.

API
---

    outcomes = run_workers(
        "gpucheck.compute.gemm:burn_worker",          # "module:function" (or a module-level function)
        [WorkerJob("gpu0", gpu=0, device="cuda", args={...}, visible_device="GPU-<uuid>"), ...],
        budget_s=90,                 # hard per-worker limit, from its start
        heartbeat_timeout_s=30,      # no message for this long after the worker's first one: hung
        startup_timeout_s=120,       # spawn + imports + device init until the first message
        cancel=ctx.cancel,           # threading.Event: set -> every worker is asked to stop
        on_progress=lambda job, info: ...,
        sampler=Sampler([...]),      # started before the workers, stopped after (optional)
    )
    outcomes["gpu0"].kind  # "ok" | "crashed" | "hung" | "over_budget" | "cancelled"

The target runs in the worker as `fn(args: dict, chan: WorkerChannel) -> dict` and returns plain,
picklable data. It calls `chan.heartbeat()` / `chan.progress({...})` from its compute loop (never
from a helper thread: a kernel that hangs must stop the heartbeat) and polls `chan.should_stop()`
to return partial results early. `torch_device(chan)` imports torch in the worker and selects the
job's GPU (or one CPU thread). An exception in the target is a `crashed` outcome with the error
text and traceback; so is a worker killed by a signal (the OOM killer's SIGKILL). Except
gpucheck's own limits: a `WorkerSetupError` or an allocation failure (gpucheck.workers.alloc: a
size that does not fit, memory held by another process) is an `ok` outcome whose result is the
target's `{"setup_error": why}`, which the checks judge `error`, never `fail`.

Outcome kinds
-------------

    ok           the target returned; `result` is its dict
    crashed      exception (error + traceback), non-zero exit, or killed by a signal (`signal`)
    hung         no message for heartbeat_timeout_s (or no first message within startup_timeout_s):
                 killed; `progress` holds the last progress report
    over_budget  still running at budget_s: asked to stop, killed after stop_grace_s;
                 `result` is set when it returned in the grace period
    cancelled    `cancel` was set: asked to stop, killed after stop_grace_s; `result` (partial)
                 when it returned in time, else `progress`

Process model: multiprocessing's *spawn* context (never fork: CUDA cannot be forked), one duplex
Pipe per worker (no queue or lock shared between workers, so a killed worker cannot corrupt
another's channel), SIGINT ignored in workers (Ctrl-C reaches the whole process group; the parent
decides), SIGTERM in a worker means "stop at the next step", killing is SIGTERM then SIGKILL, and
every process is reaped. A worker stuck in the driver that survives SIGKILL is reported
(`reaped=False`) and abandoned rather than waited for.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait as _wait
from typing import TYPE_CHECKING, Any, Callable, Generic, cast

from ..platform.processes import die_with_parent
from .alloc import WorkerSetupError, allocation_failure
from .results import P, R

if TYPE_CHECKING:  # pragma: no cover
    from .results import DeviceInfo, SetupError, WorkerProgress

OK = "ok"
CRASHED = "crashed"
HUNG = "hung"
OVER_BUDGET = "over_budget"
CANCELLED = "cancelled"
KINDS = (OK, CRASHED, HUNG, OVER_BUDGET, CANCELLED)

# Heartbeats are rate-limited on the worker side to this interval.
HEARTBEAT_MIN_INTERVAL_S = 0.25


@dataclass
class WorkerJob:
    """One worker: which GPU it stands for, where it computes, and its arguments.

    worker_id: unique name within one run_workers call ("gpu3").
    gpu: the GPU index it reports on (NVML index on cuda; the worker number on cpu).
    device: "cuda" or "cpu".
    args: plain, picklable arguments for the target.
    visible_device: CUDA_VISIBLE_DEVICES for this worker (a GPU UUID or index); the worker then
      computes on cuda:0. None: no change, and the worker uses cuda:<gpu>.
    """

    worker_id: str
    gpu: int | None = None
    device: str = "cpu"
    # Any target's arguments (the target's TypedDict describes them: gpucheck.compute.gemm.BurnArgs,
    # ...); the pool only pickles them, and reads "threads" for a CPU worker.
    args: dict[str, Any] = field(default_factory=dict)
    visible_device: str | None = None


@dataclass
class WorkerOutcome(Generic[R, P]):
    job: WorkerJob
    kind: str
    result: R | None = None
    progress: P | None = None  # the last progress report (partial data)
    error: str | None = None  # one line
    traceback: str | None = None
    exitcode: int | None = None
    signal: str | None = None  # the signal that ended the process ("SIGKILL")
    duration_s: float = 0.0
    messages: int = 0
    reaped: bool = True

    @property
    def worker_id(self) -> str:
        return self.job.worker_id

    @property
    def ok(self) -> bool:
        return self.kind == OK

    @property
    def data(self) -> R | P | None:
        """The best data there is: the result, else the last progress report."""
        return self.result if self.result is not None else self.progress


# ---------------------------------------------------------------------------------------------
# worker side


class WorkerChannel:
    """The worker's end of its pipe: heartbeats, progress, and the parent's stop request."""

    def __init__(self, conn: Any, job: WorkerJob, parent_pid: int | None = None):
        self.job = job
        self._conn = conn
        self._parent_pid = parent_pid
        self._last_beat = 0.0
        self._stop_reason: str | None = None

    @property
    def worker_id(self) -> str:
        return self.job.worker_id

    @property
    def gpu(self) -> int | None:
        return self.job.gpu

    @property
    def device(self) -> str:
        return self.job.device

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except (BrokenPipeError, EOFError, OSError):
            self._stop_reason = self._stop_reason or "parent gone"

    def heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_beat >= HEARTBEAT_MIN_INTERVAL_S:
            self._last_beat = now
            self._send(("hb", now))

    def progress(self, info: "WorkerProgress") -> None:
        """A progress report (also a heartbeat). `info` must be plain, picklable data."""
        self._last_beat = time.monotonic()
        self._send(("progress", dict(info)))

    def should_stop(self) -> bool:
        """True once the parent asked this worker to stop (cancel, budget), a SIGTERM arrived, or
        the parent is gone. Cheap: one poll of the pipe."""
        if self._stop_reason is not None:
            return True
        try:
            while self._conn.poll():
                msg = self._conn.recv()
                if isinstance(msg, tuple) and msg and msg[0] == "stop":
                    self._stop_reason = str(msg[1]) if len(msg) > 1 else "stop"
        except (EOFError, OSError):
            self._stop_reason = "parent gone"
        if self._stop_reason is None and self._parent_pid is not None and os.getppid() != self._parent_pid:
            self._stop_reason = "parent gone"
        return self._stop_reason is not None

    def _on_sigterm(self, signum: int, _frame: Any) -> None:
        self._stop_reason = self._stop_reason or "SIGTERM"


class LocalChannel:
    """An in-process stand-in for WorkerChannel (benchmarks, unit tests of a target's loop)."""

    def __init__(self, job: WorkerJob | None = None, stop: threading.Event | None = None):
        self.job = job or WorkerJob("local", gpu=0, device="cpu")
        self.stop_event = stop or threading.Event()
        self.progress_reports: list["WorkerProgress"] = []
        self.heartbeats = 0

    worker_id = property(lambda self: self.job.worker_id)
    gpu = property(lambda self: self.job.gpu)
    device = property(lambda self: self.job.device)

    @property
    def stop_reason(self) -> str | None:
        return "stop" if self.stop_event.is_set() else None

    def heartbeat(self, force: bool = False) -> None:
        self.heartbeats += 1

    def progress(self, info: "WorkerProgress") -> None:
        self.progress_reports.append(info.copy())

    def should_stop(self) -> bool:
        return self.stop_event.is_set()


def torch_and_device(chan: WorkerChannel | LocalChannel) -> tuple[Any, Any, "SetupError | None"]:
    """In a worker target: (torch, device, None), or (None, None, {"setup_error": why}) to return
    as the target's result when torch or the device cannot be used (not a hardware verdict)."""
    try:
        import torch  # noqa: PLC0415 - only ever in a worker process

        dev = torch_device(chan)
    except (ImportError, WorkerSetupError) as e:
        return None, None, {"setup_error": f"{type(e).__name__}: {e}" if isinstance(e, ImportError) else str(e)}
    chan.heartbeat(force=True)
    return torch, dev, None


def device_info(torch: Any, dev: Any) -> "DeviceInfo":
    """What a worker computed on, for its result: model, compute capability, SMs, memory, torch
    and CUDA runtime versions (cuBLAS when torch tells); CPU model and threads for CPU workers."""
    import platform  # noqa: PLC0415

    runtime = getattr(torch.version, "cuda", None)
    if dev.type != "cuda":
        return {"device": dev.type, "torch": torch.__version__, "cuda_runtime": runtime,
                "name": platform.processor() or platform.machine() or "cpu", "capability": None,
                "threads": torch.get_num_threads()}
    p = torch.cuda.get_device_properties(dev)
    info: DeviceInfo = {"device": dev.type, "torch": torch.__version__, "cuda_runtime": runtime, "name": p.name,
                        "capability": [p.major, p.minor], "sms": p.multi_processor_count,
                        "memory_bytes": int(p.total_memory)}
    try:
        info["cublas"] = int(torch._C._cuda_getCompiledVersion())
    except Exception:  # noqa: BLE001 - informative only
        pass
    return info


def torch_device(chan: WorkerChannel | LocalChannel) -> Any:
    """Import torch in the worker and select the job's device: cuda:<gpu> (cuda:0 when
    visible_device narrowed CUDA_VISIBLE_DEVICES), or the CPU with one thread (workers stand in
    for GPUs, one core each). Raises WorkerSetupError when the device cannot be used."""
    import torch  # noqa: PLC0415 - only ever in a worker process (or a benchmark)

    job = chan.job
    if job.device == "cuda":
        if not torch.cuda.is_available():
            raise WorkerSetupError(
                f"torch {torch.__version__} sees no CUDA device (CPU-only build, or the driver is not usable)"
            )
        index = 0 if job.visible_device is not None else int(job.gpu or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise WorkerSetupError(f"cuda:{index} does not exist (torch sees {count} GPU(s))")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if job.device != "cpu":
        raise WorkerSetupError(f"unknown device {job.device!r}")
    torch.set_num_threads(int(job.args.get("threads", 1)))
    return torch.device("cpu")


def resolve_target(ref: str) -> Callable[..., Any]:
    mod_name, _, attr = ref.partition(":")
    if not mod_name or not attr:
        raise ValueError(f"worker target {ref!r} is not 'module:function'")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"worker target {ref!r} is not callable")
    return obj


def setup_error_of(exc: BaseException) -> "SetupError | None":
    """The SetupError a target's exception stands for: a WorkerSetupError (the device could not be
    used, an allocation that did not fit: gpucheck.workers.alloc.allocating) or an allocation
    failure the target left uncaught; None for anything else (a crash, which the check judges)."""
    if isinstance(exc, WorkerSetupError):
        return {"setup_error": str(exc)}
    why = allocation_failure(exc)
    return {"setup_error": f"could not allocate memory: {why}"} if why is not None else None


def _child_main(target: str, job: WorkerJob, conn: Any, parent_pid: int) -> None:
    """Entry point of a worker process (spawned)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    chan = WorkerChannel(conn, job, parent_pid)
    signal.signal(signal.SIGTERM, chan._on_sigterm)
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(0)
    if job.device == "cuda":
        # NVML numbers GPUs in PCI bus order; make CUDA agree, and pin this worker to its GPU.
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if job.visible_device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(job.visible_device)
    chan._send(("hello", os.getpid()))
    code = 0
    try:
        fn = resolve_target(target)
        result = fn(dict(job.args), chan)
        if result is None:
            result = {}
        if not isinstance(result, dict):
            raise TypeError(f"worker target returned {type(result).__name__}, not a dict")
        chan._send(("result", result))
    except BaseException as e:  # noqa: BLE001 - everything the target throws is reported
        setup_error = setup_error_of(e)
        if setup_error is not None:  # gpucheck's own limit: the target's SetupError, not a crash
            chan._send(("result", setup_error))
        else:
            code = 1
            chan._send(("error", f"{type(e).__name__}: {e}".strip(), traceback.format_exc()))
    finally:
        try:
            conn.close()
        except OSError:
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
    # Skip interpreter teardown: tearing down a CUDA context on a sick GPU can hang, and the
    # result is already in the pipe.
    os._exit(code)


# ---------------------------------------------------------------------------------------------
# parent side


def _target_ref(target: str | Callable[..., Any]) -> str:
    if isinstance(target, str):
        return target
    mod = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None)
    if not mod or not qual or "<" in qual or mod == "__main__":
        raise ValueError(
            f"worker target {target!r} must be a module-level function importable by name "
            "(spawned workers import it)"
        )
    return f"{mod}:{qual}"


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class _Worker:
    def __init__(self, job: WorkerJob, proc: Any, conn: Any, t0: float):
        self.job = job
        self.proc = proc
        self.conn = conn
        self.t0 = t0
        self.last_msg = t0
        self.started = False  # the target sent its first message
        self.conn_open = conn is not None
        self.messages = 0
        self.result: dict[str, Any] | None = None  # whatever the target returned (a dict; else wrapped)
        self.result_at: float | None = None
        self.progress: "WorkerProgress | None" = None
        self.error: str | None = None
        self.tb: str | None = None
        self.stop_kind: str | None = None  # cancelled / over_budget: a stop was requested
        self.stop_at: float | None = None
        self.kill_kind: str | None = None  # hung / over_budget / cancelled: being killed
        self.kill_reason: str | None = None
        self.term_at: float | None = None
        self.sigkill_at: float | None = None
        self.outcome: WorkerOutcome | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def drain(self, on_progress: "Callable[[WorkerJob, WorkerProgress], None] | None") -> None:
        while self.conn_open:
            try:
                if not self.conn.poll():
                    return
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.conn_open = False
                return
            except Exception as e:  # noqa: BLE001 - an unpicklable message is the worker's bug
                self.error = self.error or f"unreadable message from the worker: {type(e).__name__}: {e}"
                continue
            self.last_msg = time.monotonic()
            self.messages += 1
            if not isinstance(msg, tuple) or not msg:
                continue
            kind = msg[0]
            if kind == "hello":
                continue  # the process is up; the target has not spoken yet
            self.started = True
            if kind == "progress" and len(msg) > 1 and isinstance(msg[1], dict):
                # what the target sent with WorkerChannel.progress (one of its WorkerProgress types)
                self.progress = cast("WorkerProgress", msg[1])
                if on_progress is not None:
                    try:
                        on_progress(self.job, self.progress)
                    except Exception:  # noqa: BLE001 - a display problem never breaks the pool
                        pass
            elif kind == "result" and len(msg) > 1:
                self.result = msg[1] if isinstance(msg[1], dict) else {"value": msg[1]}
                self.result_at = self.last_msg
            elif kind == "error" and len(msg) > 2:
                self.error, self.tb = str(msg[1]), str(msg[2])

    def request_stop(self, kind: str, now: float) -> None:
        if self.stop_kind is None and self.kill_kind is None:
            self.stop_kind, self.stop_at = kind, now
            if self.conn_open:
                try:
                    self.conn.send(("stop", kind))
                except (BrokenPipeError, EOFError, OSError):
                    pass

    def start_kill(self, kind: str, reason: str, now: float) -> None:
        if self.kill_kind is not None:
            return
        self.kill_kind, self.kill_reason = kind, reason
        self.term_at = now
        try:
            self.proc.terminate()  # SIGTERM: "stop now" to a worker that can still listen
        except (OSError, ValueError, AttributeError):
            pass

    def escalate(self, now: float, term_grace_s: float, kill_wait_s: float) -> None:
        if self.kill_kind is None or self.done:
            return
        if self.sigkill_at is None and self.term_at is not None and now - self.term_at >= term_grace_s:
            self.sigkill_at = now
            try:
                self.proc.kill()
            except (OSError, ValueError, AttributeError):
                pass
        elif self.sigkill_at is not None and now - self.sigkill_at >= kill_wait_s:
            # Survived SIGKILL (uninterruptible sleep in the driver): report and abandon it, and
            # keep multiprocessing's exit handler from joining it forever.
            try:
                multiprocessing.process._children.discard(self.proc)  # type: ignore[attr-defined]
            except AttributeError:
                pass
            self.finish(now, reaped=False)

    def finish(self, now: float, reaped: bool = True) -> None:
        if self.done:
            return
        code = None
        if reaped:
            try:
                self.proc.join(0)
            except (OSError, ValueError, AssertionError):
                pass
            code = self.proc.exitcode
        sig = _signal_name(code)
        out = WorkerOutcome(
            job=self.job,
            kind=OK,
            result=self.result,
            progress=self.progress,
            error=self.error,
            traceback=self.tb,
            exitcode=code,
            signal=sig,
            duration_s=now - self.t0,
            messages=self.messages,
            reaped=reaped,
        )
        if self.kill_kind is not None:
            out.kind = self.kill_kind
            out.error = self.kill_reason if not self.error else f"{self.kill_reason}; {self.error}"
        elif self.stop_kind is not None:
            out.kind = self.stop_kind
        elif self.result is not None and code == 0:
            out.kind = OK
        else:
            out.kind = CRASHED
            if not self.error:
                if sig:
                    out.error = f"worker killed by {sig}" + (" (out of memory?)" if sig == "SIGKILL" else "")
                elif code is None:
                    out.error = "worker did not exit"
                else:
                    out.error = f"worker exited with code {code} without a result"
        if not reaped:
            out.error = (out.error + "; " if out.error else "") + (
                f"process {self.proc.pid} did not exit after SIGKILL (stuck in the driver?)"
            )
        self.outcome = out
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn_open = False


def run_workers(
    target: str | Callable[..., Any],
    jobs: list[WorkerJob],
    *,
    budget_s: float,
    heartbeat_timeout_s: float = 30.0,
    startup_timeout_s: float = 120.0,
    cancel: threading.Event | None = None,
    on_progress: "Callable[[WorkerJob, WorkerProgress], None] | None" = None,
    sampler: Any = None,
    stop_grace_s: float = 2.0,
    term_grace_s: float = 1.0,
    kill_wait_s: float = 2.0,
    poll_s: float = 0.1,
) -> dict[str, WorkerOutcome]:
    """Run `target` once per job, each in its own spawned process, all at once; supervise them;
    return one WorkerOutcome per worker_id. Never raises for a worker's failure and never waits
    on a worker past its limits (at most budget_s + stop_grace_s + term_grace_s + kill_wait_s).

    With `cancel` set the workers are asked to stop and have stop_grace_s to return partial
    results; the whole stop takes at most stop_grace_s + term_grace_s + kill_wait_s (5 s with the
    defaults, which is the runner's CANCEL_GRACE_S)."""
    ref = _target_ref(target)
    ids = [j.worker_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"worker ids must be unique: {ids}")
    mp = multiprocessing.get_context("spawn")
    workers: list[_Worker] = []
    if sampler is not None:
        sampler.start()
    try:
        for job in jobs:
            now = time.monotonic()
            try:
                parent_conn, child_conn = mp.Pipe(duplex=True)
                proc = mp.Process(
                    target=_child_main,
                    args=(ref, job, child_conn, os.getpid()),
                    name=f"gpucheck-worker-{job.worker_id}",
                    daemon=True,
                )
                proc.start()
                child_conn.close()
            except Exception as e:  # noqa: BLE001 - could not even start: that worker crashed
                w = _Worker(job, None, None, now)
                w.error = f"could not start the worker process: {type(e).__name__}: {e}"
                w.outcome = WorkerOutcome(job=job, kind=CRASHED, error=w.error)
                workers.append(w)
                continue
            workers.append(_Worker(job, proc, parent_conn, now))
        _supervise(workers, budget_s, heartbeat_timeout_s, startup_timeout_s, cancel, on_progress,
                   stop_grace_s, term_grace_s, kill_wait_s, poll_s)
    finally:
        # Whatever happened in the parent (KeyboardInterrupt in a benchmark), leave no worker
        # behind: kill what is left and reap it.
        leftovers = [w for w in workers if not w.done]
        now = time.monotonic()
        for w in leftovers:
            w.start_kill(CANCELLED, "stopped: the supervisor was interrupted", now)
        deadline = now + term_grace_s + kill_wait_s
        while any(not w.done for w in leftovers) and time.monotonic() < deadline + 0.5:
            now = time.monotonic()
            for w in leftovers:
                if w.done:
                    continue
                if w.proc is not None and not w.proc.is_alive():
                    w.drain(None)
                    w.finish(now)
                else:
                    w.escalate(now, term_grace_s, kill_wait_s)
            time.sleep(0.05)
        for w in leftovers:
            if not w.done:
                w.finish(time.monotonic(), reaped=False)
        if sampler is not None:
            sampler.stop()
    return {w.job.worker_id: w.outcome for w in workers if w.outcome is not None}


def _supervise(
    workers: list[_Worker],
    budget_s: float,
    heartbeat_timeout_s: float,
    startup_timeout_s: float,
    cancel: threading.Event | None,
    on_progress: "Callable[[WorkerJob, WorkerProgress], None] | None",
    stop_grace_s: float,
    term_grace_s: float,
    kill_wait_s: float,
    poll_s: float,
) -> None:
    while True:
        live = [w for w in workers if not w.done]
        if not live:
            return
        waitables: list[Any] = []
        for w in live:
            if w.conn_open:
                waitables.append(w.conn)
            waitables.append(w.proc.sentinel)
        try:
            _wait(waitables, timeout=poll_s)
        except OSError:
            time.sleep(poll_s)
        now = time.monotonic()
        cancelled = cancel is not None and cancel.is_set()
        for w in live:
            w.drain(on_progress)
            if not w.proc.is_alive():
                w.drain(on_progress)  # anything written just before the exit
                w.finish(now)
                continue
            if w.kill_kind is not None:
                w.escalate(now, term_grace_s, kill_wait_s)
                continue
            if w.result is not None:
                # Returned; the process is on its way out. One that does not go is killed, and
                # its result stands.
                if now - (w.result_at or now) >= stop_grace_s:
                    w.start_kill(OK, f"returned its result but did not exit within {stop_grace_s:g} s; killed", now)
                continue
            if cancelled:
                w.request_stop(CANCELLED, now)
            if w.stop_kind is not None:
                if now - (w.stop_at or now) >= stop_grace_s:
                    what = ("stopped: the run was cancelled" if w.stop_kind == CANCELLED
                            else f"over its time budget of {budget_s:.0f} s")
                    w.start_kill(w.stop_kind, f"{what}; did not stop within {stop_grace_s:.2g} s, killed", now)
                continue
            if now - w.t0 >= budget_s:
                w.request_stop(OVER_BUDGET, now)
                continue
            if w.started and now - w.last_msg >= heartbeat_timeout_s:
                w.start_kill(HUNG, f"hang: no heartbeat for {now - w.last_msg:.1f} s "
                                   f"(limit {heartbeat_timeout_s:g} s); worker killed", now)
            elif not w.started and now - w.t0 >= startup_timeout_s:
                w.start_kill(HUNG, f"hang: worker did not start within {startup_timeout_s:g} s "
                                   "(imports, device initialisation); worker killed", now)
