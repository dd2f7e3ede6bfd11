"""An output that is the kernel's or a device's file is refused before anything runs (issue 26:
`-o /proc/version` and `--prom /sys/...` ran every check, then warned, exit 0). The rule lives in
gpucheck.platform.safeio (every user-named output goes through it): under /proc, /sys or /dev
(but /dev/shm), or on a kernel or device file system by its mount type; a directory, a device
other than /dev/null or a terminal, an untrusted symlink were refused already."""

from __future__ import annotations

import os

import pytest

from gpucheck.cli.main import main
from gpucheck.platform import safeio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAP = os.path.join(ROOT, "tests", "fixtures", "snapshots", "h100-healthy.json")
KERNEL_TARGETS = ["/proc/version", "/proc/sys/kernel/hostname", "/sys/kernel/notes", "/proc/gpucheck-new.json",
                  "/sys/gpucheck-new.json", "/dev/gpucheck-new.json", "/dev/loop-gpucheck"]


@pytest.fixture(autouse=True)
def _nothing_left_in_dev():
    """Old code wrote /dev/gpucheck-new.json (devtmpfs takes a regular file): removed, whatever happens."""
    yield
    for left in ("/dev/gpucheck-new.json", "/dev/loop-gpucheck"):
        if os.path.isfile(left) and not os.path.islink(left):
            os.unlink(left)


@pytest.mark.parametrize("target", KERNEL_TARGETS)
def test_a_kernel_or_device_file_is_no_output(target):
    with pytest.raises(safeio.RefusedPath, match="never an output"):
        safeio.check_output(target)


def test_the_mount_type_alone_refuses_a_kernel_file_system(monkeypatch):
    """Wherever /proc and /sys are mounted: the type of the folder's mount decides too."""
    monkeypatch.setattr(safeio, "_KERNEL_FOLDERS", ())
    for target in ("/proc/version", "/sys/kernel/notes"):
        with pytest.raises(safeio.RefusedPath, match="on a (proc|sysfs) file system"):
            safeio.check_output(target)
    assert safeio._mount_type(os.stat("/proc").st_dev) == "proc"


def test_ordinary_outputs_stay_allowed(tmp_path):
    for target in (str(tmp_path / "v.json"), "/dev/null", "/dev/shm/gpucheck-test-output.json"):
        safeio.check_output(target)  # nothing is created
    assert not os.path.exists("/dev/shm/gpucheck-test-output.json")


@pytest.mark.parametrize("argv", [
    ["run", "--snapshot", SNAP, "--no-history", "-o", "{}"],
    ["run", "--snapshot", SNAP, "--no-history", "--prom", "{}"],
    ["sweep", "n[1-2]", "--report", "{}"],
    ["hang", "n[1-2]", "--match", "x", "--record", "{}"],
    ["report", SNAP, "-o", "{}"],
    ["telemetry", "dump", "-o", "{}"],
], ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("target", ["/proc/version", "/sys/kernel/notes", "/dev/gpucheck-new.json"])
def test_every_command_refuses_it_before_anything_runs(argv, target, capsys, monkeypatch):
    from gpucheck.platform import fanout

    def no_fan_out(*a, **kw):
        raise AssertionError("a node was run")

    monkeypatch.setattr(fanout, "run_nodes", no_fan_out)
    rc = main([a.replace("{}", target) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out[-300:], err[-500:])
    assert target in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists("/dev/gpucheck-new.json")  # nothing was written
