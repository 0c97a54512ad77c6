#!/usr/bin/env bash
# Submits one shardlm run (slurm/run.sbatch) sized for a node type. From the repository root:
#   slurm/submit.sh jobs/deepseek-v3-p5en-1node.ini          # 1 node: nodes = tp x pp x dp x replicas / 8
#   slurm/submit.sh --time 12:00:00 jobs/kimi-k2-p5en-4node.ini
#   slurm/submit.sh --profile local --nodes 1 jobs/tiny.ini  # the CPU test (2 ranks on one node)
#   SHARDLM_LAUNCHER=mpirun slurm/submit.sh jobs/deepseek-v3-p5en-2node.ini
# Options before the job file: --profile p5en|local (default p5en), --nodes N (default: from the job
# file's tp, pp, dp and replicas; else 1), --time T, --sbatch "ARGS" (more sbatch options). After the
# job file: `shardlm run` options. Prints the job id (sbatch --parsable). The log goes to
# $SHARDLM_LOG_DIR/<job name>-<job id>.log (default out/logs); results as slurm/run.sbatch says.
set -euo pipefail
cd "$(dirname "$0")/.."
source slurm/profile.sh

nodes="" time_limit="" more=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) SHARDLM_PROFILE=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --time) time_limit=$2; shift 2 ;;
    --sbatch) more=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
job=${1:?usage: slurm/submit.sh [--profile p5en|local] [--nodes N] [--time T] JOB.ini [shardlm run options]}
shift
profile_sbatch_args "$job" "$nodes"
[ -n "$time_limit" ] && sbatch_args+=(--time="$time_limit")
# shellcheck disable=SC2206
[ -n "$more" ] && sbatch_args+=($more)
logs=${SHARDLM_LOG_DIR:-out/logs}
mkdir -p "$logs"
sbatch --parsable --job-name="$(basename "$job" .ini)" --output="$logs/%x-%j.log" "${sbatch_args[@]}" \
  slurm/run.sbatch "$job" "$@"
