"""Collection for `gpucheck hang`: choosing the rank processes, running py-spy under a deadline,
reading flight-recorder dumps as root without trusting them, validating what nodes send back,
and resolving a Slurm job (injectable runner)."""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hang_synth import FIXTURES  # noqa: E402
from slurm_captures import capture, show_job  # noqa: E402

from gpucheck.platform.fanout import NodeRun  # noqa: E402
from gpucheck.hang import collect as C  # noqa: E402
from gpucheck.hang import flight as F  # noqa: E402
from gpucheck.hang import procs as P  # noqa: E402
from gpucheck.hang import pyspy as S  # noqa: E402
from gpucheck.hang import slurmjob as J  # noqa: E402

PY = "/usr/bin/python3.11"


def _p(pid, ppid=1, env=None, cmd="python3 train.py", exe=PY, cgroup=(), uid=1000):
    return P.ProcInfo(pid=pid, ppid=ppid, uid=uid, cmdline=cmd.split(), exe=exe, environ=env,
                      cgroup_jobs=list(cgroup))


# -- choosing the processes ---------------------------------------------------------------------

def test_environ_and_stat_parsing():
    env = P.parse_environ(b"RANK=3\0HOME=/root\0WORLD_SIZE=8\0RANK=9\0noequals\0SLURM_JOB_ID=77\0")
    assert env == {"RANK": "3", "WORLD_SIZE": "8", "SLURM_JOB_ID": "77"}  # only what is used; the first RANK
    assert P.parse_stat("42 (a) b (c)) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 0") == (7, "S", 12345)
    v2 = "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n"
    v1 = "12:memory:/slurm/uid_1000/job_45/step_batch/task_0\n11:cpu:/\n"
    assert P.cgroup_jobs(v2) == ["123"] and P.cgroup_jobs(v1) == ["45"] and P.cgroup_jobs("0::/user.slice\n") == []


@pytest.mark.parametrize("env,want", [
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "SLURM_PROCID": "0"}, (5, "RANK", 1, 16)),
    ({"SLURM_PROCID": "7", "SLURM_LOCALID": "3", "SLURM_NTASKS": "8"}, (7, "SLURM_PROCID", 3, 8)),
    ({"OMPI_COMM_WORLD_RANK": "2"}, (2, "OMPI_COMM_WORLD_RANK", None, None)),
])
def test_rank_from_the_launchers_variables(env, want):
    info, why = P.rank_of(env)
    assert why is None and (info["rank"], info["rank_from"], info["local_rank"], info["world_size"]) == want


@pytest.mark.parametrize("env,why", [
    ({"RANK": "0; rm -rf /"}, "RANK='0; rm -rf /' is not a rank number"),
    ({"RANK": "-1"}, "is not a rank number"), ({"RANK": "99999999999"}, "is not a rank number"),
    ({"RANK": "8", "WORLD_SIZE": "8"}, "RANK=8 is not below WORLD_SIZE=8"),
    ({"HOME": "/"}, "no rank in its environment"),
])
def test_hostile_or_missing_ranks_are_refused(env, why):
    info, got = P.rank_of(env)
    assert info is None and why in got


def test_select_by_command_line_drops_helpers_launchers_and_non_python():
    procs = [
        _p(10, env={"SLURM_PROCID": "0"}, cmd="python3 -m torch.distributed.run train.py"),  # torchrun agent (srun)
        _p(11, 10, {"RANK": "0", "SLURM_PROCID": "0"}), _p(12, 10, {"RANK": "1", "SLURM_PROCID": "0"}),
        _p(13, 11, {"RANK": "0", "SLURM_PROCID": "0"}),  # rank 0's DataLoader worker
        _p(14, 1, {}, cmd="bash run_train.py.sh", exe="/usr/bin/bash"),
        _p(15, 1, None, cmd="python3 train.py"),  # environment unreadable
        _p(16, 1, {"RANK": "3"}, cmd="python3 other.py"),
        _p(17, 1, {"RANK": "4"}, exe="/opt/app/trainer"),  # an embedded interpreter, seen by its libpython
        _p(99, 1, {"RANK": "9"}),  # gpucheck itself (its command line matches too)
    ]
    procs[7].maps_python = True
    procs[5].environ_error = "cannot read its environment: Permission denied"
    sel = P.select_ranks(procs, match=re.compile(r"train\.py"), exclude={99})
    assert [(r.pid, r.rank) for r in sel.ranks] == [(11, 0), (12, 1), (17, 4)]
    why = {s["pid"]: s["why"] for s in sel.skipped}
    assert why == {14: "not a Python process", 15: "cannot read its environment: Permission denied",
                   13: "a helper of rank 0 (forked from its process)",
                   10: "a launcher: its children hold other ranks"}
    assert sel.by == "cmdline" and 16 not in why


