"""The Slurm hooks against Slurm's own limits (issue 26).

- Slurm 22.05 ends a Prolog/Epilog that runs past `PrologEpilogTimeout` with SIGKILL ("prolog
  killed by signal 9") and drains the node ("Prolog error") whatever --on-error says. The hook
  reads the timeout (`scontrol show config`; the wrapper asks once and passes it on), shrinks its
  budget to end before it and says so; the wrapper stops a gpucheck that does not end in time
  (SIGTERM, then SIGKILL a second before Slurm's) and exits by on-error: never a drain for
  gpucheck's own limits.
- The wrapper traps SIGTERM/SIGINT on its first line: a signal while it reads its settings used to
  kill it (Slurm drains a hook a signal killed).
- The hook's exit code for a judged fault has one source (hook.hook_exit_code, EXIT_HOOK_UNHEALTHY,
  the wrapper's HOOK_UNHEALTHY), and the help and the log line say it; "not drained" says why.

The `scontrol show config` answers are the real one of tests/slurm_harness.py's Slurm 22.05.8
(tests/fixtures/slurm/show-config.txt: PrologEpilogTimeout = 7) and that one with another value.
The same in a running Slurm: tests/test_slurm_real_hooks.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import syslog
import time
from pathlib import Path

import pytest

from gpucheck.cli.main import main
from gpucheck.fleet import hook as hook_mod
from gpucheck.fleet import slurm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm" / "gpucheck-hook.sh"
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEALTHY, DBE = SNAPS / "h100-healthy.json", SNAPS / "h100-ecc-dbe.json"
CONFIG = (ROOT / "tests" / "fixtures" / "slurm" / "show-config.txt").read_text()
ENV = {"SLURMD_NODENAME": "gpu7", "SLURM_JOB_ID": "4242", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}


def config_with(timeout: str) -> str:
    """The real `scontrol show config` with another PrologEpilogTimeout."""
    text, n = re.subn(r"^PrologEpilogTimeout\s*=.*$", f"PrologEpilogTimeout     = {timeout}", CONFIG, flags=re.M)
    assert n == 1
    return text


class Scontrol:
    """scontrol: `show config` answers `config`; `update` (the drain) is recorded."""

    def __init__(self, config: str = CONFIG, rc: int = 0):
        self.config, self.rc = config, rc
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[1:3] == ["show", "config"]:
            return self.rc, self.config if self.rc == 0 else "", "" if self.rc == 0 else "Unable to contact slurm"
        return 0, "", ""


def run(tmp_path, *, environ=ENV, runner=None, now=None, **opts):
    seen, logs = [], []

    def execute(req, on_verdict=None, on_warning=None):
        seen.append(req)
        return 0

    runner = runner or Scontrol()
    out = hook_mod.run_hook(hook_mod.HookOptions("prolog", state_dir=str(tmp_path / "state"), **opts), environ,
                            runner=runner, log=lambda p, m: logs.append((p, m)), execute=execute,
                            now=now or time.time)
    return out, seen, logs, runner


# -- PrologEpilogTimeout: read, and the budget fitted into it ------------------------------------

def test_the_timeout_is_read_from_scontrol_show_config():
    assert slurm.prolog_epilog_timeout("scontrol", Scontrol()) == (7.0, "PrologEpilogTimeout = 7 (scontrol show config)")
    for value in ("65534", "65535", "0", "UNLIMITED", "(null)"):
        timeout, why = slurm.prolog_epilog_timeout("scontrol", Scontrol(config_with(value)))
        assert timeout is None and why == f"none (PrologEpilogTimeout = {value})"
    timeout, why = slurm.prolog_epilog_timeout("scontrol", Scontrol(rc=1))
    assert timeout is None and why.startswith("unknown (scontrol show config exit 1: Unable to contact slurm")


def test_a_budget_past_the_timeout_is_shrunk_and_said_so(tmp_path):
    """The reproduced bug: PrologEpilogTimeout=7 and the prolog's 15 s budget: a slow node ran
    past 7 s, Slurm killed the prolog with SIGKILL and drained the node (--on-error pass)."""
    out, (req,), logs, sl = run(tmp_path, now=lambda: 1000.0)
    assert sl.calls[0][1:3] == ["show", "config"]
    # 7 s less the wrapper's margin (2 s and 1 s of slack) from the start: 4 s; a fifth (1 s at
    # least) kept for the history, a drain and the log: 3 s for the run
    assert req.timeout_s == 3.0 and out.plan["budget_s"] == 3.0
    note = out.plan["budget_note"]
    assert note == ("budget 15 s shrunk to 3.0 s (Slurm's PrologEpilogTimeout is 7 s, and past it Slurm kills the "
                    "hook with SIGKILL and drains the node)")
    assert any(p == syslog.LOG_WARNING and note in m for p, m in logs)
    assert out.exit_code == 0 and note in out.log_line  # said so in the hook's line, too


def test_a_budget_that_fits_is_left_alone_and_a_hook_run_by_hand_asks_nothing(tmp_path):
    out, (req,), _, sl = run(tmp_path, runner=Scontrol(config_with("300")), now=lambda: 1000.0)
    assert req.timeout_s == 15.0 and "budget_note" not in out.plan
    assert out.plan["slurm_timeout"] == "PrologEpilogTimeout = 300 (scontrol show config)"
    by_hand = {k: v for k, v in ENV.items() if k != "SLURM_SCRIPT_CONTEXT"}
    out, (req,), _, sl = run(tmp_path, environ=by_hand)
    assert req.timeout_s == 15.0 and sl.calls == [] and out.plan["slurm_timeout"].startswith("none (not started")


def test_the_wrappers_deadline_is_used_and_scontrol_not_asked_again(tmp_path):
    env = {**ENV, hook_mod.DEADLINE_ENV: "1010", hook_mod.TIMEOUT_ENV: "15"}
    out, (req,), _, sl = run(tmp_path, environ=env, now=lambda: 1000.0)
    assert sl.calls == [] and req.timeout_s == 8.0  # 10 s left, 2 s kept
    env = {**ENV, hook_mod.TIMEOUT_ENV: ""}  # the wrapper found none
    out, (req,), _, sl = run(tmp_path, environ=env, now=lambda: 1000.0)
    assert sl.calls == [] and req.timeout_s == 15.0


def test_no_time_left_is_could_not_judge_by_on_error_never_a_drain(tmp_path):
    env = {**ENV, hook_mod.DEADLINE_ENV: "1001", hook_mod.TIMEOUT_ENV: "4"}
    out, seen, _, sl = run(tmp_path, environ=env, now=lambda: 1000.0)
    assert seen == [] and out.judgement == "could-not-judge" and out.exit_code == 0 and not out.drained
    assert out.cause.startswith("no time to judge: 1.0 s left before the hook must end")
    out, seen, _, sl = run(tmp_path, environ=env, now=lambda: 1000.0, on_error="fail")
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and out.drained  # the site chose fail-closed


def test_the_epilog_after_a_failed_job_fits_its_ten_minutes_too(tmp_path):
    env = {**ENV, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_JOB_EXIT_CODE2": "1:0"}
    seen = []

    def execute(req, on_verdict=None, on_warning=None):
        seen.append(req)
        return 0

    hook_mod.run_hook(hook_mod.HookOptions("epilog", state_dir=str(tmp_path)), env,
                      runner=Scontrol(config_with("300")), log=lambda p, m: None, execute=execute,
                      now=lambda: 1000.0)
    # 300 s less 31 s, less 10 s kept: 259 s of the 600 s budget
    assert seen[0].timeout_s == 259.0


# -- the exit code: one source, and the help and the line say it ----------------------------------

def test_the_exit_code_of_a_judged_fault_has_one_source():
    assert hook_mod.hook_exit_code("unhealthy", "pass") == hook_mod.EXIT_HOOK_UNHEALTHY
    assert hook_mod.hook_exit_code("could-not-judge", "fail") == hook_mod.EXIT_HOOK_UNHEALTHY
    assert hook_mod.hook_exit_code("could-not-judge", "pass") == hook_mod.hook_exit_code("healthy", "fail") == 0
    assert f"HOOK_UNHEALTHY={hook_mod.EXIT_HOOK_UNHEALTHY} " in SCRIPT.read_text()


def test_the_help_says_the_exit_code_the_hook_exits_with(capsys):
    main(["slurm", "prolog", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--no-drain Judge and exit {hook_mod.EXIT_HOOK_UNHEALTHY} when unhealthy" in text
    assert f"fail (drain, exit {hook_mod.EXIT_HOOK_UNHEALTHY})" in text
    assert "exit 1 when unhealthy" not in text


def test_no_drain_exits_42_and_says_why_it_did_not_drain(tmp_path, capsys, monkeypatch):
    for k, v in {"SLURMD_NODENAME": "gpu7", "SLURM_JOB_ID": "4242"}.items():
        monkeypatch.setenv(k, v)
    rc = main(["slurm", "prolog", "--snapshot", str(DBE), "--state-dir", str(tmp_path), "--no-drain"])
    err = capsys.readouterr().err
    assert rc == hook_mod.EXIT_HOOK_UNHEALTHY
    assert "-> not drained (--no-drain), exit 42 (the wrapper exits 1)" in err, err
    rc = main(["slurm", "prolog", "--snapshot", str(DBE), "--state-dir", str(tmp_path), "--scontrol",
               str(tmp_path / "no-scontrol")])
    err = capsys.readouterr().err
    assert rc == hook_mod.EXIT_HOOK_UNHEALTHY
    assert f"-> not drained (scontrol not found ({tmp_path}/no-scontrol: " in err, err


# -- the wrapper --------------------------------------------------------------------------------

class Wrapper:
    """The shipped wrapper under /bin/sh, with fake logger and scontrol first on PATH (scontrol
    answers `show config` with `config` and records the rest)."""

    def __init__(self, root: Path, gpucheck: str, config: str = "", extra: str = ""):
        self.root, self.extra = root, extra
        bin_dir = root / "bin"
        bin_dir.mkdir(exist_ok=True)
        (root / "config.txt").write_text(config)
        self._tool(bin_dir / "scontrol", f'case "$1" in show) cat "{root}/config.txt"; exit 0 ;; esac\n'
                                         f'printf "%s\\n" "$*" >> "{root}/scontrol.calls"\n')
        self._tool(bin_dir / "logger", f'printf "%s\\n" "$*" >> "{root}/logger.calls"\n')
        shutil.copy(SCRIPT, root / "gpucheck-prolog.sh")
        self.use(gpucheck)

    def use(self, gpucheck: str) -> None:
        (self.root / "gpucheck-slurm.env").write_text(
            f'PATH="{self.root / "bin"}:$PATH"\nGPUCHECK="{gpucheck}"\n{self.extra}')

    @staticmethod
    def _tool(path: Path, body: str) -> str:
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return str(path)

    def gpucheck(self, name: str, body: str) -> str:
        return self._tool(self.root / name, body)

    def start(self) -> subprocess.Popen:
        return subprocess.Popen(["/bin/sh", str(self.root / "gpucheck-prolog.sh")],
                                env={"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def calls(self, tool: str) -> list[str]:
        path = self.root / f"{tool}.calls"
        return path.read_text().splitlines() if path.exists() else []


def _finish(p: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    try:
        return p.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever is left of its group
        except ProcessLookupError:
            pass
        p.wait()


@pytest.mark.slow
@pytest.mark.parametrize("on_error, want_rc", [("pass", 0), ("fail", 1)])
def test_a_gpucheck_that_does_not_end_is_stopped_before_slurms_sigkill(tmp_path, on_error, want_rc):
    """gpucheck stuck (SIGTERM ignored: a hung driver call) under PrologEpilogTimeout = 7: the
    wrapper sends SIGTERM at 4 s, SIGKILL at 6 s, and exits by on-error before Slurm's SIGKILL
    at 7 s (which drains the node whatever on-error says)."""
    w = Wrapper(tmp_path, "", CONFIG, extra=f"GPUCHECK_ON_ERROR={on_error}\n")
    marks = tmp_path / "marks"
    stuck = w.gpucheck("stuck", f"trap 'echo term >> {marks}' TERM\n"
                                f'echo "deadline=$GPUCHECK_HOOK_DEADLINE timeout=$GPUCHECK_PROLOG_EPILOG_TIMEOUT" '
                                f">> {marks}\ni=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done\n")
    w.use(stuck)
    t0 = time.time()
    p = w.start()
    out, err = _finish(p)
    took = time.time() - t0
    assert p.returncode == want_rc and took < 7.0, (p.returncode, took, err)
    lines = marks.read_text().split("\n")
    deadline = int(lines[0].split()[0].split("=")[1])
    assert lines[0].endswith("timeout=7") and int(t0) + 3 <= deadline <= int(t0) + 5
    assert "term" in lines  # SIGTERM first, which it ignored
    (line,) = w.calls("logger")
    assert ("could not judge: gpucheck exited 137 (killed by signal KILL) at Slurm's PrologEpilogTimeout=7s "
            "less 2 s") in line
    if on_error == "fail":
        (drain,) = w.calls("scontrol")
        assert drain.startswith("update NodeName=n1 State=DRAIN Reason=gpucheck: could not judge: gpucheck exited 137")


def test_a_timeout_that_leaves_no_time_never_starts_gpucheck(tmp_path):
    w = Wrapper(tmp_path, "", config_with("3"))
    started = tmp_path / "started"
    w.use(w.gpucheck("g", f"touch {started}"))
    p = w.start()
    _, err = _finish(p)
    assert p.returncode == 0 and not started.exists()
    assert "PrologEpilogTimeout=3s leaves gpucheck no time" in err


def test_the_site_may_give_the_timeout_and_spare_the_question(tmp_path):
    w = Wrapper(tmp_path, "", "", extra="GPUCHECK_PROLOG_EPILOG_TIMEOUT=900\n")
    env_seen = tmp_path / "env"
    w.use(w.gpucheck("g", f"env > {env_seen}"))
    (tmp_path / "bin" / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/asked"\n')
    p = w.start()
    _finish(p)
    assert p.returncode == 0 and not (tmp_path / "asked").exists()
    assert "GPUCHECK_PROLOG_EPILOG_TIMEOUT=900" in env_seen.read_text()


@pytest.mark.slow
def test_the_real_gpucheck_fits_its_budget_into_the_wrappers_deadline(tmp_path):
    """The whole chain on this host: the wrapper reads PrologEpilogTimeout = 12, gpucheck shrinks
    its 15 s budget, judges, and the wrapper ends before 12 s."""
    real = f"/usr/bin/env PYTHONPATH={ROOT} {sys.executable} -m gpucheck"
    w = Wrapper(tmp_path, real, config_with("12"),
                extra=f'GPUCHECK_PROLOG_ARGS="--snapshot {HEALTHY} --state-dir {tmp_path}/state"\n')
    t0 = time.time()
    p = w.start()
    _, err = _finish(p)
    assert p.returncode == 0 and time.time() - t0 < 12.0, err
    assert re.search(r"healthy level 1 in [0-9.]+ s; budget 15 s shrunk to [0-9.]+ s \(Slurm's "
                     r"PrologEpilogTimeout is 12 s", err), err


# -- signals in the wrapper's first milliseconds -------------------------------------------------

DELAYS_MS = [0, 1, 2, 4, 7, 10, 15, 20, 30, 45, 60, 80, 100, 130, 160, 200, 250, 300, 380, 450]


def _loaded(pid: int, sig: signal.Signals, cap_s: float = 0.1) -> None:
    """Wait until the shell catches `sig` (SigCgt in /proc/PID/status: it ran its first command),
    at most `cap_s`: before its first command a shell is still being loaded, and no script can
    hold a signal then; the old wrapper caught none for its first 0.14-0.42 s."""
    deadline = time.monotonic() + cap_s
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        m = re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M)
        if m and int(m.group(1), 16) & (1 << (sig - 1)):
            return
        time.sleep(0.0002)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_wrappers_first_milliseconds_never_kills_it(tmp_path, sig):
    """The reproduced bug: the wrapper set its trap only after reading its settings (0.14-0.42 s
    here), and a SIGTERM meanwhile killed it (72 of 72 trials): Slurm drains a node whose prolog a
    signal killed. Now the trap is its first command: whenever the signal comes after it, the
    wrapper exits by on-error (pass: 0), with the cause in its log line."""
    w = Wrapper(tmp_path, "", "")
    fine = w.gpucheck("g", "sleep 0.3\nexit 0\n")
    w.use(fine)
    outcomes = []
    for delay in DELAYS_MS:
        p = w.start()
        _loaded(p.pid, sig)
        time.sleep(delay / 1000)
        p.send_signal(sig)
        _, err = _finish(p)
        outcomes.append((delay, p.returncode, err.strip().splitlines()[-1:] if err.strip() else []))
    assert all(rc == 0 for _, rc, _ in outcomes), outcomes
    name = sig.name
    said = " ".join(line for _, _, lines in outcomes for line in lines)
    assert f"{name} before gpucheck started: not started" in said or "killed by signal TERM" in said, outcomes
