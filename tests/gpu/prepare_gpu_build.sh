#!/usr/bin/env bash
# Prepares what tests/gpu/run_gpu_checks.sh needs on a GPU host that has the NVIDIA libraries but
# not the rest, as one compressed archive small enough to copy there:
#   build-gpu/   a CUDA build of shardlm and of the test executables with GPU tests (packed pruned
#                to the stripped binaries and CTest files: about 60 MB, most of it device code);
#   .device/     ../shared/device/stage.sh's Open MPI, HDF5 and other libraries for those binaries,
#                plus .device/shared/models/stories260K (../shared does not travel);
#   .device-pack/gpu.tar.gz   both of them, gzipped (binaries and libraries shrink to about 40%).
# Then, on the GPU host, in a copy of this tree holding .device-pack:
#   tar -xzf .device-pack/gpu.tar.gz && source .device/env.sh &&
#     SHARDLM_GPU_CHECKS_SECONDS=480 SHARDLM_GPU_BENCH_SECONDS=60 SHARDLM_GPU_LOG_ARCHIVE="$OUT/gpu-logs.tgz" \
#     tests/gpu/run_gpu_checks.sh build-gpu /tmp/gpulogs .device/shared
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=${1:-../shared}
targets=(shardlm test_cuda_model_kernels test_cuda_attention test_cuda_attention_backend test_moe_kernels test_sampling_kernels test_rows_matmul
         test_bf16_grouped_gemm
         test_cuda_backend_ops test_cuda_linear_parts test_cuda_activation_twins test_cuda_rope_kv_write test_cuda_expert_ffn test_cuda_wire_ops test_grouped_linear test_comm_staged test_comm_nccl_bootstrap test_cuda_backend)
# Not -march=native: the GPU host's CPU may lack this one's instructions (AVX-512, AMX), and the CPU
# references and backend run there too (their bits do not depend on it: -ffp-contract=off).
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSHARDLM_REQUIRE_CUDA=ON -DSHARDLM_NATIVE=OFF >/dev/null
cmake --build build-gpu -j"$(nproc)" --target "${targets[@]}"
# Only binaries, CMakeCache.txt and the CTest files are needed there: a pruned copy is packed, and
# build-gpu itself is kept whole, so that the next preparation rebuilds only what changed.
# CMakeFiles (objects, dependency files, compiler probes), static libraries and Makefiles stay behind.
pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
tar -cf - --exclude=CMakeFiles --exclude='*.a' --exclude=Makefile --exclude=cmake_install.cmake build-gpu |
  tar -xf - -C "$pack"
bins=("$pack/build-gpu/shardlm")
for t in "${targets[@]:1}"; do bins+=("$(find "$pack/build-gpu/tests" -type f -name "$t" -perm -u+x | head -1)"); done
# Other shardlm binaries to time beside this one (a baseline, a variant build):
# SHARDLM_GPU_EXTRA_BINS='NAME=PATH ...' packs each as build-gpu/extra/NAME, which
# tests/gpu/run_gpu_compare.sh times beside build-gpu/shardlm.
mkdir -p "$pack/build-gpu/extra"
for nb in ${SHARDLM_GPU_EXTRA_BINS:-}; do
  cp "${nb#*=}" "$pack/build-gpu/extra/${nb%%=*}" && bins+=("$pack/build-gpu/extra/${nb%%=*}")
done
# Symbol tables are not needed to run them (about 8% of their size).
strip --strip-unneeded "${bins[@]}"
bash "$shared/device/stage.sh" "${bins[@]}"
mkdir -p .device/shared/models
cp -r "$shared/models/stories260K" .device/shared/models/
mkdir -p .device-pack
tar -czf .device-pack/gpu.tar.gz -C "$pack" build-gpu -C "$PWD" .device
echo "build-gpu $(du -sh "$pack/build-gpu" | cut -f1), .device $(du -sh .device | cut -f1);" \
  "packed: .device-pack/gpu.tar.gz $(du -sh .device-pack/gpu.tar.gz | cut -f1)"
# The device machine takes at most 64 MiB of carried files in all.
size=$(stat -c %s .device-pack/gpu.tar.gz)
if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
  echo "prepare_gpu_build.sh: .device-pack/gpu.tar.gz is $((size / 1024 / 1024)) MiB, over the 60 MiB a device" \
    "run can carry: leave SHARDLM_GPU_EXTRA_BINS out or prune build-gpu" >&2
  exit 1
fi