def test_select_by_job_environment_and_this_node():
    procs = [_p(20, env={"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURMD_NODENAME": "n1"}),
             _p(21, env={"SLURM_JOB_ID": "42", "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2"}),  # the job on n2
             _p(22, env={"SLURM_JOB_ID": "43", "SLURM_PROCID": "0"}),
             _p(23, env={"SLURM_JOBID": "42", "RANK": "2"}),
             _p(24, env={"SLURM_JOB_ID": "42"}, exe="/usr/bin/bash")]  # the batch script: not listed
    sel = P.select_ranks(procs, job="42", node="n1")
    assert [r.pid for r in sel.ranks] == [20, 23] and sel.by == "environ" and sel.skipped == []
    # reached by another name (an ssh alias), the node still knows its Slurm name from its hostname
    assert [r.pid for r in P.select_ranks(procs, job="42", node={"n1.cluster", "n1"}).ranks] == [20, 23]


def test_job_cgroups_win_over_a_forged_environment():
    procs = [_p(30, env={"RANK": "0"}, cgroup=["42"]),
             _p(31, env={"RANK": "1", "SLURM_JOB_ID": "42"}, cgroup=[]),  # says job 42, is not in its cgroup
             _p(32, env={"RANK": "1"}, cgroup=["42"])]
    sel = P.select_ranks(procs, job="42", node="n1")
    assert [r.pid for r in sel.ranks] == [30, 32] and sel.by == "cgroup"


def test_own_lineage_and_real_proc_reading():
    lineage = P.own_lineage()
    assert os.getpid() in lineage and os.getppid() in lineage
    info = P.read_proc(os.getpid(), boot_time=P._boot_time("/proc"))
    assert info is not None and info.ppid == os.getppid() and P.is_python_exe(info.exe)
    assert abs(info.start_time - time.time()) < 24 * 3600
    assert P.is_python_exe("/usr/bin/python3.11") and P.is_python_exe("/x/pypy3") and not P.is_python_exe("/bin/sh")


# -- py-spy -------------------------------------------------------------------------------------

def test_parse_recorded_dump():
    threads = S.parse_dump((FIXTURES / "pyspy-load-batch.json").read_text(), pid=10284)
    main = [t for t in threads if t.main]
    assert len(main) == 1 and main[0].name == "MainThread" and main[0].frames[0].function == "load_batch"
    assert main[0].frames[0].line == 33 and main[0].frames[0].file.endswith("tests/hang_train.py")


@pytest.mark.parametrize("text,why", [
    ("Error: Permission Denied", "no JSON"), ("{}", "not a list"), ("[]", "no Python thread"),
    ('[{"frames": [{"name": 3}]}]', "no function name or file"), ('[{"thread_name": "x"}]', "not a py-spy thread"),
])
def test_garbage_from_py_spy_is_a_dump_error(text, why):
    with pytest.raises(S.DumpError, match=why):
        S.parse_dump(text, 1)


