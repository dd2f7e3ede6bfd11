"""Safe files as root and hostile input files (gpucheck.platform.safeio and everything that goes through it).

Outputs (--output, --prom, --report, telemetry dump -o) never replace a device, a FIFO or a symlink
an ordinary user could have planted; write through a FIFO, /dev/null and terminals; keep an
existing file's mode; a failed write after the run never masks the verdict. The state directory
and the reference store refuse folders others can change (as root) and never follow a symlink in
them. History appends are all or nothing. Input files are regular files within a size limit, and
deep JSON/TOML is a usage error, never a traceback or a hang.

Tests that need root (device nodes, chown, mount) skip otherwise. They never touch the real
/dev/null: device nodes are private copies made with os.mknod in a temporary folder.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpucheck.platform import safeio
from gpucheck.cli.main import main
from gpucheck.core.state import State

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
DBE = str(SNAPS / "h100-ecc-dbe.json")  # a judged fault: exit 1
NOBODY = 65534

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (device nodes, chown, mount)")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_dbe(capsys, *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "run", "--no-history", "--snapshot", DBE, "--check", "ecc", *argv)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def device(path: Path, major: int, minor: int) -> Path:
    os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(major, minor))
    return path


def is_device(path: Path, major: int, minor: int) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)


def no_hang(fn, seconds: float = 20):
    """fn()'s value, failing (not hanging the suite) when it does not return within `seconds`:
    the old code waited forever on a FIFO."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s (on a FIFO?)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def read_fifo_in_thread(fifo: Path) -> tuple[threading.Thread, dict]:
    got: dict = {}

    def reader() -> None:
        with open(fifo, "rb") as f:
            got["data"] = f.read()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    return t, got


