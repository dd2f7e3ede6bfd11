"""Find a job's rank processes on this node.

`scan_procs()` reads /proc into plain `ProcInfo` records (only what selection needs); the
selection itself, `select_ranks()`, is a pure function over those records:

- which processes belong to the job: `--job JOBID` (the process's Slurm cgroup `job_<ID>` when
  this node has Slurm cgroups, else SLURM_JOB_ID in its environment, and SLURMD_NODENAME equal to
  this node where the process has one) or `--match REGEX` on its command line;
- only Python processes (py-spy reads Python stacks);
- each one's rank from the environment it was started with: RANK (torchrun, torch's env://),
  else SLURM_PROCID (srun), OMPI_COMM_WORLD_RANK (mpirun), PMIX_RANK, PMI_RANK; with its local
  rank and world size from the same launcher's variables;
- helpers and launchers are dropped: a selected process whose nearest selected ancestor has the
  same rank is a helper (a DataLoader worker, a compile worker, forked from its rank); a selected
  process with a selected descendant of another rank is a launcher (torchrun's agent under srun).
  The same rank means the same number from the same variable: torchrun's agent under srun has
  SLURM_PROCID=0, its first worker RANK=0, and the agent is the launcher.

Every value read from a process is the job owner's data: ranks are parsed strictly, command
lines are only matched and shown, never run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .model import SkippedProc

# (rank, local rank, world size) variables of one launcher, in order of preference.
RANK_SOURCES: tuple[tuple[str, str | None, str | None], ...] = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMIX_RANK", None, None),
    ("PMI_RANK", None, "PMI_SIZE"),
)
FLIGHT_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
JOB_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")
# The variables kept from a process's environment (everything else is dropped on reading).
KEPT_VARS = frozenset({v for src in RANK_SOURCES for v in src if v} | set(FLIGHT_VARS) | set(JOB_VARS)
                      | {"GROUP_RANK", "SLURMD_NODENAME", "TORCHELASTIC_RUN_ID"})
ENVIRON_MAX = 4 << 20
CMDLINE_SHOWN = 300
_INT = re.compile(r"\d{1,9}")
_PYTHON_EXE = re.compile(r"(python|pypy)[0-9.]*[a-z]*")
_JOB_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")


@dataclass
class ProcInfo:
    """What /proc says about one process (None: could not be read)."""

    pid: int
    ppid: int
    uid: int | None
    cmdline: list[str]
    exe: str | None
    environ: dict[str, str] | None  # the KEPT_VARS only; None when unreadable
    environ_error: str | None = None
    start_time: float | None = None  # epoch seconds
    state: str = "?"
    cgroup_jobs: list[str] = field(default_factory=list)  # Slurm job ids in its cgroup paths
    maps_python: bool = False  # a libpython is mapped (an embedded interpreter)


@dataclass
class RankProc:
    """A selected rank process."""

    pid: int
    rank: int
    rank_from: str
    local_rank: int | None
    world_size: int | None
    group_rank: int | None
    cmdline: str
    uid: int | None
    start_time: float | None
    environ: dict[str, str]


@dataclass
class Selection:
    ranks: list[RankProc]
    skipped: list[SkippedProc]  # matched but not dumped, and why
    by: str  # cmdline | cgroup | environ


# -- reading /proc ------------------------------------------------------------------------------

def _read(path: str, limit: int = 1 << 20) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        chunks, size = [], 0
        while size < limit:
            b = os.read(fd, min(65536, limit - size))
            if not b:
                break
            chunks.append(b)
            size += len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse_environ(raw: bytes) -> dict[str, str]:
    """NUL-separated KEY=VALUE bytes -> the KEPT_VARS among them (the first of a repeated key)."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if not eq:
            continue
        k = key.decode("ascii", "replace")
        if k in KEPT_VARS and k not in out:
            out[k] = value.decode("utf-8", "replace")
    return out


def _boot_time(proc_root: str) -> float | None:
    try:
        for line in _read(f"{proc_root}/stat").decode().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_stat(text: str) -> tuple[int, str, int]:
    """/proc/PID/stat -> (ppid, state, starttime in clock ticks). The command name (field 2) may
    hold spaces and parentheses: everything is read after its last ')'."""
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[1]), rest[0], int(rest[19])


def cgroup_jobs(text: str) -> list[str]:
    """Slurm job ids in /proc/PID/cgroup paths (`.../job_42/step_0/...`, cgroup v1 or v2)."""
    jobs: list[str] = []
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for m in _JOB_CGROUP.finditer(path):
            if m.group(1) not in jobs:
                jobs.append(m.group(1))
    return jobs


