#!/bin/sh
# Slurm Prolog and Epilog wrapper for gpucheck (see docs/fleet.md). Install this one file twice:
#   install -m 755 scripts/slurm/gpucheck-hook.sh /etc/slurm/gpucheck-prolog.sh
#   install -m 755 scripts/slurm/gpucheck-hook.sh /etc/slurm/gpucheck-epilog.sh
# and in slurm.conf: Prolog=/etc/slurm/gpucheck-prolog.sh, Epilog=/etc/slurm/gpucheck-epilog.sh.
# The hook is the one its file name says (a name with "prolog" or "epilog"), else Slurm's
# SLURM_SCRIPT_CONTEXT (prolog_slurmd / epilog_slurmd). Slurm runs it as root with almost no
# environment and no PATH, so every program here is named by an absolute path or found through
# the PATH set below.
#
# Site settings: the first readable file of
#   <this script's folder>/gpucheck-slurm.env   /etc/gpucheck/slurm.env
# is sourced (shell syntax). It may set:
#   GPUCHECK             how to start gpucheck (default /usr/local/bin/gpucheck); may be
#                        several words, e.g. "/opt/gpucheck/bin/python3 -m gpucheck"
#   GPUCHECK_ARGS        arguments for both hooks (e.g. --state-dir /var/lib/gpucheck)
#   GPUCHECK_PROLOG_ARGS arguments for the prolog only (e.g. --budget 20s)
#   GPUCHECK_EPILOG_ARGS arguments for the epilog only (e.g. --failed-level 2)
#   GPUCHECK_ON_ERROR    pass (default) or fail: what to do when gpucheck cannot be started
# Arguments are split on white space; none of them may contain spaces.
#
# Exit status: gpucheck's (0 healthy or could not judge, 1 unhealthy: the node was drained
# with a "gpucheck: <cause>" reason and Slurm fails or requeues the job).

case "${0##*/}" in
  *prolog*) hook=prolog ;;
  *epilog*) hook=epilog ;;
  *) case "${SLURM_SCRIPT_CONTEXT:-}" in
       prolog_slurmd) hook=prolog ;;
       epilog_slurmd) hook=epilog ;;
       *) hook= ;;
     esac ;;
esac
dir=${0%/*}
for f in "$dir/gpucheck-slurm.env" /etc/gpucheck/slurm.env; do
  if [ -r "$f" ]; then
    . "$f"
    break
  fi
done
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
set -f  # no file-name expansion of the settings below

set -- ${GPUCHECK:-/usr/local/bin/gpucheck}
msg=
if [ -z "$hook" ]; then
  msg="job=${SLURM_JOB_ID:-?} node=${SLURMD_NODENAME:-?}: cannot tell prolog from epilog (install this script as gpucheck-prolog.sh / gpucheck-epilog.sh)"
elif [ ! -x "$1" ]; then
  msg="slurm $hook job=${SLURM_JOB_ID:-?} node=${SLURMD_NODENAME:-?}: cannot start gpucheck ($1 is not executable)"
fi
if [ -n "$msg" ]; then
  if [ -x /usr/bin/logger ]; then /usr/bin/logger -t gpucheck -p daemon.err "$msg"; fi
  echo "gpucheck: $msg" >&2
  if [ "${GPUCHECK_ON_ERROR:-pass}" = fail ]; then exit 1; fi
  exit 0
fi
# shellcheck disable=SC2086  # the argument variables are word lists on purpose
if [ "$hook" = prolog ]; then
  exec "$@" slurm prolog $GPUCHECK_ARGS $GPUCHECK_PROLOG_ARGS
fi
exec "$@" slurm epilog $GPUCHECK_ARGS $GPUCHECK_EPILOG_ARGS
