#!/usr/bin/env bash
# gpu-validate.sh: everything gpucheck can only prove on a GPU, in one command, on one GPU machine
# (an H100 or H200 with a CUDA build of torch, CuPy, nvidia-ml-py and nvcc), within 20 minutes.
#
#   bash scripts/gpu-validate.sh [--dry-run] [--only STEP,...] [--skip STEP,...] [--wheels DIR] [OUTDIR]
#
# Steps (each with its own time limit; the limits add up to less than 20 minutes):
#   env                the machine: Python, torch, CuPy, NVML, driver, `nvidia-smi -q` (read-only), nvcc
#   install            pip install --no-deps -e . and the test dependencies that are missing (never
#                      torch or CuPy: the installed versions are pinned as constraints); --wheels DIR
#                      installs them from DIR without an index (a machine without internet)
#   ptxas              registers, shared memory and spills of every kernel source for sm_90 (nvcc)
#   pytest-gpu         python3 -m pytest -m gpu (the GPU tests; their printed figures in the log)
#   bench-burn         benchmarks/bench_burn.py, every dtype at 8192: burn vs a bare matmul loop
#   bench-memtest      benchmarks/bench_memtest.py on 90 % of the free memory: memtest vs a D2D copy
#   bench-poet         benchmarks/bench_poet.py: the POET kernel vs torch.bmm (+ the gather)
#   bench-copy         benchmarks/bench_copy_bandwidth.py: H2D, D2H, D2D, P2P
#   bench-collectives  benchmarks/bench_allreduce.py: gpucheck's all-reduce vs a bare loop
#   run-level1         gpucheck run --level 1 (the verdict as JSON; wall time in the summary)
#   run-level2         gpucheck run --level 2
#   telemetry          gpucheck telemetry dump (the snapshot to commit as a fixture)
#
# Every output goes into OUTDIR (default: $OUT when it is set, else ./gpu-validate-out): STEP.log
# (stdout and stderr of the step), the JSON files the steps write, summary.tsv (step, limit,
# seconds, exit code, status), SUMMARY.md, and last gpu-validate.tar.gz with all of them. A step
# that fails or runs out of time is recorded and the next one starts. SIGTERM or SIGINT stops the
# running step's whole process group, records it, writes the summary and exits (143 / 130).
# OUTDIR must be this user's own: a link, a folder others can write, or one that holds a link or a
# special file is refused (exit 2), so that nothing is ever written through a planted link.
#
# It only observes and loads the GPU: it never changes a GPU setting (no nvidia-smi -r, -pm, -pl,
# -ac, -lgc, -c or -mig; only nvidia-smi -q and --query-gpu).
#
# --dry-run prints the plan (steps, limits, commands) and the time budget, and runs nothing.
# Exit status: 0 when every step ran and exited 0, 1 when a step failed or timed out, 2 for a
# usage error (one line on stderr), 130/143 when interrupted.

set -u
set -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
BUDGET_S=1200        # the whole run on one H100/H200
SPARE_S=40           # kept for the summary, the archive and start-up

# name|limit in seconds|command (run by bash -c in the repository root, with GV_OUT, GV_PY and
# GV_WHEELS in its environment: commands use "$GV_OUT", never a path pasted into the text)
# shellcheck disable=SC2016  # expanded by the step's own bash, on purpose
PLAN=(
  'env|15|gv_env'
  'install|60|gv_install'
  'ptxas|30|gv_ptxas'
  'pytest-gpu|240|"$GV_PY" -m pytest -m gpu -q -s -rA -p no:cacheprovider --junitxml "$GV_OUT/pytest-gpu.xml" tests'
  'bench-burn|150|"$GV_PY" benchmarks/bench_burn.py --device cuda --dtype all --size 8192 --seconds 5 --rounds 1 --breakdown --json >"$GV_OUT/bench-burn.json"'
  'bench-memtest|90|"$GV_PY" benchmarks/bench_memtest.py --device cuda --fraction 0.9 --rounds 3 --json >"$GV_OUT/bench-memtest.json"'
  'bench-poet|120|"$GV_PY" benchmarks/bench_poet.py --device cuda --seconds 0.5'
  'bench-copy|60|"$GV_PY" benchmarks/bench_copy_bandwidth.py --json >"$GV_OUT/bench-copy.json"'
  'bench-collectives|60|"$GV_PY" benchmarks/bench_allreduce.py --sizes 1M,16M --iters 20 --reps 1 --json >"$GV_OUT/bench-collectives.json"'
  'run-level1|60|"$GV_PY" -m gpucheck run --level 1 --json --output "$GV_OUT/run-level1.json" --no-history --state-dir "$GV_OUT/state"'
  'run-level2|240|"$GV_PY" -m gpucheck run --level 2 --json --output "$GV_OUT/run-level2.json" --no-history --state-dir "$GV_OUT/state"'
  'telemetry|30|"$GV_PY" -m gpucheck telemetry dump -o "$GV_OUT/telemetry.json"'
)

