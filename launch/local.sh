#!/usr/bin/env bash
# Runs ppl-jax as N local processes wired together by jax.distributed on a free localhost port.
#
#   launch/local.sh N [ppl-jax flags...]
#
# The environment passes through to every process, so each can be given fake CPU devices:
#   XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu launch/local.sh 2 \
#       --config.mesh.data=-1
# Process 0 prints the summary and writes results.json; the others print only errors.
# PYTHON selects the interpreter (default: python3).
#
# The first process to fail stops the others (SIGTERM, then SIGKILL after FAIL_GRACE_S seconds,
# default 5: they wait in a collective with the process that is gone), and the script exits with
# that process's status (one killed by a signal is named in one line). SIGTERM and SIGINT are
# passed on to every process, which then has GRACE_S seconds (default 30: the notice a
# preemptible cloud VM, Kubernetes' terminationGracePeriodSeconds and SLURM's KillWait give by
# default) to stop at its next batch, save its journal and print its sentence, even while it
# compiles its first batch; a second signal ends them at once (SIGKILL). Needs bash 5.1 or later
# (`wait -n -p`).
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: $0 NUM_PROCESSES [ppl-jax flags...]" >&2
  exit 2
fi
n=$1
shift
python=${PYTHON:-python3}
grace_s=${GRACE_S:-30}
fail_grace_s=${FAIL_GRACE_S:-5}
# Checked before anything starts: a bad value would otherwise stop bash's arithmetic in the middle
# of a stop (no journal). Base 10 for a leading zero, which bash's arithmetic reads as octal.
for name in GRACE_S FAIL_GRACE_S; do
  value=${!name:-}
  if [[ -n "$value" && ! "$value" =~ ^[0-9]{1,9}$ ]]; then
    echo "ppl-jax: error: $name is '$value', not a whole number of seconds from 0 to 999999999;" \
      "set it to one such as 30 (no sign or unit), or leave it unset." >&2
    exit 2
  fi
done
grace_s=$((10#$grace_s))
fail_grace_s=$((10#$fail_grace_s))
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

pids=()
signal_all() {
  for pid in "${pids[@]}"; do
    kill "-$1" "$pid" 2>/dev/null || true
  done
}

# Stops every process still running: SIGTERM, then SIGKILL for any left after $1 seconds.
stop_all() {
  signal_all TERM
  local deadline=$((SECONDS + $1))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
      sleep 0.1
    done
  done
  signal_all KILL
  wait 2>/dev/null || true
}

on_signal() { # $1: signal name, $2: its number
  trap "signal_all KILL; exit $((128 + $2))" TERM INT # a second signal: at once
  stop_all "$grace_s"
  exit $((128 + $2))
}
trap 'on_signal TERM 15' TERM
trap 'on_signal INT 2' INT

# The processes write to the real stderr (fd 3 here); this script's own stderr is closed to
# bash's job reports ("line 60: 1234 Killed ..."), which the one line below replaces.
exec 3>&2 2>/dev/null
for ((i = 0; i < n; i++)); do
  PPL_JAX_COORDINATOR="127.0.0.1:${port}" PPL_JAX_NUM_PROCESSES="$n" PPL_JAX_PROCESS_ID="$i" \
    "$python" -m ppl_jax "$@" 2>&3 3>&- &
  pids+=($!)
done

# `wait -n` returns as soon as any process ends; a failure stops the others at once, instead of
# leaving them blocked in a collective with the process that is gone. A process that failed
# printed its own error; one killed by a signal could not, so its loss is reported here.
for ((left = n; left > 0; left--)); do
  status=0
  ended=
  wait -n -p ended || status=$?
  if ((status != 0)); then
    # (SIGABRT: an abort reports itself, e.g. a lost peer, see ppl_jax/distributed.py.)
    if ((status > 128 && status != 134)); then
      who="a process"
      for i in "${!pids[@]}"; do
        [[ "${pids[$i]}" == "$ended" ]] && who="process $i of $n"
      done
      echo "ppl-jax: error: $who was killed by SIG$(kill -l $((status - 128))); the run is" \
        "stopped. Run the same command again to resume." >&3
    fi
    stop_all "$fail_grace_s"
    exit "$status"
  fi
done
