"""The last-pass cursor (gpucheck.platform.kernlog.cursor): a node mark and one mark per GPU (by UUID).

- a passing run on some GPUs moves only their marks; one on every GPU moves the node mark;
- a GPU's events are judged from the later of the node mark and its own mark; every event that
  names no GPU with a UUID (a GPU that left NVML, an unmapped address) from the node mark;
- a run with a narrower window (since 10s, the epilog's job start) or ignore_xids moves nothing;
- the cursor is read, changed and written under a lock: two runs at once keep both marks, and a
  lock that another process holds (or a link planted at it) never hangs or redirects a run.
"""

from __future__ import annotations

import fcntl
import json
import socket
import os
import threading
import time
from pathlib import Path

import pytest

from gpucheck import app
from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.platform.pci import short_bus_id
from gpucheck.core.result import Status
from gpucheck.core.state import State
from gpucheck.platform.telemetry.snapshot import load_snapshot
from gpucheck.tests_suite import xid as xid_mod

ROOT = Path(__file__).resolve().parents[1]
HEALTHY = ROOT / "tests" / "fixtures" / "snapshots" / "h100-healthy.json"
LAST_PASS_CURSOR = "last-pass"


def stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(epoch))


def xid79(epoch: float, bus: str) -> str:
    return f"{stamp(epoch)} node kernel: NVRM: Xid (PCI:{bus}): 79, pid=42, name=python3, GPU has fallen off the bus.\n"


class LiveNode:
    """This machine's NVML replaced by the healthy 8-GPU recording (or a changed copy), and a
    kernel log file the xid check reads (its `files` setting)."""

    def __init__(self, tmp_path: Path, monkeypatch, log_text: str = ""):
        self.tmp = tmp_path
        self.snap = load_snapshot(HEALTHY)
        self.snap.pop("kernel_log", None)
        monkeypatch.setattr(app, "_collect_live", lambda *a, **k: json.loads(json.dumps(self.snap)))
        self.log = tmp_path / "kern.log"
        # synthetic: a log without an Xid (an empty one is nothing examined: an error)
        self.log.write_text(log_text or "2024-01-01T00:00:00+00:00 node kernel: eth0: link up\n")
        self.state = tmp_path / "state"
        self.verdicts: list = []  # the typed verdicts of the runs

    def bus(self, index: int) -> str:
        return short_bus_id(self.snap["gpus"][index]["pci_bus_id"])

    def uuid(self, index: int) -> str:
        return self.snap["gpus"][index]["uuid"]

    def config(self, **xid: object) -> str:
        lines = [f'files = ["{self.log}"]'] + [f"{k} = {json.dumps(v)}" for k, v in xid.items()]
        path = self.tmp / f"config-{len(list(self.tmp.glob('config-*')))}.toml"
        path.write_text("[checks.xid]\n" + "\n".join(lines) + "\n")
        return str(path)

    def run(self, gpus=None, options=None, **xid: object) -> int:
        return app.execute(app.RunRequest(check_patterns=["xid"], gpus=gpus, config_path=self.config(**xid),
                                          state_dir=str(self.state), json=True, options=dict(options or {})),
                           on_verdict=self.verdicts.append)

    def cursor(self):
        return State(self.state, host=socket.gethostname()).read_cursor(LAST_PASS_CURSOR)  # the run's host


# -- what a run examined is what moves ------------------------------------------------------------------

@pytest.mark.parametrize("narrower", ["since", "ignore_xids", "epilog_job_start"])
def test_a_run_with_a_narrower_window_never_moves_the_cursor(tmp_path, monkeypatch, capsys, narrower):
    """A pass that looked at less than the default window (the last 10 s; Xid 79 ignored by a
    site; the epilog's job start) says nothing about GPU 1's Xid 79 of a minute ago: the next
    run with the default window still fails. (The old cursor moved on any pass: it hid it.)"""
    node = LiveNode(tmp_path, monkeypatch)
    node.log.write_text(xid79(time.time() - 60, node.bus(1)))
    if narrower == "since":
        assert node.run(since="10s") == 0
    elif narrower == "ignore_xids":
        assert node.run(ignore_xids=[79]) == 0
    else:
        assert node.run(options={"xid_since": f"@{int(time.time()) - 10}"}) == 0
    assert node.cursor() is None
    assert node.run() == 1  # the default window: GPU 1 fell off the bus


def test_a_subset_pass_moves_only_its_gpus_and_a_whole_pass_the_node_mark(tmp_path, monkeypatch, capsys):
    node = LiveNode(tmp_path, monkeypatch)
    assert node.run(gpus=[0, 3]) == 0
    cur = node.cursor()
    assert "epoch" not in cur and set(cur["gpus"]) == {node.uuid(0), node.uuid(3)}
    assert node.run(gpus=list(range(8))) == 0  # a job on every GPU examined the whole node
    cur = node.cursor()
    assert isinstance(cur["epoch"], float) and "gpus" not in cur
    first = cur["epoch"]
    assert node.run(gpus=[5]) == 0
    cur = node.cursor()
    assert cur["epoch"] == first and list(cur["gpus"]) == [node.uuid(5)]
    assert cur["gpus"][node.uuid(5)]["epoch"] >= first
    assert node.run() == 0
    assert "gpus" not in node.cursor() and node.cursor()["epoch"] >= first