usage() {
  echo "gpu-validate.sh: $1 (usage: gpu-validate.sh [--dry-run] [--only STEP,...] [--skip STEP,...] [--wheels DIR] [OUTDIR])" >&2
  exit 2
}

# -- the steps that are more than one command (exported: each step runs in its own bash) ----------
# shellcheck disable=SC2317  # run by a step's bash -c or by a trap
gv_env() {
  echo "host: $(hostname)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  uname -a
  "$GV_PY" - <<'PY'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "cupy", "pynvml", "numpy", "pytest"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "not importable:", e)
try:
    import torch
    print("torch cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("gpu0", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs", p.total_memory, "bytes")
except Exception as e:  # noqa: BLE001
    print("torch cuda: not usable:", e)
PY
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,ecc.mode.current,persistence_mode,clocks.sm,clocks.max.sm,power.limit --format=csv
  nvidia-smi -q
  nvcc --version
}

# shellcheck disable=SC2317  # run by a step's bash -c or by a trap
gv_install() {
  local constraints
  constraints=$(mktemp) || return 1
  # the machine's torch and CuPy stay as they are: pinned for every pip call below
  "$GV_PY" -m pip freeze 2>/dev/null | grep -Ei '^(torch|cupy[-_a-z0-9]*)==' >"$constraints"
  echo "pinned:"; cat "$constraints"
  local rc=0
  "$GV_PY" -m pip install --no-deps --no-build-isolation -e . || {
    rc=1
    echo "pip install -e . failed: the steps import gpucheck from the checkout (PYTHONPATH)"
  }
  local missing=() pair
  for pair in click:click rich:rich psutil:psutil pynvml:nvidia-ml-py ClusterShell:ClusterShell \
              pytest:pytest jsonschema:jsonschema numpy:numpy; do
    "$GV_PY" -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair#*:}")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "every dependency of gpucheck and its GPU tests is importable"
  else
    echo "missing: ${missing[*]}"
    local from=()
    [ -n "$GV_WHEELS" ] && from=(--no-index --find-links "$GV_WHEELS")
    "$GV_PY" -m pip install -c "$constraints" "${from[@]}" "${missing[@]}" || rc=1
  fi
  rm -f -- "$constraints"
  return "$rc"
}

# shellcheck disable=SC2317  # run by a step's bash -c or by a trap
gv_ptxas() {
  local tmp name rc=0
  tmp=$(mktemp -d) || return 1
  for name in $("$GV_PY" -c 'from gpucheck import kernels; print(" ".join(kernels.names()))'); do
    "$GV_PY" -c 'import sys; from gpucheck import kernels; sys.stdout.write(kernels.source(sys.argv[1]))' \
      "$name" >"$tmp/$name.cu" || { rc=1; continue; }
    echo "== $name.cu, sm_90"
    nvcc -cubin -arch=sm_90 -std=c++17 --resource-usage -o "$tmp/$name.cubin" "$tmp/$name.cu" || rc=1
  done
  rm -rf -- "$tmp"
  return "$rc"
}

export -f gv_env gv_install gv_ptxas

# -- the runner ---------------------------------------------------------------------------------
CHILD=""
CURRENT=""
FAILED=0

safe_file() {  # refuse to write over anything but a regular file of our own
  if [ -L "$1" ] || { [ -e "$1" ] && [ ! -f "$1" ]; }; then
    echo "gpu-validate.sh: $1 exists and is not a regular file: refusing to write over it" >&2
    return 1
  fi
}

record() {  # name limit seconds rc status
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$GV_OUT/summary.tsv"
  printf '%-18s %4s s limit  %7s s  rc %-4s %s\n' "$1" "$2" "$3" "$4" "$5"
}

run_step() {  # name limit command
  local name=$1 limit=$2 cmd=$3 t0 t1 rc status
  CURRENT=$name
  safe_file "$GV_OUT/$name.log" || { record "$name" "$limit" 0 - refused; FAILED=1; return; }
  t0=$(date +%s.%N)
  # timeout makes itself a process-group leader and signals the whole group at the limit
  timeout --kill-after=10 "$limit" bash -c "$cmd" >"$GV_OUT/$name.log" 2>&1 </dev/null &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=""
  t1=$(date +%s.%N)
  case $rc in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status=failed ;;
  esac
  [ "$rc" -eq 0 ] || FAILED=1
  record "$name" "$limit" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" "$rc" "$status"
}

