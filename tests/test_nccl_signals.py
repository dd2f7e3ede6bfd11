"""The ranks that `nccl pairs` and `bisect --builtin` start on other hosts die with the session
that started them (gpucheck.nccl.launch, gpucheck.nccl.node.StdinWatch).

The launcher holds every rank's standard input open until the group is over, writing nothing
but the rendezvous port line, and starts `nccl run --session-stdin`; an end-of-file there, at
any moment from the start on, stops every rank of that invocation: `error`, "the session that
started these ranks ended", exit 3. Old: rank 0's input was never watched and the other ranks'
was closed right after the port, so over ssh a stopped or killed `nccl pairs` left the remote
`nccl run` and its ranks running until their own --deadline.

- without root: `nccl run --session-stdin` stops at an end-of-file before the port line and
  after its ranks started; a hand-started `nccl run` (no option) runs to its result with its
  input at /dev/null or ended after the port line; the launcher passes the option and keeps
  every input open after the port (a fake launcher that checks);
- root (network namespaces with sshd, tests/netns.py): SIGTERM and SIGKILL to `nccl pairs`
  while its pair runs over real ssh leave no `nccl run` or rank process on either host within
  a few seconds. The remote processes are found by a marker in their environment (the
  `--program` sets it), so nothing else on the machine is looked at or killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucheck.nccl.launch import Launcher, run_group

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m", "gpucheck"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
MARK = "GPUCHECK_NCCSIG_MARK"
GONE_WITHIN_S = 15.0  # SIGTERM->SIGKILL grace, ssh teardown and the supervisor's poll, on a loaded machine
_count = iter(range(1, 1_000_000))


def _mark() -> str:
    return f"{os.getpid()}-{next(_count)}"


def marked(mark: str) -> list[int]:
    """Live processes (zombies excluded) whose environment holds MARK=mark."""
    want = f"{MARK}={mark}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if want in env and state != "Z":
            out.append(int(d.name))
    return out


def ranks_of(mark: str) -> list[int]:
    """The rank children (multiprocessing spawn) among the marked processes."""
    out = []
    for pid in marked(mark):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def leftovers(mark: str) -> list[int]:
    """The marked processes and those whose command line names the mark: the launchers (ssh
    clients) whose remote command sets it, a remote shell that did not exec."""
    out = set(marked(mark))
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if mark.encode() in (d / "cmdline").read_bytes() and \
                        (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(int(d.name))
            except (OSError, IndexError):
                pass
    return sorted(out)


def gone_within(mark: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while leftovers(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not leftovers(mark)


def kill_marked(mark: str) -> None:
    for pid in leftovers(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(what, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return True
        if proc is not None and proc.poll() is not None:
            return bool(what())
        time.sleep(0.1)
    return False


def _run_rank(mark: str, *args: str, stdin=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([*PY, "nccl", "run", "--master-addr", "127.0.0.1", "--backend", "gloo", "--sizes", "64K",
                             "--iters", "2", "--timeout", "20s", "--json", *args],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, MARK: mark})


def _results(out: str) -> list[dict]:
    return [ev for ev in map(json.loads, filter(None, out.splitlines())) if ev.get("event") == "result"]


# -- the node side, without root ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("when", ["at-once", "ranks-started"])
def test_an_end_of_file_on_the_session_stops_the_ranks(when):
    """Rank 1 waits for the port line that never comes; its session ends in the first second
    (before any rank process exists) or once its rank process runs. Old: no --session-stdin
    (exit 2); the ranks waited for the port until the collective timeout."""
    mark = _mark()
    p = _run_rank(mark, "--rank", "1", "--world-size", "2", "--master-port", "stdin", "--session-stdin",
                  "--timeout", "600s")
    try:
        if when == "ranks-started":
            assert wait_for(lambda: ranks_of(mark), 120, p), p.communicate(timeout=30)
        else:
            time.sleep(0.2)
        t0 = time.monotonic()
        p.stdin.close()
        p.stdin = None  # communicate() would flush it
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
        kill_marked(mark)
    assert p.returncode == 3, (out, err)
    (res,) = _results(out)
    assert res["status"] == "error" and res["rank"] == 1
    assert res["summary"] == "rank 1: stopped (the session that started these ranks ended)"
    assert res["failure"]["kind"] == "cancelled"
    assert took < 30  # not the 600 s collective timeout
    assert gone_within(mark, GONE_WITHIN_S), leftovers(mark)


@pytest.mark.slow
def test_a_hand_started_run_without_the_option_runs_to_its_result():
    """Without --session-stdin nothing changes: rank 0 with its input at /dev/null, rank 1 with
    the port line and then an end-of-file (what `nccl pairs` did before) both measure."""
    mark = _mark()
    r0 = _run_rank(mark, "--rank", "0", "--world-size", "2", "--master-port", "0", stdin=subprocess.DEVNULL)
    r1 = _run_rank(mark, "--rank", "1", "--world-size", "2", "--master-port", "stdin")
    try:
        port = None
        for line in r0.stdout:
            ev = json.loads(line)
            if ev.get("event") == "listening":
                port = ev["port"]
                break
        assert port, r0.communicate(timeout=60)
        r1.stdin.write(f"{port}\n")
        r1.stdin.close()
        r1.stdin = None
        out1, err1 = r1.communicate(timeout=240)
        out0, err0 = r0.communicate(timeout=240)
    finally:
        for p in (r0, r1):
            if p.poll() is None:
                p.kill()
        kill_marked(mark)
    assert (r0.returncode, r1.returncode) == (0, 0), (out0, err0, out1, err1)
    assert [r["status"] for r in _results(out0) + _results(out1)] == ["ok", "ok"]


# -- the launcher side, without root --------------------------------------------------------------

FAKE_RANK = r"""
import json, select, sys, time
argv = sys.argv[1:]
rank = int(argv[argv.index("--rank") + 1])
host = argv[argv.index("--host-label") + 1]
def result(status, summary):
    print(json.dumps({"event": "result", "rank": rank, "world": 2, "host": host, "status": status,
                      "summary": summary, "results": []}), flush=True)
