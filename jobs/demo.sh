#!/usr/bin/env bash
# The main job on the embedded default: builds shardlm, makes the tiny random-weight Llama model,
# runs every prompt of inputs/prompts.jsonl through it under mpirun (NP ranks, default 2: each a
# replica claiming windows of 16 prompt lines as it has room; rank 0 writes), and writes out/demo.h5.
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p out
[ -f out/tiny-llama/model.safetensors ] ||
  build/shardlm make-model --config inputs/models/tiny-llama.json --out out/tiny-llama --dtype bf16 --seed 1
np=${NP:-2}
threads=$(( $(nproc) / np )); [ "$threads" -ge 1 ] || threads=1
mpirun -np "$np" build/shardlm run --config jobs/tiny.ini --threads "$threads" "$@"
# What the run did (read the rows with h5py: f["requests/output_tokens"][i], f["requests/output_text"][i]).
build/shardlm report out/demo.h5
