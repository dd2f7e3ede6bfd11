"""The Slurm hooks in a real Slurm (tests/slurm_harness.py: munged, slurmctld, four slurmd on one
host) with the shipped wrapper scripts (scripts/slurm/) as Prolog= and Epilog=.

What each node's hook judges comes from a per-node snapshot file ({node} in the hook's
--snapshot): n2's prolog sees an uncorrectable ECC error, n3's epilog sees ECC errors appear
during the job. Checked: a healthy prolog lets the job run; a failing prolog drains only its
node with the gpucheck reason and the job fails (srun) or is requeued (sbatch); the epilog
drains on ECC growth; `slurm resume` brings back only gpucheck's drains that pass now; a
sweep with srun. gpucheck's own failures never drain: a usage error in a node's hook settings
(a per-node settings file, hooks/extra-<node>.env, sourced by the shared one) lets the job run
and is recorded; a python that cannot start gpucheck, with on-error fail, drains with a
`gpucheck: could not judge` reason that `slurm resume` undoes. Every srun runs under `timeout`
(srun waits forever on a drained node)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_harness import SlurmHarness, slurm_unavailable  # noqa: E402
from sshd_harness import SshdHarness, sshd_unavailable  # noqa: E402

from gpucheck.cli.main import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEALTHY, DBE = SNAPS / "h100-healthy.json", SNAPS / "h100-ecc-dbe.json"
NODES = ["n1", "n2", "n3", "n4"]
GPUCHECK = f"env PYTHONPATH={ROOT} {sys.executable} -m gpucheck"

pytestmark = pytest.mark.root
_why = slurm_unavailable() or sshd_unavailable()
if _why:
    pytestmark = [pytest.mark.root, pytest.mark.skip(reason=_why)]


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="gpucheck-slurm-"))  # not under pytest's 0700 folders: munged checks
    hooks, snaps = root / "hooks", root / "snaps"
    hooks.mkdir()
    snaps.mkdir()
    for hook in ("prolog", "epilog"):  # one script, installed under both names (docs/fleet.md)
        shutil.copy(ROOT / "scripts" / "slurm" / "gpucheck-hook.sh", hooks / f"gpucheck-{hook}.sh")
    for n in NODES:
        shutil.copy(HEALTHY, snaps / f"{n}.json")
        shutil.copy(HEALTHY, snaps / f"{n}-after.json")
    shutil.copy(DBE, snaps / "n2.json")
    shutil.copy(DBE, snaps / "n3-after.json")
    (hooks / "gpucheck-slurm.env").write_text(
        f'GPUCHECK="{sys.executable} -m gpucheck"\n'
        f"PYTHONPATH={ROOT}\n"
        "export PYTHONPATH\n"
        f'GPUCHECK_ARGS="--state-dir {root}/gpucheck-state/{{node}}"\n'
        f'GPUCHECK_PROLOG_ARGS="--snapshot {snaps}/{{node}}.json"\n'
        f'GPUCHECK_EPILOG_ARGS="--snapshot {snaps}/{{node}}-after.json"\n'
        # per-node settings, as docs/fleet.md shows: SLURMD_NODENAME is set when this is read
        f'extra="{hooks}/extra-$SLURMD_NODENAME.env"\n'
        'if [ -r "$extra" ]; then . "$extra"; fi\n')
    cl = SlurmHarness(root, NODES, prolog=str(hooks / "gpucheck-prolog.sh"), epilog=str(hooks / "gpucheck-epilog.sh"),
                      extra_conf="PrologFlags=Alloc\nPrologEpilogTimeout=300")  # as docs/fleet.md recommends
    sshd = SshdHarness(root / "sshd", {n: f"127.0.0.{i + 1}" for i, n in enumerate(NODES)})
    try:
        with cl:
            sshd.start()
            cl.snaps = snaps
            cl.hooks = hooks
            cl.sshd = sshd
            yield cl
    finally:
        sshd.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def env(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    for k, v in cluster.sshd.env().items():
        monkeypatch.setenv(k, v)
    return cluster


def history(cluster, node) -> list[dict]:
    path = cluster.root / "gpucheck-state" / node / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sweep_with_srun(env, capsys):
    rc = main(["sweep", "n[1,4]", "--srun", "--remote-cmd", GPUCHECK, "--snapshot", str(HEALTHY), "--timeout", "60s",
               "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert [(n["node"], n["status"]) for n in doc["nodes"]] == [("n1", "pass"), ("n4", "pass")]
    assert doc["mode"] == "srun"


def test_healthy_prolog_lets_the_job_run(env):
    before = len(history(env, "n1"))
    r = env.run(["srun", "-w", "n1", "echo", "job-ran"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "job-ran", r.stderr
    env.wait_for(lambda: len(history(env, "n1")) >= before + 2, 30, "prolog and epilog verdicts in n1's history")
    assert env.node_info("n1")["state"] in ("IDLE", "MIXED", "ALLOCATED", "IDLE+COMPLETING")
    assert [v["status"] for v in history(env, "n1")[-2:]] == ["pass", "pass"]


def test_failing_prolog_drains_only_that_node_and_fails_the_job(env):
    r = env.run(["srun", "-w", "n2", "echo", "job-ran"], timeout=60)
    assert r.returncode != 0 and "job-ran" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert "prolog" in r.stderr.lower(), r.stderr
    info = env.node_info("n2")
    assert "DRAIN" in info["state"], info
    assert info["reason"] == "gpucheck: gpu3 ecc-dbe -> reset-gpu", info
    for n in ("n1", "n3", "n4"):
        assert "DRAIN" not in env.node_info(n)["state"], (n, env.node_info(n))
    # the prolog's verdict is in n2's history (the epilog, which also runs, may have added one after it)
    prolog = [v for v in history(env, "n2") if v["source"]["path"] == str(env.snaps / "n2.json")]
    assert prolog and prolog[-1]["status"] == "fail"


def test_failing_prolog_requeues_a_batch_job(env):
    shutil.copy(DBE, env.snaps / "n4.json")
    try:
        r = env.run(["sbatch", "--parsable", "-w", "n4", "-o", "/dev/null", "--wrap", "true"], timeout=30)
        job = r.stdout.strip().split(";")[0]
        assert r.returncode == 0 and job.isdigit(), r.stderr
        env.wait_for(lambda: "DRAIN" in env.node_info("n4")["state"], 60, "n4 drained")

        def requeued() -> bool:
            out = env.run(["scontrol", "show", "job", job], timeout=10).stdout
            return "JobState=PENDING" in out and "Restarts=1" in out
        env.wait_for(requeued, 60, "the job requeued")
        assert "held" in env.run(["scontrol", "show", "job", job], timeout=10).stdout.lower()
        assert env.node_info("n4")["reason"] == "gpucheck: gpu3 ecc-dbe -> reset-gpu"
        env.run(["scancel", job], timeout=10)
    finally:
        shutil.copy(HEALTHY, env.snaps / "n4.json")


def test_epilog_drains_on_ecc_errors_during_the_job(env):
    r = env.run(["srun", "-w", "n3", "echo", "job-ran"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "job-ran", r.stderr
    env.wait_for(lambda: "DRAIN" in env.node_info("n3")["state"], 60, "n3 drained by its epilog")
    reason = env.node_info("n3")["reason"]
    assert reason.startswith("gpucheck: gpu3 ecc-in-job"), reason  # the full cause is in the log


def test_resume_brings_back_only_gpucheck_drains_that_pass(env, capsys):
    env.run(["scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=admin: broken fan"], timeout=10)
    for n in ("n2", "n3", "n4"):  # whatever the earlier tests left: gpucheck drains on n2, n3 (and n4)
        assert env.node_info(n)["reason"].startswith("gpucheck:") or "DRAIN" not in env.node_info(n)["state"]
    # n3 still has its ECC errors; n2 was repaired.
    rc = main(["slurm", "resume", "n[1-4]", "--remote-cmd", GPUCHECK, "--snapshot", str(HEALTHY),
               "--node-args", f"n3=--snapshot {DBE}", "--timeout", "60s", "--json"])
    decisions = {d["node"]: d for d in json.loads(capsys.readouterr().out)}
    assert rc == 1  # n3 is still bad
    assert decisions["n1"]["decision"] == "not-ours" and decisions["n1"]["reason"] == "admin: broken fan"
    assert decisions["n2"]["decision"] == "resumed" and decisions["n3"]["decision"] == "still-bad"
    assert decisions["n3"]["detail"].startswith("fail: ecc gpu3")
    assert "DRAIN" in env.node_info("n1")["state"] and env.node_info("n1")["reason"] == "admin: broken fan"
    assert "DRAIN" not in env.node_info("n2")["state"]
    assert "DRAIN" in env.node_info("n3")["state"]
    env.wait_for(lambda: env.sinfo_states().get("n2") == "idle", 30, "n2 idle again")
    # n2 takes jobs again (its prolog snapshot is healthy now)
    shutil.copy(HEALTHY, env.snaps / "n2.json")
    r = env.run(["srun", "-w", "n2", "echo", "back"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "back", r.stderr


def test_a_usage_error_in_a_nodes_hook_settings_does_not_drain_it(env):
    env.wait_for(lambda: env.sinfo_states().get("n4") == "idle", 60, "n4 idle")
    extra = env.hooks / "extra-n4.env"
    extra.write_text('GPUCHECK_PROLOG_ARGS="$GPUCHECK_PROLOG_ARGS --budget 5x"\n')
    try:
        r = env.run(["srun", "-w", "n4", "echo", "job-ran"], timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "job-ran", r.stderr
        assert "DRAIN" not in env.node_info("n4")["state"], env.node_info("n4")
        recorded = [v for v in history(env, "n4") if v["results"] and v["results"][0]["check"] == "slurm.prolog"]
        assert recorded and recorded[-1]["status"] == "error"
        assert "usage error in the hook's arguments" in recorded[-1]["results"][0]["summary"]
        assert "bad duration '5x'" in recorded[-1]["results"][0]["summary"]
    finally:
        extra.unlink()


def test_gpucheck_that_cannot_start_fails_closed_with_a_gpucheck_reason_that_resume_undoes(env, capsys):
    env.wait_for(lambda: env.sinfo_states().get("n4") == "idle", 60, "n4 idle")
    extra = env.hooks / "extra-n4.env"
    extra.write_text(f'GPUCHECK="{sys.executable} -I -S -m gpucheck"\nGPUCHECK_ON_ERROR=fail\n')
    try:
        r = env.run(["srun", "-w", "n4", "echo", "job-ran"], timeout=60)
        assert r.returncode != 0 and "job-ran" not in r.stdout, (r.returncode, r.stdout, r.stderr)
        env.wait_for(lambda: "DRAIN" in env.node_info("n4")["state"], 60, "n4 drained")
        reason = env.node_info("n4")["reason"]
        # NHC-style (issue 26): the cause's head; "No module named gpucheck" is in the log line
        assert reason == "gpucheck: could not judge: gpucheck exited 1 (crashed)", reason
    finally:
        extra.unlink()
    rc = main(["slurm", "resume", "n4", "--remote-cmd", GPUCHECK, "--snapshot", str(HEALTHY), "--timeout", "60s",
               "--json"])
    (decision,) = json.loads(capsys.readouterr().out)
    assert rc == 0 and decision["decision"] == "resumed", decision
    env.wait_for(lambda: env.sinfo_states().get("n4") == "idle", 60, "n4 idle again")
