#!/usr/bin/env bash
# Runs ppl-jax on every worker of a Cloud TPU VM pod slice, one process per worker.
#
#   launch/tpu_pod.sh [--dry-run] NAME ZONE [ppl-jax flags...]
#   launch/tpu_pod.sh [--dry-run] NAME ZONE --install PIP_ARGS...   # pip install on every worker
#
# Runs `gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all --command=...`; on each worker
# the command is `env PPL_JAX_DISTRIBUTED=1 python3 -m ppl_jax FLAGS`, and ppl_jax's
# `jax.distributed.initialize()` finds the other workers itself (from the TPU VM's metadata).
# Every flag is quoted for the worker's shell, so spaces, quotes and globs arrive unchanged.
# Process 0 (worker 0) prints the summary and writes output.dir; the others print only errors.
# The checkpoint and the data must be on a filesystem mounted at the same path on every worker
# (gcsfuse, NFS, Filestore); gs:// paths are not read yet.
#
# Environment: PROJECT (gcloud --project), PYTHON (the interpreter on the workers, default
# python3), WORKDIR (the workers `cd` there first), DRY_RUN=1 (same as --dry-run: print the
# command, one line, and run nothing).
set -euo pipefail

usage() {
  echo "usage: $0 [--dry-run] NAME ZONE [ppl-jax flags...]" >&2
  echo "       $0 [--dry-run] NAME ZONE --install PIP_ARGS..." >&2
  exit 2
}

# quote and join_quoted: one word, or the words, for the shell (shared with slurm.sh).
# shellcheck source=launch/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

dry_run=${DRY_RUN:-0}
if [[ "${1:-}" == "--dry-run" ]]; then
  dry_run=1
  shift
fi
if [[ $# -lt 2 || -z "$1" || -z "$2" || "$1" == -* || "$2" == -* ]]; then
  usage
fi
name=$1
zone=$2
shift 2
python=${PYTHON:-python3}

if [[ "${1:-}" == "--install" ]]; then
  shift
  [[ $# -ge 1 ]] || usage
  remote=$(join_quoted "$python" -m pip install "$@")
else
  remote=$(join_quoted env PPL_JAX_DISTRIBUTED=1 "$python" -m ppl_jax "$@")
fi
if [[ -n "${WORKDIR:-}" ]]; then
  remote="cd $(quote "$WORKDIR") && $remote"
fi

cmd=(gcloud compute tpus tpu-vm ssh "$name" "--zone=$zone")
if [[ -n "${PROJECT:-}" ]]; then
  cmd+=("--project=$PROJECT")
fi
cmd+=(--worker=all "--command=$remote")

if [[ "$dry_run" == 1 ]]; then
  join_quoted "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
