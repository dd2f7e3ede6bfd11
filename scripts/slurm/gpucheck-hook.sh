#!/bin/sh
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
# assignments). It must be owned by root and writable by root only, in a folder only root can
# write: a file another user could have written is never sourced. It may set:
#   GPUCHECK             how to start gpucheck (default /usr/local/bin/gpucheck); may be
#                        several words, e.g. "/opt/gpucheck/bin/python3 -m gpucheck"
#   GPUCHECK_ARGS        arguments for both hooks (e.g. --state-dir /var/lib/gpucheck)
#   GPUCHECK_PROLOG_ARGS arguments for the prolog only (e.g. --budget 20s)
#   GPUCHECK_EPILOG_ARGS arguments for the epilog only (e.g. --failed-level 2)
#   GPUCHECK_ON_ERROR    pass or fail: what to do when gpucheck cannot judge the node
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
# killed by a signal) is gpucheck's own failure, never a verdict: it is logged with gpucheck's
# exit code and the end of its stderr, then follows on-error. on-error is the first of:
# --on-error in the arguments, GPUCHECK_ON_ERROR, `on_error = "pass"|"fail"` in the [run]
# table of the config file (--config in the arguments, else /etc/gpucheck/config.toml), pass.
#
# gpucheck runs as a child of this script (never exec'd): SIGTERM and SIGINT (Slurm's
# PrologEpilogTimeout) are forwarded to it as SIGTERM, and this script waits for it to stop.

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/slurm/bin
export PATH
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

config_on_error() {  # on_error in the [run] table of the config file: fail, pass or nothing
  config=${opt_config:-/etc/gpucheck/config.toml}
  if [ -f "$config" ] && [ -r "$config" ]; then
    awk '
      /^[ \t]*\[/ { in_run = ($0 ~ /^[ \t]*\[[ \t]*run[ \t]*\][ \t]*(#.*)?$/); in_table = 1; next }
      (in_run && /^[ \t]*on_error[ \t]*=/) || (!in_table && /^[ \t]*run[ \t]*\.[ \t]*on_error[ \t]*=/) {
        v = $0; sub(/^[^=]*=[ \t]*/, "", v); sub(/[ \t]*(#.*)?$/, "", v); gsub(/["\047]/, "", v)
        if (v == "fail") f = 1; else if (v == "pass") p = 1
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
    printf 'not drained (no scontrol)'; return
  fi
  reason=$(one_line "gpucheck: $1" 200)
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
      action=$(drain_node "could not judge: $1")
    fi
    say err "$what: could not judge: $1 -> $action (on-error fail), exit 1"
    exit 1
  fi
  say warning "$what: could not judge: $1 -> not drained (on-error pass), exit 0"
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

# -- settings ------------------------------------------------------------------------------
unsafe_to_source() {  # $1: a settings file; prints why root must not source it (nothing: safe)
  me=$(id -u)
  file=$1
  for p in "$file" "$(dirname -- "$file")"; do  # the file (a link: the link, then its target) and its folder
    for how in -c -Lc; do
      # shellcheck disable=SC2046  # owner, octal mode, type: three words on purpose
      set -- $(stat "$how" '%u %a %F' -- "$p" 2>/dev/null)
      if [ $# -lt 3 ]; then printf '%s: cannot stat it' "$p"; return; fi
      case "$3" in symbolic*) continue ;; esac  # the link itself: judged by its target below
      if [ "$1" != 0 ] && [ "$1" != "$me" ]; then printf '%s is owned by uid %s, not root' "$p" "$1"; return; fi
      w=$(( 0$2 & 022 ))
      sticky=$(( 0$2 & 01000 ))
      if [ "$w" != 0 ] && { [ "$p" = "$file" ] || [ "$sticky" = 0 ]; }; then
        printf '%s is writable by group or others (mode %s)' "$p" "$2"; return
      fi
    done
  done
}

# A settings file that the shell cannot read would stop this script with a non-zero exit, and
# Slurm would drain the node: check it first (syntax, then a trial in a subshell). It is shell
# code run as root: one that another user could have written or replaced (not owned by root, or
# writable by group or others, or in such a folder) is never sourced.
settings_error=
case "$0" in */*) dir=${0%/*} ;; *) dir=. ;; esac
for f in "$dir/gpucheck-slurm.env" /etc/gpucheck/slurm.env; do
  if [ -f "$f" ] && [ -r "$f" ]; then
    unsafe=$(unsafe_to_source "$f")
    if [ -n "$unsafe" ]; then
      settings_error="$f: not sourced: $unsafe"
    elif ! syntax=$(/bin/sh -n "$f" 2>&1); then
      settings_error="$f: not valid shell: $(one_line "$syntax" 200)"
    elif [ "$( . "$f" </dev/null >/dev/null 2>&1; echo read)" != read ]; then
      settings_error="$f: reading it stops the shell (exit, or a failing special built-in)"
    else
      . "$f" </dev/null
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
opt_on_error= opt_config= opt_scontrol= opt_no_drain= prev=
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

child= pending=
forward() {  # an asynchronous child of a non-interactive shell ignores SIGINT: send SIGTERM
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; else pending=1; fi
}
trap forward TERM INT
if [ -n "$errfile" ]; then
  "$@" 2>"$errfile" &
else
  "$@" &
fi
child=$!
if [ -n "$pending" ]; then kill -TERM "$child" 2>/dev/null; fi
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break  # still there: the wait was cut short by a signal
done
trap '' TERM INT  # gpucheck has stopped: finish the log line (Slurm's SIGKILL still ends this)

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
could_not_judge "gpucheck exited $rc ($(exit_meaning "$rc"))${tail:+: $tail}"