def _fake_py_spy(tmp_path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


@pytest.mark.slow
def test_a_hung_py_spy_is_killed_at_the_deadline_and_the_process_is_untouched(tmp_path, sleeper):
    fake = _fake_py_spy(tmp_path, f'echo $$ > {tmp_path}/pid; exec sleep 60')
    t0 = time.monotonic()
    got = S.dump_process(fake, sleeper.pid, timeout_s=1.0, native=False, children=S.Children())
    assert time.monotonic() - t0 < 10
    assert got == {"error": "py-spy did not finish within 1 s (killed)", "attempts": 1, "duration_s": got["duration_s"]}
    spy = int((tmp_path / "pid").read_text())
    assert not os.path.exists(f"/proc/{spy}") or P.parse_stat(Path(f"/proc/{spy}/stat").read_text())[1] == "Z"
    assert sleeper.poll() is None and P.parse_stat(Path(f"/proc/{sleeper.pid}/stat").read_text())[1] == "S"


def test_py_spy_failures_are_retried_then_reported(tmp_path, sleeper):
    fake = _fake_py_spy(tmp_path, f'echo x >> {tmp_path}/calls; echo "Error: Operation not permitted (os error 1)" >&2; exit 1')
    got = S.dump_process(fake, sleeper.pid, timeout_s=5, native=False, children=S.Children())
    assert got["attempts"] == 3 and len((tmp_path / "calls").read_text().split()) == 3
    assert got["error"].startswith("Error: Operation not permitted (os error 1) (py-spy needs ptrace permission")
    ok = _fake_py_spy(tmp_path, f"cat {FIXTURES / 'pyspy-allreduce.json'}")
    got = S.dump_process(ok, sleeper.pid, timeout_s=5, native=False, children=S.Children())
    assert got["attempts"] == 1 and [t.name for t in got["threads"]] == ["fr-dump", "MainThread"]


def test_dump_is_non_blocking_unless_native_is_asked_for():
    assert S.dump_argv("/x/py-spy", 7) == ["/x/py-spy", "dump", "--pid", "7", "--json", "--nonblocking"]
    assert S.dump_argv("/x/py-spy", 7, native=True)[-1] == "--native"
    assert S.find_py_spy("/nonexistent/py-spy") is None


# -- the flight recorder --------------------------------------------------------------------------

def _uid_start(path: Path):
    return os.stat(path).st_uid, os.stat(path).st_mtime - 10


def test_flight_dump_read_and_summarized(tmp_path):
    path = tmp_path / "fr_2"
    path.write_bytes((FIXTURES / "fr-rank2.pickle").read_bytes())
    uid, start = _uid_start(path)
    summary, why = F.read_rank(str(tmp_path / "fr_"), 2, owner_uid=uid, not_before=start)
    assert why is None and summary["file"] == str(path) and summary["version"] == "2.10"
    pg = summary["pgs"]["0"]
    assert (pg["desc"], pg["ranks"], pg["last_seq"], pg["last_op"]) == ("default_pg", [0, 1, 2, 3], 3, "gloo:all_reduce")
    assert pg["ops"] == [[1, "gloo:all_reduce"], [2, "gloo:all_reduce"], [3, "gloo:all_reduce"]]
    assert F.read_rank(str(tmp_path / "fr_"), 5, owner_uid=uid, not_before=start) == (None, None)  # no dump


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ.get('GPUCHECK_EVIL_MARK', '/nonexistent/x')}",))


def test_a_pickle_that_runs_code_is_refused_without_running_it(tmp_path, monkeypatch):
    mark = tmp_path / "pwned"
    monkeypatch.setenv("GPUCHECK_EVIL_MARK", str(mark))
    path = tmp_path / "fr_0"
    path.write_bytes(pickle.dumps({"entries": [_Evil()]}))
    uid, start = _uid_start(path)
    summary, why = F.read_rank(str(tmp_path / "fr_"), 0, owner_uid=uid, not_before=start)
    assert summary is None and "refusing posix.system" in why and not mark.exists()


def test_planted_symlinks_fifos_foreign_and_stale_files_are_refused(tmp_path):
    target = tmp_path / "real"
    target.write_bytes((FIXTURES / "fr-rank0.pickle").read_bytes())
    uid, start = _uid_start(target)
    (tmp_path / "fr_0").symlink_to(target)
    os.mkfifo(tmp_path / "fr_1")  # opening must not block
    (tmp_path / "fr_2").write_bytes(target.read_bytes())
    (tmp_path / "fr_3").write_bytes(target.read_bytes())
    os.utime(tmp_path / "fr_3", (start - 3600, start - 3600))
    prefix = str(tmp_path / "fr_")
    assert F.read_rank(prefix, 0, owner_uid=uid, not_before=start)[1].endswith("a symbolic link (refused)")
    assert F.read_rank(prefix, 1, owner_uid=uid, not_before=start)[1].endswith("not a regular file (refused)")
    assert "not by the process's user 4242 (refused)" in F.read_rank(prefix, 2, owner_uid=4242, not_before=start)[1]
    assert F.read_rank(prefix, 3, owner_uid=uid, not_before=start)[1].endswith("written before the process started "
                                                                              "(another run's dump)")
    assert F.read_rank("relative_", 0, owner_uid=uid, not_before=start)[1] == "relative_0: not an absolute path"


def test_flight_json_dump_and_garbage(tmp_path):
    doc = {"version": "2.10", "pg_config": {"1": {"desc": "tp", "ranks": [0, 1]}}, "entries": [
        {"process_group": ["1", "tp"], "collective_seq_id": 5, "profiling_name": "nccl:all_gather", "state": "started"},
        {"process_group": ["1", "tp"], "is_p2p": True, "p2p_seq_id": 2, "profiling_name": "nccl:send 1->2"}]}
    s = F.summarize(F.parse_dump_bytes(json.dumps(doc).encode()))
    assert s["pgs"]["1"]["ranks"] == [0, 1] and s["pgs"]["1"]["last_seq"] == 5
    assert s["pgs"]["1"]["last_p2p_op"] == "nccl:send 1->2"
    for bad in (b"", b"\x80\x04garbage", b"[1,2]", pickle.dumps([1, 2])):
        with pytest.raises(F.FlightError, match="not a flight-recorder dump"):
            F.parse_dump_bytes(bad)


