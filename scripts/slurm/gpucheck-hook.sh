#!/bin/sh
trap 'hook_signal=${hook_signal:-TERM}' TERM; trap 'hook_signal=${hook_signal:-INT}' INT  # first: see Signals below
# Slurm Prolog and Epilog wrapper for gpucheck (see docs/fleet.md). Install this one file twice:
#   install -m 755 scripts/slurm/gpucheck-hook.sh /etc/slurm/gpucheck-prolog.sh
#   install -m 755 scripts/slurm/gpucheck-hook.sh /etc/slurm/gpucheck-epilog.sh
# and in slurm.conf: Prolog=/etc/slurm/gpucheck-prolog.sh, Epilog=/etc/slurm/gpucheck-epilog.sh.
# The hook is the one its file name says (a name with "prolog" or "epilog"), else Slurm's
# SLURM_SCRIPT_CONTEXT (prolog_slurmd / epilog_slurmd). Slurm runs it as root with almost no
# environment and no PATH: the PATH below is set first (the settings file may extend it).
#
# Site settings: the first readable file of
#   <this script's folder>/gpucheck-slurm.env   /etc/gpucheck/slurm.env
# is sourced (shell syntax, with SLURMD_NODENAME and the job's variables set, so that it can
# vary the settings per node; it is read twice, a trial in a subshell first, so keep it to
# assignments). It must be owned by root and writable by root only, and so must every folder on
# its real path (links resolved) and on the real path of the folder that holds its name (a
# sticky folder such as /tmp excepted): a file another user could have written or swapped is
# never sourced. It may set:
#   GPUCHECK             how to start gpucheck (default /usr/local/bin/gpucheck); may be
#                        several words, e.g. "/opt/gpucheck/bin/python3 -m gpucheck"
#   GPUCHECK_ARGS        arguments for both hooks (e.g. --state-dir /var/lib/gpucheck)
#   GPUCHECK_PROLOG_ARGS arguments for the prolog only (e.g. --budget 20s)
#   GPUCHECK_EPILOG_ARGS arguments for the epilog only (e.g. --failed-level 2)
#   GPUCHECK_ON_ERROR    pass or fail: what to do when gpucheck cannot judge the node
#   GPUCHECK_PROLOG_EPILOG_TIMEOUT  Slurm's PrologEpilogTimeout in seconds, so that this script
#                        need not ask `scontrol show config` at every job (empty: ask)
# Arguments are split on white space; none of them may contain spaces.
#
# Exit status (what Slurm acts on):
#   0  the node may run the job: gpucheck judged it healthy, or could not judge it and
#      on-error is pass (one line to syslog, ident gpucheck)
#   1  gpucheck judged the node unhealthy (it exits 42, only then) and drained it with a
#      "gpucheck: <cause>" reason; or it could not judge and on-error is fail: the node is
#      drained with "gpucheck: could not judge: ..." (by gpucheck, or here when gpucheck
#      itself failed), so that `gpucheck slurm resume` can undo it.
# Any other outcome of gpucheck (a usage error, a traceback, a missing package, not found,
# killed by a signal it cannot hold) is gpucheck's own failure, never a verdict: it is logged
# with gpucheck's exit code and the end of its stderr, then follows on-error. on-error is the
# first of: --on-error in the arguments, GPUCHECK_ON_ERROR, `on_error = "pass"|"fail"` of the
# run table in the config file (--config in the arguments, else /etc/gpucheck/config.toml;
# spellings below, config_on_error), pass.
#
# Signals: the trap above is this script's first command, so that no SIGTERM or SIGINT (scancel,
# slurmd stopping) kills it (Slurm drains a node whose prolog a signal killed): one that comes
# before gpucheck started means gpucheck is not started (could not judge: on-error); later ones
# are forwarded to gpucheck (a child, never exec'd) as SIGTERM, and this script waits for it.
# gpucheck holds them from its start until it has decided, drained and logged: a node it judged
# unhealthy and drained still makes this script exit 1.
#
# Slurm's PrologEpilogTimeout (`scontrol show config`, or GPUCHECK_PROLOG_EPILOG_TIMEOUT) is not
# a signal that can be held: past it Slurm 22.05 sends SIGKILL ("prolog killed by signal 9") and
# drains the node ("Prolog error") whatever on-error says. So this script ends first: gpucheck is
# told the time it has (GPUCHECK_HOOK_DEADLINE, an epoch: it fits its budget into it, and says
# so), gets SIGTERM at that time (a verdict cut short is could not judge: on-error) and SIGKILL a
# second before the timeout, and this script then exits by on-error.

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/slurm/bin
export PATH
hook_started=$(date +%s 2>/dev/null)
HOOK_UNHEALTHY=42  # `gpucheck slurm prolog|epilog`: judged unhealthy (gpucheck.fleet.hook)