finish() {
  {
    echo "# gpu-validate $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo
    echo "| step | limit (s) | seconds | exit | status |"
    echo "|---|---|---|---|---|"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$GV_OUT/summary.tsv"
  } >"$GV_OUT/SUMMARY.md"
  tar -czf "$GV_OUT/gpu-validate.tar.gz.part" -C "$GV_OUT" --exclude=gpu-validate.tar.gz \
    --exclude=gpu-validate.tar.gz.part . && mv -f -- "$GV_OUT/gpu-validate.tar.gz.part" "$GV_OUT/gpu-validate.tar.gz"
  echo "outputs: $GV_OUT"
}

# shellcheck disable=SC2317  # run by a step's bash -c or by a trap
on_signal() {  # signal name, exit status
  trap '' TERM INT
  if [ -n "$CHILD" ]; then
    kill -TERM -- "-$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null
    sleep 2
    kill -KILL -- "-$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
    record "$CURRENT" - - - "interrupted ($1)"
  fi
  finish
  exit "$2"
}

# -- arguments ----------------------------------------------------------------------------------
DRY=0
ONLY=""
SKIP=""
GV_WHEELS=""
OUTDIR=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --only) [ $# -ge 2 ] || usage "--only needs a list of steps"; ONLY=$2; shift ;;
    --skip) [ $# -ge 2 ] || usage "--skip needs a list of steps"; SKIP=$2; shift ;;
    --wheels) [ $# -ge 2 ] || usage "--wheels needs a directory"; GV_WHEELS=$2; shift ;;
    -h | --help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) usage "unknown option $1" ;;
    *) [ -z "$OUTDIR" ] || usage "one OUTDIR only"; OUTDIR=$1 ;;
  esac
  shift
done
[ -z "$GV_WHEELS" ] || [ -d "$GV_WHEELS" ] || usage "--wheels $GV_WHEELS is not a directory"

names=()
for entry in "${PLAN[@]}"; do names+=("${entry%%|*}"); done
for list in "$ONLY" "$SKIP"; do
  IFS=',' read -r -a asked <<<"$list"
  for step in "${asked[@]}"; do
    case " ${names[*]} " in *" $step "*) ;; *) usage "unknown step $step (steps: ${names[*]})" ;; esac
  done
done

selected() {
  case ",$SKIP," in *",$1,"*) return 1 ;; esac
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; esac
  return 1
}

OUTDIR=${OUTDIR:-${OUT:-./gpu-validate-out}}
total=0
for entry in "${PLAN[@]}"; do
  name=${entry%%|*}; rest=${entry#*|}; limit=${rest%%|*}
  selected "$name" && total=$((total + limit))
done

if [ "$DRY" -eq 1 ]; then
  echo "gpu-validate plan (outputs into $OUTDIR, commands run in $ROOT):"
  for entry in "${PLAN[@]}"; do
    name=${entry%%|*}; rest=${entry#*|}; limit=${rest%%|*}; cmd=${rest#*|}
    selected "$name" && printf 'step %-18s limit %4s s  %s\n' "$name" "$limit" "$cmd"
  done
  echo "time budget: $total s of steps + $SPARE_S s spare, within $BUDGET_S s"
  [ $((total + SPARE_S)) -le "$BUDGET_S" ] || { echo "gpu-validate.sh: the plan exceeds its budget" >&2; exit 1; }
  exit 0
fi

# -- the output folder: ours, never through a link another user could plant ------------------------
if [ -L "$OUTDIR" ] || { [ -e "$OUTDIR" ] && [ ! -d "$OUTDIR" ]; }; then
  usage "OUTDIR $OUTDIR is a link or not a directory"
fi
mkdir -p -- "$OUTDIR" || usage "cannot create OUTDIR $OUTDIR"
if [ -n "$(find "$OUTDIR" -maxdepth 0 \( ! -user "$(id -u)" -o -perm -0002 \) -print)" ]; then
  usage "OUTDIR $OUTDIR is not ours or others can write to it"
fi
GV_OUT=$(cd "$OUTDIR" && pwd -P)
if [ -n "$(find "$GV_OUT" -mindepth 1 ! -type f ! -type d -print -quit)" ]; then
  usage "OUTDIR $OUTDIR holds a link or a special file: the steps would write through it"
fi
for f in summary.tsv SUMMARY.md gpu-validate.tar.gz gpu-validate.tar.gz.part; do
  safe_file "$GV_OUT/$f" || exit 2
done
: >"$GV_OUT/summary.tsv"
export GV_OUT GV_WHEELS
export GV_PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT" || exit 2
trap 'on_signal TERM 143' TERM
trap 'on_signal INT 130' INT

echo "gpu-validate: $total s of steps, outputs into $GV_OUT"
for entry in "${PLAN[@]}"; do
  name=${entry%%|*}; rest=${entry#*|}; limit=${rest%%|*}; cmd=${rest#*|}
  selected "$name" && run_step "$name" "$limit" "$cmd"
done
finish
exit "$FAILED"
