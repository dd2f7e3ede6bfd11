"""scripts/slurm/gpucheck-hook.sh: one wrapper for both Slurm hooks. It picks the hook from the
name it is installed under (or SLURM_SCRIPT_CONTEXT), passes the site's per-hook arguments, and
never blocks a node when gpucheck cannot be started unless the site asks for fail-closed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm" / "gpucheck-hook.sh"


@pytest.fixture
def hooks(tmp_path):
    fake = tmp_path / "fake-gpucheck"
    fake.write_text('#!/bin/sh\necho "ARGS: $*"\nexit 7\n')
    fake.chmod(0o755)
    (tmp_path / "gpucheck-slurm.env").write_text(
        f'GPUCHECK="{fake}"\nGPUCHECK_ARGS="--state-dir /s"\n'
        'GPUCHECK_PROLOG_ARGS="--budget 9s"\nGPUCHECK_EPILOG_ARGS="--failed-level 2"\n')
    for name in ("gpucheck-prolog.sh", "gpucheck-epilog.sh", "gpucheck-hook.sh"):
        shutil.copy(SCRIPT, tmp_path / name)
    return tmp_path


def _run(path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"}
    return subprocess.run(["/bin/sh", str(path)], env={**base, **env}, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("name, want", [
    ("gpucheck-prolog.sh", "ARGS: slurm prolog --state-dir /s --budget 9s"),
    ("gpucheck-epilog.sh", "ARGS: slurm epilog --state-dir /s --failed-level 2"),
])
def test_hook_from_the_installed_name(hooks, name, want):
    r = _run(hooks / name, SLURM_SCRIPT_CONTEXT="epilog_slurmd" if "prolog" in name else "prolog_slurmd")
    assert r.stdout.strip() == want and r.returncode == 7  # gpucheck's own exit status


@pytest.mark.parametrize("context, hook", [("prolog_slurmd", "prolog"), ("epilog_slurmd", "epilog")])
def test_hook_from_slurm_script_context_under_a_neutral_name(hooks, context, hook):
    r = _run(hooks / "gpucheck-hook.sh", SLURM_SCRIPT_CONTEXT=context)
    assert r.stdout.startswith(f"ARGS: slurm {hook} --state-dir /s")


def test_unknown_hook_passes_by_default_and_fails_closed_on_request(hooks):
    r = _run(hooks / "gpucheck-hook.sh")
    assert r.returncode == 0 and "cannot tell prolog from epilog" in r.stderr and not r.stdout
    env = hooks / "gpucheck-slurm.env"
    env.write_text(env.read_text() + "GPUCHECK_ON_ERROR=fail\n")
    assert _run(hooks / "gpucheck-hook.sh").returncode == 1


def test_missing_gpucheck_is_logged_not_a_drain(hooks):
    env = hooks / "gpucheck-slurm.env"
    env.write_text(f'GPUCHECK="{hooks}/nowhere"\n')
    r = _run(hooks / "gpucheck-prolog.sh")
    assert r.returncode == 0 and "cannot start gpucheck" in r.stderr and os.fspath(hooks / "nowhere") in r.stderr
