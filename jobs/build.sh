#!/usr/bin/env bash
# Configures and builds shardlm into build/ (Release) with all cores. The CUDA backend is built
# when nvcc is found (PATH, $CUDACXX or /usr/local/cuda); SHARDLM_REQUIRE_CUDA=1 makes its absence
# an error (CI sets it: the CUDA sources must compile there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/setup.sh
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
extra=()
[ "${SHARDLM_REQUIRE_CUDA:-0}" = 1 ] && extra+=(-DSHARDLM_REQUIRE_CUDA=ON)
# (${a[@]+"${a[@]}"}: an empty array under set -u, for the bash 4.2 of Amazon Linux 2.)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${extra[@]+"${extra[@]}"} "$@" >/dev/null
cmake --build build -j"$(nproc)"