def test_an_xid_of_a_gpu_that_left_nvml_is_judged_from_the_node_mark(tmp_path, monkeypatch, capsys):
    """GPU 1 fell off the bus: a prolog on GPU 0 passes (GPU 1 is not its job's). Then NVML stops
    listing GPU 1, so its Xid 79 names no GPU any more: it is judged from the node mark, which
    that prolog never moved, and the next prolog on GPU 0 fails the node."""
    node = LiveNode(tmp_path, monkeypatch)
    node.log.write_text(xid79(time.time() - 5, node.bus(1)))
    assert node.run(gpus=[0]) == 0
    node.snap["gpus"] = [g for g in node.snap["gpus"] if g["index"] != 1]
    assert node.run(gpus=[0]) == 1
    (pci,) = [r.to_json() for r in node.verdicts[-1].results if r.subject.startswith("pci:")]
    assert pci["status"] == "fail" and "Xid 79" in pci["summary"]


# -- the check: each GPU from its own mark ------------------------------------------------------------

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
SNAP = {"nvml": {"ok": True}, "gpus": [
    {"index": 0, "uuid": UUID0, "pci_bus_id": "00000000:3B:00.0", "state": "ok"},
    {"index": 1, "uuid": UUID1, "pci_bus_id": "00000000:5E:00.0", "state": "ok"},
]}


def check_with_cursor(tmp_path: Path, lines: list[str], cursor: dict) -> dict:
    st = State(tmp_path / "state")
    st.write_cursor(LAST_PASS_CURSOR, cursor)
    log = tmp_path / "kern.log"
    log.write_text("".join(lines))
    ctx = Context(level=Level.QUICK, config=Config(checks={"xid": {"files": [str(log)], "since": "last-pass"}}),
                  snapshot=SNAP, state=st)
    return {r.subject: r for r in xid_mod.run(ctx)}


def test_each_gpu_is_judged_from_its_own_mark_and_the_rest_from_the_node_mark(tmp_path):
    t0 = time.time() - 300
    lines = [xid79(t0 + 50, "0000:5e:00"),  # GPU 1, before GPU 1's own pass: judged then
             f"{stamp(t0 + 150)} node kernel: NVRM: Xid (PCI:0000:5e:00): 13, pid=1, name=a, Graphics Exception\n",
             xid79(t0 + 50, "0000:3b:00"),  # GPU 0, after the node mark: never judged yet
             xid79(t0 + 50, "0000:c1:00")]  # no GPU known there: from the node mark
    res = check_with_cursor(tmp_path, lines, {"epoch": t0, "gpus": {UUID1: {"epoch": t0 + 100}}})
    assert res["gpu1"].status == Status.PASS and res["gpu1"].metrics["events"] == 1  # the Xid 13 only
    assert res["gpu0"].status == Status.FAIL
    assert res["pci:0000:c1:00"].status == Status.FAIL
    assert any(e.startswith("GPUs passed on their own since: " + UUID1) for e in res["node"].evidence)
    assert any("1 older event(s)" in e for e in res["node"].evidence)


def test_a_gpu_mark_that_cannot_be_trusted_is_ignored(tmp_path):
    t0 = time.time() - 300
    for bad in ({"epoch": time.time() + 86400}, {"epoch": "soon"}, {"time": "junk"}, "x"):
        res = check_with_cursor(tmp_path, [xid79(t0 + 50, "0000:5e:00")], {"epoch": t0, "gpus": {UUID1: bad}})
        assert res["gpu1"].status == Status.FAIL, bad
        assert any(e.startswith(f"warning: ignored the last-pass mark of {UUID1}") for e in res["node"].evidence)


def test_gpu_marks_without_a_node_mark_judge_the_others_since_boot(tmp_path):
    t0 = time.time() - 300
    res = check_with_cursor(tmp_path, [xid79(t0 + 50, "0000:5e:00"), xid79(t0 + 50, "0000:3b:00")],
                            {"gpus": {UUID1: {"epoch": t0 + 100}}})
    assert res["gpu1"].status == Status.PASS and res["gpu0"].status == Status.FAIL
    assert any("no run on every GPU has passed yet" in e for e in res["node"].evidence)
    assert not any(e.startswith("warning:") for e in res["node"].evidence)


# -- the marks themselves ---------------------------------------------------------------------------

