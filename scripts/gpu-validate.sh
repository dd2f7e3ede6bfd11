#!/usr/bin/env bash
# gpu-validate.sh: what gpucheck can only prove on a GPU, in two parts that fit one borrowed GPU
# machine (one H100 or H200; 15 minutes of device time in all, the machine's start included; at
# most 10 minutes a command): part 1 within 480 s, part 2 within 180 s, on the same warm machine.
#
#   bash scripts/gpu-validate.sh --part 1|2 [--dry-run] [--only STEP,...] [--skip STEP,...]
#                                [--budget S] [--wheels DIR] [OUTDIR]
#
# Through the device tool (the command runs in the repository root; $OUT comes back):
#   run  command: bash scripts/gpu-validate.sh --part 1 "$OUT"     timeout_s: 540
#   run  command: bash scripts/gpu-validate.sh --part 2 "$OUT"     timeout_s: 240   (then give_back)
# Before part 2, the tool's status says the device time left: below 180 + 40 s, add --budget (that
# time - 40). Each call returns that part's two files (the tool empties $OUT before each command).
# Nothing must travel on the lent image (Python 3.12 with torch, CuPy, nvidia-ml-py, numpy, pytest,
# click, rich, psutil; nvcc, nvdisasm, cuobjdump): no step imports ClusterShell or jsonschema, and
# the kit never runs pip against an index. Where the env step says "missing: NAME", it prints the
# `pip download` line for NAME's wheel: fetch it into .whl here (echo /.whl/ >>.git/info/exclude),
# name .whl in the call's carry, and add --wheels .whl (installed with --no-index --no-deps into a
# private folder on PYTHONPATH; the tests' own subprocesses that set PYTHONPATH do not see it).
# If the device's $OUT were refused (exit 2 at once: a folder others can write), give "$OUT/gv".
#
# Each part runs its steps in order, the most valuable evidence first, each under its own time
# limit; `core` steps' limits plus the part's spare add up to its budget, `extra` steps run only
# when the deadline still leaves them time. A step gets min(its limit, what the deadline leaves
# after the reserve); one that cannot get min(its limit, 5 s) is recorded skipped-for-time, not run.
#   part 1 (480 s): env (versions, GPU, nvidia-smi -q read-only), telemetry (gpucheck telemetry
#     dump: the snapshot to commit as a fixture), run-level1, pytest-poet (tests/test_poet_gpu.py,
#     and tests/test_kernel_infra.py's GPU bits against the emulator's), pytest-eud
#     (tests/test_eud_gpu.py), bench-poet, bench-memtest, bench-burn (bf16, fp8), sass
#     (ptxas resources and SASS of every kernel source by the machine's nvcc/nvdisasm);
#     extra: bench-copy
#   part 2 (180 s): run-level2, pytest-busy (tests/test_busy_gpu.py); extra: pytest-power
#     (tests/test_eud_power_gpu.py), bench-burn-more (fp16, tf32, fp32, fp64), bench-repro,
#     bench-level1, bench-allreduce
# --dry-run prints `part N budget S s` and the plan (steps, limits, commands) and runs nothing.
# --budget S lowers the part's budget (less device time left); it can never raise it.
#
# Outputs: OUTDIR (default $OUT when set, else ./gpu-validate-out) ends with two files per part,
# gpu-validate-partN.tar.gz (every log and JSON of the part, under gpu-validate-partN/, with
# summary.tsv) and gpu-validate-partN.md (step, kind, limit, allowed, seconds, exit code, status and
# the key figures). Both are rewritten after every step (and every 30 s during one) by writing a
# .tmp file in OUTDIR and renaming it, so a kill at any moment leaves what was done before (at
# most one .tmp file per part, never under the final names). The steps work in a private
# temporary folder, removed at the end. A step's processes that escape its process group (setsid)
# are found by a token in their environment and killed when the step ends. A step past its time
# gets SIGINT (pytest then prints its summary, benchmarks clean up), SIGKILL 5 s later. SIGTERM or
# SIGINT to the kit stops the running step's whole process group the same way, records it, writes
# both files and exits 143 / 130.
# OUTDIR must be this user's own: a link, a folder others can write, or one that holds a link or a
# special file is refused (exit 2), so that nothing is ever written through a planted link.
#
# It only observes and loads the GPU: it never changes a GPU setting (no nvidia-smi -r, -pm, -pl,
# -ac, -lgc, -c or -mig; only nvidia-smi -q, -q -x, --query-gpu and topo -m).
#
# Exit status: 0 when every step that ran exited 0 and no core step was skipped for time, 1 when
# a step failed or ran out of time or a core step was skipped for time, 2 for a usage error or a
# refused OUTDIR (one line on stderr), 130/143 when interrupted. GV_TIME_SCALE (tests only): a number in (0, 1] that every limit, the budget, the
# spare and the reserve are multiplied by, so that the suite runs a part in seconds; it can only
# shorten a part, never lengthen it.

