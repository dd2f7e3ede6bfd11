"""From the workers' digests to per-GPU results (the check) and to a record decision (`repro
record`). Pure: plain data in, Results or records out; no torch, no processes.

Per GPU, the comparisons count the workloads of each finding (metrics `reference_mismatches`,
`majority_outliers`, `nondeterministic_workloads`, `workloads_without_majority`) and RULES judge
the counts (result.evaluate), in this order of strength:

- fail, drain: "silent data corruption suspected in <workload>: digest differs from the reference
  for <fingerprint>" when a reference for the GPU's fingerprint holds that workload;
- fail, drain: "... differs from the node majority (k of n GPUs agree)" for workloads without a
  reference, among the node's GPUs of the same fingerprint;
- fail, investigate: "non-deterministic: two runs of <workload> on this GPU differ";
- warn, investigate: "no majority for <workload>" when the node's GPUs split evenly (or with no
  group above half), so that no GPU can be named;
- pass, saying what it was compared with: the reference, the other GPUs, or (one GPU and no
  reference) only itself, with the fingerprint to record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ..core.result import Action, Basis, Result, Rule, Status, evaluate
from . import majority as mj
from .fingerprint import canonical, closest, describe, fingerprint_key, short_key
from .store import entries

if TYPE_CHECKING:  # pragma: no cover
    from ..workers.pool import WorkerOutcome
    from ..workers.results import Fingerprint, ReproDigest, ReproProgress, ReproResult, SetupError
    from .store import Record, RefDoc, RefEntry

    # What the pool returned for one GPU's gpucheck.repro.worker:repro_worker (None: no outcome).
    ReproOutcome = WorkerOutcome[ReproResult | SetupError, ReproProgress] | None

SHORT = 16  # hex characters of a digest shown in metrics

# The findings, each a count of this GPU's workloads (a per-GPU metric, unit "count").
REFERENCE_MISMATCHES = "reference_mismatches"  # a run's digest differs from the stored reference
MAJORITY_OUTLIERS = "majority_outliers"  # no reference: the digest differs from the node's majority
NONDETERMINISTIC = "nondeterministic_workloads"  # the GPU's two runs differ
WITHOUT_MAJORITY = "workloads_without_majority"  # no reference, and the node's GPUs split without a majority
FINDINGS = (REFERENCE_MISMATCHES, MAJORITY_OUTLIERS, NONDETERMINISTIC, WITHOUT_MAJORITY)

# One rule per finding. The summary names the findings per workload, in the order of the
# workloads (for each: its two runs, then its comparison), every fail before every warn, as it
# always has: the three fail rules are one finding whose cause, {faults}, is the texts of this
# GPU's fail findings in that order (a count of 0 adds none); {ties}, the no-majority texts.
RULES: tuple[Rule, ...] = (
    Rule(REFERENCE_MISMATCHES, ">", 0, Status.FAIL, Action.DRAIN, "{faults}", "count", finding="faults"),
    Rule(MAJORITY_OUTLIERS, ">", 0, Status.FAIL, Action.DRAIN, "{faults}", "count", finding="faults"),
    Rule(NONDETERMINISTIC, ">", 0, Status.FAIL, Action.INVESTIGATE, "{faults}", "count", finding="faults"),
    Rule(WITHOUT_MAJORITY, ">", 0, Status.WARN, Action.INVESTIGATE, "{ties}", "count"),
)


@dataclass
class GpuRun:
    """One GPU's usable worker result."""

    gpu: int
    key: str
    fingerprint: "Fingerprint"
    run1: "dict[str, ReproDigest]"
    run2: "dict[str, ReproDigest]"
    asked: list[str]
    seconds: float
    injected_at: list[str] = field(default_factory=list)
    stopped: str | None = None

    @property
    def complete(self) -> list[str]:
        """Workloads that finished in both runs, in order."""
        return [w for w in self.asked if w in self.run1 and w in self.run2]

    @property
    def incomplete(self) -> list[str]:
        return [w for w in self.asked if w not in self.complete]

    def digest(self, w: str) -> str:
        return self.run1[w]["digest"]

    @property
    def nondeterministic(self) -> list[str]:
        return [w for w in self.complete if self.run1[w]["digest"] != self.run2[w]["digest"]]


