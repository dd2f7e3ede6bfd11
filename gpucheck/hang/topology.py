"""Parallel groups of a job, and the nodes to evict around suspect ranks.

`--topology tp=8,pp=4` follows Megatron-LM's rank order: the first dimension of the order varies
fastest, default order tp-cp-dp-pp (Megatron's tp-cp-ep-dp-pp without expert parallelism), so
rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)). dp is the world size divided by
the others unless given; `order=tp-pp-dp` changes the order (Megatron's tp-pp-dp mapping;
dimensions left out of `order` come last, in the default order).

`--groups FILE` names the groups directly: a JSON object {"DIMENSION": [[rank, ...], ...], ...}.

Eviction (ByteRobust's over-eviction): a suspect rank may be the victim of a peer in its parallel
group (a stuck pipeline stage leaves its neighbour stages waiting in other places), so the nodes to
evict are those of the parallel group that holds every suspect: of the dimensions with one group
holding them all, the one whose group spans the fewest nodes (then the fewest ranks, then the
earlier dimension). One suspect in a tp=8 job evicts its TP group (usually its own node); two
suspects in one pipeline evict that pipeline's nodes. When no single group holds every suspect,
the dimension whose groups holding suspects span the fewest nodes is taken the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .model import EvictGroup, EvictPlan

DIMENSIONS = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = ("tp", "cp", "dp", "pp")
_SIZE = re.compile(r"[1-9]\d{0,6}")


class TopologyError(ValueError):
    """A topology option or file that cannot be used (a usage error, exit 2)."""


@dataclass
class Topology:
    source: str  # the --topology text, or the groups file's path
    dims: dict[str, list[list[int]]]  # dimension -> its groups (lists of global ranks)


@dataclass
class MegatronSpec:
    text: str
    sizes: dict[str, int]  # the sizes given (dp may be missing)
    order: tuple[str, ...]


def parse_spec(text: str) -> MegatronSpec:
    """`tp=8,pp=4[,cp=2][,dp=16][,order=tp-cp-dp-pp]` -> MegatronSpec; TopologyError otherwise."""
    sizes: dict[str, int] = {}
    order: tuple[str, ...] = DEFAULT_ORDER
    for part in (p.strip() for p in text.split(",")):
        key, eq, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not key:
            raise TopologyError(f"want KEY=VALUE items (tp=8,pp=4), got {part!r}")
        if key == "order":
            named = tuple(x.strip().lower() for x in value.split("-"))
            if len(set(named)) != len(named) or not set(named) <= set(DIMENSIONS):
                raise TopologyError(f"order {value!r}: want distinct dimensions among {'-'.join(DIMENSIONS)}")
            order = named + tuple(d for d in DEFAULT_ORDER if d not in named)
        elif key in DIMENSIONS:
            if key in sizes:
                raise TopologyError(f"{key} given twice")
            if not _SIZE.fullmatch(value):
                raise TopologyError(f"{key}={value!r} is not a positive size")
            sizes[key] = int(value)
        else:
            raise TopologyError(f"unknown dimension {key!r} (want {', '.join(DIMENSIONS)} or order)")
    if not sizes:
        raise TopologyError("no dimension given (e.g. tp=8,pp=4)")
    return MegatronSpec(text=text, sizes=sizes, order=order)


def megatron(spec: MegatronSpec, world: int) -> Topology:
    """Every dimension's groups for a world of `world` ranks."""
    sizes = {d: spec.sizes.get(d, 1) for d in DIMENSIONS if d != "dp"}
    known = sizes["tp"] * sizes["cp"] * sizes["pp"]
    if "dp" in spec.sizes:
        sizes["dp"] = spec.sizes["dp"]
        if known * sizes["dp"] != world:
            raise TopologyError(f"{spec.text}: tp*cp*dp*pp = {known * sizes['dp']}, but the job has {world} ranks")
    else:
        if world % known:
            raise TopologyError(f"{spec.text}: the job's {world} ranks are not a multiple of tp*cp*pp = {known}")
        sizes["dp"] = world // known
    strides, step = {}, 1
    for d in spec.order:
        strides[d] = step
        step *= sizes[d]
    dims: dict[str, list[list[int]]] = {}
    for d in spec.order:
        if sizes[d] == 1:
            continue
        groups: dict[tuple, list[int]] = {}
        for rank in range(world):
            key = tuple((rank // strides[o]) % sizes[o] for o in spec.order if o != d)
            groups.setdefault(key, []).append(rank)
        dims[d] = list(groups.values())
    return Topology(source=spec.text, dims=dims)


def load_groups(path: str) -> Topology:
    """A groups file: {"DIMENSION": [[rank, ...], ...], ...}; TopologyError naming the key.

    Read through gpucheck.platform.safeio: a regular file of at most LIMITS["groups"] bytes (a FIFO or a
    device is refused, never waited on), JSON nested at most MAX_JSON_DEPTH deep."""
    from ..platform.safeio import describe_error, loads_json, read_input

    try:
        doc = loads_json(read_input(path, "groups").decode("utf-8"))
    except OSError as e:
        raise TopologyError(f"{path}: {describe_error(e, path)}") from None
    except UnicodeDecodeError:
        raise TopologyError(f"{path}: not UTF-8 text") from None
    except ValueError as e:
        raise TopologyError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not doc:
        raise TopologyError(f"{path}: want an object {{\"DIMENSION\": [[rank, ...], ...]}}")
    dims: dict[str, list[list[int]]] = {}
    for name, groups in doc.items():
        if not isinstance(groups, list) or not all(isinstance(g, list) and g for g in groups):
            raise TopologyError(f"{path}: {name}: want a list of non-empty rank lists")
        seen: set[int] = set()
        for g in groups:
            for r in g:
                if not isinstance(r, int) or isinstance(r, bool) or r < 0:
                    raise TopologyError(f"{path}: {name}: {r!r} is not a rank")
                if r in seen:
                    raise TopologyError(f"{path}: {name}: rank {r} is in two groups")
                seen.add(r)
        dims[str(name)] = [list(g) for g in groups]
    return Topology(source=path, dims=dims)


def evict_plan(topology: Topology, suspects: list[int], node_of: dict[int, str]) -> EvictPlan:
    """The suspects' parallel groups in every dimension and the nodes to evict (module text)."""
    from .folding import fold

    wanted = set(suspects)
    dims_doc: dict[str, list[EvictGroup]] = {}
    choices = []
    for order, (dim, groups) in enumerate(topology.dims.items()):
        holding = [(i, g) for i, g in enumerate(groups) if wanted.intersection(g)]
        dims_doc[dim] = [{"index": i, "ranks": g, "suspects": sorted(wanted.intersection(g)),
                          "nodes": fold({node_of[r] for r in g if r in node_of})} for i, g in holding]
        covered = {r for _, g in holding for r in g}
        if wanted <= covered:
            nodes = {node_of.get(r, f"?{r}") for r in covered}  # a rank on no known node counts as one
            choices.append((len(holding) > 1, len(nodes), len(covered), order, dim, covered))
    suspect_nodes = {node_of[r] for r in wanted if r in node_of}
    if not choices:
        return {"source": topology.source, "dims": dims_doc, "evict_dim": None, "evict_ranks": sorted(wanted),
                "evict_nodes": fold(suspect_nodes), "ranks_without_node": [],
                "note": "no dimension's groups hold every suspect: evicting the suspects' own nodes"}
    *_, dim, covered = min(choices, key=lambda c: c[:4])
    return {"source": topology.source, "dims": dims_doc, "evict_dim": dim, "evict_ranks": sorted(covered),
            "evict_nodes": fold(suspect_nodes | {node_of[r] for r in covered if r in node_of}),
            "ranks_without_node": sorted(r for r in covered if r not in node_of), "note": None}