case "${0##*/}" in
  *prolog*) hook=prolog ;;
  *epilog*) hook=epilog ;;
  *) case "${SLURM_SCRIPT_CONTEXT:-}" in
       prolog_slurmd) hook=prolog ;;
       epilog_slurmd) hook=epilog ;;
       *) hook= ;;
     esac ;;
esac
node=${SLURMD_NODENAME:-}
if [ -z "$node" ]; then
  node=$(uname -n 2>/dev/null)
  node=${node%%.*}
fi
what="slurm ${hook:-hook} job=${SLURM_JOB_ID:-?} node=${node:-?}"

one_line() {  # $1 -> one line, no control characters, at most $2 characters
  printf '%s' "$1" | tr '\n\r\t' '   ' | tr -d '\000-\037\177' | tr -s ' ' | cut -c "1-$2"
}

say() {  # $1: syslog priority (daemon.$1), $2: the line (made one line: no forged log lines)
  line=$(one_line "$2" 2000)
  if command -v logger >/dev/null 2>&1; then
    logger -t gpucheck -p "daemon.$1" -- "$line" 2>/dev/null
  fi
  printf 'gpucheck: %s\n' "$line" >&2
}

config_on_error() {  # on_error of the config file's run table: fail, pass or nothing
  # The spellings gpucheck reads (gpucheck.core.config.scan_on_error): [run] or ["run"] / ['run'] then
  # on_error = ..., a top-level run.on_error = ..., an inline run = { ..., on_error = ... }, keys
  # bare or quoted; a leading UTF-8 byte order mark is dropped. "fail" anywhere wins.
  config=${opt_config:-/etc/gpucheck/config.toml}
  if [ -f "$config" ] && [ -r "$config" ]; then
    LC_ALL=C awk -v bom="$(printf '\357\273\277')" '
      function value(s) {  # the text after a key: fail, pass or nothing
        sub(/^[ \t]*=[ \t]*/, "", s)
        if (s ~ /^("fail"|\047fail\047|fail)([ \t,}#]|$)/) return "fail"
        if (s ~ /^("pass"|\047pass\047|pass)([ \t,}#]|$)/) return "pass"
        return ""
      }
      function note(v) { if (v == "fail") f = 1; else if (v == "pass") p = 1 }
      BEGIN {
        q = "\047"
        run = "(run|\"run\"|" q "run" q ")"
        key = "(on_error|\"on_error\"|" q "on_error" q ")"
        header = "^[ \t]*\\[[ \t]*" run "[ \t]*\\][ \t]*(#.*)?$"
      }
      NR == 1 && substr($0, 1, 3) == bom { $0 = substr($0, 4) }
      /^[ \t]*\[/ { in_run = ($0 ~ header); in_table = 1; next }
      in_run && match($0, "^[ \t]*" key "[ \t]*=") { note(value(substr($0, RSTART + RLENGTH - 1))); next }
      !in_table && match($0, "^[ \t]*" run "[ \t]*\\.[ \t]*" key "[ \t]*=") {
        note(value(substr($0, RSTART + RLENGTH - 1))); next
      }
      !in_table && match($0, "^[ \t]*" run "[ \t]*=[ \t]*\\{") {
        s = substr($0, RSTART + RLENGTH - 1)
        if (match(s, "[{,][ \t]*" key "[ \t]*=")) note(value(substr(s, RSTART + RLENGTH - 1)))
      }
      END { if (f) print "fail"; else if (p) print "pass" }' "$config" 2>/dev/null
  fi
}

on_error_setting() {
  case "${opt_on_error:-}" in pass|fail) printf '%s' "$opt_on_error"; return ;; esac
  case "${GPUCHECK_ON_ERROR:-}" in pass|fail) printf '%s' "$GPUCHECK_ON_ERROR"; return ;; esac
  from_config=$(config_on_error)
  case "$from_config" in pass|fail) printf '%s' "$from_config"; return ;; esac
  printf pass
}

drain_node() {  # $1: the cause; prints what was done
  case "$node" in
    ''|[!A-Za-z0-9]*|*[!A-Za-z0-9._-]*)
      printf "not drained ('%s' is not a single node name)" "$(one_line "$node" 80)"; return ;;
  esac
  scontrol=${opt_scontrol:-$(command -v scontrol 2>/dev/null)}
  if [ -z "$scontrol" ]; then
    printf 'not drained (scontrol not found on PATH=%s)' "$PATH"; return
  fi
  # NHC-style, as gpucheck's own (gpucheck.core.reason): printable ASCII, at most 60 characters
  # (`sinfo -R` shows few); the whole cause is in the log line
  reason=$(printf '%s' "gpucheck: $1" | tr '\n\r\t' '   ' | LC_ALL=C tr -cd ' -~' | tr -s ' ' | cut -c 1-60)
  if command -v timeout >/dev/null 2>&1; then
    out=$(timeout 30 "$scontrol" update "NodeName=$node" State=DRAIN "Reason=$reason" 2>&1)
  else
    out=$("$scontrol" update "NodeName=$node" State=DRAIN "Reason=$reason" 2>&1)
  fi
  status=$?
  if [ "$status" -eq 0 ]; then
    printf drained
  else
    printf 'not drained (scontrol exit %s: %s)' "$status" "$(one_line "$out" 160)"
  fi
}

could_not_judge() {  # $1: why (gpucheck itself failed): log, then on-error; exits
  on_error=$(on_error_setting)
  if [ "$on_error" = fail ]; then
    if [ -n "${opt_no_drain:-}" ]; then
      action="not drained (--no-drain)"
    else
      action=$(drain_node "could not judge: ${1%%: *}")  # the cause's head; its detail is in the log line
    fi
    say err "$what: could not judge: $1 -> $action (on-error fail), exit 1"
    exit 1
  fi
  # "by the wrapper": gpucheck may have drained the node before something it cannot hold
  # (SIGKILL, the OOM killer) ended it; it holds SIGTERM/SIGINT until it has drained and logged.
  say warning "$what: could not judge: $1 -> not drained by the wrapper (on-error pass), exit 0"
  exit 0
}

exit_meaning() {
  case "$1" in
    1) printf 'crashed' ;;
    2) printf 'usage error' ;;
    3) printf 'could not judge' ;;
    120) printf 'could not write its output' ;;
    126) printf 'cannot be executed' ;;
    127) printf 'not found' ;;
    *) if [ "$1" -gt 128 ] 2>/dev/null; then
         printf 'killed by signal %s' "$(kill -l "$(($1 - 128))" 2>/dev/null || echo "$(($1 - 128))")"
       else
         printf 'not an outcome of a gpucheck hook'
       fi ;;
  esac
}