def _differing_parts(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return [k for k in a if a.get(k) != b.get(k)] + [k for k in b if k not in a]


def _parts_note(a: "ReproDigest", b: "ReproDigest") -> str:
    diff = _differing_parts(a.get("parts", {}), b.get("parts", {}))
    total = max(len(a.get("parts", {})), len(b.get("parts", {})))
    if not diff:
        return "no single output differs (the digests' manifests differ)"
    shown = ", ".join(diff[:6]) + (f", ... ({len(diff) - 6} more)" if len(diff) > 6 else "")
    return f"{len(diff)} of {total} output(s) differ: {shown}"


def usable(check_id: str, gpu: int, outcome: "ReproOutcome", injected: list[str]) -> tuple[GpuRun | None, Result | None]:
    """A GpuRun for a worker that returned digests, or the Result saying why it did not."""
    from ..workers.pool import CANCELLED, CRASHED, HUNG

    if outcome is None:
        return None, Result(check_id, Status.ERROR, "no outcome from the worker pool", gpu=gpu, injected=injected)
    data = outcome.result
    if outcome.kind == HUNG:
        return None, Result(check_id, Status.FAIL,
                            f"hang: the reproducibility worker stopped answering and was killed ({outcome.error}); "
                            "a GPU that hangs a kernel is unhealthy", gpu=gpu, action=Action.RESET_GPU,
                            injected=injected, basis=Basis.HANG)
    if outcome.kind == CRASHED:
        err = outcome.error or "unknown error"
        if err.startswith("WorkloadError"):
            r = Result(check_id, Status.ERROR, f"could not run the workloads: {err}", gpu=gpu, injected=injected)
        else:
            cuda = "cuda" in err.lower() or "cublas" in err.lower()
            r = Result(check_id, Status.FAIL, f"reproducibility worker crashed: {err}", gpu=gpu,
                       action=Action.RESET_GPU if cuda else Action.INVESTIGATE, injected=injected,
                       basis=Basis.CRASH)
        if outcome.traceback:
            r.evidence.extend(outcome.traceback.strip().splitlines()[-12:])
        return None, r
    setup_error = data.get("setup_error") if data is not None else None
    if setup_error:
        return None, Result(check_id, Status.ERROR, f"could not run the workloads: {setup_error}",
                            gpu=gpu, injected=injected)
    if data is None or "runs" not in data:
        why = ("interrupted before the worker returned" if outcome.kind == CANCELLED
               else f"the worker overran its time budget ({outcome.error})")
        return None, Result(check_id, Status.ERROR, f"not finished: {why}", gpu=gpu, injected=injected)
    data = cast("ReproResult", data)  # it has its runs: no setup error
    run = GpuRun(gpu=gpu, key=data["key"], fingerprint=data["fingerprint"], run1=data["runs"][0],
                 run2=data["runs"][1], asked=list(data["workloads"]), seconds=float(data.get("seconds", 0.0)),
                 injected_at=list(data.get("injected", [])), stopped=data.get("stopped"))
    if not run.complete:
        return None, Result(check_id, Status.ERROR,
                            f"not finished: stopped ({run.stopped or outcome.kind}) before any workload ran twice",
                            gpu=gpu, injected=injected)
    return run, None


@dataclass
class _Finding:
    """One workload's finding on one GPU: `kind` is the metric that counts it (FINDINGS)."""

    kind: str
    text: str
    evidence: list[str] = field(default_factory=list)


@dataclass
class _Comparisons:
    """Per GPU of one fingerprint group: what was found, and which workloads were compared with
    the reference, with the group's other GPUs, or only between the GPU's own two runs."""

    findings: dict[int, list[_Finding]]
    vs_ref: dict[int, list[str]]
    vs_peers: dict[int, list[str]]
    self_only: dict[int, list[str]]

    @classmethod
    def of(cls, members: list[int]) -> _Comparisons:
        return cls({g: [] for g in members}, {g: [] for g in members}, {g: [] for g in members},
                   {g: [] for g in members})


def judge_node(check_id: str, outcomes: "dict[int, ReproOutcome]", *, refs: "RefDoc | None", ref_source: str,
               injected: dict[int, list[str]] | None = None, not_run: dict[str, str] | None = None) -> list[Result]:
    """Per-GPU results (and a node result carrying the digest set for fleet comparison).

    outcomes: GPU index -> WorkerOutcome of gpucheck.repro.worker:repro_worker.
    refs: the loaded reference file, or None (no file). ref_source: where it came from, said in
    the evidence. not_run: workloads this device does not run, and why."""
    injected = injected or {}
    results, runs = _usable_runs(check_id, outcomes, injected)
    by_key: dict[str, list[int]] = {}
    for g, run in runs.items():
        by_key.setdefault(run.key, []).append(g)
    stored = entries(refs)
    for key, members in by_key.items():
        entry = stored.get(key)
        ref_digests: dict[str, str] = entry["digests"] if entry else {}
        cmp = _compare_group(key, members, runs, entry)
        for g in members:
            results.append(_gpu_result(check_id, runs[g], cmp.findings[g], cmp.vs_ref[g], cmp.vs_peers[g],
                                       cmp.self_only[g], entry, ref_digests, len(members), refs, ref_source,
                                       injected.get(g, []), not_run or {}))
    results.sort(key=lambda r: (r.gpu is None, r.gpu or 0))
    if runs:
        results.append(_node_result(check_id, runs, by_key))
    return results


def _usable_runs(check_id: str, outcomes: "dict[int, ReproOutcome]",
                 injected: dict[int, list[str]]) -> tuple[list[Result], dict[int, GpuRun]]:
    """The GPUs whose workers returned digests, and a Result for each one that did not."""
    results: list[Result] = []
    runs: dict[int, GpuRun] = {}
    for g in sorted(outcomes):
        run, res = usable(check_id, g, outcomes[g], injected.get(g, []))
        if res is not None:
            results.append(res)
        if run is not None:
            runs[g] = run
    return results, runs


def _compare_group(key: str, members: list[int], runs: dict[int, GpuRun],
                   entry: "RefEntry | None") -> _Comparisons:
    """Every workload of one fingerprint group: each GPU's two runs with each other, then the
    GPUs with the stored reference where it holds the workload, else with each other."""
    ref_digests: dict[str, str] = entry["digests"] if entry else {}
    workloads = [w for w in runs[members[0]].asked if any(w in runs[g].complete for g in members)]
    cmp = _Comparisons.of(members)
    nondet_everywhere = set()
    for w in workloads:
        ran = [g for g in members if w in runs[g].complete]
        if len(ran) > 1 and all(w in runs[g].nondeterministic for g in ran):
            nondet_everywhere.add(w)
    for w in workloads:
        have = [g for g in members if w in runs[g].complete]
        _note_nondeterminism(w, have, runs, w in nondet_everywhere, cmp)
        if entry is not None and w in ref_digests:
            _compare_with_reference(w, have, runs, key, entry, cmp)
        else:
            _compare_with_peers(w, have, runs, cmp)
    return cmp


def _note_nondeterminism(w: str, have: list[int], runs: dict[int, GpuRun], everywhere: bool,
                         cmp: _Comparisons) -> None:
    for g in have:
        r = runs[g]
        if w in r.nondeterministic:
            where = " (on every GPU of this node: likely the software stack, not this GPU)" if everywhere else ""
            cmp.findings[g].append(_Finding(
                NONDETERMINISTIC, f"non-deterministic: two runs of {w} on this GPU differ{where}",
                [f"{w}: run 1 {r.run1[w]['digest']}, run 2 {r.run2[w]['digest']}; "
                 + _parts_note(r.run1[w], r.run2[w])]))


def _compare_with_reference(w: str, have: list[int], runs: dict[int, GpuRun], key: str, entry: "RefEntry",
                            cmp: _Comparisons) -> None:
    ref = entry["digests"][w]
    for g in have:
        r = runs[g]
        bad = [i + 1 for i, run in enumerate((r.run1, r.run2)) if run[w]["digest"] != ref]
        cmp.vs_ref[g].append(w)
        if bad:
            got = r.run1[w]["digest"] if 1 in bad else r.run2[w]["digest"]
            cmp.findings[g].append(_Finding(
                REFERENCE_MISMATCHES,
                f"silent data corruption suspected in {w}: digest differs from the reference for "
                f"fingerprint {short_key(key)}",
                [f"{w}: this GPU {got} (run {', '.join(map(str, bad))}), reference {ref} "
                 f"(recorded on {entry.get('host')} at {entry.get('recorded_at')})"]))


def _compare_with_peers(w: str, have: list[int], runs: dict[int, GpuRun], cmp: _Comparisons) -> None:
    """A workload without a reference: the GPUs that ran it vote (one GPU compares only itself)."""
    v = mj.vote({g: runs[g].digest(w) for g in have})
    if v["status"] == mj.SINGLE:
        for g in have:
            cmp.self_only[g].append(w)
        return
    for g in have:
        cmp.vs_peers[g].append(w)
    majority = v["majority"]
    if v["status"] == mj.MAJORITY and majority is not None:  # (a majority always names its digest)
        peer = next(g for g in have if runs[g].digest(w) == majority)
        for g in have:
            if g in v["outliers"]:
                cmp.findings[g].append(_Finding(
                    MAJORITY_OUTLIERS,
                    f"silent data corruption suspected in {w}: digest differs from the node majority "
                    f"({v['agree']} of {v['of']} GPUs agree)",
                    [f"{w}: this GPU {runs[g].digest(w)}, majority {majority} (GPUs "
                     f"{', '.join(map(str, v['groups'][majority]))}); "
                     + _parts_note(runs[g].run1[w], runs[peer].run1[w])]))
    elif v["status"] != mj.AGREE:
        sizes = " vs ".join(str(len(x)) for x in v["groups"].values())
        split = "; ".join(f"{d[:SHORT]} on GPU(s) {', '.join(map(str, gs))}" for d, gs in v["groups"].items())
        for g in have:
            cmp.findings[g].append(_Finding(
                WITHOUT_MAJORITY,
                f"no majority for {w}: the {v['of']} GPUs with this fingerprint give {len(v['groups'])} "
                f"different digests ({sizes}); cannot tell which GPU is wrong",
                [f"{w}: {split}"]))


def _gpu_result(check_id: str, r: GpuRun, findings: list[_Finding], vs_ref: list[str], vs_peers: list[str],
                self_only: list[str], entry: "RefEntry | None", ref_digests: dict[str, str], n_same: int,
                refs: "RefDoc | None", ref_source: str, injected: list[str],
                not_run: dict[str, str]) -> Result:
    """One GPU's result: its metrics (digests and the count of each finding) judged by RULES."""
    sk = short_key(r.key)
    metrics, units = _gpu_metrics(r, findings, ref_digests)
    faults = [f.text for f in findings if f.kind != WITHOUT_MAJORITY]
    ties = [f.text for f in findings if f.kind == WITHOUT_MAJORITY]
    ok = _pass_summary(sk, vs_ref, vs_peers, self_only, entry, n_same)
    if r.incomplete:
        ok += f" (partial: {', '.join(r.incomplete)} not run twice)"
    res = evaluate(check_id, RULES, metrics, units=units, gpu=r.gpu, ok_summary=ok,
                   facts={"faults": "; ".join(faults) or None, "ties": "; ".join(ties) or None})
    res.injected = list(injected)
    res.evidence = [f"fingerprint {sk}: {describe(r.fingerprint)}"]
    for f in findings:
        res.evidence.extend(f.evidence)
    res.evidence += _coverage(sk, vs_ref, vs_peers, self_only, entry, n_same)
    res.evidence += _reference_evidence(r, entry, ref_digests, refs, ref_source)
    if r.incomplete:
        res.evidence.append(f"stopped early ({r.stopped}): not run twice: {', '.join(r.incomplete)}")
    for w, why in not_run.items():
        res.evidence.append(f"{w} not run: {why}")
    for w in r.complete:
        res.evidence.append(f"{w}: {r.run1[w]['outputs']} outputs, {r.run1[w]['bytes']} bytes, "
                            f"{r.run1[w]['seconds']:.3f} s + {r.run2[w]['seconds']:.3f} s, digest {r.digest(w)}")
    res.evidence.extend(f"injected {x}" for x in r.injected_at)
    return res


def _gpu_metrics(r: GpuRun, findings: list[_Finding],
                 ref_digests: dict[str, str]) -> tuple[dict[str, str | int | float], dict[str, str]]:
    """The digests (and the reference's) per workload, the fingerprint, the workloads compared,
    the run time, and the count of each finding (FINDINGS)."""
    metrics: dict[str, str | int | float] = {}
    for w in r.complete:
        metrics[f"digest_{w}"] = r.digest(w)[:SHORT]
        if w in ref_digests:
            metrics[f"reference_{w}"] = ref_digests[w][:SHORT]
    metrics.update({"fingerprint": short_key(r.key), "workloads": len(r.complete), "runtime_s": round(r.seconds, 3)})
    units = {"workloads": "count", "runtime_s": "s"}
    for kind in FINDINGS:
        metrics[kind] = sum(1 for f in findings if f.kind == kind)
        units[kind] = "count"
    return metrics, units


def _coverage(sk: str, vs_ref: list[str], vs_peers: list[str], self_only: list[str], entry: "RefEntry | None",
              n_same: int) -> list[str]:
    """What each workload was compared with: the reference, the node's other GPUs, or only itself."""
    coverage = []
    if vs_ref:
        coverage.append(f"{', '.join(vs_ref)} compared with the reference for fingerprint {sk}")
    if vs_peers:
        coverage.append(f"{', '.join(vs_peers)} compared across the node's {n_same} GPUs of this fingerprint"
                        + (" (no reference for them)" if entry else ""))
    if self_only:
        coverage.append(f"{', '.join(self_only)} compared only between two runs on this GPU")
    return coverage


def _reference_evidence(r: GpuRun, entry: "RefEntry | None", ref_digests: dict[str, str],
                        refs: "RefDoc | None", ref_source: str) -> list[str]:
    """Where the reference came from, or, without one, the closest stored fingerprint and how to
    record one; the workloads the reference lacks."""
    sk = short_key(r.key)
    ev = []
    if entry is None:
        ev.append(f"no reference for this fingerprint in {ref_source}")
        others = [e["fingerprint"] for e in entries(refs).values()]
        near = closest(r.fingerprint, others)
        if near is not None:
            ev.append(f"closest stored fingerprint {short_key(fingerprint_key(near[0]))} differs in: "
                      + "; ".join(near[1]))
        ev.append("to record it, run `gpucheck repro record --out FILE` on a known-good node of this kind; "
                  f"fingerprint {canonical(r.fingerprint)}")
    else:
        ev.append(f"reference from {ref_source}, recorded on {entry.get('host')} at {entry.get('recorded_at')}")
    missing_ref = [w for w in r.complete if entry is not None and w not in ref_digests]
    if missing_ref:
        ev.append(f"not in the reference for {sk}: {', '.join(missing_ref)}")
    return ev


def _pass_summary(sk: str, vs_ref: list[str], vs_peers: list[str], self_only: list[str],
                  entry: "RefEntry | None", n_same: int) -> str:
    """A passing GPU's summary: what its workloads were compared with."""
    parts = []
    if vs_ref:
        parts.append(f"{', '.join(vs_ref)} bit-identical to the reference for fingerprint {sk}")
    peers = f"compared {n_same} GPUs with each other (all agree)"
    parts += _beyond_reference(vs_peers, entry, sk, "; " + peers, ": " + peers)
    alone = " and no other GPU to compare with: only checked that two runs give identical bits"
    parts += _beyond_reference(self_only, entry, sk, alone, alone)
    return "; ".join(parts) + "; two runs identical"


def _beyond_reference(workloads: list[str], entry: "RefEntry | None", sk: str, no_ref: str,
                      not_in_ref: str) -> list[str]:
    """The summary part for workloads no reference holds: the fingerprint has none (then say how
    to record one), or its reference lacks these workloads."""
    if not workloads:
        return []
    if not entry:
        return [f"no reference for fingerprint {sk}{no_ref}; record one with `gpucheck repro record`"]
    return [f"{', '.join(workloads)} not in the reference{not_in_ref}"]


def node_digest_sets(runs: dict[int, GpuRun], by_key: dict[str, list[int]]) -> dict[str, dict[str, str]]:
    """The node's digests per fingerprint, for fleet comparison: per workload the digest its GPUs
    agree on, or hold by majority; a workload that splits the node without a majority is left
    out."""
    return {key: {w: v["majority"] for w, v in _workload_votes(runs, members) if v["majority"] is not None}
            for key, members in by_key.items()}


def _workload_votes(runs: dict[int, GpuRun], members: list[int]) -> list[tuple[str, mj.Vote]]:
    """Per workload asked of these GPUs (one fingerprint), the vote of the GPUs that completed it
    (majority.vote); workloads no GPU completed are left out."""
    out = []
    for w in runs[members[0]].asked:
        votes = {g: runs[g].digest(w) for g in members if w in runs[g].complete}
        if votes:
            out.append((w, mj.vote(votes)))
    return out


def _node_result(check_id: str, runs: dict[int, GpuRun], by_key: dict[str, list[int]]) -> Result:
    sets = node_digest_sets(runs, by_key)
    fps = {key: runs[members[0]].fingerprint for key, members in by_key.items()}
    desc = ", ".join(f"{short_key(k)} ({len(by_key[k])} GPU(s), {len(sets[k])} workload(s))" for k in sets)
    r = Result(check_id, Status.PASS, f"digest set for fleet comparison: fingerprint {desc}", subject="node")
    r.metric("digest_sets", sets)
    r.metric("fingerprints", fps)
    r.evidence = [f"{short_key(k)}: {describe(fp)}" for k, fp in fps.items()]
    return r


def plan_record(check_id: str, outcomes: "dict[int, ReproOutcome]") -> tuple[
        "list[Record]", list[tuple[Status, str]], dict[str, list[int]]]:
    """What `repro record` may write: ([(fingerprint, {workload: digest})], problems, {key: GPUs}).
    Any problem refuses the whole record. A problem is (status, text): fail for what says the
    node is not known-good (a GPU that hung or crashed, a non-deterministic GPU, GPUs of one
    fingerprint that disagree), error for what kept gpucheck from judging (no CUDA in torch,
    a workload not run twice)."""
    problems: list[tuple[Status, str]] = []
    runs: dict[int, GpuRun] = {}
    for g in sorted(outcomes):
        run, res = usable(check_id, g, outcomes[g], [])
        if res is not None:
            problems.append((res.status, f"GPU {g}: {res.summary}"))
        if run is not None:
            runs[g] = run
            if run.incomplete:
                problems.append((Status.ERROR, f"GPU {g}: not run twice: {', '.join(run.incomplete)}"))
            for w in run.nondeterministic:
                problems.append((Status.FAIL, f"GPU {g}: non-deterministic: two runs of {w} differ: "
                                 f"run 1 {run.run1[w]['digest']}, run 2 {run.run2[w]['digest']}"))
    by_key: dict[str, list[int]] = {}
    for g, run in runs.items():
        by_key.setdefault(run.key, []).append(g)
    records = []
    for key, members in by_key.items():
        digests: dict[str, str] = {}
        for w, v in _workload_votes(runs, members):
            if len(v["groups"]) > 1:
                split = "; ".join(f"{d} on GPU(s) {', '.join(map(str, gs))}" for d, gs in v["groups"].items())
                problems.append((Status.FAIL, f"{w}: the node's GPUs of fingerprint {short_key(key)} disagree: {split}"))
                continue
            agreed = v["majority"]
            if agreed is not None:  # one group: its digest (every workload here has a vote)
                digests[w] = agreed
        if digests:
            records.append((runs[members[0]].fingerprint, digests))
    return records, problems, by_key
