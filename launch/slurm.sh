#!/usr/bin/env bash
#SBATCH --job-name=ppl-jax
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --signal=TERM@120
#SBATCH --output=ppl-jax-%j.out
# Runs ppl-jax on the nodes of a SLURM allocation, wired together by jax.distributed.
#
#   sbatch [sbatch options] launch/slurm.sh [ppl-jax flags...]      # a batch job
#   salloc --nodes=2 --gpus-per-node=8                              # or, inside an allocation:
#   launch/slurm.sh [--dry-run] [ppl-jax flags...]
#
# Runs `srun` with one process per node, each driving all of its node's GPUs; with PER_GPU=1, one
# process per GPU (`--ntasks-per-node=GPUS --gpus-per-task=1`, each sees only its own GPU). Each
# process runs `env PPL_JAX_DISTRIBUTED=1 PPL_JAX_ALL_LOCAL_DEVICES=1 python3 -m ppl_jax FLAGS`:
# `jax.distributed.initialize()` reads SLURM's environment (SLURM_JOB_ID, SLURM_STEP_NODELIST,
# SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID; the coordinator is the step's first node), and
# PPL_JAX_ALL_LOCAL_DEVICES=1 stops JAX from restricting each process to GPU number
# SLURM_LOCALID. `--kill-on-bad-exit=1`: the first process to fail stops the others. The
# #SBATCH header (overridden by sbatch's own options) asks SLURM to send SIGTERM 120 s before
# the time limit: the run stops at one batch and the same command resumes from its journal.
# Process 0 prints the summary and writes output.dir on its node.
#
# Environment: PER_GPU=1 (one process per GPU), GPUS_PER_NODE (with PER_GPU=1; default
# SLURM_GPUS_ON_NODE, else the count in SLURM_GPUS_PER_NODE), PYTHON (default python3), WORKDIR
# (srun --chdir), DRY_RUN=1 (same as --dry-run: print the command, one line, and run nothing).
set -euo pipefail

usage() {
  echo "usage: $0 [--dry-run] [ppl-jax flags...]   (inside a SLURM allocation: sbatch or salloc)" >&2
  [[ -n "${1:-}" ]] && echo "$0: $1" >&2
  exit 2
}

dry_run=${DRY_RUN:-0}
if [[ "${1:-}" == "--dry-run" ]]; then
  dry_run=1
  shift
fi
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}
if [[ -z "${SLURM_JOB_ID:-}" || ! "$nodes" =~ ^[0-9]+$ ]]; then
  usage "not inside a SLURM allocation (SLURM_JOB_ID and SLURM_JOB_NUM_NODES are not set)"
fi
python=${PYTHON:-python3}

cmd=(srun "--nodes=$nodes")
if [[ "${PER_GPU:-0}" == 1 ]]; then
  gpus=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-}}}
  gpus=${gpus##*:} # SLURM_GPUS_PER_NODE may name the type: "a100:8"
  if [[ ! "$gpus" =~ ^[0-9]+$ || "$gpus" -lt 1 ]]; then
    usage "PER_GPU=1 needs the number of GPUs per node: set GPUS_PER_NODE"
  fi
  cmd+=("--ntasks=$((nodes * gpus))" "--ntasks-per-node=$gpus" --gpus-per-task=1)
else
  cmd+=("--ntasks=$nodes" --ntasks-per-node=1)
fi
cmd+=(--kill-on-bad-exit=1)
if [[ -n "${WORKDIR:-}" ]]; then
  cmd+=("--chdir=$WORKDIR")
fi
cmd+=(env PPL_JAX_DISTRIBUTED=1 PPL_JAX_ALL_LOCAL_DEVICES=1 "$python" -m ppl_jax "$@")

if [[ "$dry_run" == 1 ]]; then
  # Only a dry run quotes, and it runs from the repository (sbatch runs a copy of this script,
  # away from launch/common.sh).
  # shellcheck source=launch/common.sh
  . "$(dirname "${BASH_SOURCE[0]}")/common.sh"
  join_quoted "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
