"""`gpucheck hang --job JOBID --srun` in a real Slurm (tests/slurm_harness.py: munged, slurmctld,
four slurmd on one host): a batch job of two srun tasks (gloo, ranks from SLURM_PROCID), task 1
stuck in data loading. scontrol gives the job's nodes, one `srun --jobid --overlap` step per node
runs `hang --local --job`, each node picks the job's processes of that node (SLURM_JOB_ID and
SLURMD_NODENAME: all four "nodes" share this host and its /proc) and names task 1 on n2."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_harness import SlurmHarness, slurm_unavailable  # noqa: E402

from gpucheck.cli.main import main  # noqa: E402
from gpucheck.hang.local import ptrace_scope  # noqa: E402
from gpucheck.hang.pyspy import find_py_spy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPUCHECK = f"env PYTHONPATH={ROOT} {sys.executable} -m gpucheck"
NODES = ["n1", "n2", "n3", "n4"]


def _why_not() -> str | None:
    why = slurm_unavailable()
    if why:
        return why
    if find_py_spy() is None:
        return "py-spy is not installed (pip install '.[hang]')"
    if ptrace_scope() == 3:
        return "kernel.yama.ptrace_scope=3: py-spy cannot read any process here"
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return "torch is not installed"
    return None


pytestmark = pytest.mark.root
_why = _why_not()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=_why)]


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="gpucheck-hang-slurm-"))  # munged refuses pytest's 0700 folders
    cl = SlurmHarness(root, NODES)
    try:
        with cl:
            yield cl
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_job_hang_over_srun_names_the_stuck_task_and_its_node(cluster, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    for k in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        monkeypatch.delenv(k)
    out = cluster.root / "job.out"
    script = cluster.root / "job.sh"
    port = 29500 + os.getpid() % 400
    script.write_text(
        "#!/bin/sh\n"
        f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} HANG_RANK=1 HANG_AFTER=3 PYTHONPATH={ROOT}\n"
        f"srun {sys.executable} {ROOT / 'tests' / 'hang_train.py'}\n")
    r = cluster.run(["sbatch", "-N", "2", "-n", "2", "-w", "n[1-2]", "-o", str(out), str(script)], timeout=30)
    job = re.search(r"Submitted batch job (\d+)", r.stdout)
    assert job, r.stdout + r.stderr
    job_id = job.group(1)
    try:
        deadline = time.monotonic() + 240
        while True:
            text = out.read_text() if out.exists() else ""
            if "hanging" in text and text.count("step 3") >= 2:
                break
            assert time.monotonic() < deadline, f"the job never hung: {text[-2000:]}"
            time.sleep(0.5)
        time.sleep(2)  # task 0 is inside all_reduce, waiting for task 1
        rc = main(["hang", "--job", job_id, "--srun", "--remote-cmd", GPUCHECK, "--timeout", "120s", "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert rc == 1, doc["summary"]
        assert doc["source"] == {"nodeset": "n[1-2]", "job": job_id, "match": None, "mode": "srun"}
        assert [(n["node"], n["status"], n["ranks"]) for n in doc["nodes"]] == [("n1", "ok", [0]), ("n2", "ok", [1])]
        assert [(s["rank"], s["node"]) for s in doc["suspects"]] == [(1, "n2")] and doc["suspect_nodes"] == "n2"
        assert doc["world_size"] == 2 and doc["groups"][0]["main_frames"][0].startswith("all_reduce (")
    finally:
        cluster.run(["scancel", job_id], timeout=30)
        cluster.wait_for(cluster.all_idle, 60, "the job's nodes idle again")
