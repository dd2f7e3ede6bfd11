"""Who am I in the job, where is the rendezvous, and which network interface reaches it.

`resolve_topology(opts, env)`: this invocation's ranks, the world size and the rendezvous, from
the options (`--rank/--world-size`, `--node-rank/--nnodes` with `--nproc-per-node`), else
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), else Slurm's
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first node of the step's node list, a port from
the job id), else this node alone: a rank per local GPU, or `--nproc-per-node` ranks. A setting that does not fit is a TopologyError naming the option or variable.

`pick_interface(...)`: without `--ifname`, the interface whose address routes to the other
hosts of the job (rank 0: a peer's address; the others: the rendezvous address), so that gloo
and NCCL never bind to the address the host name resolves to (127.0.0.1 on many hosts, which
the peers cannot reach). Pure reads of the routing table (a UDP connect sends nothing).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any, Mapping


class TopologyError(ValueError):
    """A rank, world or rendezvous setting that cannot work; `hint` names the option."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass
class Topology:
    ranks: list[int]  # global ranks this invocation runs
    local_ranks: list[int]  # CUDA device index of each
    world: int
    master_addr: str
    master_port: int | str | None  # int, "stdin", or None (rank 0 binds a free port)
    agent_store: bool = False
    source: str = "options"


def _int(v: Any, what: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise TopologyError(f"{what} must be an integer, not {v!r}") from None


def first_slurm_node(nodelist: str) -> str:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError

    try:
        ns = NodeSet(nodelist, resolver=RESOLVER_NOGROUP)  # Slurm's list names nodes, never @groups
    except NodeSetParseError as e:
        raise TopologyError(f"bad Slurm node list {nodelist!r}: {e}") from None
    if len(ns) == 0:
        raise TopologyError(f"empty Slurm node list {nodelist!r}")
    return next(iter(ns))


def _port(opts: Mapping[str, Any]) -> int | str | None:
    port_opt = opts.get("master_port")
    if port_opt is None:
        return None
    if str(port_opt).strip().lower() == "stdin":
        return "stdin"
    port = _int(port_opt, "--master-port")
    if not 0 <= port < 65536:
        raise TopologyError(f"--master-port {port} is not a TCP port")
    return port


def resolve_topology(opts: Mapping[str, Any], env: Mapping[str, str]) -> Topology:
    """Rank, world and rendezvous from the options, else torchrun's, else Slurm's environment."""
    nproc = int(opts.get("nproc_per_node") or 1)
    port = _port(opts)
    addr = opts.get("master_addr")
    if opts.get("rank") is not None or opts.get("world_size") is not None:
        return _checked(_from_rank_options(opts, nproc, addr, port))
    if opts.get("node_rank") is not None or opts.get("nnodes") is not None:
        return _checked(_from_node_options(opts, nproc, addr, port))
    if env.get("RANK") is not None and env.get("WORLD_SIZE") is not None:
        if nproc != 1:
            raise TopologyError("--nproc-per-node does not apply under torchrun (it starts the ranks)")
        if port is None and env.get("MASTER_PORT"):
            port = _int(env["MASTER_PORT"], "MASTER_PORT")
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return _checked(Topology([_int(env["RANK"], "RANK")], [_int(env.get("LOCAL_RANK", "0"), "LOCAL_RANK")],
                                 _int(env["WORLD_SIZE"], "WORLD_SIZE"), addr or env.get("MASTER_ADDR") or "127.0.0.1",
                                 port, agent, "torchrun"))
    if env.get("SLURM_PROCID") is not None and env.get("SLURM_NTASKS") is not None:
        return _checked(_from_slurm(env, nproc, addr, port))
    if callable(opts.get("local_gpus")):
        return _checked(_one_node(opts, nproc, addr, port))
    raise TopologyError("no rank given: use --rank/--world-size (or --node-rank/--nnodes), or run under torchrun or srun")


def _one_node(opts: Mapping[str, Any], nproc: int, addr: str | None, port: Any) -> Topology:
    """Nothing said about ranks, no launcher: this node alone, one rank per local GPU (what
    nccl-tests' `-g N` gives), or `--nproc-per-node` ranks when it is given. `opts["local_gpus"]`
    counts the GPUs (called only here); `opts["nproc_given"]`: --nproc-per-node was given."""
    if opts.get("nproc_given"):
        ranks = nproc
    else:
        ranks, why = opts["local_gpus"]()
        if ranks < 2:
            raise TopologyError(f"{why}: a test on this node alone needs 2 or more; give --nproc-per-node N "
                                "(with --backend gloo: N CPU ranks), or --node-rank/--nnodes for several nodes")
    return Topology(list(range(ranks)), list(range(ranks)), ranks, addr or "127.0.0.1", port, source="one node")


def _from_rank_options(opts: Mapping[str, Any], nproc: int, addr: str | None, port: Any) -> Topology:
    if opts.get("rank") is None or opts.get("world_size") is None:
        raise TopologyError("--rank and --world-size go together")
    if nproc != 1:
        raise TopologyError("with --nproc-per-node use --node-rank and --nnodes, not --rank/--world-size")
    return Topology([int(opts["rank"])], [int(opts.get("local_rank") or 0)], int(opts["world_size"]),
                    addr or "127.0.0.1", port)


def _from_node_options(opts: Mapping[str, Any], nproc: int, addr: str | None, port: Any) -> Topology:
    if opts.get("node_rank") is None or opts.get("nnodes") is None:
        raise TopologyError("--node-rank and --nnodes go together")
    nr, nn = int(opts["node_rank"]), int(opts["nnodes"])
    if not 0 <= nr < nn:
        raise TopologyError(f"--node-rank {nr} is outside 0..{nn - 1}")
    return Topology([nr * nproc + i for i in range(nproc)], list(range(nproc)), nn * nproc, addr or "127.0.0.1", port)


def _from_slurm(env: Mapping[str, str], nproc: int, addr: str | None, port: Any) -> Topology:
    if nproc != 1:
        raise TopologyError("--nproc-per-node does not apply under srun (it starts the tasks)")
    if not addr:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise TopologyError("under srun without --master-addr, SLURM_NODELIST is needed")
        addr = first_slurm_node(nodelist)
    if port is None:
        if env.get("MASTER_PORT"):
            port = _int(env["MASTER_PORT"], "MASTER_PORT")
        else:  # every task of the step computes the same port
            port = 20000 + _int(env.get("SLURM_JOB_ID", "0"), "SLURM_JOB_ID") % 20000
    return Topology([_int(env["SLURM_PROCID"], "SLURM_PROCID")], [_int(env.get("SLURM_LOCALID", "0"), "SLURM_LOCALID")],
                    _int(env["SLURM_NTASKS"], "SLURM_NTASKS"), addr, port, False, "slurm")


def _checked(t: Topology) -> Topology:
    if t.world < 2:
        raise TopologyError(f"a collective test needs at least 2 ranks (world size {t.world})")
    for r in t.ranks:
        if not 0 <= r < t.world:
            raise TopologyError(f"rank {r} is outside 0..{t.world - 1}")
    if 0 not in t.ranks and not t.agent_store and t.master_port in (None, 0):
        raise TopologyError("ranks other than 0 need --master-port (a number, or 'stdin' to read it)")
    return t


def spec_port(rank: int, topo: Topology) -> int | None:
    """Rank 0 hosts the store (on the given port, or a free one: 0); the others connect to the
    given port, or wait for it (None) from the local rank 0 or standard input."""
    port = topo.master_port if isinstance(topo.master_port, int) else None
    if rank == 0 and not topo.agent_store:
        return port or 0
    return port or None


def rank_hosts(world: int, peers: list[str]) -> list[str]:
    """The host label of every rank, from the node list (ranks fill the nodes in order)."""
    if not peers:
        return []
    per_node = max(1, world // len(peers))
    return [peers[min(r // per_node, len(peers) - 1)] for r in range(world)]


# -- the network interface -------------------------------------------------------------------
def local_address_towards(target: str) -> str | None:
    """This host's source address for packets to `target` (resolved here), or None."""
    try:
        infos = socket.getaddrinfo(target, 9, proto=socket.IPPROTO_UDP)
    except (OSError, UnicodeError):
        return None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)  # a UDP connect only consults the routing table
                return str(s.getsockname()[0]).split("%")[0]
        except OSError:
            continue
    return None


def interface_of(address: str) -> str | None:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if str(a.address).split("%")[0] == address:
                return name
    return None


def pick_interface(master_addr: str, peer_addrs: list[str], node_rank: int) -> tuple[str | None, str]:
    """(interface, why) for a rank on node `node_rank` of the job; (None, why) when every other
    host is this one (loopback is right then) or no route is known."""
    targets = [a for i, a in enumerate(peer_addrs) if i != node_rank] if node_rank == 0 else [master_addr]
    if node_rank == 0 and not targets:
        return None, "no peer address given"
    for target in targets:
        local = local_address_towards(target)
        if local is None:
            continue
        try:
            if ipaddress.ip_address(local).is_loopback:
                continue  # the target is this host (or its name resolves to 127.x here)
        except ValueError:
            continue
        name = interface_of(local)
        if name:
            return name, f"{name} ({local}: the route to {target})"
    return None, f"no interface routes to {', '.join(targets) or master_addr} other than loopback"
