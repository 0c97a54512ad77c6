#!/usr/bin/env bash
# Configures and builds shardlm into build/ (Release) with all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
