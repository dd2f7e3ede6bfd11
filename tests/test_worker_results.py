"""Each worker's result is the TypedDict that describes it (gpucheck.workers.results): every worker
target runs in this process on a CPU stand-in, and the keys it returns are exactly its type's
(every required key, no key the type does not name), its device description DeviceInfo's."""

from __future__ import annotations

import pytest

from gpucheck.workers import results as R
from gpucheck.workers.pool import LocalChannel, WorkerJob

pytest.importorskip("torch")
pytest.importorskip("numpy")


def _chan():
    return LocalChannel(WorkerJob("w", gpu=0, device="cpu"))


def _matches(value, typed) -> None:
    keys = set(value)
    missing = set(typed.__required_keys__) - keys
    unknown = keys - set(typed.__required_keys__) - set(typed.__optional_keys__)
    assert not missing and not unknown, (typed.__name__, sorted(missing), sorted(unknown))


def _burn():
    from gpucheck.compute.gemm import burn_worker

    return burn_worker({"duration_s": 0.3, "dtypes": ["fp32"], "size": 32, "repeats": 2}, _chan())


def _poet():
    from gpucheck.poet.worker import poet_worker

    return poet_worker({"duration_s": 0.3, "dtypes": ["fp32"], "blocks": [32]}, _chan())


def _memtest():
    from gpucheck.eud.memtest_worker import memtest_worker

    return memtest_worker({"patterns": ["zeros"], "passes": 1, "cpu_bytes": 1 << 16, "cpu_chunk_bytes": 1 << 15},
                          _chan())


def _repro():
    from gpucheck.repro.worker import repro_worker

    return repro_worker({"workloads": ["all"]}, _chan())


def _copybw():
    from gpucheck.eud.copybw import copybw_worker

    return copybw_worker({"gpus": [{"gpu": 0, "name": None}], "h2d_bytes": 4096, "d2d_bytes": 4096,
                          "p2p_bytes": 4096, "repeats": 1, "warmup": 0}, _chan())


@pytest.mark.slow
@pytest.mark.parametrize("run,typed", [(_burn, R.BurnResult), (_poet, R.PoetResult), (_memtest, R.MemtestResult),
                                       (_repro, R.ReproResult), (_copybw, R.CopyBwResult)],
                         ids=["burn", "poet", "memtest", "repro", "copybw"])
def test_a_workers_result_is_its_type(run, typed):
    out = run()
    assert "setup_error" not in out, out
    _matches(out, typed)
    if isinstance(out.get("device"), dict) and "torch" in out["device"]:
        _matches(out["device"], R.DeviceInfo)
    if typed is R.BurnResult:
        _matches(out["config"], R.BurnRunConfig)
        for d in out["dtypes"].values():
            _matches(d, R.BurnDtype)
    if typed is R.ReproResult:
        for run in out["runs"]:
            for digest in run.values():
                _matches(digest, R.ReproDigest)


def test_silent_data_corruption_events_are_their_type(monkeypatch):
    from gpucheck.compute import gemm

    repeat = gemm.burn_worker({"duration_s": 0.3, "dtypes": ["fp32"], "size": 32, "repeats": 3, "ref_every_s": 60.0,
                               "bitflip": {"set": 1, "bit": None, "row": 1, "col": 2}}, _chan())
    monkeypatch.setattr(gemm, "reference_tolerance", lambda dtype, n: -1.0)  # every reference check fails
    reference = gemm.burn_worker({"duration_s": 0.3, "dtypes": ["fp32"], "size": 32, "repeats": 2,
                                  "ref_every_s": 0.0}, _chan())
    events = repeat["sdc"] + reference["sdc"]
    assert {e["kind"] for e in events} == {"repeat", "reference"}
    for e in events:
        _matches(e, R.SdcEvent)


def test_a_device_that_cannot_be_used_is_a_setup_error():
    from gpucheck.poet.worker import poet_worker

    out = poet_worker({"duration_s": 0.3, "blocks": [8]}, _chan())
    _matches(out, R.SetupError)
