# shellcheck shell=bash
# Node profiles for slurm/submit.sh and slurm/array.sh (sourced): the sbatch options of one run.
#   p5en   p5en.48xlarge: 8 H200 GPUs, 16 EFA interfaces, 192 vCPUs, 2 TiB; one rank per GPU, whole nodes
#   local  the CPU test cluster of slurm/ci/local_slurm.sh: SHARDLM_LOCAL_RANKS ranks (default 2) of one CPU each
SHARDLM_PROFILE=${SHARDLM_PROFILE:-p5en}

# ini_get KEY FILE: the value of "KEY = value" in an INI job file ("" when absent).
ini_get() {
  sed -n -E "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*([^#;]*[^#;[:space:]])?[[:space:]]*([#;].*)?$/\1/p" "$2" | tail -n 1
}

# profile_sbatch_args JOB.ini [NODES]: fills the array sbatch_args. Without NODES the node count
# comes from the job file's layout: tp x pp x dp x replicas ranks over the profile's ranks per node.
profile_sbatch_args() {
  local job=$1 nodes=${2:-} per_node
  case "$SHARDLM_PROFILE" in
    p5en)
      per_node=8
      sbatch_args=(--ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=24 --exclusive --mem=0) ;;
    local)
      per_node=${SHARDLM_LOCAL_RANKS:-2}
      sbatch_args=(--ntasks-per-node="$per_node" --cpus-per-task=1) ;;
    *)
      echo "unknown profile '$SHARDLM_PROFILE' (p5en | local)" >&2; return 2 ;;
  esac
  [ -f "$job" ] || { echo "no job file $job" >&2; return 2; }
  local tp pp dp replicas world
  tp=$(ini_get tp "$job"); pp=$(ini_get pp "$job"); dp=$(ini_get dp "$job"); replicas=$(ini_get replicas "$job")
  # The binary's rank count: replicas x pp x dp x tp (replicas 0 or absent: whatever the nodes hold).
  world=$(( ${tp:-1} * ${pp:-1} * ${dp:-1} * ${replicas:-0} ))
  if [ -z "$nodes" ]; then
    nodes=1
    [ "$world" -gt 0 ] && nodes=$(( (world + per_node - 1) / per_node ))
  fi
  if [ "$world" -gt 0 ] && [ "$world" -ne $(( nodes * per_node )) ]; then
    echo "warning: $job asks for tp ${tp:-1} x pp ${pp:-1} x dp ${dp:-1} x replicas $replicas = $world ranks, but $nodes node(s) x $per_node = $(( nodes * per_node ))" >&2
  fi
  sbatch_args+=(--nodes="$nodes")
  echo "[$SHARDLM_PROFILE] $job: $nodes node(s) x $per_node rank(s)" >&2
}
