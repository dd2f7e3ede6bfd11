"""What a fleet command runs on the nodes, and how: the options of `gpucheck sweep` and
`gpucheck slurm resume` turned into a SweepPlan (the `gpucheck run --json` arguments, per-node
extras, fan-out, per-node timeout) and the fan-out's ssh/srun settings.

Pure: plain data in, plain data out. A problem with what was asked is a PlanError naming the
option, which the CLI reports as a usage error (exit 2) before any node is touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..platform.fanout import RunnerSettings, SrunSettings, SshSettings
from ..platform.nodeset import NodeSetError, parse_node_map
from .sweep import SweepPlan, remote_command

DEFAULT_NODE_TIMEOUT_S = 600.0


class PlanError(ValueError):
    """A usage error in the remote options: `option` names the one at fault."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class RemoteOptions:
    """How to run `gpucheck run --json` on the nodes, and with what arguments (durations in
    seconds, already parsed)."""

    level: str | None = None
    checks: tuple[str, ...] = ()
    skips: tuple[str, ...] = ()
    snapshot_path: str | None = None  # a path on the nodes
    injections: tuple[str, ...] = ()
    device: str | None = None
    strict: bool = False
    force: bool = False
    run_args: tuple[str, ...] = ()  # any other `gpucheck run` argument, passed through
    node_args: tuple[str, ...] = ()  # NODESET=ARGS: extra arguments for some nodes
    remote_cmd: str = "gpucheck"  # shell text: how to start gpucheck on the nodes
    fanout: int | None = None
    timeout_s: float | None = DEFAULT_NODE_TIMEOUT_S  # per node
    use_srun: bool = False
    srun_args: tuple[str, ...] = ()
    ssh_options: str | None = None
    ssh_user: str | None = None
    connect_timeout_s: float | None = None


def run_arguments(opts: RemoteOptions) -> list[str]:
    """The `gpucheck run --json` arguments every node gets."""
    args: list[str] = []
    if opts.level:
        args += ["--level", str(opts.level)]
    for c in opts.checks:
        args += ["--check", c]
    for s in opts.skips:
        args += ["--skip", s]
    if opts.snapshot_path:
        args += ["--snapshot", opts.snapshot_path]
    for i in opts.injections:
        args += ["--inject", i]
    if opts.device:
        args += ["--device", opts.device]
    if opts.strict:
        args.append("--strict")
    if opts.force:
        args.append("--force")
    return args + list(opts.run_args)


def build_plan(nodes: list[str], opts: RemoteOptions, *, subset: list[str] | None = None) -> SweepPlan:
    """The sweep of `nodes` (or of `subset` of them: the per-node arguments are checked against
    all of `nodes` either way). PlanError for a --node-args spec that names a node outside the
    node set, or whose arguments cannot be quoted for the remote shell."""
    args = run_arguments(opts)
    try:
        per_node = parse_node_map(opts.node_args, nodes, what="--node-args")
    except NodeSetError as e:
        raise PlanError("--node-args", str(e)) from None
    for node, extra in per_node.items():
        try:
            remote_command(opts.remote_cmd, args, extra)
        except ValueError as e:
            raise PlanError("--node-args", f"{node}: {extra!r}: {e}") from None
    if subset is not None:
        chosen = set(subset)
        nodes = [n for n in nodes if n in chosen]
        per_node = {n: a for n, a in per_node.items() if n in chosen}
    return SweepPlan(nodes=nodes, remote_cmd=opts.remote_cmd, run_args=args, node_args=per_node,
                     mode="srun" if opts.use_srun else "ssh", fanout=opts.fanout, timeout_s=opts.timeout_s)


def runner_settings(opts: RemoteOptions) -> RunnerSettings:
    """The fan-out's keyword arguments: how to reach the nodes over ssh, or through srun."""
    return {
        "ssh": SshSettings(ssh_options=opts.ssh_options, ssh_user=opts.ssh_user,
                           connect_timeout_s=opts.connect_timeout_s),
        "srun": SrunSettings(extra_args=list(opts.srun_args)),
    }