def test_flight_prefix_from_the_process_environment():
    assert F.prefix_for({"TORCH_FR_DUMP_TEMP_FILE": "/a/x_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/b/"}) == "/a/x_"
    assert F.prefix_for({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/b/"}) == "/b/"
    assert F.prefix_for({}) == F.DEFAULT_PREFIX and F.prefix_for({}, "/c/") == "/c/"


# -- what nodes send back -------------------------------------------------------------------------

NODE_DOC = json.loads((FIXTURES / "node-4ranks-rank2-hung.json").read_text())


def _mutated(path, value):
    doc = json.loads(json.dumps(NODE_DOC))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(doc)


@pytest.mark.parametrize("text,why", [
    ("", "no hang document (exit 0)"), ("Welcome to n3!", "not a hang document: Welcome to n3!"),
    ('{"schema": "gpucheck.verdict"}', "not a hang document"),
    (_mutated(["schema_version"], "2.0"), "schema_version 2.0 is not supported"),
    (_mutated(["status"], "fine"), "status: 'fine' is not a node status"),
    (_mutated(["node"], "n[1-3],evil"), "node: 'n[1-3],evil' is not a host name"),
    (_mutated(["node"], None), "node: 'None' is not a host name"),
    (_mutated(["processes"], {}), "processes: not a list"),
    (_mutated(["processes", 0, "rank"], "0"), "processes[0]: rank is not a non-negative integer"),
    (_mutated(["processes", 1, "pid"], -4), "processes[1]: pid is not a positive integer"),
    (_mutated(["processes", 0, "threads", 0, "frames", 0, "function"], None),
     "processes[0].threads[0].frames[0]: want function and file strings"),
    (_mutated(["processes", 0, "threads", 0, "frames", 0, "line"], "12"), "line is not an integer"),
    (_mutated(["processes", 0, "threads"], []), "processes[0]: dumped without a thread"),
    (_mutated(["processes", 0, "flight", "pgs", "0", "ops"], [[1]]), "flight.pgs['0']: bad ops"),
    (_mutated(["processes", 0, "flight", "pgs", "0", "last_seq"], 1.5), "last_seq is not an integer"),
])
def test_garbage_from_a_node_is_an_error_for_that_node(text, why):
    run = NodeRun(node="n3", rc=0, stdout=text)
    res = C.classify(run)
    assert res.status == "error" and why in res.reason and res.ranks == []


def test_node_results_from_runs():
    good = C.classify(NodeRun(node="gpu7", rc=0, stdout=json.dumps(NODE_DOC), duration_s=1.5))
    assert good.status == "ok" and [r["rank"] for r in good.ranks] == [0, 1, 2, 3]
    assert {r["node"] for r in good.ranks} == {"gpu7"}  # the fan-out's name, whatever the node calls itself
    cases = [(NodeRun("a", 255, stderr="ssh: connect to host a port 22: Connection refused"), "unreachable",
              "ssh: connect to host a port 22: Connection refused"),
             (NodeRun("b", None, timed_out=True), "timeout", "no answer within 30 s (killed)"),
             (NodeRun("c", 127, stderr="sh: gpucheck: not found"), "error", "gpucheck not installed (sh: gpucheck: not found)"),
             (NodeRun("d", 2, stderr="gpucheck hang: error: no such option"), "error", "usage error on the node: "),
             (NodeRun("e", 1, via="srun", stderr="srun: error: Unable to allocate"), "error",
              "no hang document (exit 1): srun: error: Unable to allocate")]
    for run, status, reason in cases:
        res = C.classify(run, timeout_s=30)
        assert res.status == status and res.reason.startswith(reason)


def test_the_remote_command_quotes_everything(tmp_path):
    hostile = f"$(touch {tmp_path}/pwned) 'x'; y`id`!"
    plan = C.FanoutPlan(nodes=["n1"], local_args=["--match", hostile], remote_cmd="printf '%s\\n'")
    cmd = plan.command("n1")
    assert shlex.split(cmd)[:2] == ["sh", "-c"]
    for login_shell in ("sh", "bash"):
        out = subprocess.run([login_shell, "-c", cmd], capture_output=True, text=True)
        assert out.stdout.splitlines() == ["hang", "--local", "--json", "--node", "n1", "--match", hostile]
    assert not (tmp_path / "pwned").exists()


def test_collect_nodes_keeps_what_answered_when_interrupted():
    def runner(commands, *, on_done, **kw):
        on_done(NodeRun(node="n1", rc=0, stdout=json.dumps(NODE_DOC)))
        raise C.Interrupted("SIGTERM")

    plan = C.FanoutPlan(nodes=["n1", "n2"], local_args=["--match", "x"])
    results, interrupted = C.collect_nodes(plan, runner=runner)
    assert interrupted == "SIGTERM" and [(r.node, r.status) for r in results] == [("n1", "ok"), ("n2", "interrupted")]


def test_recorded_documents_load_in_every_form(tmp_path):
    one = json.dumps(NODE_DOC)
    for text in (one, f"[{one}, {one}]", f"{one}\n{one}\n"):
        got = C.load_recorded("f.json", text)
        assert got and all(r.node == NODE_DOC["node"] and r.status == "ok" for r in got)
    with pytest.raises(ValueError, match="f.json: document 1: not a hang document"):
        C.load_recorded("f.json", '{"a": 1}')


# -- Slurm ------------------------------------------------------------------------------------------

SHOW_JOB = show_job("77", nodelist="gpu[001-003,007]", user="alice(1000)")


def test_job_nodes_from_scontrol():
    calls = []

    def runner(argv):
        calls.append(argv)
        return 0, SHOW_JOB, ""

    info = J.job_info("77", runner=runner, scontrol="/usr/bin/scontrol")
    assert calls == [["/usr/bin/scontrol", "-o", "show", "job", "77"]]
    assert info.nodes == ["gpu001", "gpu002", "gpu003", "gpu007"] and info.user == "alice(1000)"


@pytest.mark.parametrize("rc,out,err,exc,why", [
    (0, show_job("77", state="PENDING", nodelist=""), "", J.JobUsageError, "job 77 is PENDING, not RUNNING"),
    (1, "", "slurm_load_jobs error: Invalid job id specified", J.JobUsageError, "job 77: slurm_load_jobs error"),
    (1, "", "slurm_load_jobs error: Unable to contact slurm controller", J.JobLookupError,
     "scontrol show job 77 failed (exit 1)"),
    (127, "", "No such file or directory", J.JobUsageError, "--job needs Slurm's scontrol"),
])
def test_job_lookup_failures(rc, out, err, exc, why):
    with pytest.raises(exc, match=re.escape(why)):
        J.job_info("77", runner=lambda argv: (rc, out, err), scontrol="scontrol")


def test_a_job_name_cannot_choose_the_nodes_examined():
    """`sbatch -J 'train NodeList=n4'` (a real answer of Slurm 22.05): the job's nodes are n1, not
    n4; a name that holds a whole second chain of fields is could not judge, never a guess."""
    info = J.job_info("10", runner=lambda argv: (0, capture("name-nodelist"), ""), scontrol="scontrol")
    assert info.nodes == ["n1"] and info.nodelist == "n1"
    with pytest.raises(J.JobLookupError, match="cannot tell Slurm's from the job's"):
        J.job_info("7", runner=lambda argv: (0, capture("name-forged-chain"), ""), scontrol="scontrol")


@pytest.mark.parametrize("text", ["", "77;id", "-1", "12 13", "$(id)"])
def test_job_ids_are_checked_before_any_command(text):
    with pytest.raises(J.JobUsageError, match="is not a Slurm job id"):
        J.job_info(text, runner=lambda argv: pytest.fail("ran a command"), scontrol="scontrol")
    assert J.valid_job_id("123_4") == "123_4" and J.valid_job_id("5+1") == "5+1"


def test_sigterm_in_local_collection_stops_py_spy_children(tmp_path, sleeper):
    fake = _fake_py_spy(tmp_path, f"echo $$ >> {tmp_path}/pids; exec sleep 60")
    children = S.Children()
    import threading

    box = {}
    th = threading.Thread(target=lambda: box.update(got=S.dump_process(fake, sleeper.pid, timeout_s=60, native=False,
                                                                       children=children)))
    th.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "pids").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with C.on_signals(lambda signum: children.stop_all()):
        os.kill(os.getpid(), signal.SIGTERM)
        th.join(10)
    assert box["got"]["error"] == "interrupted" and sleeper.poll() is None