# -- Slurm's PrologEpilogTimeout ------------------------------------------------------------
prolog_epilog_timeout() {  # prints Slurm's PrologEpilogTimeout in seconds, or nothing (none, unknown)
  value=${GPUCHECK_PROLOG_EPILOG_TIMEOUT:-}
  if [ -z "$value" ]; then
    scontrol=${opt_scontrol:-$(command -v scontrol 2>/dev/null)}
    [ -n "$scontrol" ] || return 0
    if command -v timeout >/dev/null 2>&1; then
      config=$(timeout 5 "$scontrol" show config 2>/dev/null)
    else
      config=$("$scontrol" show config 2>/dev/null)
    fi
    value=$(printf '%s\n' "$config" | awk '$1 == "PrologEpilogTimeout" && $2 == "=" { print $3; exit }')
  fi
  # 65534 and above: Slurm's "not set" (NO_VAL16) and "unlimited"
  case "$value" in ''|*[!0-9]*) return 0 ;; esac
  if [ "${#value}" -le 5 ] && [ "$value" -gt 0 ] && [ "$value" -lt 65534 ]; then printf '%s' "$value"; fi
}

# shellcheck disable=SC2317  # run in the background below
watchdog() {  # $1: gpucheck's pid; SIGTERM at $stop_at, SIGKILL at $kill_at (epochs)
  nap=
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  for when_sig in "$stop_at TERM" "$kill_at KILL"; do
    left=$(( ${when_sig% *} - $(date +%s) ))
    if [ "$left" -gt 0 ]; then
      sleep "$left" & nap=$!
      wait "$nap"
    fi
    kill "-${when_sig#* }" "$1" 2>/dev/null || exit 0
  done
}

