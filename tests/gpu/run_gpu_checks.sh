#!/usr/bin/env bash
# Every check that needs a GPU, in one run, with a log: the CUDA kernels against their CPU
# references, the NCCL and staged-MPI communicator tests, --backend cuda end to end against the CPU
# backend (stories260K and the tiny dense, MoE and MLA models; 2 ranks sharing the GPU with
# --comm mpi and --comm fabric), and the GPU benchmarks (decode and prefill tok/s, cuBLAS GEMM TFLOP/s, sampling
# us/row, prefill attention on bf16 tensor cores and in fp32, linears on fp8 and bf16 weights, the fp8 model with its weights kept fp8 and dequantised,
# one DeepSeek-sized MoE layer's grouped expert GEMMs (fp8: the grouped W8A8 kernel against one
# cuBLASLt GEMM per expert, beside the fp8 peak; bf16: a graph's routed GEMMs on tensor cores
# against the direct kernel), beside the H200's 4.8 TB/s and
# 989 TFLOP/s, and bench-comm on device buffers).
#
#   tests/gpu/run_gpu_checks.sh BUILD_DIR LOG_DIR [SHARED_DIR]
#
# The parts run in order of what they prove: the kernels and --backend cuda against the CPU first,
# then the benchmarks. SHARDLM_GPU_CHECKS_SECONDS=N bounds the whole run to N seconds (a leased
# machine): a part is cut at the time left and the parts after it are listed as not run, so the log
# always ends with what was and was not checked. SHARDLM_GPU_BENCH_SECONDS=N cuts each benchmark at
# N seconds, so that one slow part leaves time for the rest. SHARDLM_GPU_SKIP='bench-mla|bench-comm.*'
# (an extended regex of part names) leaves those parts out, for a second run that finishes a cut
# first one. SHARDLM_GPU_CTEST_JOBS (default 4) kernel test processes share the GPU at once.
# SHARDLM_GPU_LOG_ARCHIVE=PATH packs the logs there after every part. On a leased machine (600 s a
# command): SHARDLM_GPU_CHECKS_SECONDS=480 SHARDLM_GPU_BENCH_SECONDS=60
# SHARDLM_GPU_LOG_ARCHIVE=$OUT/gpu-logs.tgz, LOG_DIR outside $OUT (only a few files come back).
#
# BUILD_DIR is a CUDA build (cmake -DSHARDLM_CUDA=ON, the default where nvcc is found). The tests
# carry the absolute paths of the tree they were built in; when this copy of the tree lives
# elsewhere (a GPU host the tree was copied to), the script links the build-time paths to it.
# SHARED_DIR (models/stories260K, tokenizers/) defaults to ../shared.
set -uo pipefail
build=${1:?usage: run_gpu_checks.sh BUILD_DIR LOG_DIR [SHARED_DIR]}
logs=${2:?usage: run_gpu_checks.sh BUILD_DIR LOG_DIR [SHARED_DIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${3:-$root/../shared}
mkdir -p "$logs"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# An Open MPI copied onto a host whose own PMIx plugins do not match it warns at every start that it
# found no compression library; the logs keep the rest.
export PMIX_MCA_pcompress_base_silence_warning=1

step() { echo "== $* ($(date +%T))" | tee -a "$logs/summary.log"; }

# The source tree, ../shared and mpiexec at the paths the build recorded.
src_then=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
if [ -n "$src_then" ] && [ "$src_then" != "$root" ] && [ ! -e "$src_then" ]; then
  mkdir -p "$(dirname "$src_then")" && ln -sfn "$root" "$src_then"
  echo "linked $src_then -> $root" | tee -a "$logs/summary.log"
fi
shared_then=$(cd "$src_then/.." 2>/dev/null && pwd)/shared
if [ -d "$shared" ] && [ ! -e "$shared_then" ]; then
  ln -sfn "$(cd "$shared" && pwd)" "$shared_then" && echo "linked $shared_then -> $shared" | tee -a "$logs/summary.log"
fi
mpiexec_then=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")
if [ -n "$mpiexec_then" ] && [ ! -x "$mpiexec_then" ] && command -v mpiexec >/dev/null; then
  ln -sfn "$(command -v mpiexec)" "$mpiexec_then"
fi

step "machine"
{ nvidia-smi; nvcc --version 2>/dev/null; "$build/shardlm" --version; } >"$logs/machine.log" 2>&1
head -20 "$logs/machine.log" | tee -a "$logs/summary.log"

status=0
budget=${SHARDLM_GPU_CHECKS_SECONDS:-0}
started=$SECONDS
jobs=${SHARDLM_GPU_CTEST_JOBS:-4}
cap=0  # seconds for one part; the benchmarks set it
run() {  # name, command...
  local name=$1; shift
  if [ -n "${SHARDLM_GPU_SKIP:-}" ] && [[ $name =~ ^(${SHARDLM_GPU_SKIP})$ ]]; then
    echo "== $name: left out (SHARDLM_GPU_SKIP)" | tee -a "$logs/summary.log"; return
  fi
  local limit=() left=0
  if [ "$budget" -gt 0 ]; then
    left=$((budget - (SECONDS - started)))
    if [ "$left" -lt 15 ]; then
      echo "== $name: not run (the ${budget} s budget is spent)" | tee -a "$logs/summary.log"; status=1; return
    fi
  fi
  if [ "$cap" -gt 0 ] && { [ "$left" = 0 ] || [ "$cap" -lt "$left" ]; }; then left=$cap; fi
  [ "$left" -gt 0 ] && limit=(timeout -k 5 "$left")
  step "$name"
  local rc=0
  ${limit[@]+"${limit[@]}"} "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    echo "   ok ($((SECONDS - started)) s in)" | tee -a "$logs/summary.log"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "   CUT after ${left} s, see $name.log" | tee -a "$logs/summary.log"; status=1
  else
    echo "   FAILED (exit $rc), see $name.log" | tee -a "$logs/summary.log"; status=1
  fi
  grep -E "PASSED|FAILED|SKIPPED|Skipped|tests passed|tok/s|TFLOP/s|GB/s|GFLOP/s|us/row|ran as" "$logs/$name.log" | tail -25 >>"$logs/summary.log"
  archive
}
# SHARDLM_GPU_LOG_ARCHIVE=PATH (e.g. $OUT/gpu-logs.tgz): every log packed there after each part,
# so a run cut from outside still brings back what it did.
archive() {
  [ -n "${SHARDLM_GPU_LOG_ARCHIVE:-}" ] && tar -czf "$SHARDLM_GPU_LOG_ARCHIVE" -C "$logs" . 2>/dev/null
  return 0
}

# No GPU visible (a driver or library path problem): every GPU test would skip and read as passed.
gpus=$(nvidia-smi -L 2>/dev/null) || true
if [[ $gpus != GPU* ]]; then
  echo "== no GPU visible (nvidia-smi -L lists none): nothing here can be checked" | tee -a "$logs/summary.log"
  archive
  exit 1
fi

# 1. Kernels against CPU references; NCCL and staged-MPI communicators on device buffers. (Not the
#    Emulated.* copies, nor the bench-comm logic whose names say NCCL: they run on the CPU,
#    everywhere, and a pruned build-gpu has no binaries for them.)
run kernels ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 300 -R "${SHARDLM_GPU_TESTS:-Cuda|Nccl|nccl|Staged|staged}" -E "CudaBackend\.|^Emulated\.|^BenchComm"
# 2. --backend cuda against the CPU backend, 1 and 2 ranks on the GPU; one test at a time, since each
#    run's KV cache takes a share of the memory free when it starts.
run e2e ctest --test-dir "$build" --output-on-failure --timeout 300 -R "^CudaBackend\."
# 3. Benchmarks: bench-1024 (254M parameters, bf16) on the GPU.
cap=${SHARDLM_GPU_BENCH_SECONDS:-0}
model="${TMPDIR:-/tmp}/shardlm-bench-model"
run make-model "$build/shardlm" make-model --config "$root/inputs/models/bench-1024.json" --out "$model" --dtype bf16 \
  --seed 1
#    --op-profile: where a prefill and a decode step's device time goes, op group by op group.
run bench "$build/shardlm" bench --model "$model" --backend cuda --prompt-len 2048 --decode-tokens 256 \
  --batch 256 --batch-in 512 --batch-out 128 --cuda-graphs --op-profile
# 4. One MoE layer of DeepSeek-V3's size as one rank of EP 8 holds it (hidden 7168, 32 routed
#    experts of intermediate 2048, top 8 of the 256-expert routing scaled to 32: 8 groups, 4
#    kept, one shared expert): route, expert GEMMs (grouped; and the same from device offsets, as a
#    graph step runs them) and combine per token count, beside the peak and the HBM bandwidth.
#    First with its experts in fp8 (128 x 128 blocks) kept fp8, as DeepSeek-V3 ships them: groups
#    past 16 rows as W8A8 GEMMs in one grouped launch (the default), one cuBLASLt GEMM per expert,
#    then dequantised to bf16; the expert GEMMs line of the first two is the grouped kernel's
#    before/after.
for form in w8a8 w8a8-per-expert bf16; do
  extra=(--fp8-prefill "${form%-per-expert}")
  [ "$form" = w8a8-per-expert ] && extra+=(--fp8-expert-gemm per-expert)
  run "bench-moe-fp8-$form" "$build/shardlm" bench-moe --backend cuda --dtype fp8 "${extra[@]}" --hidden 7168 \
    --experts 32 --inter 2048 --top-k 8 --groups 8 --topk-groups 4 --shared 1 --tokens 16,128,1024,4096 --iters 10 \
    --warmup 2
done
#    The same layer in bf16; its routed GEMMs (a CUDA graph's) past 16 rows an expert in one grouped
#    GEMM on bf16 tensor cores, then through the direct kernel (--routed-gemm direct): the "routed
#    GEMMs" lines of the two are that kernel's before/after.
run bench-moe "$build/shardlm" bench-moe --backend cuda --hidden 7168 --experts 32 --inter 2048 --top-k 8 \
  --groups 8 --topk-groups 4 --shared 1 --tokens 16,128,1024,4096 --iters 10 --warmup 2
run bench-moe-routed-direct "$build/shardlm" bench-moe --backend cuda --hidden 7168 --experts 32 --inter 2048 \
  --top-k 8 --groups 8 --topk-groups 4 --shared 1 --tokens 128,1024 --iters 5 --warmup 1 --routed-gemm direct
#    The bf16 and fp8 wires' packing of a captured ep 8 dispatch (DeepSeek-V3 width and routing) on
#    one GPU: the "wire" line against the measured HBM copy bandwidth.
for wire in bf16 fp8; do
  run bench-moe-wire-$wire "$build/shardlm" bench-moe --backend cuda --hidden 7168 --experts 64 --inter 256 \
    --top-k 8 --groups 8 --topk-groups 4 --shared 0 --tokens 128,1024 --iters 10 --warmup 2 --ep-wire $wire
done
# 5. Prefill again with its attention in fp32 (--prefill-attention fp32: the CUDA-core kernels)
#    beside step 3's bf16 tensor cores (auto on a bf16 checkpoint): the prefill tok/s of the two.
#    (Step 3's "attention prefill" lines time both kernels on the attention alone.)
run bench-prefill-attention-fp32 "$build/shardlm" bench --model "$model" --backend cuda --prompt-len 2048 \
  --decode-tokens 2 --batch 1 --batch-in 16 --batch-out 2 --attention-context 0 --peak-gemm 0 --prefill-attention fp32
# 6. DeepSeek-V3's attention geometry (MLA: kv_lora 512, rope 64; 16 heads, a tp-8 shard of its
#    128) on 2 layers, bf16: prefill with its attention on bf16 tensor cores (auto), and the MLA
#    op alone up to 4096 positions (prefill chunks and, with --decode-attention bf16, decode tokens
#    on tensor cores, each beside the fp32 kernel); then prefill with --prefill-attention fp32;
#    then decode and batched tok/s with decode attention on tensor cores and in fp32.
modelmla="${TMPDIR:-/tmp}/shardlm-bench-mla-model"
run make-model-mla "$build/shardlm" make-model --config "$root/inputs/models/bench-mla-512.json" --out "$modelmla" \
  --dtype bf16 --seed 1
run bench-mla "$build/shardlm" bench --model "$modelmla" --backend cuda --prompt-len 4096 --decode-tokens 2 \
  --batch 1 --batch-in 16 --batch-out 2 --attention-context 4096 --peak-gemm 0 --decode-attention bf16
run bench-mla-prefill-attention-fp32 "$build/shardlm" bench --model "$modelmla" --backend cuda --prompt-len 4096 \
  --decode-tokens 2 --batch 1 --batch-in 16 --batch-out 2 --attention-context 0 --peak-gemm 0 --prefill-attention fp32
for decode in bf16 fp32; do
  run "bench-mla-decode-attention-$decode" "$build/shardlm" bench --model "$modelmla" --backend cuda \
    --prompt-len 4096 --decode-tokens 64 --batch 64 --batch-in 2048 --batch-out 32 --attention-context 0 --peak-gemm 0 \
    --decode-attention $decode --cuda-graphs
done
# 7. The same model in fp8 (128 x 128 block scales): its linear weights kept fp8 (the default),
#    then dequantised to bf16 at load; decode reads half the bytes from the first. Kept fp8, prefill
#    runs W8A8 (the default: cuBLASLt's block-scaled fp8 GEMMs), then on the weights dequantised to
#    bf16 per GEMM (--fp8-prefill bf16): the prefill tok/s of the two, and the "fp8 weights as"
#    lines (W8A8 against dequantised, beside the fp8 and bf16 peaks).
model8="${TMPDIR:-/tmp}/shardlm-bench-model-fp8"
run make-model-fp8 "$build/shardlm" make-model --config "$root/inputs/models/bench-1024.json" --out "$model8" \
  --dtype fp8 --seed 1
for form in fp8 bf16 fp8-prefill-bf16; do
  extra=(--fp8-weights "${form%%-*}")
  [ "$form" = fp8-prefill-bf16 ] && extra+=(--fp8-prefill bf16)
  run "bench-fp8-weights-$form" "$build/shardlm" bench --model "$model8" --backend cuda "${extra[@]}" \
    --prompt-len 2048 --decode-tokens 256 --batch 64 --batch-in 512 --batch-out 128 --attention-context 0 --peak-gemm 0
done
# 8. A DeepSeek-V3-shaped model (MLA, 64 routed experts top 8 in groups, a shared expert; 8 layers,
#    hidden 1024) in fp8: decode and batched, eager and with its MoE decode steps replayed from
#    CUDA graphs (the routing on the device).
modelmoe="${TMPDIR:-/tmp}/shardlm-bench-moe-model-fp8"
run make-model-moe "$build/shardlm" make-model --config "$root/inputs/models/bench-moe-1024.json" --out "$modelmoe" \
  --dtype fp8 --seed 1
run bench-moe-model "$build/shardlm" bench --model "$modelmoe" --backend cuda --prompt-len 2048 --decode-tokens 256 \
  --batch 256 --batch-in 512 --batch-out 128 --attention-context 0 --peak-gemm 0 --cuda-graphs --op-profile
# 9. bench-comm on device buffers: NCCL on the one GPU (one rank: the device path and its check;
#    bus bandwidth needs 2+ GPUs), and 2 ranks sharing it over MPI staged through pinned memory.
mpiexec=$(command -v mpiexec || echo "$mpiexec_then")
run bench-comm-nccl "$mpiexec" -np 1 "$build/shardlm" bench-comm --comm nccl --max-bytes 256M --iters 5
#    (Up to 16 MiB: on the one H200 host so far its Open MPI took 53 ms at 8 MiB and 3.4 s at 256.)
run bench-comm-staged "$mpiexec" -np 2 "$build/shardlm" bench-comm --comm mpi --buffers device --max-bytes 16M \
  --iters 5
step "done: status $status"
exit $status
