"""Issue 26's hook cases in a real Slurm 22.05 (tests/slurm_harness.py: munged, slurmctld, three
slurmd on one host) with the shipped wrapper as Prolog= and Epilog=, and a PrologEpilogTimeout
(12 s) shorter than the prolog's budget (15 s): past it Slurm kills a hook with SIGKILL ("prolog
killed by signal 9") and drains the node whatever --on-error says.

- n1: NVML hangs (a pynvml whose calls never return, first on PYTHONPATH): the prolog fits its
  budget into the timeout, judges what it can (could not judge: on-error pass), and the job runs;
  the node is not drained. Before, the run took its 15 s and Slurm drained the node.
- n2: a gpucheck that never ends (SIGTERM ignored): the wrapper stops it before Slurm's SIGKILL
  and exits by on-error: the job runs, the node is not drained.
- n3: an epilog-only judgement (the epilog keeps its own state, so no prolog record: the job's
  start comes from scontrol) of a job named `train NodeList=n1 StartTime=<submit + 20 s>` that
  logs an Xid 79 three seconds in: the epilog's window starts at Slurm's StartTime, so the Xid is
  judged and the node drained; `hang --job`'s reader names n3, not n1. Before, the name's
  StartTime started the window after the Xid: pass."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_harness import SlurmHarness, slurm_unavailable  # noqa: E402

from gpucheck.fleet.slurm import default_runner  # noqa: E402
from gpucheck.hang.slurmjob import job_info  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEALTHY = ROOT / "tests" / "fixtures" / "snapshots" / "h100-healthy.json"
NODES = ["n1", "n2", "n3"]
TIMEOUT_S = 12

pytestmark = [pytest.mark.root, pytest.mark.slow]
_why = slurm_unavailable()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.skip(reason=_why)]

HANGING_PYNVML = '''
"""A pynvml whose driver answers nvmlInit and then never again (nvmlShutdown included)."""
import threading

class NVMLError(Exception):
    pass

def nvmlInit():
    pass

def _hang(*args):
    threading.Event().wait()

nvmlDeviceGetCount = _hang
nvmlShutdown = _hang
'''


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="gpucheck-slurm26-"))  # munged refuses pytest's 0700 folders
    hooks, fake = root / "hooks", root / "fake-nvml"
    hooks.mkdir()
    fake.mkdir()
    (fake / "pynvml.py").write_text(textwrap.dedent(HANGING_PYNVML))
    for hook in ("prolog", "epilog"):
        shutil.copy(ROOT / "scripts" / "slurm" / "gpucheck-hook.sh", hooks / f"gpucheck-{hook}.sh")
    stuck = hooks / "stuck-gpucheck"
    stuck.write_text("#!/bin/sh\ntrap '' TERM INT\ni=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done\n")
    stuck.chmod(0o755)
    (root / "xid.toml").write_text(f'[checks.xid]\nfiles = ["{root}/kern.log"]\n')
    (root / "kern.log").write_text("")
    (hooks / "gpucheck-slurm.env").write_text(
        f'GPUCHECK="{sys.executable} -m gpucheck"\n'
        f"PYTHONPATH={ROOT}\n"
        f'GPUCHECK_ARGS="--state-dir {root}/state/{{node}}"\n'
        'case "$SLURMD_NODENAME" in\n'
        f'  n1) PYTHONPATH={fake}:{ROOT}; GPUCHECK_PROLOG_ARGS="--skip repro.bitwise";\n'
        f'      GPUCHECK_EPILOG_ARGS="--snapshot {HEALTHY}" ;;\n'
        f'  n2) GPUCHECK="{stuck}" ;;\n'
        f'  n3) GPUCHECK_PROLOG_ARGS="--snapshot {HEALTHY}";\n'
        f'      GPUCHECK_EPILOG_ARGS="--state-dir {root}/epilog-state --check xid --config {root}/xid.toml" ;;\n'
        "esac\n"
        "export PYTHONPATH\n")
    cl = SlurmHarness(root, NODES, prolog=str(hooks / "gpucheck-prolog.sh"), epilog=str(hooks / "gpucheck-epilog.sh"),
                      extra_conf=f"PrologFlags=Alloc\nPrologEpilogTimeout={TIMEOUT_S}")
    try:
        with cl:
            yield cl
    finally:
        shutil.rmtree(root, ignore_errors=True)


def history(cluster, folder: str) -> list[dict]:
    path = cluster.root / folder / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_prolog_on_a_hung_driver_ends_before_slurms_sigkill_and_the_job_runs(cluster):
    t0 = time.monotonic()
    r = cluster.run(["srun", "-w", "n1", "echo", "job-ran"], timeout=90)
    assert r.returncode == 0 and r.stdout.strip() == "job-ran", (r.returncode, r.stdout, r.stderr)
    assert time.monotonic() - t0 < TIMEOUT_S + 10
    info = cluster.node_info("n1")
    assert "DRAIN" not in info["state"] and "Prolog error" not in info["reason"], info
    cluster.wait_for(lambda: len(history(cluster, "state/n1")) >= 1, 30, "n1's prolog verdict")
    prolog = history(cluster, "state/n1")[0]
    assert prolog["status"] == "error"  # NVML did not answer: could not judge, never a pass
    assert prolog["duration_s"] < TIMEOUT_S - 3  # the 15 s budget was shrunk to fit


def test_a_gpucheck_that_never_ends_is_stopped_by_the_wrapper_and_the_job_runs(cluster):
    r = cluster.run(["srun", "-w", "n2", "echo", "job-ran"], timeout=90)
    assert r.returncode == 0 and r.stdout.strip() == "job-ran", (r.returncode, r.stdout, r.stderr)
    info = cluster.node_info("n2")
    assert "DRAIN" not in info["state"] and "Prolog error" not in info["reason"], info
    log = (cluster.root / "log" / "slurmd-n2.log").read_text()
    assert "killed by signal 9" not in log and "prolog failed" not in log.lower()


def test_a_job_name_moves_neither_the_epilogs_window_nor_the_nodes_examined(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    log = cluster.root / "kern.log"
    future = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 20))
    xid = ("$(date -u +%Y-%m-%dT%H:%M:%S+00:00) n3 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, "
           "GPU has fallen off the bus.")
    name = f"train NodeList=n1 StartTime={future}"
    r = cluster.run(["sbatch", "--parsable", "-J", name, "-w", "n3", "-o", "/dev/null",
                     "--wrap", f'sleep 3; echo "{xid}" >> {log}; sleep 24'], timeout=30)
    job = r.stdout.strip().split(";")[0]
    assert r.returncode == 0 and job.isdigit(), r.stderr

    def running() -> bool:
        return " JobState=RUNNING " in cluster.run(["scontrol", "-o", "show", "job", job], timeout=10).stdout
    cluster.wait_for(running, 60, "the job running")
    text = cluster.run(["scontrol", "-o", "show", "job", job], timeout=10).stdout
    assert re.search(r"(?:^|\s)NodeList=(\S*)", text).group(1) == "n1"  # what the first-match reader took
    info = job_info(job, runner=default_runner, scontrol=shutil.which("scontrol") or "scontrol")
    assert info.nodes == ["n3"] and info.nodelist == "n3"
    start = re.findall(r"\sStartTime=(\S+)", text)[-1]  # Slurm's (the name's comes first)
    assert start != future
    cluster.wait_for(lambda: "DRAIN" in cluster.node_info("n3")["state"], 90, "n3 drained by its epilog")
    reason = cluster.node_info("n3")["reason"]
    assert reason.startswith("gpucheck: ") and "79" in reason, reason
    (verdict,) = history(cluster, "epilog-state")
    xid = next(r for r in verdict["results"] if r["check"] == "xid" and r["status"] == "fail")
    said = " ".join([r["summary"] for r in verdict["results"]] + [e for r in verdict["results"] for e in r["evidence"]])
    start_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))))
    assert f"since {start_utc}" in said, (start_utc, said)  # the window starts at Slurm's StartTime
    assert "fallen off the bus" in xid["summary"]
