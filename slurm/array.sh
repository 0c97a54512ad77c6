#!/usr/bin/env bash
# Bulk evaluation of a big prompt file as a Slurm job array, then one merged result file:
#   slurm/array.sh --shards 16 jobs/deepseek-v3-p5en-1node.ini /fsx/prompts/eval.jsonl
#   slurm/array.sh --shards 8 --max-parallel 4 --time 08:00:00 jobs/kimi-k2-p5en-2node.ini prompts.txt
# 1. split: slurm/split_prompts.py cuts PROMPTS into N shards of consecutive lines under
#    out/shards/<time>-<pid>/ ($SHARDLM_OUT_ROOT instead of out when set; here, on the submitting host: one streaming pass). Shards keep the
#    whole file's line numbers, so ids and sampling seeds are those of a single run.
# 2. array: one slurm/run.sbatch task per shard, sized like slurm/submit.sh (--profile, --nodes);
#    task i writes out/<array id>/task-<i>/results.h5 and, requeued, resumes it.
# 3. merge: slurm/merge.sbatch, submitted with --dependency=afterok:<array id> (it starts once every
#    task has succeeded), runs `shardlm merge out/<array id>/merged.h5 task-*/results.h5` and
#    `shardlm report`. A failed task leaves it pending forever (DependencyNeverSatisfied): rerun the
#    task (`scontrol requeue <array id>_<i>`; it resumes) or scancel the merge job.
# Prints "<array id> <merge id>". Extra arguments after PROMPTS go to `shardlm run`.
set -euo pipefail
cd "$(dirname "$0")/.."
source slurm/profile.sh

shards=4 nodes="" time_limit="" parallel="" more=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) SHARDLM_PROFILE=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --time) time_limit=$2; shift 2 ;;
    --max-parallel) parallel=$2; shift 2 ;;
    --sbatch) more=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "usage: slurm/array.sh [--profile P] [--shards N] [--nodes N] [--max-parallel M] [--time T] JOB.ini PROMPTS [shardlm run options]" >&2; exit 2; }
job=$1 prompts=$2
shift 2
# The prompt format: the run options' --format, else the job file's, else auto (by the name). The
# split reads the file in it; the shards are JSONL and run as such (SHARDLM_SHARD_FORMAT, which
# run.sbatch passes), so a --format given here does not go on to the tasks.
format=$(ini_get format "$job")
format=${format:-auto}
run_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --format) format=$2; shift 2 ;;
    --format=*) format=${1#--format=}; shift ;;
    *) run_args+=("$1"); shift ;;
  esac
done
shard_format=jsonl
[ "$format" = openai ] && shard_format=openai

shard_dir="${SHARDLM_OUT_ROOT:-out}/shards/$(date +%Y%m%d-%H%M%S)-$$"
n=$(python3 slurm/split_prompts.py "$prompts" "$shard_dir" "$shards" "$format")
profile_sbatch_args "$job" "$nodes"
[ -n "$time_limit" ] && sbatch_args+=(--time="$time_limit")
# shellcheck disable=SC2206
[ -n "$more" ] && sbatch_args+=($more)
logs=${SHARDLM_LOG_DIR:-out/logs}
mkdir -p "$logs"
name=$(basename "$job" .ini)
array=$(SHARDLM_SHARDS="$shard_dir" SHARDLM_SHARD_FORMAT="$shard_format" sbatch --parsable --job-name="$name" \
          --array="0-$((n - 1))${parallel:+%$parallel}" --output="$logs/%x-%A_%a.log" "${sbatch_args[@]}" \
          slurm/run.sbatch "$job" ${run_args[@]+"${run_args[@]}"})
array=${array%%;*}
# The merge gets the user's --sbatch options too (a partition, an account the cluster requires).
merge_args=()
# shellcheck disable=SC2206
[ -n "$more" ] && merge_args+=($more)
merge=$(sbatch --parsable --job-name="$name-merge" --output="$logs/%x-%j.log" --dependency="afterok:$array" \
          ${merge_args[@]+"${merge_args[@]}"} slurm/merge.sbatch "${SHARDLM_OUT_ROOT:-out}/$array" "$n") || {
  echo "[array] array job $array is queued, but its merge job could not be submitted" >&2
  exit 1
}
echo "[array] $n shard(s) of $prompts in $shard_dir; array job $array, merge job $merge -> ${SHARDLM_OUT_ROOT:-out}/$array/merged.h5" >&2
echo "$array $merge"