# -- settings ------------------------------------------------------------------------------
unsafe_entry() {  # $1: a path with no link on it, $2: file or folder; prints why it is unsafe
  path=$1 want=$2
  # shellcheck disable=SC2046  # owner, octal mode, type: words on purpose
  set -- $(stat -c '%u %a %F' -- "$path" 2>/dev/null)
  if [ $# -lt 3 ]; then printf '%s: cannot stat it' "$path"; return; fi
  case "$want:$3" in
    file:regular) ;;
    folder:directory) ;;
    file:*) printf '%s is not a regular file' "$path"; return ;;
    *) printf '%s is not a folder' "$path"; return ;;
  esac
  if [ "$1" != 0 ] && [ "$1" != "$me" ]; then printf '%s is owned by uid %s, not root' "$path" "$1"; return; fi
  w=$(( 0$2 & 022 ))
  sticky=$(( 0$2 & 01000 ))
  if [ "$w" != 0 ] && { [ "$want" = file ] || [ "$sticky" = 0 ]; }; then
    printf '%s is writable by group or others (mode %s)' "$path" "$2"
  fi
}

unsafe_path() {  # $1: a real path (no link on it), $2: file or folder; checks it and every folder up to /
  p=$1 want=$2
  while :; do
    why=$(unsafe_entry "$p" "$want")
    if [ -n "$why" ]; then printf '%s' "$why"; return; fi
    [ "$p" != / ] || return
    p=$(dirname -- "$p") want=folder
  done
}

