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
# The first process to fail stops the others (SIGTERM, then SIGKILL after GRACE_S seconds), and
# the script exits with that process's status. SIGTERM and SIGINT are passed on to every process.
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: $0 NUM_PROCESSES [ppl-jax flags...]" >&2
  exit 2
fi
n=$1
shift
python=${PYTHON:-python3}
grace_s=${GRACE_S:-5}
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

pids=()
signal_all() {
  for pid in "${pids[@]}"; do
    kill "-$1" "$pid" 2>/dev/null || true
  done
}

# Stops every process still running: SIGTERM, then SIGKILL for any left after the grace period.
stop_all() {
  signal_all TERM
  local deadline=$((SECONDS + grace_s))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
      sleep 0.1
    done
  done
  signal_all KILL
  wait 2>/dev/null || true
}

on_signal() { # $1: signal name, $2: its number
  trap - TERM INT
  stop_all
  exit $((128 + $2))
}
trap 'on_signal TERM 15' TERM
trap 'on_signal INT 2' INT

for ((i = 0; i < n; i++)); do
  PPL_JAX_COORDINATOR="127.0.0.1:${port}" PPL_JAX_NUM_PROCESSES="$n" PPL_JAX_PROCESS_ID="$i" \
    "$python" -m ppl_jax "$@" &
  pids+=($!)
done

# `wait -n` returns as soon as any process ends; a failure stops the others at once, instead of
# leaving them blocked in a collective with the process that is gone.
for ((left = n; left > 0; left--)); do
  status=0
  wait -n || status=$?
  if ((status != 0)); then
    stop_all
    exit "$status"
  fi
done
