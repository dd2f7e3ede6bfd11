"""A user command as the group test (`gpucheck bisect --test 'COMMAND {nodes}'`)."""

from __future__ import annotations

import signal
import time

from ...platform.nodeset import fold
from .session import GroupOutcome

# Exit statuses that mean the command could not run at all (POSIX shells): no evidence about nodes.
CANNOT_RUN = {126: "the command cannot be executed (exit 126)", 127: "command not found (exit 127)"}


def tail(text: str, n: int = 200) -> str:
    """The last non-empty line of `text`, at most `n` characters."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:n] if lines else ""


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class CommandTest:
    """A user command as the group test: healthy when it exits 0.

    Placeholders: {nodes} (the group as a folded node set, e.g. n[1-4,7]), {nodes_comma}
    (n1,n2,...), {count}. Each is substituted shell-quoted, in one pass; a template that puts
    one inside a quoted string or after a backslash is refused (quoting cannot protect it there:
    gpucheck.platform.placeholders). The command runs with /bin/sh in a process group of its own;
    past `timeout_s` the whole group is stopped (SIGTERM, SIGKILL a second later) and the test
    counts as failed (a hang is what bad nodes often do).

    A command that cannot run is no test of the nodes: exit 126 or 127 (the shell could not find
    or execute it), the shell killed by a signal that gpucheck did not send, or a shell that
    cannot start: the outcome is `broken` and the bisection stops (exit 3, no node blamed).
    """

    PLACEHOLDERS = ("{nodes}", "{nodes_comma}")
    ALL = ("{nodes}", "{nodes_comma}", "{count}")

    def __init__(self, template: str, *, timeout_s: float | None = None, shell: str = "/bin/sh"):
        from ...platform.placeholders import quoted_placeholder, refusal

        if not any(p in template for p in self.PLACEHOLDERS):
            raise ValueError(f"--test {template!r} has no {{nodes}} (or {{nodes_comma}}) placeholder")
        hit = quoted_placeholder(template, self.ALL)
        if hit:
            raise ValueError(refusal("--test", template, hit))
        self.template = template
        self.timeout_s = timeout_s
        self.shell = shell

    def command(self, nodes: list[str]) -> str:
        from ...platform.placeholders import substitute

        return substitute(self.template, {"{nodes_comma}": ",".join(nodes), "{nodes}": fold(nodes),
                                          "{count}": str(len(nodes))})

    def __call__(self, nodes: list[str]) -> GroupOutcome:
        from ...platform.processes import run

        cmd = self.command(nodes)
        t0 = time.monotonic()
        try:
            done = run([self.shell, "-c", cmd], timeout_s=self.timeout_s)
        except OSError as e:
            why = f"cannot start {self.shell}: {e.strerror or e}"
            return GroupOutcome(False, why, broken=why)
        dt = time.monotonic() - t0
        if done.timed_out:
            return GroupOutcome(False, f"timed out after {self.timeout_s:g} s (killed)", dt, timed_out=True)
        if done.rc == 0:
            return GroupOutcome(True, "exit 0", dt)
        why = tail(done.stderr) or tail(done.stdout)
        detail = f"exit {done.rc}" + (f": {why}" if why else "")
        if done.rc in CANNOT_RUN:
            return GroupOutcome(False, detail, dt, broken=CANNOT_RUN[done.rc] + (f": {why}" if why else ""))
        if done.rc is not None and done.rc < 0:
            name = _signal_name(-done.rc)
            return GroupOutcome(False, f"killed by {name}", dt,
                                broken=f"the command was killed by {name}, which gpucheck did not send")
        return GroupOutcome(False, detail, dt)
