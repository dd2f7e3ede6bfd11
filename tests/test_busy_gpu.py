"""The load-test guard on a GPU machine (run: python3 -m pytest -m gpu tests/test_busy_gpu.py -s).

A separate process holds a CUDA context and 1 GiB on GPU 0, as a job would: `gpucheck burn`
must not load GPU 0 (skip naming that PID, exit 3), and with --force must load it and say so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
JOB = ("import time, torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:0'); "
       "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)")


def _burn(tmp_path, *extra):
    argv = [sys.executable, "-m", "gpucheck.cli.main", "burn", "--gpus", "0", "--duration", "3s", "--size", "2048",
            "--json", "--no-history", "--state-dir", str(tmp_path), *extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    v = json.loads(r.stdout)
    (res,) = [x for x in v["results"] if x["gpu"] == 0]
    print(f"\nexit {r.returncode}: {res['status']} {res['summary']}\n  evidence: {res['evidence']}")
    return r.returncode, res


def test_burn_does_not_load_a_gpu_that_a_cuda_process_is_using(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no usable CUDA GPU")
    job = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert job.stdout.readline().strip() == "ready"
        rc, res = _burn(tmp_path)
        assert rc == 3 and res["status"] == "skip" and res.get("unexamined") is True
        assert res["summary"].startswith("GPU 0 is in use by PID ")
        assert res["summary"].endswith(": not loaded; --force to load it anyway")
        if os.path.exists(f"/proc/{job.pid}") and f"PID {job.pid} " in res["summary"]:  # same PID namespace as NVML
            assert f"PID {job.pid} (python" in res["summary"]
        assert res["metrics"]["processes"]["value"] >= 1 and "tflops_bf16" not in res["metrics"]  # nothing burned
        rc, res = _burn(tmp_path, "--force")
        assert res["status"] != "skip", res["summary"]
        assert any(e.startswith("--force: loaded although GPU 0 is in use by PID ") for e in res["evidence"])
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
