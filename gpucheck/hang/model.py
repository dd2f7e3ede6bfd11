"""The documents of `gpucheck hang` (docs/hang.md) as types: TypedDicts, because they are JSON as
they are. A node's `gpucheck.hang.node` document crosses the wire from `hang --local --json` and
comes back from a recording (collect.validate_node_doc checks it before anything reads it); the
analysis is the `gpucheck.hang` document printed with --json and read by the table (render.py);
the tests build ranks and nodes as plain dicts. A TypedDict types their keys without a second
representation to convert to and from.
"""

from __future__ import annotations

from typing import TypedDict

# -- a node's document ---------------------------------------------------------------------------


class FrameDoc(TypedDict):
    function: str
    file: str
    line: int | None


class ThreadDoc(TypedDict):
    name: str
    tid: int | None
    main: bool
    active: bool | None
    frames: list[FrameDoc]  # innermost first, as py-spy prints them


class PgSummary(TypedDict):
    """One process group in a rank's flight-recorder dump (flight.summarize)."""

    desc: str
    ranks: list[int] | None  # its members, where the dump says
    ops: list[list[int | str]]  # [sequence number, collective] of the last OPS_KEPT, oldest first
    last_seq: int | None  # the last collective this rank entered
    last_op: str | None
    last_state: str | None
    last_p2p_seq: int | None
    last_p2p_op: str | None


class _DumpFile(TypedDict, total=False):
    file: str  # the dump it was read from


class FlightSummary(_DumpFile):
    version: str
    entries: int
    pgs: dict[str, PgSummary]


class ProcessDoc(TypedDict):
    """A rank process of a node and what was read of it."""

    pid: int
    rank: int
    rank_from: str  # the variable the rank came from
    local_rank: int | None
    world_size: int | None
    group_rank: int | None
    cmdline: str
    status: str  # dumped | error
    error: str | None  # why it was not dumped
    attempts: int
    duration_s: float
    threads: list[ThreadDoc]
    flight: FlightSummary | None
    flight_note: str | None  # why its flight-recorder dump was not used


class RankDoc(ProcessDoc):
    """A rank process with its node: the analysis's input."""

    node: str


class SkippedProc(TypedDict):
    """A process that matched the selection but is not a rank to dump, and why."""

    pid: int
    why: str
    cmdline: str


class Selector(TypedDict):
    match: str | None
    job: str | None
    by: str  # cmdline | cgroup | environ


class PySpyInfo(TypedDict):
    path: str | None
    version: str | None
    mode: str  # nonblocking | native


class NodeDoc(TypedDict):
    """One node's collection: the `gpucheck.hang.node` document."""

    schema: str
    schema_version: str
    gpucheck_version: str
    node: str
    hostname: str
    time: str
    duration_s: float
    selector: Selector
    py_spy: PySpyInfo
    ptrace_scope: int | None
    status: str  # ok partial error no-processes interrupted
    reason: str
    processes: list[ProcessDoc]
    skipped: list[SkippedProc]
    skipped_count: int
    exit_code: int


class NodeOutline(TypedDict):
    """A node of the collection as the analysis lists it (collect.NodeResult.outline)."""

    node: str
    status: str  # a node status, or unreachable, timeout
    reason: str
    duration_s: float
    ranks: list[int]
    skipped: int


# -- the analysis -----------------------------------------------------------------------------------


class GroupDoc(TypedDict):
    """Ranks whose stacks share one signature."""

    id: int
    size: int
    ranks: list[int]
    nodes: str  # folded
    dominant: bool
    in_collective: bool
    main_frames: list[str]
    collective_frames: list[str]
    distinct_frames: list[str]  # what sets it apart from the dominant group, innermost first
    splits_from: str | None  # the innermost frame it shares with the dominant group


class Suspect(TypedDict):
    rank: int
    node: str | None
    pid: int | None
    group: int | None
    source: str  # stacks | flight-recorder
    why: str
    frames: list[str]


class Undumped(TypedDict):
    rank: int
    node: str
    pid: int
    error: str


class DuplicateRank(TypedDict):
    rank: int
    where: list[str]  # node:pid of every process claiming it


class Mismatch(TypedDict):
    """A sequence number under which ranks entered different collectives."""

    seq: int
    op: str  # the majority's
    ranks: dict[str, str]  # rank -> its collective, for the ranks that differ


class PgDivergence(TypedDict):
    pg: str
    desc: str
    members: list[int] | None
    reporting: list[int]
    status: str  # agree | diverged
    last_seq: int | None
    divergence_seq: int | None  # the first collective not every rank entered
    op: str | None
    entered: list[int]
    not_entered: list[int]
    no_data: list[int]  # members without a dump
    mismatched: list[Mismatch]


class FlightRecorder(TypedDict):
    ranks_with_data: int
    groups: list[PgDivergence]


class FlightDivergence(FlightRecorder):
    suspects: dict[int, str]  # rank -> why


class EvictGroup(TypedDict):
    index: int
    ranks: list[int]
    suspects: list[int]
    nodes: str


class EvictPlan(TypedDict):
    source: str
    dims: dict[str, list[EvictGroup]]
    evict_dim: str | None
    evict_ranks: list[int]
    evict_nodes: str
    ranks_without_node: list[int]
    note: str | None


class Analysis(TypedDict):
    """The analysis (analysis.analyze): the body of the `gpucheck.hang` document."""

    status: str  # suspects | could-not-judge | agree
    exit_code: int
    summary: str
    problems: list[str]
    world_size: int | None
    ranks_found: int
    ranks_dumped: int
    missing_ranks: list[int]
    duplicate_ranks: list[DuplicateRank]
    dominant_group: int | None
    dominant_why: str
    groups: list[GroupDoc]
    suspects: list[Suspect]
    suspect_nodes: str
    evict_nodes: str
    topology: EvictPlan | None
    undumped: list[Undumped]
    flight_recorder: FlightRecorder
    nodes: list[NodeOutline]
    uncollected_nodes: str


# What was analyzed: a node set or a job (over ssh or srun: mode; with the --match), one node
# (--local), or recorded node documents (--from files).
Source = TypedDict("Source", {"nodeset": str, "job": str | None, "match": str | None, "mode": str, "local": str,
                              "from": list[str]}, total=False)


class HangDocument(Analysis):
    """The `gpucheck.hang` document: the analysis, what it analyzed and when."""

    schema: str
    schema_version: str
    gpucheck_version: str
    time: str
    duration_s: float
    source: Source
    interrupted: str | None