if "--session-stdin" not in argv:
    result("error", "no --session-stdin"); sys.exit(3)
if rank == 0:
    print(json.dumps({"event": "listening", "rank": 0, "host": host, "port": 4242}), flush=True)
elif sys.stdin.readline().strip() != "4242":
    result("error", "no port line"); sys.exit(3)
# the session must stay open while the rank runs
ready, _, _ = select.select([sys.stdin], [], [], 1.5)
if ready and not sys.stdin.readline():
    result("error", "the session ended while the rank ran"); sys.exit(3)
result("ok", "ok")
"""


@pytest.mark.slow
def test_the_launcher_holds_every_session_open_until_the_group_is_over(tmp_path):
    """Old: no --session-stdin, and rank 1's input was closed right after the port line."""
    fake = tmp_path / "fake_rank.py"
    fake.write_text(FAKE_RANK)
    lau = Launcher(template=f"{sys.executable} {fake} {{cmd}}", program=["gpucheck"])
    out = run_group(["h1", "h2"], lau, ["--backend", "gloo"], deadline_s=60)
    assert out["launch_errors"] == {}, out
    assert out["status"] == "ok", out


def test_srun_steps_get_no_session_option():
    """srun: the step is Slurm's (srun forwards SIGTERM to it and cancels it); the tasks are
    started exactly as before, without --session-stdin."""
    from gpucheck.nccl.launch import _Group

    (proc,) = _Group(["n1", "n2"], Launcher(template="srun"), ["--backend", "gloo"], deadline_s=1, index=0,
                     corrupt=None, on_event=None, nproc_per_node=1).procs
    assert "--session-stdin" not in proc.argv


# -- over real ssh (root) ----------------------------------------------------------------------

def _lab_unusable() -> str | None:
    import netns
    from sshd_harness import sshd_unavailable

    return netns.usable() or sshd_unavailable()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    why = _lab_unusable()
    if why:
        pytest.skip(why)
    import netns

    with netns.running_ssh_lab(2, ENV["PYTHONPATH"], tmp_path_factory.mktemp("ssh")) as lab:
        yield lab


