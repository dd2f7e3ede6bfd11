"""`gpucheck hang` end to end without a cluster: recorded node documents (--from), real py-spy
dumps of local processes (--local), the --job path with injected scontrol and fan-out, usage
errors (exit 2, one line)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hang_synth import FIXTURES  # noqa: E402
from slurm_captures import show_job  # noqa: E402

from gpucheck.cli.main import main  # noqa: E402
from gpucheck.platform.fanout import NodeRun  # noqa: E402
from gpucheck.hang.pyspy import find_py_spy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NODE_DOC = FIXTURES / "node-4ranks-rank2-hung.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def hang(capsys, *argv):
    rc = main(["hang", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _split_doc(nodes: list[str]) -> dict[str, str]:
    """The recorded 4-rank document split over `nodes` (rank i on nodes[i % len(nodes)])."""
    doc = json.loads(NODE_DOC.read_text())
    out = {}
    for k, node in enumerate(nodes):
        part = dict(doc, node=node, processes=[p for p in doc["processes"] if p["rank"] % len(nodes) == k])
        out[node] = json.dumps(part)
    return out


def test_recorded_document_names_the_hung_rank(capsys):
    rc, out, err = hang(capsys, "--from", str(NODE_DOC))
    assert rc == 1, err
    assert "rank 2 on vm (pid 10284): not in the collective the other 3 rank(s) wait in: load_batch (hang_train.py)" in out
    assert "process group 0 (default_pg): diverges at collective #4 (gloo:all_reduce): entered by 0-1,3, never by 2" in out
    assert out.rstrip().endswith("suspect nodes: vm")
    rc, out, _ = hang(capsys, "--from", str(NODE_DOC), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["schema"] == "gpucheck.hang" and doc["schema_version"] == "1.0"
    assert doc["exit_code"] == 1 and doc["status"] == "suspects" and doc["source"] == {"from": [str(NODE_DOC)]}
    assert [s["rank"] for s in doc["suspects"]] == [2] and doc["suspect_nodes"] == "vm"
    recorded = json.loads(NODE_DOC.read_text())["duration_s"]
    assert doc["nodes"] == [{"node": "vm", "status": "ok", "reason": "", "duration_s": recorded,
                             "ranks": [0, 1, 2, 3], "skipped": 0}]


def test_topology_on_recorded_documents(capsys, tmp_path):
    split = _split_doc(["g1", "g2"])  # ranks 0, 2 on g1; 1, 3 on g2
    files = []
    for node, text in split.items():
        (tmp_path / node).write_text(text)
        files += ["--from", str(tmp_path / node)]
    rc, out, _ = hang(capsys, *files, "--topology", "tp=2")
    assert rc == 1
    assert "  tp group 1 (ranks 2-3) holds suspect(s) 2: nodes g[1-2]" in out
    assert "  dp group 0 (ranks 0,2) holds suspect(s) 2: nodes g1" in out
    assert "evict (dp group of the suspects, over-eviction): g1" in out  # the group on the fewest nodes
    rc, out, err = hang(capsys, *files, "--topology", "tp=3")
    assert rc == 2 and err == "gpucheck hang: error: Invalid value for --topology/--groups: tp=3: the job's 4 " \
                              "ranks are not a multiple of tp*cp*pp = 3\n"


@pytest.mark.parametrize("argv,msg", [
    ([], "say where to look"),
    (["n[1-2]"], "exactly one of --match REGEX and --job JOBID"),
    (["n[1-2]", "--match", "x", "--job", "1"], "exactly one of --match"),
    (["n[1-2", "--match", "x"], "Invalid value for NODESET: malformed node set"),
    (["n1", "--match", "("], "Invalid value for --match: '(': missing ), unterminated subpattern"),
    (["--local", "--from", "x"], "give one of NODESET, --job, --local and --from, not --local and --from"),
    (["--job", "12;id"], "Invalid value for --job: '12;id' is not a Slurm job id"),
    (["n1", "--match", "x", "--topology", "tp=8,ep=2"], "unknown dimension 'ep'"),
    (["n1", "--match", "x", "--topology", "tp=2", "--groups", "g.json"], "give --topology or --groups, not both"),
    (["n1", "--match", "x", "--groups", "/nonexistent/g.json"], "Invalid value for --groups: /nonexistent/g.json: "),
    (["n1", "--match", "x", "--dump-timeout", "soon"], "Invalid value for '--dump-timeout': bad duration 'soon'"),
    (["--local", "--match", "x", "--record", "/tmp/r.json"], "--record saves what a fan-out collected"),
    (["n1", "--match", "x", "--record", "/nonexistent/dir/r.json"], "folder /nonexistent does not exist"),
    (["--from", "/nonexistent.json"], "Invalid value for --from: /nonexistent.json: No such file or directory"),
    (["n1", "--match", "x", "--node", "n1"], "--node names this node in a --local run"),
    (["--local", "--match", "x", "--node", "n[1-2]"], "Invalid value for --node: 'n[1-2]' is not a host name"),
])
def test_usage_errors_are_one_line_exit_2(capsys, argv, msg):
    rc, out, err = hang(capsys, *argv)
    assert rc == 2 and out == "" and msg in err and err.count("\n") == 1, err


def test_record_path_that_is_not_a_regular_file_is_refused(capsys, tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    rc, _, err = hang(capsys, "n1", "--match", "x", "--record", str(tmp_path / "link"))
    assert rc == 2 and "exists and is not a regular file" in err and not (tmp_path / "elsewhere").exists()


@pytest.fixture
def fake_cluster(monkeypatch):
    """scontrol and the fan-out replaced: the job runs on gpu[001-002]; each node answers its share
    of the recorded document."""
    calls = {"scontrol": [], "commands": None, "kw": None}

    def scontrol(argv, timeout_s=30.0):
        calls["scontrol"].append(argv)
        return 0, show_job("77", nodelist="gpu[001-002]", user="alice(1000)"), ""

    def run_nodes(commands, *, on_done=None, **kw):
        calls["commands"], calls["kw"] = dict(commands), kw
        split = _split_doc(list(commands))
        runs = {n: NodeRun(node=n, rc=0, stdout=split[n], via=kw["mode"]) for n in commands}
        for run in runs.values():
            on_done(run)
        return runs

    monkeypatch.setattr("gpucheck.fleet.slurm.default_runner", scontrol)
    monkeypatch.setattr("gpucheck.platform.fanout.run_nodes", run_nodes)
    return calls


def test_job_resolves_nodes_and_selects_by_job(capsys, fake_cluster, tmp_path):
    record = tmp_path / "rec.json"
    rc, out, err = hang(capsys, "--job", "77", "--srun", "--scontrol", "/opt/slurm/bin/scontrol", "--json",
                        "--record", str(record), "--dump-timeout", "5s", "--no-flight-recorder")
    assert rc == 1, err
    assert fake_cluster["scontrol"] == [["/opt/slurm/bin/scontrol", "-o", "show", "job", "77"]]
    assert fake_cluster["commands"] == {
        n: f"sh -c 'gpucheck hang --local --json --node {n} --job 77 --dump-timeout 5s --no-flight-recorder'"
        for n in ("gpu001", "gpu002")}
    assert fake_cluster["kw"]["mode"] == "srun" and fake_cluster["kw"]["srun"].extra_args == ["--jobid=77"]
    doc = json.loads(out)
    assert doc["source"] == {"nodeset": "gpu[001-002]", "job": "77", "match": None, "mode": "srun"}
    assert [(s["rank"], s["node"]) for s in doc["suspects"]] == [(2, "gpu001")] and doc["suspect_nodes"] == "gpu001"
    # the record replays to the same analysis
    rc2, out2, _ = hang(capsys, "--from", str(record), "--json")
    again = json.loads(out2)
    assert rc2 == 1 and again["suspects"] == doc["suspects"] and again["groups"] == doc["groups"]


def test_job_that_is_not_running_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr("gpucheck.fleet.slurm.default_runner",
                        lambda argv, timeout_s=30.0: (0, show_job("9", state="COMPLETED", nodelist="gpu1"), ""))
    rc, out, err = hang(capsys, "--job", "9")
    assert rc == 2 and "job 9 is COMPLETED, not RUNNING" in err


def test_slurm_not_answering_is_could_not_judge(capsys, monkeypatch):
    monkeypatch.setattr("gpucheck.fleet.slurm.default_runner",
                        lambda argv, timeout_s=30.0: (1, "", "Unable to contact slurm controller (connect failure)"))
    rc, out, err = hang(capsys, "--job", "9")
    assert rc == 3 and "could not judge: scontrol show job 9 failed (exit 1)" in err


# -- real processes, real py-spy ------------------------------------------------------------------

def _py_spy_unusable() -> str | None:
    from gpucheck.hang.local import ptrace_scope

    if find_py_spy() is None:
        return "py-spy is not installed (pip install '.[hang]')"
    scope = ptrace_scope()
    if scope == 3 or (scope in (1, 2) and os.geteuid() != 0):
        return f"kernel.yama.ptrace_scope={scope}: py-spy may not read this user's other processes"
    return None


needs_py_spy = pytest.mark.skipif(_py_spy_unusable() is not None, reason=str(_py_spy_unusable()))


@pytest.fixture
def local_ranks(tmp_path):
    """Three 'ranks' of a job on this node: 0 and 1 wait in a queue, 2 is stuck in load_batch."""
    marker = f"gpucheck-hang-test-{os.getpid()}"
    script = tmp_path / "job.py"
    script.write_text(
        "import os, queue, sys, time\n"
        "def load_batch():\n    time.sleep(600)\n"
        "def wait_for_peers(q):\n    q.get()\n"
        "def step():\n"
        "    if os.environ['RANK'] == '2':\n        load_batch()\n"
        "    wait_for_peers(queue.Queue())\n"
        "print('ready', flush=True)\nstep()\n")
    procs = []
    for rank in range(3):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen([sys.executable, str(script), marker], env=env, stdout=subprocess.PIPE, text=True))
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    yield marker, procs
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.slow
@needs_py_spy
def test_local_json_is_the_node_document(local_ranks):
    marker, procs = local_ranks
    r = subprocess.run([sys.executable, "-m", "gpucheck", "hang", "--local", "--json", "--match", marker,
                        "--node", "nodeA"], capture_output=True, text=True, env=ENV, timeout=120)
    # issue 26: the node document, and the exit code of the judged verdict (rank 2 is stuck: 1, as
    # the table's, test_local_table_names_the_stuck_rank), never the document's own 0
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpucheck.hang.node" and doc["node"] == "nodeA" and doc["status"] == "ok"
    assert doc["py_spy"]["mode"] == "nonblocking" and doc["selector"] == {"match": marker, "job": None, "by": "cmdline"}
    assert sorted((p["rank"], p["pid"]) for p in doc["processes"]) == [(i, p.pid) for i, p in enumerate(procs)]
    main = {p["rank"]: next(t for t in p["threads"] if t["main"]) for p in doc["processes"]}
    assert main[2]["frames"][0]["function"] == "load_batch"
    assert [f["function"] for f in main[0]["frames"]][1:3] == ["Queue.get", "wait_for_peers"]
    assert all(p.poll() is None for p in procs)  # nothing was stopped or killed


@pytest.mark.slow
@needs_py_spy
def test_local_table_names_the_stuck_rank(local_ranks):
    marker, procs = local_ranks
    r = subprocess.run([sys.executable, "-m", "gpucheck", "hang", "--local", "--match", marker],
                       capture_output=True, text=True, env=ENV, timeout=120)
    # no rank waits in a torch collective here: the majority (ranks 0, 1) is the healthy group
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"rank 2 on " in r.stdout and f"(pid {procs[2].pid}): stack differs from the 2 rank(s) of group 1: " \
                                       "load_batch (job.py)" in r.stdout


def test_local_without_any_rank_process_is_could_not_judge():
    r = subprocess.run([sys.executable, "-m", "gpucheck", "hang", "--local", "--match", "no-such-process-xyz"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 3 and "could not judge: no rank process was found" in r.stdout
    r = subprocess.run([sys.executable, "-m", "gpucheck", "hang", "--local", "--json", "--match", "no-such-process-xyz"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["status"] == "no-processes" and doc["exit_code"] == 3


@pytest.mark.slow
def test_local_without_py_spy_reports_every_rank_undumped(local_ranks, tmp_path):
    marker, procs = local_ranks
    r = subprocess.run([sys.executable, "-m", "gpucheck", "hang", "--local", "--json", "--match", marker,
                        "--py-spy", str(tmp_path / "missing")], capture_output=True, text=True, env=ENV, timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["status"] == "error"
    assert doc["reason"].startswith("no rank process could be dumped: rank 0 (pid")
    assert {p["error"] for p in doc["processes"]} == {"py-spy not found (pip install 'gpucheck-cluster[hang]', or --py-spy PATH)"}


def test_sigterm_on_a_node_stops_py_spy_and_prints_what_it_has(local_ranks, tmp_path):
    marker, procs = local_ranks
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 'py-spy 0.4.3'; exit 0; }}\n"
                    f"echo $$ >> {tmp_path}/spies\nexec sleep 120\n")
    fake.chmod(0o755)
    p = subprocess.Popen([sys.executable, "-m", "gpucheck", "hang", "--local", "--json", "--match", marker,
                          "--py-spy", str(fake), "--dump-timeout", "100s"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            spies = (tmp_path / "spies").read_text().split() if (tmp_path / "spies").exists() else []
            if len(spies) == 3:  # one dump per rank, all hanging
                break
            time.sleep(0.05)
        assert len(spies) == 3, "py-spy was not started for every rank"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    doc = json.loads(out)
    assert p.returncode == 3 and doc["status"] == "interrupted" and doc["exit_code"] == 3, err
    assert {x["error"] for x in doc["processes"]} == {"interrupted"} and doc["py_spy"]["version"] == "0.4.3"
    for pid in map(int, spies):  # every py-spy stopped (its whole process group), the ranks untouched
        assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert all(x.poll() is None for x in procs)


def test_nodeset_with_job_selects_by_job_without_asking_slurm(capsys, fake_cluster):
    rc, out, err = hang(capsys, "gpu[001-002]", "--job", "77", "--json")
    assert rc == 1, err
    assert fake_cluster["scontrol"] == [] and fake_cluster["kw"]["mode"] == "ssh"
    assert all(" --job 77 " in c for c in fake_cluster["commands"].values())
    assert json.loads(out)["source"] == {"nodeset": "gpu[001-002]", "job": "77", "match": None, "mode": "ssh"}


def test_an_internal_error_is_could_not_judge_never_a_suspect(capsys, monkeypatch):
    def broken(*a, **kw):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr("gpucheck.platform.fanout.run_nodes", broken)
    rc, out, err = hang(capsys, "n[1-2]", "--match", "x")
    assert rc == 3 and err == "gpucheck hang: error: could not judge: internal error: OSError: [Errno 24] Too many open files\n"


@pytest.mark.parametrize("text", ["", "  \n\n", "[]"])
def test_an_empty_from_file_is_a_usage_error(tmp_path, text):
    """issue 26: `hang --from <empty file>` was exit 3 where every other empty input is exit 2."""
    path = tmp_path / "empty.json"
    path.write_text(text)
    r = subprocess.run([sys.executable, "-m", "gpucheck", "hang", "--from", str(path)], capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert "--from" in r.stderr and "no node document" in r.stderr and len(r.stderr.strip().splitlines()) == 1
