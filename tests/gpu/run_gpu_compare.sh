#!/usr/bin/env bash
# Before/after timings in one run: the same benchmarks with this build's shardlm and with every
# other build packed beside it (tests/gpu/prepare_gpu_build.sh's SHARDLM_GPU_EXTRA_BINS, in
# BUILD_DIR/extra), one after the other on the same GPU, so that a kernel change's figures are
# never compared across machines or sessions.
#
#   tests/gpu/run_gpu_compare.sh BUILD_DIR LOG_DIR
#
# Per binary: bench-1024 (GQA, bf16, 64-dim heads) and bench-mla-512 (DeepSeek-V3's attention
# geometry) with decode attention timed up to 32768 positions, and decode batch 1 after a
# 2048-token prompt; bench-gqa-128 (Llama 3's attention: groups of 4 heads of 128 dims) for its
# decode attention lines, with short scenarios; the MLA one again with --decode-attention bf16
# where the binary has it; bench-1024 in fp8 (128 x 128 block scales, kept fp8): the linears read
# straight from fp8 weights at 1, 16 and 64 rows, on its gate/up shape and at 8192 x 8192, and
# decode batch 1; and bench-moe on one EP-8 rank's share of DeepSeek-V3's MoE layer at 128, 1024
# and 4096 tokens, its experts fp8 kept fp8 (the grouped W8A8 GEMM) and bf16 (the routed GEMMs of
# a graph step: the grouped bf16 GEMM), for their expert GEMM lines, on wgmma and again with
# --grouped-gemm-core mma-sync where the binary has the option, and with each expert's gate and
# up apart (--gate-up apart) where it stacks them.
# LOG_DIR/compare.log gathers each one's attention (decode, and prefill chunks on tensor cores and
# in fp32), linear and tok/s lines. SHARDLM_COMPARE_BACKEND (default cuda), SHARDLM_COMPARE_ARGS,
# SHARDLM_COMPARE_GQA128_ARGS and SHARDLM_COMPARE_FP8_ARGS (the bench arguments after --model) and
# SHARDLM_COMPARE_MOE_ARGS (bench-moe's layer and token counts) let the script be tried on a CPU
# build with small sizes; SHARDLM_COMPARE_SECONDS (default 60) cuts each benchmark, and
# SHARDLM_COMPARE_TOTAL_SECONDS (default: none) bounds them all.
set -uo pipefail
build=${1:?usage: run_gpu_compare.sh BUILD_DIR LOG_DIR}
logs=${2:?usage: run_gpu_compare.sh BUILD_DIR LOG_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$logs"
backend=${SHARDLM_COMPARE_BACKEND:-cuda}
cap=${SHARDLM_COMPARE_SECONDS:-60}
read -r -a args <<<"${SHARDLM_COMPARE_ARGS:---prompt-len 2048 --decode-tokens 64 --batch 1 --batch-in 16 --batch-out 2 --attention-context 32768 --peak-gemm 0}"
read -r -a gqa128_args <<<"${SHARDLM_COMPARE_GQA128_ARGS:---prompt-len 256 --decode-tokens 8 --batch 1 --batch-in 16 --batch-out 2 --attention-context 32768 --peak-gemm 0}"
read -r -a fp8_args <<<"${SHARDLM_COMPARE_FP8_ARGS:---prompt-len 2048 --decode-tokens 64 --batch 1 --batch-in 16 --batch-out 2 --attention-context 0 --peak-gemm 8192}"
read -r -a moe_args <<<"${SHARDLM_COMPARE_MOE_ARGS:---hidden 7168 --experts 32 --inter 2048 --top-k 8 --groups 8 --topk-groups 4 --shared 1 --tokens 128,1024,4096 --iters 5 --warmup 1}"
tmp="${TMPDIR:-/tmp}"
declare -A configs=([gqa]=bench-1024 [gqa128]=bench-gqa-128 [mla]=bench-mla-512 [fp8]=bench-1024)
declare -A dtypes=([gqa]=bf16 [gqa128]=bf16 [mla]=bf16 [fp8]=fp8)
status=0
for c in gqa gqa128 mla fp8; do
  model="$tmp/shardlm-compare-$c"
  [ -d "$model" ] || timeout -k 5 300 "$build/shardlm" make-model --config "$root/inputs/models/${configs[$c]}.json" --out "$model" \
    --dtype "${dtypes[$c]}" --seed 1 >/dev/null || { echo "make-model ${configs[$c]} failed" | tee -a "$logs/compare.log"; exit 1; }
done
bins=("$build/shardlm")
for b in "$build"/extra/*; do [ -x "$b" ] && bins+=("$b"); done
# One benchmark: config $1, binary $2, log name $3, then extra bench arguments.
bench() {
  local c=$1 bin=$2 log="$logs/compare-$3.log" rc=0
  shift 3
  local -a base=("${args[@]}")
  [ "$c" = fp8 ] && base=("${fp8_args[@]}")
  [ "$c" = gqa128 ] && base=("${gqa128_args[@]}")
  echo "== $c: $(basename "$bin") $* ($(date +%T))" | tee -a "$logs/compare.log"
  local cap_now=$cap
  time_left || return 0
  timeout -k 5 "$cap_now" "$bin" bench --model "$tmp/shardlm-compare-$c" --backend "$backend" "${base[@]}" "$@" \
    >"$log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { echo "   exit $rc, see $(basename "$log")" | tee -a "$logs/compare.log"; status=1; }
  grep -E "^attention|positions|^prefill|^decode|fp8 weights:" "$log" >>"$logs/compare.log"
}
# Whether binary $1's subcommand $2 has option $3 (not `--help | grep -q`: under pipefail grep's
# early exit can kill the writer with SIGPIPE and read as "no").
has_option() {
  local help
  help=$("$1" "$2" --help 2>/dev/null) || true
  [[ $help == *"$3"* ]]
}
# The budget left of SHARDLM_COMPARE_TOTAL_SECONDS (0: none): a benchmark that would start with
# less than 15 s of it is listed as not run instead.
total=${SHARDLM_COMPARE_TOTAL_SECONDS:-0}
started=$SECONDS
time_left() {
  [ "$total" -gt 0 ] || return 0
  local left=$((total - (SECONDS - started)))
  if [ "$left" -lt 15 ]; then
    echo "   not run: the ${total} s budget is spent" | tee -a "$logs/compare.log"; status=1; return 1
  fi
  [ "$left" -lt "$cap" ] && cap_now=$left
  return 0
}
# One MoE layer benchmark: binary $1, log name $2, then extra bench-moe arguments.
bench_moe() {
  local bin=$1 log="$logs/compare-$2.log" rc=0
  shift 2
  echo "== moe: $(basename "$bin") $* ($(date +%T))" | tee -a "$logs/compare.log"
  local cap_now=$cap
  time_left || return 0
  timeout -k 5 "$cap_now" "$bin" bench-moe --backend "$backend" "${moe_args[@]}" "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { echo "   exit $rc, see $(basename "$log")" | tee -a "$logs/compare.log"; status=1; }
  grep -E "GEMMs|^# ceilings" "$log" >>"$logs/compare.log"
}
for c in gqa gqa128 mla fp8; do
  for bin in "${bins[@]}"; do
    name="$(basename "$bin")"
    bench "$c" "$bin" "$c-$name"
    # MLA decode on tensor cores too, where the binary has it (each line then times both kernels).
    if [ "$c" = mla ] && has_option "$bin" bench --decode-attention; then
      bench "$c" "$bin" "$c-$name-decode-bf16" --decode-attention bf16
    fi
  done
done
for bin in "${bins[@]}"; do
  name="$(basename "$bin")"
  bench_moe "$bin" "moe-fp8-$name" --dtype fp8 --fp8-prefill w8a8
  bench_moe "$bin" "moe-bf16-$name"
  # The same grouped GEMMs on mma.sync, where the binary runs them on wgmma by default.
  if has_option "$bin" bench-moe --grouped-gemm-core; then
    bench_moe "$bin" "moe-fp8-$name-mma-sync" --dtype fp8 --fp8-prefill w8a8 --grouped-gemm-core mma-sync
    bench_moe "$bin" "moe-bf16-$name-mma-sync" --grouped-gemm-core mma-sync
  fi
  # Each expert's gate and up apart (two routed calls), where the binary stacks them by default.
  if has_option "$bin" bench-moe --gate-up; then
    bench_moe "$bin" "moe-fp8-$name-gate-up-apart" --dtype fp8 --fp8-prefill w8a8 --gate-up apart
    bench_moe "$bin" "moe-bf16-$name-gate-up-apart" --gate-up apart
  fi
done
exit $status