def _pairs_running(lab, mark: str) -> subprocess.Popen:
    """`nccl pairs` over ssh on the lab's two hosts, with a sweep that lasts minutes, started
    and waited for until both hosts' rank processes run."""
    program = f"env PYTHONPATH={ROOT} {MARK}={mark} {sys.executable} -m gpucheck"  # sshd passes no environment
    proc = subprocess.Popen([*PY, "nccl", "pairs", ",".join(lab.hosts), "--strategy", "ring", "--json",
                             "--launcher", lab.ssh_launcher(lab.ssh_root), "--program", program, "--backend", "gloo",
                             "--sizes", "64K", "--iters", "1000000", "--timeout", "600s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    if not wait_for(lambda: len(ranks_of(mark)) >= 2, 180, proc):
        proc.kill()
        out, err = proc.communicate(timeout=30)
        kill_marked(mark)
        pytest.fail(f"the ranks never started on both hosts: {marked(mark)} {out[-2000:]} {err[-2000:]}")
    time.sleep(2.0)  # into the rendezvous and the sweep
    return proc


@pytest.mark.root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_nccl_pairs_stops_the_ranks_on_every_host(lab, sig):
    """SIGTERM: the local side kills its ssh clients; SIGKILL: it dies and its ends of the
    pipes close, so the ssh clients (left running, in sessions of their own) see an
    end-of-file and pass it on. Either way the remote `nccl run` reads the end of its session
    and stops its ranks. Old: both kept running until their --deadline (minutes here)."""
    mark = _mark()
    proc = _pairs_running(lab, mark)
    try:
        assert len(marked(mark)) >= 4  # nccl run + its rank on each host
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        gone = gone_within(mark, GONE_WITHIN_S)  # the ranks, nccl run, and the ssh clients too
        left = [(pid, Path(f"/proc/{pid}/cmdline").read_bytes()[:200]) for pid in leftovers(mark)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_marked(mark)
    assert gone, f"still running: {left}"
    if sig == signal.SIGTERM:
        assert proc.returncode == 3, err[-2000:]
        assert json.loads(out)["interrupted"] == "SIGTERM"
    else:
        assert proc.returncode == -signal.SIGKILL



@pytest.mark.slow
@pytest.mark.parametrize("template, refused", [
    ("ssh -o BatchMode=yes -o ConnectTimeout=10 -- {host} {qcmd}", False),
    ("ip netns exec c ssh -F /x/ssh_config -o BatchMode=yes -- {host} {qcmd}", False),
    ("ssh -q {host} {qcmd}", False), ("ip netns exec {host} {cmd}", False),
    ("ssh -n -- {host} {qcmd}", True), ("/usr/bin/ssh -qn {host} {qcmd}", True),
    ("ssh -o StdinNull=yes -- {host} {qcmd}", True), ("timeout 600 ssh -f {host} {qcmd}", True),
])
def test_an_ssh_template_without_standard_input_is_a_usage_error(template, refused):
    """The remote `nccl run` reads its port and the end of its session on standard input; ssh
    -n gives it /dev/null (old: rank 0 ran, the others waited for a port that never came)."""
    if not refused:
        Launcher(template=template).validate()
        return
    with pytest.raises(ValueError, match="no standard input"):
        Launcher(template=template).validate()
    r = subprocess.run([*PY, "nccl", "pairs", "n[1-2]", "--launcher", template, "--json"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and "no standard input" in r.stderr and "--launcher" in r.stderr, r.stderr


def test_the_watch_reads_the_port_then_waits_for_the_end_of_the_session():
    """StdinWatch on a pipe: the port line, then no end until the writer closes; unbounded
    input (no newline) is read in bounded pieces; without a session nothing ends."""
    import io

    from gpucheck.nccl.node import StdinWatch

    r, w = os.pipe()
    with open(r, "r") as rd, open(w, "w") as wr:
        watch = StdinWatch(want_port=True, session=True, stream=rd).start()
        wr.write("41235\n")
        wr.flush()
        assert wait_for(lambda: watch.port() == 41235, 10)
        wr.write("x" * 100_000)  # never a newline: still only an end-of-file ends it
        wr.flush()
        assert not watch.ended.wait(0.5)
        wr.close()
        assert watch.ended.wait(10)
    quiet = StdinWatch(want_port=True, session=False, stream=io.StringIO("7\n")).start()
    assert wait_for(lambda: quiet.port() == 7, 10) and not quiet.ended.wait(0.3)
    early = StdinWatch(want_port=True, session=True, stream=io.StringIO("")).start()
    assert early.ended.wait(10) and early.port() is None
