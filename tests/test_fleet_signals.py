"""SIGTERM/SIGINT to the fleet commands (bisect, nccl pairs, sweep, slurm resume), each started as
a real `gpucheck` process: their children (fake test commands, launchers, ssh and srun clients,
each spawning a `sleep` grandchild and recording both PIDs) must all be gone, the command must
exit 3 within a bound that catches a hang, and print what it had (rounds so far, pairs measured,
nodes answered). A second signal while stopping must not lose the output. Then the shared
mechanism itself (gpucheck.platform.processes) and `slurm resume`'s decisions when a signal comes.

Every grandchild sleeps for a duration unique to the test run (`sleep 300.<pid><n>`), the marker
the leftover check and the clean-up look for; clean-up is by PID only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucheck.platform import processes
from gpucheck.fleet import slurm

ROOT = Path(__file__).resolve().parents[1]
HEALTHY = ROOT / "tests" / "fixtures" / "snapshots" / "h100-healthy.json"
# Bounds that catch a hang and nothing else: a command that waits for its children takes 300 s
# (their grandchildren sleep that long). 10 s was a measure of speed, which a loaded CI machine
# (two cores, the whole suite beside it) missed with a command that stopped correctly (issue 26).
STOP_BOUND_S = 60.0
LEFTOVER_BOUND_S = 30.0
REMOTE_SETTLE_S = 0.3  # the node's watcher stops its command at an end-of-file from the start on
_count = iter(range(1, 1_000_000))


class Fakes:
    """Scripts in `root` that stand in for test commands, launchers, ssh, srun and scontrol.
    Each hanging one appends its PID and its grandchild's to `root/pids` before waiting."""

    def __init__(self, root: Path):
        self.root = root
        self.marker = f"300.{os.getpid()}{next(_count):03d}"
        self.pids = root / "pids"
        self.hang = self._script("hang.sh", f"""
echo $$ >> {root}/pids
sleep {self.marker} &
echo $! >> {root}/pids
wait
""")
        # nccl pairs: the pairs of round 1 of a 4-node ring answer at once, the others hang
        self.pair = self._script("pair.sh", f"""
case "$2" in
  *"--peer-hosts n1,n2 "*|*"--peer-hosts n3,n4 "*)
    rank=$(printf '%s\\n' "$2" | sed -n 's/.*--rank \\([0-9]*\\).*/\\1/p')
    printf '{{"event":"result","rank":%s,"world":2,"host":"%s","status":"ok","summary":"ok",\
"results":[{{"op":"all_gather","bytes":1048576,"busbw_gbs":2.0,"algbw_gbs":2.0,"time_s":0.001}},\
{{"op":"all_reduce","bytes":1048576,"busbw_gbs":2.0,"algbw_gbs":2.0,"time_s":0.001}}]}}\\n' "$rank" "$1"
    exit 0;;
esac
exec sh {root}/hang.sh
""")
        # ssh and srun: the client relays its standard input to the "remote" command, which runs
        # here in a session of its own (as under sshd or slurmstepd, out of the client's reach)
        # with NODE set (the fake gpucheck looks at it); it sees end-of-file when the client dies
        self.ssh = self._script("ssh", f"""
for a; do host=$cmd; cmd=$a; done
echo $$ > {root}/client-$host.pid
NODE=$host; export NODE
mkfifo {root}/stdin-$host
exec 3<&0
cat <&3 >{root}/stdin-$host & relay=$!
setsid sh -c "$cmd" <{root}/stdin-$host; rc=$?
kill $relay; exit $rc
""")
        srun_dir = root / "bin"
        srun_dir.mkdir()
        self.srun_dir = srun_dir
        self._script("bin/srun", f"""
for a; do case "$a" in --nodelist=*) NODE=${{a#--nodelist=}};; esac; done
while [ $# -gt 0 ] && [ "$1" != /bin/sh ]; do shift; done
echo $$ > {root}/client-$NODE.pid
export NODE
mkfifo {root}/stdin-$NODE
exec 3<&0
cat <&3 >{root}/stdin-$NODE & relay=$!
setsid "$@" <{root}/stdin-$NODE; rc=$?
kill $relay; exit $rc
""")
        # gpucheck on the "nodes": n1 answers with a real verdict, every other node hangs
        self.gpucheck = self._script("gpucheck", f"""
case "$NODE" in
  n1) PYTHONPATH={ROOT} exec {sys.executable} -m gpucheck "$@";;
esac
exec sh {root}/hang.sh
""")
        self.scontrol = self._script("scontrol", f"""
echo "$*" >> {root}/scontrol.log
case "$1 $2 $3" in
  "-o show node") for n in n1 n2 n3; do
      echo "NodeName=$n Arch=x86_64 State=IDLE+DRAIN Reason=gpucheck: xid 79 [root@2026-01-01T00:00:00]"; done;;
esac
""")
        clush = root / "clush"
        clush.mkdir()
        (clush / "clush.conf").write_text(f"[Main]\nfanout: 64\nssh_path: {self.ssh}\n")
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "CLUSTERSHELL_CFGDIR": str(clush),
                    "PATH": f"{srun_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def _script(self, name: str, body: str) -> Path:
        path = self.root / name
        path.write_text("#!/bin/sh\n" + body.lstrip("\n"))
        path.chmod(0o755)
        return path

    def recorded(self) -> list[int]:
        if not self.pids.exists():
            return []
        return [int(x) for x in self.pids.read_text().split()]

    def alive(self) -> list[int]:
        """Recorded processes (and any other grandchild with the marker) still running."""
        out = []
        for pid in {*self.recorded(), *self._marked()}:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            state = stat.rsplit(")", 1)[1].split()[0]
            if state != "Z" and (str(self.root) in cmdline or self.marker in cmdline):
                out.append(pid)
        return sorted(out)

    def _marked(self) -> list[int]:
        found = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if self.marker.encode() in (d / "cmdline").read_bytes():
                        found.append(int(d.name))
                except OSError:
                    pass
        return found

    def cleanup(self) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def fakes(tmp_path):
    f = Fakes(tmp_path)
    try:
        yield f
    finally:
        f.cleanup()


