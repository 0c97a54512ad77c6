#!/usr/bin/env bash
# Builds shardlm and runs the whole test suite (unit, integration, end to end) with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/build.sh
# Open MPI refuses to start as root unless told; CI and containers run as root. CTest runs two
# tests at a time, so MPI ranks share the cores: a waiting rank yields its core.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
ctest --test-dir build --output-on-failure -j2 --timeout 900
# Opt-in (CI sets it): the slurm/ scripts end to end on a one-node Slurm cluster started on this
# machine (root, Debian; slurm/ci/local_slurm.sh installs slurm-wlm and munge).
if [ "${SHARDLM_SLURM_TEST:-0}" = 1 ]; then
  SHARDLM_BIN=build/shardlm bash slurm/ci/local_slurm.sh
fi
