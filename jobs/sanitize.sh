#!/usr/bin/env bash
# Builds shardlm with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan/
# (RelWithDebInfo) and runs the whole CTest suite under them.
#   bash jobs/sanitize.sh            # configure, build, run every test
#   bash jobs/sanitize.sh -R tokenizer   # extra args go to ctest (e.g. a test filter)
# Any sanitizer report fails the test that triggered it (halt_on_error / abort_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/setup.sh
jobs="${SHARDLM_JOBS:-2}"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLM_SANITIZE=ON -DSHARDLM_TESTS=ON -DSHARDLM_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"

# Open MPI refuses to start as root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI (and its hwloc/pmix plugins) leak at exit on purpose; leak checking would fail every
# MPI test on memory that is not ours, so it is off. Every other ASan/UBSan finding is fatal.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 1800 "$@"