def wait_for(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stop_command(fakes: Fakes, argv: list[str], *, children: int, signals: list[int],
                 ready=None, settle_s: float = 0.3) -> tuple[int, str, str, float]:
    """Start `gpucheck ARGV`, wait until `children` PIDs are recorded (and `ready()`) and then
    `settle_s`, send `signals` (50 ms apart); return (exit code, stdout, stderr, seconds from
    the first signal)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpucheck", *argv], env=fakes.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=fakes.root)
    try:
        wait_for(lambda: len(fakes.recorded()) >= children or proc.poll() is not None, 120, "the children")
        t_children = time.monotonic()
        if ready is not None:
            wait_for(lambda: ready() or proc.poll() is not None, 120, "the command to be ready")
        assert proc.poll() is None, proc.communicate()
        time.sleep(max(0.0, t_children + settle_s - time.monotonic()))
        t0 = time.monotonic()
        for i, sig in enumerate(signals):
            if i:
                time.sleep(0.05)
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=STOP_BOUND_S)
        return proc.returncode, out, err, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_no_leftovers(fakes: Fakes, expected: int) -> None:
    """Every recorded child is gone (a zombie waiting for init counts as gone). The bound only
    catches a leftover (it would sleep 300 s): a killed process, or a "remote" one that the
    session watcher stops a few forks later, gets a moment on a loaded machine."""
    assert len(fakes.recorded()) >= expected
    deadline = time.monotonic() + LEFTOVER_BOUND_S
    while fakes.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not fakes.alive(), f"left running: {fakes.alive()}"


SIGNALS = {"SIGTERM": [signal.SIGTERM], "SIGINT": [signal.SIGINT]}


# -- bisect --------------------------------------------------------------------------------------

@pytest.mark.parametrize("signame", SIGNALS)
def test_bisect_command_test_stops_its_tests(fakes, signame):
    rc, out, err, dt = stop_command(
        fakes, ["bisect", "n[1-8]", "--test", f"sh {fakes.hang} {{nodes}}", "--strategy", "grid", "--group-size", "4"],
        children=4, signals=SIGNALS[signame])
    assert rc == 3, (out, err)
    assert f"interrupted by {signame}" in out and "no node was judged" in out and "bad nodes" not in out
    assert "0 test(s) in 0 round(s)" in out  # the round it cut short is not a result
    assert_no_leftovers(fakes, 4)


def test_bisect_keeps_the_rounds_done_and_a_second_signal_loses_nothing(fakes):
    """Round 1: row n[1-4] fails, row n[5-8] passes; round 2 (the four columns that cross the
    failing row) hangs: SIGTERM, then SIGINT while stopping; the JSON document comes out whole,
    with round 1 and without the round cut short. The hanging tests ignore SIGTERM (as a stuck
    one may), so the stop lasts its grace (processes.GRACE_S) before SIGKILL and the SIGINT 50 ms
    after the SIGTERM lands in it on any machine: an idle one had stopped before it came."""
    script = fakes._script("rows.sh", f'case "$1" in n5,n6,n7,n8) exit 0;; n1,n2,n3,n4) exit 1;; esac\n'
                                      f"trap '' TERM\nexec sh {fakes.hang}\n")
    rc, out, err, dt = stop_command(
        fakes, ["bisect", "n[1-8]", "--test", f"sh {script} {{nodes_comma}}", "--strategy", "grid",
                "--group-size", "4", "--json"], children=8, signals=[signal.SIGTERM, signal.SIGINT])
    assert rc == 3, (out, err)
    doc = json.loads(out)
    assert doc["interrupted"] == "SIGTERM" and doc["exit_code"] == 3 and doc["bad"] == ""
    assert doc["rounds"] == 1 and [(r["nodes"], r["healthy"]) for r in doc["records"]] == [
        ("n[1-4]", False), ("n[5-8]", True)]
    assert "round 1 (rows): 2 test(s), 1 failed" in err and "round 2" not in err
    assert_no_leftovers(fakes, 8)


@pytest.mark.slow
@pytest.mark.parametrize("signame", SIGNALS)
def test_bisect_builtin_stops_launchers_and_ranks(fakes, signame):
    rc, out, err, dt = stop_command(
        fakes, ["bisect", "n[1-4]", "--builtin", "allreduce", "--launcher", f"sh {fakes.hang} {{host}} {{qcmd}}",
                "--strategy", "grid", "--group-size", "2", "--json"], children=8, signals=SIGNALS[signame])
    assert rc == 3, (out, err)
    assert json.loads(out)["interrupted"] == signame
    assert_no_leftovers(fakes, 8)


# -- nccl pairs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("signame", SIGNALS)
def test_nccl_pairs_prints_the_pairs_measured(fakes, signame):
    rc, out, err, dt = stop_command(
        fakes, ["nccl", "pairs", "n[1-4]", "--strategy", "ring", "--launcher", f"sh {fakes.pair} {{host}} {{qcmd}}",
                "--backend", "gloo", "--json"], children=8, signals=SIGNALS[signame])
    assert rc == 3, (out, err)
    doc = json.loads(out)
    assert doc["interrupted"] == signame and doc["exit_code"] == 3 and doc["pairs_planned"] == 4
    assert [(p["nodes"], p["status"]) for p in doc["pairs"]] == [(["n1", "n2"], "ok"), (["n3", "n4"], "ok")]
    assert_no_leftovers(fakes, 8)


# -- sweep and slurm resume ----------------------------------------------------------------------

def _answered(fakes: Fakes):
    """n1's client (ssh or srun) has ended and been reaped by the fan-out."""
    pid_file = fakes.root / "client-n1.pid"
    return pid_file.exists() and not Path(f"/proc/{pid_file.read_text().strip()}").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ssh", "srun"])
@pytest.mark.parametrize("signame", SIGNALS)
def test_sweep_reports_the_nodes_that_answered(fakes, signame, mode):
    rc, out, err, dt = stop_command(
        fakes, ["sweep", "n[1-3]", "--remote-cmd", f"sh {fakes.gpucheck}", "--snapshot", str(HEALTHY),
                "--run-arg=--no-history", "--json", *(["--srun"] if mode == "srun" else [])],
        children=4, signals=SIGNALS[signame], ready=lambda: _answered(fakes), settle_s=REMOTE_SETTLE_S)
    assert rc == 3, (out, err)
    doc = json.loads(out)
    assert doc["interrupted"] == signame and doc["exit_code"] == 3
    assert [(n["node"], n["status"]) for n in doc["nodes"]] == [("n1", "pass")]
    assert doc["unanswered"] == "n[2-3]" and doc["planned"] == 3
    assert_no_leftovers(fakes, 4)


@pytest.mark.slow
def test_sweep_table_says_it_was_interrupted(fakes):
    rc, out, err, dt = stop_command(
        fakes, ["sweep", "n[1-2]", "--remote-cmd", f"sh {fakes.gpucheck}", "--snapshot", str(HEALTHY),
                "--run-arg=--no-history"], children=2, signals=[signal.SIGTERM], ready=lambda: _answered(fakes),
        settle_s=REMOTE_SETTLE_S)
    assert rc == 3, (out, err)
    assert "interrupted by SIGTERM: 1 of 2 node(s) answered; not answered: n2" in out
    assert "all nodes healthy" not in out
    assert_no_leftovers(fakes, 2)


@pytest.mark.slow
@pytest.mark.parametrize("signame", SIGNALS)
def test_slurm_resume_resumes_nothing_after_a_signal(fakes, signame):
    rc, out, err, dt = stop_command(
        fakes, ["slurm", "resume", "n[1-3]", "--scontrol", str(fakes.scontrol), "--remote-cmd",
                f"sh {fakes.gpucheck}", "--snapshot", str(HEALTHY), "--run-arg=--no-history", "--json"],
        children=4, signals=SIGNALS[signame], ready=lambda: _answered(fakes), settle_s=REMOTE_SETTLE_S)
    assert rc == 3, (out, err)
    decisions = {d["node"]: d for d in json.loads(out)}
    assert {n: d["decision"] for n, d in decisions.items()} == {"n1": "interrupted", "n2": "interrupted",
                                                                "n3": "interrupted"}
    assert decisions["n1"]["detail"] == f"passes (pass) but not resumed: interrupted by {signame}"
    assert decisions["n2"]["detail"] == f"not tested: not resumed: interrupted by {signame}"
    assert "update" not in (fakes.root / "scontrol.log").read_text()
    assert_no_leftovers(fakes, 4)


# -- the mechanism -------------------------------------------------------------------------------

def _raise_signal(sig: int = signal.SIGTERM) -> str:
    os.kill(os.getpid(), sig)
    return wait_for(processes.stopping, 5, "the handler")


@pytest.mark.slow
def test_stop_kills_a_group_that_ignores_sigterm_and_run_raises(fakes):
    stubborn = fakes._script("stubborn.sh", f"trap '' TERM\necho $$ >> {fakes.pids}\n"
                                            f"sleep {fakes.marker} & echo $! >> {fakes.pids}\nwait\n")
    before = signal.getsignal(signal.SIGTERM)
    with processes.stop_on_signals(grace_s=0.5):
        import threading

        box = {}

        def work():
            try:
                processes.run(["sh", str(stubborn)])
            except processes.Interrupted as e:
                box["signame"] = e.signame

        th = threading.Thread(target=work)
        th.start()
        wait_for(lambda: len(fakes.recorded()) >= 2, 30, "the children")
        t0 = time.monotonic()
        assert _raise_signal() == "SIGTERM"
        th.join(STOP_BOUND_S)
        assert box == {"signame": "SIGTERM"} and time.monotonic() - t0 < STOP_BOUND_S
        with pytest.raises(processes.Interrupted):  # nothing starts after the stop
            processes.start(["true"])
        with pytest.raises(processes.Interrupted):
            processes.check_stop()
    assert signal.getsignal(signal.SIGTERM) is before and processes.stopping() is None
    assert_no_leftovers(fakes, 2)


def test_a_group_tracked_after_the_stop_is_killed_at_once(fakes):
    with processes.stop_on_signals():
        _raise_signal(signal.SIGINT)
        p = subprocess.Popen(["sh", str(fakes.hang)], start_new_session=True)
        processes.track(p.pid)  # as the fan-out does for ClusterShell's clients
        assert p.wait(STOP_BOUND_S) == -signal.SIGKILL
        processes.untrack(p.pid)
    fakes.cleanup()


@pytest.mark.slow
def test_children_left_by_an_exception_are_stopped_on_the_way_out(fakes):
    with pytest.raises(RuntimeError):
        with processes.stop_on_signals():
            processes.start(["sh", str(fakes.hang)])
            wait_for(lambda: len(fakes.recorded()) >= 2, 30, "the children")
            raise RuntimeError("a bug")
    assert_no_leftovers(fakes, 2)


@pytest.mark.slow
def test_a_timed_out_run_stops_its_whole_group(fakes):
    done = processes.run(["sh", str(fakes.hang)], timeout_s=1.0)
    assert done.timed_out and done.rc is None
    assert_no_leftovers(fakes, 2)


class FakeScontrol:
    def __init__(self, on_update=None):
        self.calls: list[list[str]] = []
        self.on_update = on_update

    def __call__(self, argv, timeout_s: float = 30.0):
        self.calls.append(list(argv))
        if argv[1:3] == ["-o", "show"]:
            return 0, "".join(f"NodeName={n} State=IDLE+DRAIN Reason=gpucheck: xid 79 [root@2026]\n"
                              for n in ("n1", "n2", "n3")), ""
        if argv[1] == "update" and self.on_update:
            self.on_update()
        return 0, "", ""


def test_resume_stops_resuming_when_the_signal_comes_between_nodes():
    sl = FakeScontrol(on_update=_raise_signal)
    with processes.stop_on_signals():
        decisions = slurm.resume_nodes(["n1", "n2", "n3"], test=lambda c: {n: (True, "pass") for n in c},
                                       scontrol="scontrol", runner=sl, log=lambda p, m: None)
    assert [(d.node, d.decision) for d in decisions] == [("n1", "resumed"), ("n2", "interrupted"),
                                                         ("n3", "interrupted")]
    assert [c[2] for c in sl.calls if c[1] == "update"] == ["NodeName=n1"]


def test_resume_keeps_the_bad_answers_of_an_interrupted_sweep():
    def test(candidates):
        raise processes.Interrupted(_raise_signal(), partial={"n1": (False, "fail: xid"), "n2": (True, "pass")})

    sl = FakeScontrol()
    with processes.stop_on_signals():
        decisions = slurm.resume_nodes(["n1", "n2", "n3"], test=test, scontrol="scontrol", runner=sl,
                                       log=lambda p, m: None)
    assert [(d.node, d.decision) for d in decisions] == [("n1", "still-bad"), ("n2", "interrupted"),
                                                         ("n3", "interrupted")]
    assert not [c for c in sl.calls if c[1] == "update"]