unsafe_to_source() {  # $1: a settings file, $2: its real path; prints why root must not source it
  me=$(id -u)
  case "$2" in
    /*) ;;
    *) printf 'cannot resolve the links on its path'; return ;;
  esac
  # The folder that holds the name (a link may stand there: whoever can write this folder can
  # point it elsewhere), then the file itself and every folder on its real path: if only root
  # can change any of them, the file read below is the file checked here.
  link_folder=$(readlink -f -- "$(dirname -- "$1")" 2>/dev/null)
  case "$link_folder" in
    /*) why=$(unsafe_path "$link_folder" folder) ;;
    *) why="$(dirname -- "$1"): cannot resolve the links on its path" ;;
  esac
  if [ -z "$why" ]; then why=$(unsafe_path "$2" file); fi
  printf '%s' "$why"
}

# A settings file that the shell cannot read would stop this script with a non-zero exit, and
# Slurm would drain the node: check it first (syntax, then a trial in a subshell). It is shell
# code run as root: one that another user could have written or replaced is never sourced. The
# name is resolved once (readlink -f); the real file must be owned by root (or the user running
# this script) and writable by its owner only, and so must every folder on its real path and on
# the real path of the folder that holds the name (a folder writable by others only when it is
# sticky, like /tmp). Every read below (sh -n, the trial, the source) reads that real path, which
# nobody but root can change meanwhile.
settings_error=
case "$0" in */*) dir=${0%/*} ;; *) dir=. ;; esac
for f in "$dir/gpucheck-slurm.env" /etc/gpucheck/slurm.env; do
  if [ -f "$f" ] && [ -r "$f" ]; then
    real=$(readlink -f -- "$f" 2>/dev/null)
    unsafe=$(unsafe_to_source "$f" "$real")
    # shellcheck source=/dev/null  # the site's settings
    if [ -n "$unsafe" ]; then
      settings_error="$f: not sourced: $unsafe"
    elif ! syntax=$(/bin/sh -n "$real" 2>&1); then
      settings_error="$f: not valid shell: $(one_line "$syntax" 200)"
    elif [ "$( . "$real" </dev/null >/dev/null 2>&1; echo read)" != read ]; then
      settings_error="$f: reading it stops the shell (exit, or a failing special built-in)"
    else
      . "$real" </dev/null
    fi
    break
  fi
done
export PATH
if [ -n "${GPUCHECK_ON_ERROR:-}" ]; then export GPUCHECK_ON_ERROR; fi
set -f  # no file-name expansion from here on

# The command line, split on white space into "$@" (no unquoted expansion).
case "$hook" in
  prolog) hook_args=${GPUCHECK_PROLOG_ARGS:-} ;;
  epilog) hook_args=${GPUCHECK_EPILOG_ARGS:-} ;;
  *) hook_args= ;;
esac
rest="${GPUCHECK:-/usr/local/bin/gpucheck} slurm ${hook:-none} ${GPUCHECK_ARGS:-} $hook_args"
set --
while :; do
  rest=${rest#"${rest%%[![:space:]]*}"}
  [ -n "$rest" ] || break
  word=${rest%%[[:space:]]*}
  rest=${rest#"$word"}
  set -- "$@" "$word"
done
# What this script needs from the arguments when gpucheck cannot tell it.
opt_on_error='' opt_config='' opt_scontrol='' opt_no_drain='' prev=''
for arg in "$@"; do
  case "$prev" in
    --on-error) opt_on_error=$arg ;;
    --config) opt_config=$arg ;;
    --scontrol) opt_scontrol=$arg ;;
  esac
  case "$arg" in
    --on-error=*) opt_on_error=${arg#*=} ;;
    --config=*) opt_config=${arg#*=} ;;
    --scontrol=*) opt_scontrol=${arg#*=} ;;
    --no-drain) opt_no_drain=1 ;;
  esac
  prev=$arg
done

if [ -n "$settings_error" ]; then
  could_not_judge "$settings_error"
fi
if [ -z "$hook" ]; then
  could_not_judge "cannot tell prolog from epilog (install this script as gpucheck-prolog.sh / gpucheck-epilog.sh)"
fi

# The time gpucheck has: a second of slack for this script's start (the clock is read in whole
# seconds) and end, a margin (a tenth of the timeout, 2 to 30 s) for gpucheck to stop and log.
timeout_s=$(prolog_epilog_timeout)
stop_at='' kill_at=''
if [ -n "$timeout_s" ] && [ -n "$hook_started" ]; then
  margin=$(( timeout_s / 10 ))
  if [ "$margin" -lt 2 ]; then margin=2; elif [ "$margin" -gt 30 ]; then margin=30; fi
  stop_at=$(( hook_started + timeout_s - 1 - margin ))
  kill_at=$(( hook_started + timeout_s - 1 ))
  GPUCHECK_HOOK_DEADLINE=$stop_at GPUCHECK_PROLOG_EPILOG_TIMEOUT=$timeout_s
  export GPUCHECK_HOOK_DEADLINE GPUCHECK_PROLOG_EPILOG_TIMEOUT
  if [ "$stop_at" -le "$(date +%s)" ]; then
    could_not_judge "Slurm's PrologEpilogTimeout=${timeout_s}s leaves gpucheck no time (it must end by $margin s before it, as Slurm kills a hook past it with SIGKILL and drains the node)"
  fi
fi
if [ -n "$hook_signal" ]; then
  could_not_judge "SIG$hook_signal before gpucheck started: not started"
fi

# -- run gpucheck as a child -----------------------------------------------------------------
# Its stderr is kept (a file in memory-backed /dev/shm where there is one, so that a full disk
# does not take it) to name the cause in the log when gpucheck itself fails.
errfile=
for d in /dev/shm "${TMPDIR:-/tmp}"; do
  if [ -d "$d" ] && [ -w "$d" ]; then
    errfile=$(mktemp "$d/gpucheck-hook.XXXXXX" 2>/dev/null) && break
    errfile=
  fi
done

child=''
# shellcheck disable=SC2317  # run by the trap below
forward() {  # an asynchronous child of a non-interactive shell ignores SIGINT: send SIGTERM
  hook_signal=${hook_signal:-$1}
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi
}
trap 'forward TERM' TERM
trap 'forward INT' INT
if [ -n "$errfile" ]; then
  "$@" 2>"$errfile" &
else
  "$@" &
fi
child=$!
if [ -n "$hook_signal" ]; then kill -TERM "$child" 2>/dev/null; fi  # came while it was being started
watcher=
if [ -n "$stop_at" ]; then
  watchdog "$child" </dev/null >/dev/null 2>&1 &
  watcher=$!
fi
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break  # still there: the wait was cut short by a signal
done
trap '' TERM INT  # gpucheck has stopped: finish the log line (Slurm's SIGKILL still ends this)
late=
if [ -n "$watcher" ]; then
  kill "$watcher" 2>/dev/null
  if [ "$(date +%s)" -ge "$stop_at" ]; then
    late=" at Slurm's PrologEpilogTimeout=${timeout_s}s less $margin s (stopped by this script: past it Slurm kills with SIGKILL and drains)"
  fi
fi

tail=
if [ -n "$errfile" ]; then
  cat "$errfile" >&2 2>/dev/null
  tail=$(tail -n 4 "$errfile" 2>/dev/null | awk 'NF { sub(/^[ \t]+/, ""); printf "%s%s", sep, $0; sep = " | " }')
  tail=$(one_line "$tail" 400)
  rm -f "$errfile"
fi
case "$rc" in
  0) exit 0 ;;
  "$HOOK_UNHEALTHY") exit 1 ;;
esac
could_not_judge "gpucheck exited $rc ($(exit_meaning "$rc"))$late${tail:+: $tail}"