{  # the whole script is read before any of it runs: an edit of this file cannot change a run under way
set -u
set -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
BUDGET_S=(0 480 180)   # per part
SPARE_S=(0 10 15)      # per part: the kit's own time (start, figures, archives) between the steps
RESERVE_S=5            # kept before the deadline for the step's figures and the last archive
GRACE_S=5              # a step past its time gets SIGINT, then SIGKILL this much later (inside its time)
MIN_STEP_S=5           # a step that cannot get min(its limit, this) is skipped for time
FIG_S=3                # the figures of one step (scripts/gpu_validate.py figures)
HEARTBEAT_S=30         # the archive is rewritten this often during a long step
WHEELS_S=20            # the --wheels step

# part|name|limit in seconds|core or extra|command (run by bash -c in the repository root, with
# GV_DIR, GV_TMP, GV_PY, GV_STEP, GV_INNER_S (a gpucheck --timeout inside the step's time) in its
# environment: commands use "$GV_DIR", never a path pasted into the text)
# shellcheck disable=SC2016  # expanded by the step's own bash, on purpose
PLAN=(
  '1|env|20|core|gv_env'
  '1|telemetry|20|core|"$GV_PY" -m gpucheck telemetry dump -o "$GV_DIR/telemetry.json"'
  '1|run-level1|30|core|"$GV_PY" -m gpucheck run --level 1 -v --output "$GV_DIR/run-level1.json" --no-history --state-dir "$GV_TMP/state" --timeout "${GV_INNER_S}s"'
  '1|pytest-poet|160|core|gv_pytest tests/test_poet_gpu.py tests/test_kernel_infra.py'
  '1|pytest-eud|75|core|gv_pytest tests/test_eud_gpu.py'
  '1|bench-poet|45|core|"$GV_PY" benchmarks/bench_poet.py --device cuda --seconds 0.25 --problems 2'
  '1|bench-memtest|45|core|"$GV_PY" benchmarks/bench_memtest.py --device cuda --fraction 0.9 --rounds 3 --json >"$GV_DIR/bench-memtest.json"'
  '1|bench-burn|55|core|"$GV_PY" benchmarks/bench_burn.py --device cuda --dtype bf16,fp8 --size 8192 --seconds 6 --rounds 1 --breakdown --json >"$GV_DIR/bench-burn.json"'
  '1|sass|20|core|gv_sass'
  '1|bench-copy|20|extra|"$GV_PY" benchmarks/bench_copy_bandwidth.py --h2d 256M --d2d 1G --repeats 10 --json >"$GV_DIR/bench-copy.json"'
  '2|run-level2|120|core|"$GV_PY" -m gpucheck run --level 2 -v --output "$GV_DIR/run-level2.json" --no-history --state-dir "$GV_TMP/state" --timeout "${GV_INNER_S}s"'
  '2|pytest-busy|45|core|gv_pytest tests/test_busy_gpu.py'
  '2|pytest-power|75|extra|gv_pytest tests/test_eud_power_gpu.py'
  '2|bench-burn-more|65|extra|"$GV_PY" benchmarks/bench_burn.py --device cuda --dtype fp16,tf32,fp32,fp64 --size 8192 --seconds 4 --rounds 1 --breakdown --json >"$GV_DIR/bench-burn-more.json"'
  '2|bench-repro|60|extra|"$GV_PY" benchmarks/bench_repro.py --device cuda --rounds 1'
  '2|bench-level1|45|extra|"$GV_PY" benchmarks/bench_level1.py --device cuda --runs 1 --timeout 15'
  '2|bench-allreduce|40|extra|"$GV_PY" benchmarks/bench_allreduce.py --sizes 1M,16M --iters 20 --reps 1 --json >"$GV_DIR/bench-allreduce.json"'
)
# shellcheck disable=SC2016
WHEELS_CMD='"$GV_PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$GV_SITE" "$GV_WHEELS"/*.whl'

usage() {
  echo "gpu-validate.sh: $1 (usage: gpu-validate.sh --part 1|2 [--dry-run] [--only STEP,...] [--skip STEP,...] [--budget S] [--wheels DIR] [OUTDIR])" >&2
  exit 2
}

# -- the steps that are more than one command (exported: each step runs in its own bash) ----------
# shellcheck disable=SC2317  # run by a step's bash -c
gv_env() {
  local rc=0
  echo "== kit: part $GV_PART, checkout $GV_ROOT"
  git -C "$GV_ROOT" log -1 --format='commit %H %cI %s' 2>/dev/null || echo "commit: not a git checkout"
  echo "== host"
  uname -a
  echo "cpus $(nproc), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "== python"
  "$GV_PY" "$GV_ROOT/scripts/gpu_validate.py" env || rc=1
  echo "== nvidia-smi (read-only: --query-gpu, -q, -q -x, topo -m)"
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,ecc.mode.current,persistence_mode,clocks.sm,clocks.max.sm,power.limit --format=csv || rc=1
  nvidia-smi -q >"$GV_DIR/nvidia-smi-q.txt" || rc=1
  nvidia-smi -q -x >"$GV_DIR/nvidia-smi-q.xml" || rc=1
  nvidia-smi topo -m
  echo "== tools"
  nvcc --version | tail -n 2
  local tool
  for tool in nvcc nvdisasm cuobjdump g++; do echo "$tool: $(command -v "$tool" || echo missing)"; done
  return "$rc"
}

# shellcheck disable=SC2317  # run by a step's bash -c
gv_pytest() {  # FILE: its tests marked gpu, a skip counted as a failure (a GPU run must not skip)
  GPUCHECK_NO_SKIP=1 GPUCHECK_REQUIRE_NVRTC=1 "$GV_PY" -m pytest -m gpu -v -s -rfEs -p no:cacheprovider \
    --durations=15 --junitxml "$GV_DIR/$GV_STEP.xml" "$@"
}

# shellcheck disable=SC2317  # run by a step's bash -c
gv_sass() {  # ptxas's resources (nvcc --resource-usage) and the SASS of every kernel source, sm_90
  local d="$GV_DIR/sass" names name rc=0
  mkdir -p "$d" || return 1
  names=$("$GV_PY" -c 'from gpucheck import kernels; print(" ".join(kernels.names()))') || return 1
  for name in $names; do
    [[ $name =~ ^[A-Za-z0-9_]+$ ]] || { echo "bad kernel source name $name"; rc=1; continue; }
    "$GV_PY" -c 'import sys; from gpucheck import kernels; sys.stdout.write(kernels.source(sys.argv[1]))' \
      "$name" >"$d/$name.cu" || { rc=1; continue; }
    echo "== $name.cu: nvcc -cubin -arch=sm_90 -std=c++17 -ftz=true --resource-usage"
    nvcc -cubin -arch=sm_90 -std=c++17 -ftz=true --resource-usage -o "$d/$name.sm_90.cubin" "$d/$name.cu" \
      || { rc=1; continue; }
    cuobjdump -res-usage "$d/$name.sm_90.cubin" || rc=1
    nvdisasm -c "$d/$name.sm_90.cubin" >"$d/$name.sm_90.sass" \
      || cuobjdump -sass "$d/$name.sm_90.cubin" >"$d/$name.sm_90.sass" || rc=1
  done
  return "$rc"
}

export -f gv_env gv_pytest gv_sass

# -- time: milliseconds, every limit multiplied by the scale (parts per million) ----------------------
SCALE_PPM=1000000
NOW_MS=0
now_ms() {
  local t=${EPOCHREALTIME:-}
  if [ -n "$t" ]; then
    t=${t//[.,]/}
    NOW_MS=$((10#$t / 1000))
  else
    NOW_MS=$(($(date +%s%N) / 1000000))
  fi
}
now_ms
T0_MS=$NOW_MS

parse_scale() {  # GV_TIME_SCALE -> SCALE_PPM: (0, 1] only, so that no lease is ever exceeded
  local s=${GV_TIME_SCALE:-1} frac
  [[ $s =~ ^([01])(\.([0-9]{1,6}))?$ ]] || usage "GV_TIME_SCALE=$s is not a number in (0, 1] with at most 6 decimals"
  frac="${BASH_REMATCH[3]}000000"
  SCALE_PPM=$((BASH_REMATCH[1] * 1000000 + 10#${frac:0:6}))
  if [ "$SCALE_PPM" -le 0 ] || [ "$SCALE_PPM" -gt 1000000 ]; then usage "GV_TIME_SCALE=$s is not in (0, 1]"; fi
}

ms() { REPLY=$(($1 * SCALE_PPM / 1000)); }                          # seconds -> scaled milliseconds
secs() { printf -v REPLY '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }  # milliseconds -> "S.mmm" (timeout)
shown() {                                                            # milliseconds -> "S" or "S.cc"
  if [ $(($1 % 1000)) -eq 0 ]; then REPLY=$(($1 / 1000)); else printf -v REPLY '%d.%02d' $(($1 / 1000)) $(($1 % 1000 / 10)); fi
}

# -- arguments ------------------------------------------------------------------------------------
PART=""
DRY=0
ONLY=""
SKIP=""
GV_WHEELS=""
BUDGET_ARG=""
OUTDIR=""
while [ $# -gt 0 ]; do
  case $1 in
    --part) [ $# -ge 2 ] || usage "--part needs 1 or 2"; PART=$2; shift ;;
    --dry-run) DRY=1 ;;
    --only) [ $# -ge 2 ] || usage "--only needs a list of steps"; ONLY=$2; shift ;;
    --skip) [ $# -ge 2 ] || usage "--skip needs a list of steps"; SKIP=$2; shift ;;
    --budget) [ $# -ge 2 ] || usage "--budget needs seconds"; BUDGET_ARG=$2; shift ;;
    --wheels) [ $# -ge 2 ] || usage "--wheels needs a directory"; GV_WHEELS=$2; shift ;;
    -h | --help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) usage "unknown option $1" ;;
    *) [ -z "$OUTDIR" ] || usage "one OUTDIR only"; OUTDIR=$1 ;;
  esac
  shift
done
case $PART in 1 | 2) ;; "") usage "--part 1 or --part 2 is required" ;; *) usage "--part $PART: 1 or 2" ;; esac
parse_scale
BUDGET=${BUDGET_S[$PART]}
if [ -n "$BUDGET_ARG" ]; then
  [[ $BUDGET_ARG =~ ^[1-9][0-9]{0,5}$ ]] || usage "--budget $BUDGET_ARG is not a number of seconds"
  [ "$BUDGET_ARG" -le "$BUDGET" ] || usage "--budget $BUDGET_ARG is over part $PART's budget of $BUDGET s: it can only be lowered"
  BUDGET=$BUDGET_ARG
fi
[ -z "$GV_WHEELS" ] || [ -d "$GV_WHEELS" ] || usage "--wheels $GV_WHEELS is not a directory"
if [ -n "$GV_WHEELS" ]; then
  GV_WHEELS=$(cd "$GV_WHEELS" && pwd -P) || usage "--wheels $GV_WHEELS cannot be entered"
  compgen -G "$GV_WHEELS/*.whl" >/dev/null || usage "--wheels $GV_WHEELS holds no .whl file"
fi

# -- the plan of this part ------------------------------------------------------------------------
NAMES=() LIMITS=() KINDS=() CMDS=()
part_of() {  # step name -> its part in REPLY ("" when no step has that name)
  local entry p n
  REPLY=""
  for entry in "${PLAN[@]}"; do
    IFS='|' read -r p n _ <<<"$entry"
    [ "$n" = "$1" ] && { REPLY=$p; return; }
  done
}
for list in "$ONLY" "$SKIP"; do
  IFS=',' read -r -a asked <<<"$list"
  for step in "${asked[@]}"; do
    part_of "$step"
    [ -n "$REPLY" ] || usage "unknown step $step"
    [ "$REPLY" = "$PART" ] || usage "step $step is in part $REPLY, not part $PART"
  done
done
selected() {
  case ",$SKIP," in *",$1,"*) return 1 ;; esac
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; esac
  return 1
}
[ -z "$GV_WHEELS" ] || { NAMES+=(wheels); LIMITS+=("$WHEELS_S"); KINDS+=(core); CMDS+=("$WHEELS_CMD"); }
for entry in "${PLAN[@]}"; do
  IFS='|' read -r p n l k c <<<"$entry"
  [ "$p" = "$PART" ] && selected "$n" && { NAMES+=("$n"); LIMITS+=("$l"); KINDS+=("$k"); CMDS+=("$c"); }
done
[ "${#NAMES[@]}" -gt 0 ] || usage "no step of part $PART is selected"
CORE=0
EXTRAS=""
for i in "${!NAMES[@]}"; do
  if [ "${KINDS[$i]}" = core ]; then CORE=$((CORE + LIMITS[i])); else EXTRAS+=" ${NAMES[$i]} (${LIMITS[$i]} s)"; fi
done

OUTDIR=${OUTDIR:-${OUT:-./gpu-validate-out}}
ARCHIVE=gpu-validate-part$PART.tar.gz
SUMMARY=gpu-validate-part$PART.md

if [ "$DRY" -eq 1 ]; then
  echo "part $PART budget $BUDGET s"
  echo "plan of part $PART: $ARCHIVE and $SUMMARY into $OUTDIR; commands run in $ROOT"
  for i in "${!NAMES[@]}"; do
    printf 'step %-16s limit %4s s  %-5s  %s\n' "${NAMES[$i]}" "${LIMITS[$i]}" "${KINDS[$i]}" "${CMDS[$i]}"
  done
  total=$((CORE + SPARE_S[PART]))
  if [ "$total" -le "$BUDGET" ]; then
    echo "core steps $CORE s + spare ${SPARE_S[$PART]} s = $total s, within the budget of $BUDGET s"
  else
    echo "core steps $CORE s + spare ${SPARE_S[$PART]} s = $total s, over the budget of $BUDGET s: the deadline cuts the last of them"
  fi
  echo "extra steps, run only while the deadline leaves them time:${EXTRAS:- none}"
  [ "$SCALE_PPM" -eq 1000000 ] || echo "time scale ${GV_TIME_SCALE} (GV_TIME_SCALE): every limit and the budget multiplied by it"
  exit 0
fi

# -- the output folder: ours, never through a link another user could plant ------------------------
safe_file() {  # refuse to write over anything but a regular file of our own
  if [ -L "$1" ] || { [ -e "$1" ] && [ ! -f "$1" ]; }; then
    usage "$1 exists and is not a regular file: refusing to write over it"
  fi
}
if [ -L "$OUTDIR" ] || { [ -e "$OUTDIR" ] && [ ! -d "$OUTDIR" ]; }; then
  usage "OUTDIR $OUTDIR is a link or not a directory"
fi
mkdir -p -- "$OUTDIR" 2>/dev/null || usage "cannot create OUTDIR $OUTDIR"
if [ -n "$(find "$OUTDIR" -maxdepth 0 \( ! -user "$(id -u)" -o -perm -0002 \) -print)" ]; then
  usage "OUTDIR $OUTDIR is not ours or others can write to it (give a folder of your own, e.g. $OUTDIR/gv)"
fi
OUTABS=$(cd "$OUTDIR" && pwd -P) || usage "cannot enter OUTDIR $OUTDIR"
if [ -n "$(find "$OUTABS" -mindepth 1 ! -type f ! -type d -print -quit)" ]; then
  usage "OUTDIR $OUTDIR holds a link or a special file: refusing to write next to it"
fi
for f in "$ARCHIVE" "$SUMMARY" "$ARCHIVE.tmp" "$SUMMARY.tmp"; do safe_file "$OUTABS/$f"; done
rm -f -- "$OUTABS/$ARCHIVE.tmp" "$OUTABS/$SUMMARY.tmp"   # a killed run's leftovers: ours, regular files
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-validate.XXXXXXXX") || usage "cannot create a private temporary folder"
PNAME=gpu-validate-part$PART
PDIR=$WORK/$PNAME
mkdir -p "$PDIR" "$WORK/tmp" || usage "cannot create folders in $WORK"

# -- the record: one row per step, published to OUTDIR after every step ---------------------------------
STATUS=() RCS=() SECS=() ALLOWED=() FIGS=()
for i in "${!NAMES[@]}"; do
  ms "${LIMITS[$i]}"; LIMITS_MS[i]=$REPLY
  STATUS[i]=pending RCS[i]=- SECS[i]=- ALLOWED[i]=- FIGS[i]=""
done
ms "$BUDGET"; DEADLINE_MS=$((T0_MS + REPLY)); BUDGET_MS=$REPLY
ms "$RESERVE_S"; RESERVE_MS=$REPLY
ms "$GRACE_S"; GRACE_MS=$REPLY
ms "$MIN_STEP_S"; MIN_MS=$REPLY
ms "$FIG_S"; FIG_MS=$REPLY
ms "$HEARTBEAT_S"; BEAT_MS=$REPLY
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
STATE=running
TOKEN="gv$$x${RANDOM}${RANDOM}"   # in every step's environment: how its escaped processes are found
CHILD=""
EXIT=0
# A step past its time gets SIGINT, which Python turns into KeyboardInterrupt: pytest prints its
# summary and writes its XML, benchmarks run their clean-up. (A script's background job starts with
# SIGINT ignored, and Python would keep it so; timeout installs its own SIGINT handler, so the
# command it starts has SIGINT at its default again.)
STEP_SIG=INT

write_tsv() {
  local i
  printf 'step\tkind\tlimit_s\tallowed_s\tseconds\trc\tstatus\tfigures\n'
  for i in "${!NAMES[@]}"; do
    shown "${LIMITS_MS[$i]}"; local lim=$REPLY al=${ALLOWED[$i]}
    [ "$al" = - ] || { shown "$al"; al=$REPLY; }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${NAMES[$i]}" "${KINDS[$i]}" "$lim" "$al" "${SECS[$i]}" \
      "${RCS[$i]}" "${STATUS[$i]}" "${FIGS[$i]}"
  done
}

write_md() {
  shown "$BUDGET_MS"
  echo "# gpu-validate part $PART: $STATE"
  echo
  echo "Budget $REPLY s$([ "$SCALE_PPM" -eq 1000000 ] || echo " (time scale ${GV_TIME_SCALE})"); started $STARTED on ${HOSTNAME:-$(uname -n)}; written $(date -u +%Y-%m-%dT%H:%M:%SZ). Every log and JSON: $ARCHIVE."
  echo
  echo "| step | kind | limit s | allowed s | seconds | rc | status | figures |"
  echo "|---|---|---|---|---|---|---|---|"
  write_tsv | tail -n +2 | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
}

publish_md() {  # OUTDIR/SUMMARY, by a .tmp file renamed over it
  write_md >"$OUTABS/$SUMMARY.tmp" && mv -f -- "$OUTABS/$SUMMARY.tmp" "$OUTABS/$SUMMARY"
}

publish() {  # the archive (first), then the summary: the summary never names a step the archive lacks
  write_tsv >"$PDIR/summary.tsv"
  write_md >"$PDIR/SUMMARY.md"
  local tmp="$OUTABS/$ARCHIVE.tmp" rc
  tar -czf "$tmp" -C "$WORK" "$PNAME" 2>/dev/null
  rc=$?  # 1: a file changed while it was read (a running step's log): the archive is whole
  if [ "$rc" -le 1 ] && [ "$(stat -c %s "$tmp")" -gt 15728640 ]; then  # over what the device tool returns
    tar -czf "$tmp" -C "$WORK" --exclude='*.sass' --exclude='*.cubin' "$PNAME" 2>/dev/null
    rc=$?
  fi
  if [ "$rc" -le 1 ]; then
    mv -f -- "$tmp" "$OUTABS/$ARCHIVE"
  else
    rm -f -- "$tmp"
    echo "gpu-validate: tar failed ($rc): $ARCHIVE keeps its last contents" | tee -a "$PDIR/kit.log" >&2
  fi
  publish_md
}

alive() {  # PID still running (not a zombie). Not bash's kill -0: it answers yes for a child it reaped
  local stat
  [ -d /proc/self ] || { ps -p "$1" >/dev/null 2>&1; return; }
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

sweep() {  # SIGKILL every process whose environment holds a step token of this run (escaped its group)
  local round f pid pids
  for round in 1 2 3; do
    pids=()
    while IFS= read -r f; do
      pid=${f#/proc/}; pid=${pid%/environ}
      [ "$pid" = "$$" ] || pids+=("$pid")
    done < <(grep -lszE "^GV_TOKEN=${TOKEN}-[0-9]+\$" /proc/[0-9]*/environ 2>/dev/null)
    [ "${#pids[@]}" -gt 0 ] || return 0
    echo "gpu-validate: round $round: killing ${#pids[@]} process(es) a step left behind: ${pids[*]}" >>"$PDIR/kit.log"
    kill -KILL "${pids[@]}" 2>/dev/null
    sleep 0.1
  done
}

# shellcheck disable=SC2317  # run by a trap
stop_group() {  # STEP_SIG to the step's timeout (it passes it to its process group), SIGKILL after 2 s
  local pg=$1 n=0
  kill -"$STEP_SIG" "$pg" 2>/dev/null
  while alive "$pg" && [ "$n" -lt 40 ]; do sleep 0.05; n=$((n + 1)); done
  kill -KILL -- "-$pg" 2>/dev/null
  wait "$pg" 2>/dev/null
}

figures() {  # step index: the key figures of its outputs (scripts/gpu_validate.py), within FIG_MS
  local i=$1 line
  secs "$FIG_MS"
  line=$(cd "$ROOT" && GV_TOKEN="$TOKEN-$i" timeout -k 0.5 "$REPLY" "$GV_PY" scripts/gpu_validate.py figures \
    "${NAMES[$i]}" "$PDIR" 2>/dev/null </dev/null | head -n 1)
  if [ -z "$line" ] && [ "${RCS[$i]}" != 0 ]; then  # no figures from a step that failed: its last words
    line=$(grep -v '^[[:space:]]*$' "$PDIR/${NAMES[$i]}.log" | tail -n 1 | cut -c 1-200)
    line="last line: ${line:-(no output)}"
  fi
  line=${line//$'\t'/ }
  FIGS[i]=${line//|//}
}

launch() {  # step index, its time in ms: the step's bash under timeout (its own process group), in the background
  local i=$1 allowed=$2 grace term inner
  grace=$((allowed / 4 < GRACE_MS ? allowed / 4 : GRACE_MS))
  grace=$((grace < 1 ? 1 : grace))
  term=$((allowed - grace < 1 ? 1 : allowed - grace))
  inner=$((allowed / 1000 - (allowed / 10000 > 5 ? allowed / 10000 : 5)))
  secs "$grace"; local grace_s=$REPLY
  secs "$term"
  # shellcheck disable=SC2016  # the command is expanded by the step's bash
  GV_STEP=${NAMES[$i]} GV_INNER_S=$((inner < 1 ? 1 : inner)) GV_TOKEN="$TOKEN-$i" TMPDIR="$GV_TMP" \
    timeout -s "$STEP_SIG" -k "$grace_s" "$REPLY" bash -c 'eval "$1"' "gv-${NAMES[$i]}" "${CMDS[$i]}" \
    >"$PDIR/${NAMES[$i]}.log" 2>&1 </dev/null &
  CHILD=$!
}

wait_step() {  # until the step's timeout process ends; the archive rewritten every BEAT_MS meanwhile
  local beat=$((NOW_MS + BEAT_MS))
  while alive "$CHILD"; do
    sleep 0.05
    now_ms
    if [ "$NOW_MS" -ge "$beat" ]; then publish; beat=$((NOW_MS + BEAT_MS)); fi
  done
  wait "$CHILD"
  REPLY=$?
  CHILD=""
}

run_step() {  # step index
  local i=$1 left allowed least t0 rc
  now_ms
  left=$((DEADLINE_MS - NOW_MS - RESERVE_MS))
  allowed=$((LIMITS_MS[i] < left ? LIMITS_MS[i] : left))
  least=$((LIMITS_MS[i] < MIN_MS ? LIMITS_MS[i] : MIN_MS))
  if [ "$allowed" -lt "$least" ] || [ "$allowed" -le 0 ]; then
    STATUS[i]=skipped-for-time
    [ "${KINDS[$i]}" = extra ] || EXIT=1  # an extra step is there for time left over
    publish_md
    return
  fi
  STATUS[i]=running ALLOWED[i]=$allowed
  publish_md
  t0=$NOW_MS
  launch "$i" "$allowed"
  wait_step 2>/dev/null  # not bash's "Killed" line for a step that needed SIGKILL: the summary says it
  rc=$REPLY
  now_ms
  shown $((NOW_MS - t0)); SECS[i]=$REPLY
  RCS[i]=$rc
  case $rc in
    0) STATUS[i]=ok ;;
    124 | 137) if [ "$allowed" -lt "${LIMITS_MS[$i]}" ]; then STATUS[i]=deadline; else STATUS[i]=timeout; fi ;;
    *) STATUS[i]=failed ;;
  esac
  [ "$rc" -eq 0 ] || EXIT=1
  figures "$i"
  sweep
  publish
}

finish() {  # the last record, then the private folder goes
  sweep
  publish
  rm -rf -- "$WORK"
}

# shellcheck disable=SC2317  # run by a trap
on_signal() {  # signal name, exit status
  trap '' TERM INT
  local i
  if [ -n "$CHILD" ]; then
    stop_group "$CHILD" 2>/dev/null
    CHILD=""
  fi
  for i in "${!NAMES[@]}"; do
    case ${STATUS[$i]} in
      running) STATUS[i]=interrupted-$1 RCS[i]=- ;;
      pending) STATUS[i]=not-run ;;
    esac
  done
  STATE="interrupted ($1)"
  finish
  exit "$2"
}

# -- the run --------------------------------------------------------------------------------------
export GV_PART=$PART GV_ROOT=$ROOT GV_DIR=$PDIR GV_TMP=$WORK/tmp GV_WHEELS GV_SITE=$WORK/site
export GV_PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${GV_WHEELS:+:$GV_SITE}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT" || usage "cannot enter $ROOT"
trap 'on_signal TERM 143' TERM
trap 'on_signal INT 130' INT

publish
shown "$BUDGET_MS"
echo "gpu-validate part $PART: budget $REPLY s, ${#NAMES[@]} steps, outputs $OUTABS/$ARCHIVE and $OUTABS/$SUMMARY"
for i in "${!NAMES[@]}"; do
  run_step "$i"
  printf '%-16s %-16s %8s s  rc %-4s %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${RCS[$i]}" "${FIGS[$i]}"
done
STATE=finished
finish
exit "$EXIT"
}