def test_advance_never_moves_a_mark_back_and_drops_what_cannot_be_trusted():
    from gpucheck.platform.kernlog.cursor import advance

    now = 1_800_000_000.0
    acked = {"time": "t", "epoch": now - 10, "by": "gpucheck xid --ack"}
    # a run that started before the ack: the ack (and who made it) stands
    assert advance(acked, epoch=now - 20, time="t", uuids=[], whole=True, now=now) == acked
    # a later whole pass replaces it and drops the GPU marks it covers, not a later one
    cur = {"epoch": now - 50, "gpus": {"A": {"epoch": now - 40}, "B": {"epoch": now - 5}}}
    out = advance(cur, epoch=now - 20, time="t", uuids=[], whole=True, now=now)
    assert out == {"time": "t", "epoch": now - 20, "gpus": {"B": {"epoch": now - 5}}}
    # a subset pass: only its GPUs, never back
    out = advance(cur, epoch=now - 20, time="t", uuids=["A", "B", "C"], whole=False, now=now)
    assert out["epoch"] == now - 50 and out["gpus"]["A"]["epoch"] == now - 20
    assert out["gpus"]["B"]["epoch"] == now - 5 and out["gpus"]["C"]["epoch"] == now - 20
    # marks ahead of now, or with no time, are dropped; a cursor that is no table starts afresh
    bogus = {"epoch": now + 1e6, "gpus": {"A": {"epoch": now + 5}, "B": {"epoch": float("nan")}, "": {}}}
    assert advance(bogus, epoch=now - 1, time="t", uuids=["C"], whole=False, now=now) == \
        {"gpus": {"C": {"time": "t", "epoch": now - 1}}}
    assert advance([1, 2], epoch=now - 1, time="t", uuids=[], whole=True, now=now) == {"time": "t", "epoch": now - 1}


def test_the_default_window_and_what_covers_the_node():
    from gpucheck.platform.kernlog.cursor import covers_the_node, window_is_default

    from gpucheck.core.check import RunOptions

    assert window_is_default({"since": "last-pass", "ignore_xids": []}, RunOptions())
    assert window_is_default({"since": " LAST-PASS "}, RunOptions(xid_since=""))
    assert not window_is_default({"since": "boot"}, RunOptions())
    assert not window_is_default({"since": "last-pass", "ignore_xids": [13]}, RunOptions())
    assert not window_is_default({"since": "last-pass"}, RunOptions(xid_since="@1"))
    inventory = [{"index": 0}, {"index": 1}]
    assert covers_the_node(None, inventory) and covers_the_node([1, 0], inventory)
    assert not covers_the_node([0], inventory)
    assert covers_the_node([0], [])  # no GPU known: every event names none, all were judged


# -- the lock ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_runs_at_once_keep_both_marks(tmp_path, monkeypatch):
    from gpucheck.platform.kernlog.cursor import advance

    st = State(tmp_path / "state")
    barrier = threading.Barrier(2, timeout=2)
    real = State.read_cursor

    def read_then_meet(self, name):
        value = real(self, name)
        try:
            barrier.wait()  # without the lock both would read before either writes
        except threading.BrokenBarrierError:
            pass
        return value

    monkeypatch.setattr(State, "read_cursor", read_then_meet)
    now = time.time()

    def run(uuid: str) -> None:
        State(tmp_path / "state").update_cursor(
            LAST_PASS_CURSOR, lambda c: advance(c, epoch=now - 1, time="t", uuids=[uuid], whole=False, now=now))

    threads = [threading.Thread(target=run, args=(u,)) for u in ("GPU-a", "GPU-b")]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    monkeypatch.undo()
    assert set(st.read_cursor(LAST_PASS_CURSOR)["gpus"]) == {"GPU-a", "GPU-b"}


def test_a_lock_held_by_a_hung_process_times_out_instead_of_hanging(tmp_path):
    st = State(tmp_path / "state")
    st.ensure()
    holder = os.open(st.root / "cursor-last-pass.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="locked by another gpucheck"):
            st.update_cursor(LAST_PASS_CURSOR, lambda c: {"epoch": 1.0}, lock_timeout_s=0.3)
        assert time.monotonic() - t0 < 10
    finally:
        os.close(holder)
    assert st.read_cursor(LAST_PASS_CURSOR) is None
    st.update_cursor(LAST_PASS_CURSOR, lambda c: {"epoch": 1.0})
    assert st.read_cursor(LAST_PASS_CURSOR) == {"epoch": 1.0}


def test_a_link_planted_at_the_lock_is_refused_and_its_target_untouched(tmp_path):
    from gpucheck.platform.safeio import RefusedPath

    st = State(tmp_path / "state")
    st.ensure()
    victim = tmp_path / "victim"
    (st.root / "cursor-slurm-jobs.lock").symlink_to(victim)
    with pytest.raises(RefusedPath, match="symlink"):
        st.update_cursor("slurm-jobs", lambda c: {"x": 1})
    assert not victim.exists() and st.read_cursor("slurm-jobs") is None


def test_a_cursor_that_cannot_be_moved_is_a_warning_and_the_verdict_stands(tmp_path, monkeypatch, capsys):
    node = LiveNode(tmp_path, monkeypatch)
    (node.state / "cursor-last-pass.json").mkdir(parents=True)  # something that is not a regular file
    warnings: list[str] = []
    rc = app.execute(app.RunRequest(check_patterns=["xid"], config_path=node.config(), state_dir=str(node.state),
                                    json=True), on_warning=warnings.append)
    assert rc == 0
    (warning,) = warnings
    assert warning.startswith(f"cannot move the last-pass cursor in {node.state}") and "verdict stands" in warning
    assert len(list(State(node.state).iter_history())) == 1  # the history was written
