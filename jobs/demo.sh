#!/usr/bin/env bash
# The main job on the embedded default: builds shardlm, makes the tiny random-weight Llama model,
# runs every prompt of inputs/prompts.jsonl through it under mpirun, and writes out/demo.h5.
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p out
[ -f out/tiny-llama/model.safetensors ] ||
  build/shardlm make-model --config inputs/models/tiny-llama.json --out out/tiny-llama --dtype bf16 --seed 1
mpirun -np "${NP:-1}" build/shardlm run --config jobs/tiny.ini "$@"
if command -v h5dump >/dev/null; then
  h5dump -d /requests/output_text out/demo.h5 | head -n 20
fi
