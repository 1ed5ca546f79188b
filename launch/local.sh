#!/usr/bin/env bash
# Runs ppl-jax as N local processes wired together by jax.distributed on a free localhost port.
#
#   launch/local.sh N [ppl-jax flags...]
#
# The environment passes through to every process, so each can be given fake CPU devices:
#   XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu launch/local.sh 2 \
#       --config.mesh.data=-1
# Process 0 prints the summary and writes results.json; the others print only errors.
# PYTHON selects the interpreter (default: python3). Exits non-zero if any process fails.
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: $0 NUM_PROCESSES [ppl-jax flags...]" >&2
  exit 2
fi
n=$1
shift
python=${PYTHON:-python3}
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

pids=()
for ((i = 0; i < n; i++)); do
  PPL_JAX_COORDINATOR="127.0.0.1:${port}" PPL_JAX_NUM_PROCESSES="$n" PPL_JAX_PROCESS_ID="$i" \
    "$python" -m ppl_jax "$@" &
  pids+=($!)
done

status=0
for pid in "${pids[@]}"; do
  if ! wait "$pid"; then
    status=1
  fi
done
if [[ $status -ne 0 ]]; then
  # One failed process leaves the others waiting on it: stop them.
  kill "${pids[@]}" 2>/dev/null || true
fi
exit $status