def read_proc(pid: int, proc_root: str = "/proc", *, boot_time: float | None = None,
              want_cgroup: bool = False) -> ProcInfo | None:
    """One process, or None when it is gone (or not a process)."""
    base = f"{proc_root}/{pid}"
    try:
        ppid, state, ticks = parse_stat(_read(f"{base}/stat").decode("utf-8", "replace"))
        cmdline = [a.decode("utf-8", "replace") for a in _read(f"{base}/cmdline").split(b"\0") if a]
        uid = os.stat(base).st_uid
    except (OSError, ValueError, IndexError):
        return None
    try:
        exe: str | None = os.readlink(f"{base}/exe")
    except OSError:
        exe = None
    environ, why = None, None
    try:
        environ = parse_environ(_read(f"{base}/environ", ENVIRON_MAX))
    except OSError as e:
        why = f"cannot read its environment: {e.strerror or e}"
    start = boot_time + ticks / os.sysconf("SC_CLK_TCK") if boot_time is not None else None
    info = ProcInfo(pid=pid, ppid=ppid, uid=uid, cmdline=cmdline, exe=exe, environ=environ,
                    environ_error=why, start_time=start, state=state)
    if want_cgroup:
        try:
            info.cgroup_jobs = cgroup_jobs(_read(f"{base}/cgroup").decode("utf-8", "replace"))
        except OSError:
            pass
    return info


def maps_libpython(pid: int, proc_root: str = "/proc") -> bool:
    try:
        return b"libpython" in _read(f"{proc_root}/{pid}/maps", 64 << 20)
    except OSError:
        return False


def scan_procs(proc_root: str = "/proc", *, want_cgroup: bool = False,
               prefilter=None) -> list[ProcInfo]:
    """Every process of `proc_root`. prefilter(ProcInfo) -> bool keeps the libpython probe (which
    reads the memory map) to the processes that may be selected."""
    boot = _boot_time(proc_root)
    out: list[ProcInfo] = []
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        info = read_proc(int(name), proc_root, boot_time=boot, want_cgroup=want_cgroup)
        if info is None:
            continue
        if not is_python_exe(info.exe) and (prefilter is None or prefilter(info)):
            info.maps_python = maps_libpython(info.pid, proc_root)
        out.append(info)
    return out


# -- selection (pure) ---------------------------------------------------------------------------

def is_python_exe(exe: str | None) -> bool:
    if not exe:
        return False
    return bool(_PYTHON_EXE.fullmatch(os.path.basename(exe.removesuffix(" (deleted)"))))


def _int_var(env: dict[str, str], name: str | None) -> tuple[int | None, str | None]:
    """(value, None), (None, None) when absent, (None, why) when not a small non-negative integer."""
    if not name or name not in env:
        return None, None
    text = env[name].strip()
    if not _INT.fullmatch(text):
        return None, f"{name}={env[name][:40]!r} is not a rank number"
    return int(text), None


def rank_of(env: dict[str, str]) -> tuple[dict | None, str | None]:
    """{"rank", "rank_from", "local_rank", "world_size", "group_rank"} from a process's environment,
    or (None, why)."""
    for rank_var, local_var, world_var in RANK_SOURCES:
        rank, why = _int_var(env, rank_var)
        if why:
            return None, why
        if rank is None:
            continue
        local, _ = _int_var(env, local_var)
        world, _ = _int_var(env, world_var)
        group, _ = _int_var(env, "GROUP_RANK")
        if world is not None and rank >= world:
            return None, f"{rank_var}={rank} is not below {world_var}={world}"
        return {"rank": rank, "rank_from": rank_var, "local_rank": local, "world_size": world,
                "group_rank": group}, None
    return None, "no rank in its environment (RANK, SLURM_PROCID, ...): a launcher or not a rank"