@contextmanager
def tiny_fs(where: Path, size: str = "16k"):
    """A real, tiny filesystem (tmpfs of `size`) mounted at `where`, for a real ENOSPC."""
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def run_subprocess(argv: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    """gpucheck in a child process with a time limit and a memory cap: the old code waited on a
    FIFO forever and read /dev/zero until memory ran out."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gpucheck.cli.main", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=cap, **kw)


# -- 1. outputs -----------------------------------------------------------------------------------

@root_only
def test_output_to_a_null_device_is_written_through_and_never_replaced(capsys, tmp_path):
    null = device(tmp_path / "null", 1, 3)
    rc, out, err = run_dbe(capsys, "--json", "--output", str(null), "--prom", str(null))
    assert rc == 1, err
    assert is_device(null, 1, 3)  # the old code renamed a regular file over it
    assert "WARNING" not in err


@root_only
@pytest.mark.parametrize("option", ["--output", "--prom"])
def test_output_refuses_any_other_device_up_front(capsys, tmp_path, option):
    zero = device(tmp_path / "zero", 1, 5)
    rc, out, err = run_dbe(capsys, option, str(zero))
    assert rc == 2 and out == ""
    line = one_line(err)
    assert f"{option} {zero}" in line and "character device" in line
    assert is_device(zero, 1, 5)


def test_output_to_a_fifo_is_written_through(capsys, tmp_path):
    fifo = tmp_path / "verdict.fifo"
    os.mkfifo(fifo)
    t, got = read_fifo_in_thread(fifo)
    rc, out, err = run_dbe(capsys, "--json", "--output", str(fifo))
    t.join(30)
    assert rc == 1, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert json.loads(got["data"]) == json.loads(out)


def test_a_fifo_nobody_reads_is_a_warning_not_a_hang(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(safeio, "WRITE_THROUGH_TIMEOUT_S", 0.3)
    fifo = tmp_path / "nobody.fifo"
    os.mkfifo(fifo)
    rc, out, err = run_dbe(capsys, "--output", str(fifo))
    assert rc == 1
    assert "WARNING: --output" in err and "no process opened it for reading" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@root_only
def test_output_symlink_planted_by_another_user_is_refused(capsys, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    rc, out, err = run_dbe(capsys, "--output", str(link))
    assert rc == 2
    assert "symlink owned by uid 65534" in one_line(err)
    assert link.is_symlink() and victim.read_text() == "root's file\n"


@root_only
def test_output_symlink_in_a_folder_others_can_write_is_refused(capsys, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may replace the link
    target = tmp_path / "target.json"
    (shared / "out.json").symlink_to(target)
    rc, out, err = run_dbe(capsys, "--output", str(shared / "out.json"))
    assert rc == 2 and "folder others can change" in one_line(err)
    assert (shared / "out.json").is_symlink() and not target.exists()


def test_a_trusted_symlink_is_followed_and_kept(capsys, tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    rc, out, err = run_dbe(capsys, "--json", "--output", str(link))
    assert rc == 1, err
    assert link.is_symlink() and json.loads(target.read_text()) == json.loads(out)


def test_replacing_an_output_keeps_its_mode_and_drops_setuid(capsys, tmp_path):
    out_file, prom = tmp_path / "v.json", tmp_path / "g.prom"
    for p in (out_file, prom):
        p.write_text("old\n")
    out_file.chmod(0o640)
    prom.chmod(0o4755)
    rc, out, err = run_dbe(capsys, "--output", str(out_file), "--prom", str(prom))
    assert rc == 1, err
    assert stat.S_IMODE(out_file.stat().st_mode) == 0o640  # the old code made it 0644
    assert stat.S_IMODE(prom.stat().st_mode) == 0o755
    assert json.loads(out_file.read_text())["status"] == "fail"


def test_a_new_output_is_0644_whatever_the_umask(capsys, tmp_path):
    old = os.umask(0o077)
    try:
        rc, out, err = run_dbe(capsys, "--output", str(tmp_path / "v.json"))
    finally:
        os.umask(old)
    assert rc == 1 and stat.S_IMODE((tmp_path / "v.json").stat().st_mode) == 0o644


def test_a_file_name_too_long_is_a_usage_error(capsys, tmp_path):
    name = tmp_path / ("x" * 300)
    for option in ("--output", "--prom"):
        rc, out, err = run_dbe(capsys, option, str(name))
        assert rc == 2 and "file name too long" in one_line(err) and option in err


def test_an_output_naming_a_directory_is_refused(capsys, tmp_path):
    rc, out, err = run_dbe(capsys, "--output", str(tmp_path))
    assert rc == 2 and "directory" in one_line(err)
    rc, out, err = run_dbe(capsys, "--output", str(tmp_path) + "/")
    assert rc == 2 and "names a folder" in one_line(err)


def test_dash_is_stdout_for_output_and_prom(capsys):
    rc, out, err = run_dbe(capsys, "--output", "-", "--prom", "-")
    assert rc == 1
    assert '"schema": "gpucheck.verdict"' in out and "gpucheck_verdict_status{" in out
    assert not Path("-").exists()


@root_only
def test_telemetry_dump_refuses_a_device_before_collecting(capsys, tmp_path):
    zero = device(tmp_path / "zero", 1, 5)
    rc, out, err = run_cli(capsys, "telemetry", "dump", "-o", str(zero), "--sysfs-root", str(tmp_path),
                           "--no-kernel-log")
    assert rc == 2 and "character device" in one_line(err)
    assert is_device(zero, 1, 5)


@root_only
def test_sweep_report_refuses_a_device_before_any_node_runs(capsys, tmp_path):
    zero = device(tmp_path / "zero", 1, 5)
    rc, out, err = run_cli(capsys, "sweep", "n[1-2]", "--report", str(zero))
    assert rc == 2 and "character device" in one_line(err)
    assert is_device(zero, 1, 5)


def test_stale_temporary_files_of_ours_are_cleaned_by_age_only(tmp_path):
    state = State(tmp_path / "state")
    state.ensure()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    old_tmp = state.root / f"{safeio.TMP_PREFIX}dead.tmp"
    old_tmp.write_text("left by a killed writer")
    fresh_tmp = state.root / f"{safeio.TMP_PREFIX}alive.tmp"
    fresh_tmp.write_text("a writer at work")
    old_link = state.root / f"{safeio.TMP_PREFIX}link.tmp"
    old_link.symlink_to(victim)
    foreign = state.root / ".someone-else.tmp"
    foreign.write_text("not ours")
    long_ago = time.time() - 2 * safeio.STALE_TMP_AGE_S
    for p in (old_tmp, foreign):
        os.utime(p, (long_ago, long_ago))
    os.utime(old_link, (long_ago, long_ago), follow_symlinks=False)
    state.write_cursor("last-pass", {"epoch": 1})
    assert not old_tmp.exists()
    assert fresh_tmp.exists() and foreign.exists() and old_link.is_symlink()
    assert victim.read_text() == "keep me\n"


# -- 2. outputs never mask the verdict -----------------------------------------------------------

def test_a_failed_output_write_is_a_warning_and_the_verdict_stands(capsys, tmp_path, monkeypatch):
    def full_disk(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safeio, "write_output", full_disk)
    rc, out, err = run_dbe(capsys, "--output", str(tmp_path / "v.json"), "--prom", str(tmp_path / "g.prom"))
    assert rc == 1  # unhealthy stays unhealthy: the old code turned it into 2
    assert f"WARNING: --output {tmp_path / 'v.json'} was not written: No space left on device" in err
    assert "WARNING: --prom" in err and "the verdict stands (fail, exit 1)" in err


@root_only
def test_a_full_disk_never_turns_a_verdict_into_a_usage_error(capsys, tmp_path):
    with tiny_fs(tmp_path / "tiny") as tiny:
        rc, out, err = run_cli(capsys, "run", "--snapshot", DBE, "--output", str(tiny / "v.json"),
                               "--state-dir", str(tiny / "state"))
        assert rc == 1
        assert "WARNING: --output" in err and "No space left on device" in err
        assert not (tiny / "v.json").exists()
        assert [p.name for p in tiny.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_warnings_reach_the_callers_sink(tmp_path, monkeypatch, capsys):
    from gpucheck.app import RunRequest, execute

    monkeypatch.setattr(safeio, "write_output", lambda p, d: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    seen: list[str] = []
    req = RunRequest(check_patterns=["ecc"], snapshot_path=DBE, history=False, output=str(tmp_path / "v.json"))
    assert execute(req, on_warning=seen.append) == 1
    assert len(seen) == 1 and seen[0].startswith("--output") and "I/O error" in seen[0]


def test_a_failed_history_write_is_a_warning_and_the_verdict_stands(capsys, tmp_path):
    state = tmp_path / "state"
    (state / "history.jsonl").mkdir(parents=True)  # something that is not a regular file
    rc, out, err = run_cli(capsys, "run", "--snapshot", DBE, "--check", "ecc", "--state-dir", str(state))
    assert rc == 1
    assert "WARNING: cannot write the history" in err and "verdict stands" in err


# -- 3/4. state directory, reference store, modes ----------------------------------------------------

@root_only
def test_a_state_dir_owned_by_another_user_is_refused_up_front(capsys, tmp_path):
    user = tmp_path / "user"
    (user / "state").mkdir(parents=True)
    secret = tmp_path / "root-only"
    secret.write_text("")
    secret.chmod(0o600)
    (user / "state" / "history.jsonl").symlink_to(secret)
    os.chown(user, NOBODY, NOBODY)
    os.chown(user / "state", NOBODY, NOBODY)
    rc, out, err = run_cli(capsys, "run", "--snapshot", DBE, "--check", "ecc", "--state-dir", str(user / "state"))
    assert rc == 2 and out == ""
    line = one_line(err)
    assert f"state directory {user / 'state'}" in line and "owned by uid 65534" in line
    assert secret.read_text() == ""  # the old code appended the verdict to it


@root_only
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_state_dir_others_can_write_is_refused(capsys, tmp_path, mode):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    rc, out, err = run_cli(capsys, "run", "--snapshot", DBE, "--check", "ecc", "--state-dir", str(state))
    assert rc == 2 and "writable by group or others" in one_line(err)
    assert not (state / "history.jsonl").exists()


@root_only
def test_a_private_state_dir_under_a_sticky_folder_is_fine_but_not_under_a_writable_one(capsys, tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    rc, out, err = run_cli(capsys, "run", "--snapshot", DBE, "--check", "ecc", "--state-dir", str(sticky / "s"))
    assert rc == 1 and (sticky / "s" / "history.jsonl").exists()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    rc, out, err = run_cli(capsys, "run", "--snapshot", DBE, "--check", "ecc", "--state-dir", str(open_dir / "s"))
    assert rc == 2 and "folder on the way that others can write" in one_line(err)
    assert not (open_dir / "s").exists()


@root_only
def test_a_state_dir_through_a_planted_symlink_is_refused(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    os.chown(user, NOBODY, NOBODY)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "state-link"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(safeio.RefusedPath, match="symlink owned by uid 65534"):
        State(link).check()


def test_state_files_are_never_symlinks(tmp_path):
    state = State(tmp_path / "state")
    state.ensure()
    victim = tmp_path / "victim"
    victim.write_text("")
    (state.root / "history.jsonl").symlink_to(victim)
    (state.root / "cursor-last-pass.json").symlink_to(victim)
    with pytest.raises(safeio.RefusedPath, match="symlink"):
        state.append_history({"schema": "gpucheck.verdict", "i": 1})
    with pytest.raises(safeio.RefusedPath, match="symlink"):
        state.read_cursor("last-pass")
    with pytest.raises(safeio.RefusedPath, match="not a regular file"):
        state.write_cursor("last-pass", {"epoch": 1})
    assert victim.read_text() == ""
    assert list(state.iter_history()) == [] and state.skipped_lines == 1


def test_a_fifo_cursor_is_refused_not_waited_on(tmp_path):
    state = State(tmp_path / "state")
    state.ensure()
    os.mkfifo(state.root / "cursor-last-pass.json")
    with pytest.raises(safeio.RefusedPath, match="not a regular file"):
        no_hang(lambda: state.read_cursor("last-pass"))


def test_state_dir_and_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        state = State(tmp_path / "a" / "state")
        state.append_history({"schema": "gpucheck.verdict", "i": 1})
        state.write_cursor("last-pass", {"epoch": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(state.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(state.history_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((state.root / "cursor-last-pass.json").stat().st_mode) == 0o600


def test_a_replaced_cursor_keeps_its_mode(tmp_path):
    state = State(tmp_path / "state")
    state.write_cursor("last-pass", {"epoch": 1})
    cursor = state.root / "cursor-last-pass.json"
    cursor.chmod(0o640)
    state.write_cursor("last-pass", {"epoch": 2})
    assert stat.S_IMODE(cursor.stat().st_mode) == 0o640 and state.read_cursor("last-pass") == {"epoch": 2}


def test_a_planted_lock_symlink_creates_nothing(tmp_path):
    from gpucheck.repro import store
    from tests.test_repro_store import FP, A

    refs = tmp_path / "refs"
    refs.mkdir(mode=0o700)
    created = tmp_path / "created-by-root"
    (refs / ".refs.json.lock").symlink_to(created)
    with pytest.raises(safeio.RefusedPath, match="symlink"):
        store.record(refs / "refs.json", [(FP, {"gemm.bf16": A})], host="h")
    assert not created.exists() and not (refs / "refs.json").exists()


@root_only
def test_a_reference_folder_others_control_is_refused(capsys, tmp_path):
    from gpucheck.repro import store
    from tests.test_repro_store import FP, A

    user = tmp_path / "user"
    user.mkdir()
    store.record(user / "refs.json", [(FP, {"gemm.bf16": A})], host="h")
    os.chown(user, NOBODY, NOBODY)
    for call in (lambda: store.load(user / "refs.json"),
                 lambda: store.record(user / "refs.json", [(FP, {"gemm.fp32": A})], host="h"),
                 lambda: store.check_writable(user / "refs.json")):
        with pytest.raises(store.RefFileError, match="owned by uid 65534"):
            call()
    rc, out, err = run_cli(capsys, "repro", "check", "--reference", str(user / "refs.json"))
    assert rc == 2 and "owned by uid 65534" in one_line(err)
    rc, out, err = run_cli(capsys, "repro", "record", "--device", "cpu", "--workers", "1",
                           "--out", str(user / "refs.json"))
    assert rc == 2 and "owned by uid 65534" in one_line(err)


def test_repro_record_out_refuses_a_symlink_or_a_fifo(capsys, tmp_path):
    from gpucheck.repro import store

    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    os.mkfifo(tmp_path / "fifo.json")
    for name, needle in (("link.json", "is a symlink"), ("fifo.json", "not a regular file")):
        with pytest.raises(store.RefFileError, match=needle):
            store.check_writable(tmp_path / name)
    with pytest.raises(store.RefFileError, match="file name too long"):
        store.check_writable(tmp_path / ("r" * 300))


# -- 5. history on a full disk ------------------------------------------------------------------

def _verdict(i: int, pad: int = 100) -> dict:
    return {"schema": "gpucheck.verdict", "i": i, "pad": "x" * pad}


def test_a_short_write_then_enospc_leaves_no_torn_line(tmp_path, monkeypatch):
    state = State(tmp_path / "state")
    state.append_history(_verdict(0))
    before = state.history_path.read_bytes()
    real_write = os.write
    calls = []

    def half_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))  # cut short at a "page boundary"
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError) as e:
        state.append_history(_verdict(1))
    assert e.value.errno == errno.ENOSPC
    monkeypatch.setattr(os, "write", real_write)
    assert state.history_path.read_bytes() == before  # cut back: all or nothing
    state.append_history(_verdict(2))
    assert [d["i"] for d in state.iter_history()] == [0, 2] and state.skipped_lines == 0


@root_only
def test_history_on_a_real_full_filesystem_never_tears(tmp_path):
    with tiny_fs(tmp_path / "tiny") as tiny:
        state = State(tiny / "state")
        written, failed = 0, 0
        for i in range(40):
            try:
                state.append_history(_verdict(i, pad=1500))
                written += 1
            except OSError as e:
                assert e.errno == errno.ENOSPC
                failed += 1
        assert written and failed
        raw = state.history_path.read_bytes()
        assert raw.endswith(b"\n")
        assert [json.loads(line)["i"] for line in raw.splitlines()] == list(range(written))
        assert len(list(state.iter_history())) == written and state.skipped_lines == 0


def test_a_torn_line_glued_to_a_good_one_is_recovered_and_reported(tmp_path):
    state = State(tmp_path / "state")
    state.append_history(_verdict(0))
    good = json.dumps(_verdict(1), separators=(",", ":"), sort_keys=True)
    with open(state.history_path, "ab") as f:  # what an older gpucheck left: torn, then glued
        f.write(b'{"i":99,"pad":"xxxx' + good.encode() + b"\n")
    assert [d["i"] for d in state.iter_history()] == [0, 1]
    assert state.skipped_lines == 1 and "torn" in state.skipped_notes[0]


def test_the_next_append_seals_a_torn_tail(tmp_path):
    state = State(tmp_path / "state")
    state.append_history(_verdict(0))
    with open(state.history_path, "ab") as f:
        f.write(b'{"i":99,"schema":"gpucheck.verdict","pad":"xx')  # a crash mid-line
    state.append_history(_verdict(1))
    assert [d["i"] for d in state.iter_history()] == [0, 1] and state.skipped_lines == 1
    assert len(state.history_path.read_bytes().splitlines()) == 3


def test_hostile_history_lines_are_skipped_and_counted(tmp_path, monkeypatch):
    import gpucheck.core.state as state_mod

    state = State(tmp_path / "state")
    state.append_history(_verdict(0))
    with open(state.history_path, "ab") as f:
        f.write(b"[" * 100_000 + b"\n")  # used to raise RecursionError
        f.write(b'{"schema":"gpucheck.verdict","i":1,"pad":"' + b"y" * 5000 + b'"}\n')
        f.write(b'{"not":"a verdict"}\n')
    state.append_history(_verdict(2))
    monkeypatch.setattr(state_mod, "HISTORY_LINE_MAX", 4096)
    assert [d["i"] for d in state.iter_history()] == [0, 2]
    assert state.skipped_lines == 3
    assert any("longer than 4096" in n for n in state.skipped_notes)


def test_a_run_warns_about_a_torn_history(capsys, tmp_path):
    state = State(tmp_path / "state")
    state.append_history(_verdict(0))
    with open(state.history_path, "ab") as f:
        f.write(b'{"torn\n')
    rc, out, err = run_cli(capsys, "run", "--snapshot", DBE, "--check", "nvlink", "--state-dir", str(state.root))
    assert rc in (0, 1, 3)
    assert "WARNING: history in" in err and "1 torn or unreadable line(s) skipped" in err


# -- 6. hostile input files ----------------------------------------------------------------------

def test_a_fifo_snapshot_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "snap.json"
    os.mkfifo(fifo)
    r = run_subprocess(["run", "--no-history", "--snapshot", str(fifo)])  # the old code hung here
    assert r.returncode == 2 and "not a regular file (it is a FIFO)" in one_line(r.stderr)


@root_only
def test_a_zero_device_snapshot_is_refused(tmp_path):
    zero = device(tmp_path / "zero", 1, 5)
    r = run_subprocess(["run", "--no-history", "--snapshot", str(zero)])  # the old code read forever
    assert r.returncode == 2 and "character device" in one_line(r.stderr)


def test_a_deeply_nested_snapshot_is_a_usage_error(capsys, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    rc, out, err = run_cli(capsys, "run", "--no-history", "--snapshot", str(deep))
    assert rc == 2 and str(deep) in one_line(err) and "nested deeper than" in err
    deep.write_text('{"a":' * 100 + "1" + "}" * 100)  # parses, but deeper than any snapshot
    rc, out, err = run_cli(capsys, "run", "--no-history", "--snapshot", str(deep))
    assert rc == 2 and "nested deeper than 64 levels" in one_line(err)


def test_a_snapshot_over_the_size_limit_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(safeio.LIMITS, "snapshot", 1000)
    rc, out, err = run_cli(capsys, "run", "--no-history", "--snapshot", DBE)
    assert rc == 2 and "too big" in one_line(err) and "snapshot" in err


def test_hostile_config_files(capsys, tmp_path, monkeypatch):
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 100_000)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * 300_000 + "\n")
    monkeypatch.setitem(safeio.LIMITS, "config", 200_000)  # the deep one is 100,004 bytes
    for path, needle in ((deep, "nested too deeply"), (fifo, "not a regular file"), (big, "too big")):
        rc, out, err = no_hang(lambda: run_dbe(capsys, "--config", str(path)))
        assert rc == 2 and str(path) in one_line(err) and needle in err, err


def test_a_fifo_config_does_not_hang(tmp_path):
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    r = run_subprocess(["run", "--no-history", "--snapshot", DBE, "--config", str(fifo)])
    assert r.returncode == 2 and "not a regular file" in one_line(r.stderr)


def test_hostile_reference_files(capsys, tmp_path):
    from gpucheck.repro import store

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    for path, needle in ((fifo, "not a regular file"), (deep, "nested deeper than")):
        with pytest.raises(store.RefFileError, match=needle):
            no_hang(lambda: store.load(path))
        rc, out, err = no_hang(lambda: run_cli(capsys, "repro", "check", "--reference", str(path)))
        assert rc == 2 and needle in one_line(err)


@root_only
def test_a_zero_device_reference_is_refused(tmp_path):
    zero = device(tmp_path / "zero", 1, 5)
    r = run_subprocess(["repro", "check", "--reference", str(zero)])  # the old code read it until OOM
    assert r.returncode == 2 and "not a regular file" in one_line(r.stderr)


def test_xid_file_refuses_a_fifo_up_front(capsys, tmp_path):
    fifo = tmp_path / "kern.log"
    os.mkfifo(fifo)
    r = run_subprocess(["xid", "--file", str(fifo), "--no-nvml"])  # the old code hung in open()
    assert r.returncode == 2 and "--file reads regular files" in one_line(r.stderr)


@root_only
def test_xid_file_refuses_a_device(tmp_path):
    zero = device(tmp_path / "zero", 1, 5)
    r = run_subprocess(["xid", "--file", str(zero), "--no-nvml"])  # the old code read it forever
    assert r.returncode == 2 and "not a regular file" in one_line(r.stderr)


def test_the_log_reader_itself_never_opens_a_fifo(tmp_path):
    from gpucheck.platform.kernlog.sources.selection import read_kernel_log

    fifo = tmp_path / "kern.log"
    os.mkfifo(fifo)
    res = no_hang(lambda: read_kernel_log(files=[str(fifo)], boot_time=0.0))
    assert not res.ok and "not a regular file" in res.error


def test_deep_dcgm_json_is_a_parse_error():
    from gpucheck.eud.dcgm_parse import DcgmParseError, parse_diag

    with pytest.raises(DcgmParseError, match="nested deeper than"):
        parse_diag('{"a":' * 50_000 + "1" + "}" * 50_000)


def test_loads_json_limits():
    assert safeio.loads_json('{"a":[1,{"b":2}]}') == {"a": [1, {"b": 2}]}
    assert safeio.loads_json("3") == 3
    safeio.loads_json("[" * 64 + "]" * 64)
    with pytest.raises(ValueError, match="nested deeper than 64"):
        safeio.loads_json("[" * 65 + "]" * 65)
    with pytest.raises(ValueError, match="nested deeper than"):
        safeio.loads_json("[" * 100_000)


def test_a_signal_in_the_middle_of_an_append_leaves_nothing_half_written(tmp_path, monkeypatch):
    state = State(tmp_path / "state")
    state.append_history(_verdict(0))
    before = state.history_path.read_bytes()
    real_write = os.write

    def half_then_interrupted(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise KeyboardInterrupt  # SIGINT (or a SIGTERM handler raising) at the worst moment

    monkeypatch.setattr(os, "write", half_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        state.append_history(_verdict(1))
    monkeypatch.setattr(os, "write", real_write)
    assert state.history_path.read_bytes() == before


@root_only
def test_a_symlink_swapped_in_while_the_output_is_written_is_not_replaced(tmp_path, monkeypatch):
    """The check and the write are one walk: a symlink planted between the plan and the rename
    makes the write fail; the link (and what it points at) are left alone."""
    out = tmp_path / "v.json"
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    real_write_all = safeio.write_all

    def plant_then_write(fd, data, deadline=None):
        if not out.is_symlink():
            out.symlink_to(victim)
            os.lchown(out, NOBODY, NOBODY)
        return real_write_all(fd, data, deadline)

    monkeypatch.setattr(safeio, "write_all", plant_then_write)
    with pytest.raises(safeio.RefusedPath, match="is now a symlink"):
        safeio.write_output(out, "{}\n")
    assert out.is_symlink() and victim.read_text() == "root's file\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(safeio.TMP_PREFIX)] == []
