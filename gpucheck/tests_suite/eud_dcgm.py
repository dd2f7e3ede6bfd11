"""eud.dcgm: NVIDIA DCGM diagnostics (`dcgmi diag -r <level> -j`) when the node has DCGM (level 3).

- `--device cpu` (CPU stand-ins) or a replayed snapshot: skip (DCGM loads the real GPUs).
- No `dcgmi` (the `dcgmi_path` setting, a name on PATH or a path): skip "DCGM not installed".
- The host engine does not answer `dcgmi discovery -l` within `probe_timeout_s`: skip "DCGM host
  engine not answering", with dcgmi's words (set `require_hostengine = false` to let dcgmi start
  an embedded engine instead, as it does on its own when none answers).
- Otherwise `dcgmi diag -r <level> -j [-i <gpus>]` runs with a timeout by DCGM level
  (`timeout_s_r1..4`); on timeout or cancel the process group gets SIGTERM (dcgmi then asks the
  host engine to stop the diagnostic) and SIGKILL after a grace period.
- The JSON is parsed (gpucheck.eud.dcgm_parse, DCGM 2.x, 3.x and 4.x documents) and each DCGM
  test becomes one result per GPU (subject "gpu<N>/<test>"), keeping DCGM's own words (warning
  text, DCGM_FR_* error id, category, severity) as evidence: Pass -> pass, Skip / not run -> skip
  with DCGM's reason, Warn -> warn, Fail -> fail with an action by DCGM's error category (or error
  if DCGM's error says its test could not run: software, CUDA, configuration); a null or empty
  status is judged from DCGM's error text and severity, and with none it is an error. Output that is not
  a diag document is an error with the reason and the tail of dcgmi's output, never a crash.
- Settings: gpucheck passes no option that changes what DCGM does (no --parameters, no
  --configfile). With a live telemetry snapshot from before the run, the settings a site sets
  (enforced power limit, persistence mode, ECC and MIG modes) are read again afterwards and any
  change is a warn (subject "node/settings").

A recorded `dcgmi diag -j` document among captures judged by `gpucheck judge` (the snapshot's
`dcgm_diag`) is judged instead of running DCGM, by the same mapping (gpucheck.eud.dcgm_parse).

Options: DcgmOptions.diag_level (`gpucheck eud --dcgm-level`: 1-4; default by gpucheck level); the
run's snapshot_path (a replayed snapshot: skip). The after-run settings come from the run's telemetry source
(ctx.telemetry.snapshot()).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from ..eud.dcgm_parse import CHECK_ID, DcgmParseError, map_results, parse_diag
from ..sdk import Action, Context, Level, Limit, Result, Rule, Slice, Status, define, evaluate, option, settle
from ..sdk.workers import guard_context, unknown_gpus

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import GpuEntry, NvmlError, Snapshot


class DcgmParams(TypedDict):
    """eud.dcgm's parameters (DEFAULTS, merged with the config's [checks."eud.dcgm"])."""

    dcgmi_path: str
    host: str
    diag_level_level3: int
    diag_level_level4: int
    timeout_s_r1: float
    timeout_s_r2: float
    timeout_s_r3: float
    timeout_s_r4: float
    probe_timeout_s: float
    require_hostengine: bool
    term_grace_s: float
    check_settings: bool


# A GPU's site settings (SETTINGS -> its value; None: not read).
Settings = dict[str, bool | float | None]

DEFAULTS: DcgmParams = {
    "dcgmi_path": "dcgmi",  # a name looked up on PATH, or an absolute path
    "host": "",  # host engine address for --host; empty: the local one
    "diag_level_level3": 3,  # dcgmi diag -r at gpucheck level 3 (DCGM: ~15 min)
    "diag_level_level4": 4,  # ... at level 4 (DCGM: extended, longer-running)
    # Timeouts by DCGM level (dcgmi diag reference: r1 "seconds", r2 ~2 min, r3 ~15 min, r4 no
    # duration given): r2 and r3 about 4x the documented duration, rounded up; r1 five minutes
    # (plugin loading and CUDA start-up dominate); r4 3 h, gpucheck's allowance (see docs/eud.md).
    "timeout_s_r1": 300.0,
    "timeout_s_r2": 600.0,
    "timeout_s_r3": 3600.0,
    "timeout_s_r4": 10800.0,
    "probe_timeout_s": 15.0,  # dcgmi discovery -l
    "require_hostengine": True,  # skip when nv-hostengine does not answer
    "term_grace_s": 30.0,  # SIGTERM -> SIGKILL on timeout (dcgmi stops the diag in the host engine)
    "check_settings": True,  # compare site settings before and after the run
}
# What a setting may be where gpucheck.core.config.conventional_limit is not enough: sizes and counts
# of work are at least 1 (0 would examine nothing).
LIMITS = {
    "diag_level_level3": Limit("int", 1, 4),  # dcgmi diag -r 1-4
    "diag_level_level4": Limit("int", 1, 4),
    "term_grace_s": Limit("real", 0),  # 0: SIGKILL right after SIGTERM
}

LEVEL_NAMES = {"quick": 1, "short": 1, "medium": 2, "long": 3, "xlong": 4}
SETTINGS = ("power.limit_w", "persistence_mode", "ecc_mode.current", "ecc_mode.pending",
            "mig_mode.current", "mig_mode.pending")


def parse_dcgm_level(value: Any) -> int:
    """A DCGM diag level 1-4 (or dcgmi's names quick/short/medium/long/xlong). ValueError else."""
    s = str(value).strip().lower()
    if s in LEVEL_NAMES:
        return LEVEL_NAMES[s]
    if s.isdigit() and 1 <= int(s) <= 4:
        return int(s)
    raise ValueError(f"bad DCGM diag level {value!r}: use 1-4 (or quick, medium, long, xlong)")


@dataclass(frozen=True)
class DcgmOptions:
    """`gpucheck eud`'s DCGM option (None: not given, the level's default or the config's applies)."""

    diag_level: int | str | None = option(
        "--dcgm-level", parse=parse_dcgm_level,
        help="DCGM diagnostic level for eud.dcgm: 1-4 or quick, medium, long, xlong (dcgmi diag -r N; "
             "default: 3 at level 3, 4 at level 4, see docs/eud.md).")


def _params(ctx: Context) -> DcgmParams:
    return ctx.params(CHECK_ID, DEFAULTS)


def dcgm_level(ctx: Context, p: DcgmParams | None = None) -> int:
    p = p or _params(ctx)
    v = ctx.options_for(DcgmOptions).diag_level
    if v is None:
        v = p["diag_level_level4"] if int(ctx.level) >= 4 else p["diag_level_level3"]
    return parse_dcgm_level(v)


def _timeout_s(p: DcgmParams, level: int) -> float:
    """dcgmi diag -r <level>'s timeout (timeout_s_r<level>)."""
    return float({1: p["timeout_s_r1"], 2: p["timeout_s_r2"], 3: p["timeout_s_r3"], 4: p["timeout_s_r4"]}[level])


def _budget(ctx: Context) -> float:
    p = _params(ctx)
    try:
        lv = dcgm_level(ctx, p)
    except ValueError:
        lv = 1
    return _timeout_s(p, lv) + float(p["probe_timeout_s"]) + float(p["term_grace_s"]) + 30.0


# How long `dcgmi diag -r N` normally runs, by DCGM's documentation (docs/eud.md, "Levels,
# durations, timeouts"): r1 "seconds", r2 about two minutes, r3 about 15 minutes; r4 runs r3's
# tests and more, so at least as long. A run whose time limit leaves less does not start it.
DOCUMENTED_S = {1: 0.0, 2: 120.0, 3: 900.0, 4: 900.0}


def _min_slice(ctx: Context) -> Slice:
    try:
        lv = dcgm_level(ctx)
    except ValueError:
        return Slice(0.0, "bad DCGM level: judged by the check")
    return Slice(DOCUMENTED_S[lv], f"dcgmi diag -r {lv} normally runs {DOCUMENTED_S[lv]:g} s or more")


def recorded_diag(ctx: Context) -> dict[str, Any] | None:
    """A recorded `dcgmi diag -j` document among the judged captures (`gpucheck judge`: the
    snapshot's `dcgm_diag`, {"path", "text"}), or None."""
    rec = ctx.snapshot.get("dcgm_diag") if ctx.snapshot and ctx.options.snapshot_path else None  # type: ignore[misc]
    return rec if isinstance(rec, dict) and isinstance(rec.get("text"), str) else None


def not_here(ctx: Context) -> str | None:
    """Why DCGM diagnostics do not run on this run at all (a replay, CPU stand-ins), or None."""
    if recorded_diag(ctx) is not None:  # judged from the recorded document (gpucheck judge)
        return None
    if ctx.options.snapshot_path:
        return "judging a recorded snapshot (--snapshot): DCGM diagnostics run on this node's live GPUs"
    if ctx.device == "cpu":
        # --device cpu asks for CPU stand-ins: never start a GPU stress run behind the user's back.
        return "--device cpu: DCGM diagnostics load this node's real GPUs, not CPU stand-ins"
    return None


# ---------------------------------------------------------------------------------------------
# settings before/after


def site_settings(snapshot: "Snapshot | None") -> dict[int, Settings]:
    """The settings a site sets, per GPU index, from a telemetry snapshot."""
    out: dict[int, Settings] = {}
    for g in (snapshot.get("gpus", []) if snapshot else []):
        if g.get("state", "ok") != "ok" or not isinstance(g.get("index"), int):
            continue
        vals: Settings = {}
        for key in SETTINGS:
            cur: Any = g
            for part in key.split("."):
                cur = cur.get(part) if isinstance(cur, dict) else None
            vals[key] = cur
        out[g["index"]] = vals
    return out


def settings_changes(before: dict[int, Settings], after: dict[int, Settings]) -> dict[int, list[str]]:
    """Per GPU, the settings whose value differs (a value read as None on either side is not compared)."""
    changes: dict[int, list[str]] = {}
    for g, b in before.items():
        a = after.get(g)
        if a is None:
            continue
        for key in SETTINGS:
            if b.get(key) is not None and a.get(key) is not None and b[key] != a[key]:
                changes.setdefault(g, []).append(f"{key} {b[key]} -> {a[key]}")
    return changes


def _after_snapshot(ctx: Context) -> Any:
    """The GPUs' settings read again after the run, from the run's telemetry source."""
    return ctx.telemetry.snapshot(timeout_s=60.0)


# gpucheck never changes a GPU's settings; a diagnostic that did (and did not restore them) leaves
# the node unlike the one the site configured.
SETTINGS_RULE = Rule("gpus_with_changed_settings", ">", 0, Status.WARN, Action.INVESTIGATE,
                     "the DCGM run changed GPU settings: {changes}", "count")
# dcgmi's exit code where every test passed or was skipped: something it did not put in its JSON.
EXIT_RULE = Rule("dcgmi_exit_code", "!=", 0, Status.WARN, Action.INVESTIGATE,
                 "dcgmi diag exited with {value} although its JSON shows no failure")


def _settings_result(ctx: Context) -> Result | None:
    snap = ctx.snapshot
    if snap is None or not (snap.get("nvml") or {}).get("ok") or ctx.options.snapshot_path:
        return None
    before = site_settings(snap)
    if not before:
        return None
    try:
        after_snap = _after_snapshot(ctx)
        why = None
    except Exception as e:  # noqa: BLE001 - the comparison is a guard, never a crash
        after_snap, why = None, str(e)
    if not after_snap or not (after_snap.get("nvml") or {}).get("ok"):
        err = ((after_snap or {}).get("nvml") or {}).get("error") or {}
        r = Result(CHECK_ID, Status.PASS, "could not re-read GPU settings after the DCGM run: "
                   + (why or err.get("message", "NVML not available")), subject="node/settings")
        r.unjudged["GPU settings after the run"] = Status.WARN  # a warn: the guard could not look
        return settle(r)
    changes = settings_changes(before, site_settings(after_snap))
    parts = [f"gpu{g}: {'; '.join(c)}" for g, c in sorted(changes.items())]
    r = evaluate(CHECK_ID, [SETTINGS_RULE], {"gpus_with_changed_settings": len(changes)},
                 units={"gpus_with_changed_settings": "count"}, facts={"changes": " | ".join(parts)},
                 ok_summary=f"GPU settings unchanged by the DCGM run ({len(before)} GPU(s))", subject="node/settings")
    r.evidence.append(f"compared before/after: {', '.join(SETTINGS)}")
    return r



def _limits(ctx: Context, p: DcgmParams, level: int) -> tuple[float, float, list[str]]:
    """dcgmi's timeout and SIGTERM grace, and a note when the run's time limit shortened them:
    that limit is hard, so dcgmi is stopped at the run's deadline and killed within the runner's
    stop time. A diag cut short this way is a timeout (error), never a verdict."""
    timeout = _timeout_s(p, level)
    term_grace = float(p["term_grace_s"])
    if ctx.deadline is None:
        return timeout, term_grace, []
    left = ctx.deadline - time.monotonic()
    term_grace = min(term_grace, 0.8 * ctx.stop_s)
    if left >= timeout:
        return timeout, term_grace, []
    timeout = max(0.0, left)
    return timeout, term_grace, [f"timeout shortened to {timeout:.0f} s by the run's time limit"]


# ---------------------------------------------------------------------------------------------
# the check


@define(
    CHECK_ID,
    title="NVIDIA DCGM diagnostics (dcgmi diag -r <level> -j) when DCGM is installed",
    level=Level.EXTENDED,
    needs=(),
    budget_fn=_budget,
    detects="what DCGM's diagnostics find: memory, PCIe, NVLink, stress, power and EUD test failures",
    defaults=DEFAULTS,
    limits=LIMITS,
    compute=True,
    min_slice_fn=_min_slice,
    top_level=Level.BURN_IN,
    unavailable_fn=not_here,
    options=DcgmOptions,
)
def dcgm_check(ctx: Context) -> list[Result]:
    from ..eud.dcgm_run import find_dcgmi, probe_hostengine, run_diag

    p = _params(ctx)
    why = not_here(ctx)
    if why:
        return [Result(CHECK_ID, Status.SKIP, why)]
    recorded = recorded_diag(ctx)
    if recorded is not None:
        return _recorded_results(ctx, recorded)
    try:
        level = dcgm_level(ctx, p)
    except ValueError as e:
        return [Result(CHECK_ID, Status.ERROR, str(e))]
    dcgmi = find_dcgmi(str(p["dcgmi_path"]))
    if dcgmi is None:
        where = "on PATH" if "/" not in str(p["dcgmi_path"]) else "at that path"
        return [Result(CHECK_ID, Status.SKIP,
                       f"DCGM not installed: {p['dcgmi_path']!r} not found {where} "
                       "(set dcgmi_path in [checks.\"eud.dcgm\"])")]
    host = str(p["host"] or "")
    if p["require_hostengine"]:
        ok, detail = probe_hostengine(dcgmi, host=host, timeout_s=float(p["probe_timeout_s"]), cancel=ctx.cancel)
        if not ok:
            if ctx.cancel.is_set():
                return [Result(CHECK_ID, Status.ERROR, "not run: interrupted while probing the DCGM host engine")]
            return [Result(CHECK_ID, Status.SKIP,
                           f"DCGM host engine not answering (is nv-hostengine running{' on ' + host if host else ''}?): "
                           f"{detail}", evidence=[f"dcgmi: {dcgmi}"])]
    gpus, guard = _gpus_not_in_use(ctx)
    if gpus == []:
        return guard.skipped
    timeout, term_grace, notes = _limits(ctx, p, level)
    res = run_diag(dcgmi, level, gpus=gpus, host=host, timeout_s=timeout, cancel=ctx.cancel,
                   term_grace_s=term_grace)
    return guard.skipped + guard.annotate(_diag_results(ctx, p, level, dcgmi, res, notes, timeout))


def _snapshot_gpus(ctx: Context) -> "list[GpuEntry]":
    """The telemetry snapshot's GPU entries (none without a snapshot)."""
    return ctx.snapshot.get("gpus", []) if ctx.snapshot else []


def _gpus_not_in_use(ctx: Context) -> tuple[list[int] | None, Any]:
    """The load-test guard (gpucheck.workers.busy) for DCGM, which runs on a GPU list: the GPUs for
    `dcgmi diag -i` (None: all, as asked; []: none may be loaded) and the guard, whose skips name
    the GPUs in use. The node's GPUs are the selection, else every GPU of the telemetry snapshot."""
    asked = ctx.gpus if ctx.gpus is not None else sorted(
        int(g["index"]) for g in _snapshot_gpus(ctx) if isinstance(g.get("index"), int))
    if not asked:  # DCGM would test the GPUs it finds: none of them is known to be free
        nvml = ctx.snapshot.get("nvml") if ctx.snapshot else None
        err: NvmlError | dict[str, None] = (nvml.get("error") if nvml else None) or {}
        why = "NVML lists no GPU" + (f" ({err.get('kind')}: {err.get('message')})" if err else "")
        return (None if ctx.force else []), unknown_gpus(CHECK_ID, force=ctx.force, why=why)
    guard = guard_context(ctx, "cuda", CHECK_ID, asked)
    if not guard.skipped:
        return ctx.gpus, guard
    return list(guard.loaded), guard


def _recorded_results(ctx: Context, recorded: dict[str, Any]) -> list[Result]:
    """Results from a recorded `dcgmi diag -j` document (judged as a live run's output is; no
    dcgmi exit code and no settings comparison: neither is in the capture)."""
    head = [f"recorded DCGM diagnostic: {recorded.get('path')}"]
    try:
        doc = parse_diag(str(recorded["text"]))
    except DcgmParseError as e:
        return [Result(CHECK_ID, Status.ERROR, f"could not read the recorded DCGM diagnostic: {e}", evidence=head)]
    about = (f"DCGM {doc.version or '(version not given)'} ({doc.format} JSON)"
             + (f", driver {doc.driver}" if doc.driver else ""))
    if doc.runtime_error:
        return [Result(CHECK_ID, Status.ERROR, f"DCGM could not run the diagnostic: {doc.runtime_error}",
                       action=Action.INVESTIGATE, evidence=head + [about])]
    if not doc.tests:
        return [Result(CHECK_ID, Status.ERROR, "the recorded DCGM diagnostic holds no test result",
                       evidence=head + [about])]
    serial_to_index = {str(g.get("serial")): int(g["index"]) for g in _snapshot_gpus(ctx)
                       if g.get("serial") and isinstance(g.get("index"), int)}
    gpu_map = {dcgm_id: serial_to_index[s] for dcgm_id, s in doc.serials.items() if s in serial_to_index}
    results = map_results(doc, gpu_map=gpu_map)
    for r in results:
        r.evidence[:0] = head + [about]
    return results


def _diag_results(ctx: Context, p: DcgmParams, level: int, dcgmi: str, res: Any, notes: list[str],
                  timeout: float) -> list[Result]:
    """Results from a finished (or stopped) `dcgmi diag` run."""
    cmd = " ".join(res.argv[1:])
    head = [f"dcgmi: {dcgmi}", f"ran: dcgmi {cmd}"] + notes
    if res.error:
        return [Result(CHECK_ID, Status.ERROR, f"could not run dcgmi: {res.error}", evidence=head)]
    stop = "SIGTERM, then SIGKILL" if res.killed else "SIGTERM"
    if res.cancelled:
        return [Result(CHECK_ID, Status.ERROR,
                       f"not finished: interrupted after {res.duration_s:.0f} s; dcgmi stopped ({stop})",
                       evidence=head + res.tail())]
    if res.timed_out:
        return [Result(CHECK_ID, Status.ERROR,
                       f"could not judge: dcgmi diag -r {level} did not finish within {timeout:.0f} s "
                       f"(timeout_s_r{level}); stopped ({stop})",
                       action=Action.INVESTIGATE, evidence=head + res.tail())]
    try:
        doc = parse_diag(res.stdout)
    except DcgmParseError as e:
        return [Result(CHECK_ID, Status.ERROR, f"could not read dcgmi's output (exit code {res.returncode}): {e}",
                       evidence=head + res.tail())]
    about = (f"DCGM {doc.version or '(version not given)'} ({doc.format} JSON)"
             + (f", driver {doc.driver}" if doc.driver else "")
             + f"; dcgmi diag -r {level} exit code {res.returncode} after {res.duration_s:.0f} s")
    if doc.runtime_error:
        return [Result(CHECK_ID, Status.ERROR, f"DCGM could not run the diagnostic: {doc.runtime_error}",
                       action=Action.INVESTIGATE, evidence=head + [about])]
    if not doc.tests:
        return [Result(CHECK_ID, Status.ERROR, "DCGM reported no test result", evidence=head + [about] + res.tail())]
    serial_to_index = {str(g.get("serial")): int(g["index"]) for g in _snapshot_gpus(ctx)
                       if g.get("serial") and isinstance(g.get("index"), int)}
    gpu_map = {dcgm_id: serial_to_index[s] for dcgm_id, s in doc.serials.items() if s in serial_to_index}
    results = map_results(doc, gpu_map=gpu_map)
    for r in results:
        r.evidence.append(about)
        r.duration_s = res.duration_s
    if res.returncode not in (0, None) and all(r.status in (Status.PASS, Status.SKIP) for r in results):
        r = evaluate(CHECK_ID, [EXIT_RULE], {"dcgmi_exit_code": res.returncode}, subject="node/dcgmi")
        r.evidence = head + [about] + res.tail()
        results.append(r)
    if p["check_settings"]:
        s = _settings_result(ctx)
        if s is not None:
            results.append(s)
    return results


CHECKS = [dcgm_check]