def shown_cmdline(argv: list[str]) -> str:
    """The command line for display: control characters shown as '?', cut at CMDLINE_SHOWN."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join(argv))
    return text if len(text) <= CMDLINE_SHOWN else text[:CMDLINE_SHOWN] + "..."


def may_belong(p: ProcInfo, *, match: re.Pattern | None, job: str | None) -> bool:
    """Before the whole node is read: could `p` be selected (the cgroup or the environment)?"""
    if match is not None:
        return bool(match.search(" ".join(p.cmdline)))
    return job in p.cgroup_jobs or any((p.environ or {}).get(v) == job for v in JOB_VARS)


def _belongs(p: ProcInfo, *, match: re.Pattern | None, job: str | None, node: frozenset[str],
             by_cgroup: bool) -> bool:
    if match is not None:
        return bool(match.search(" ".join(p.cmdline)))
    if by_cgroup:
        return job in p.cgroup_jobs
    env = p.environ or {}
    if not any(env.get(v) == job for v in JOB_VARS):
        return False
    return not (node and env.get("SLURMD_NODENAME") and env["SLURMD_NODENAME"] not in node)


def select_ranks(procs: list[ProcInfo], *, match: re.Pattern | None = None, job: str | None = None,
                 node: str | set[str] | None = None, exclude: set[int] | frozenset[int] = frozenset()) -> Selection:
    """The rank processes among `procs` (see the module text). `node`: this node's names (the
    collector's, the hostname); a job process whose SLURMD_NODENAME is none of them runs on another
    node of the job (several slurmd on one host). `exclude`: our own process and its ancestors (a
    gpucheck step started in the job by srun is in the job too)."""
    names = frozenset([node] if isinstance(node, str) else (node or ()))
    if (match is None) == (job is None):
        raise ValueError("select by exactly one of match and job")
    by_cgroup = job is not None and any(p.cgroup_jobs for p in procs)
    by = "cmdline" if match is not None else ("cgroup" if by_cgroup else "environ")
    skipped: list[SkippedProc] = []
    members = [p for p in procs if p.pid not in exclude
               and _belongs(p, match=match, job=job, node=names, by_cgroup=by_cgroup)]
    ranked: dict[int, tuple[ProcInfo, dict]] = {}
    for p in members:
        if not (is_python_exe(p.exe) or p.maps_python):
            if match is not None:  # a job's shells and launchers are not worth a line each
                skipped.append(_skip(p, "not a Python process"))
            continue
        if p.environ is None:
            skipped.append(_skip(p, p.environ_error or "cannot read its environment"))
            continue
        info, why = rank_of(p.environ)
        if info is None:
            skipped.append(_skip(p, why or "no rank"))
            continue
        ranked[p.pid] = (p, info)
    helpers, launchers = _helpers_and_launchers(procs, ranked)
    for pid in sorted(helpers):
        skipped.append(_skip(ranked[pid][0], f"a helper of rank {ranked[pid][1]['rank']} (forked from its process)"))
    for pid in sorted(launchers):
        skipped.append(_skip(ranked[pid][0], "a launcher: its children hold other ranks"))
    ranks = [_rank_proc(p, info) for pid, (p, info) in sorted(ranked.items())
             if pid not in helpers and pid not in launchers]
    return Selection(ranks=ranks, skipped=skipped, by=by)


def _helpers_and_launchers(procs: list[ProcInfo], ranked: dict[int, tuple[ProcInfo, dict]]) -> tuple[set[int], set[int]]:
    parent = {p.pid: p.ppid for p in procs}
    helpers: set[int] = set()
    launchers: set[int] = set()
    for pid, (_, info) in ranked.items():
        seen, up = {pid}, parent.get(pid)
        while up and up not in seen and up not in ranked:
            seen.add(up)
            up = parent.get(up)
        if not up or up not in ranked or up in seen:
            continue
        if (ranked[up][1]["rank"], ranked[up][1]["rank_from"]) == (info["rank"], info["rank_from"]):
            helpers.add(pid)
        else:
            launchers.add(up)
    return helpers, launchers


def _skip(p: ProcInfo, why: str) -> SkippedProc:
    return {"pid": p.pid, "why": why, "cmdline": shown_cmdline(p.cmdline)}


def _rank_proc(p: ProcInfo, info: dict) -> RankProc:
    return RankProc(pid=p.pid, rank=info["rank"], rank_from=info["rank_from"], local_rank=info["local_rank"],
                    world_size=info["world_size"], group_rank=info["group_rank"],
                    cmdline=shown_cmdline(p.cmdline), uid=p.uid, start_time=p.start_time,
                    environ=dict(p.environ or {}))


def own_lineage(pid: int | None = None, proc_root: str = "/proc") -> set[int]:
    """This process and its ancestors (never selected: a gpucheck started inside the job)."""
    out: set[int] = set()
    cur = pid or os.getpid()
    while cur and cur not in out and len(out) < 256:
        out.add(cur)
        try:
            cur = parse_stat(_read(f"{proc_root}/{cur}/stat").decode("utf-8", "replace"))[0]
        except (OSError, ValueError, IndexError):
            break
    return out
