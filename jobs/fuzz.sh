#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ (clang, ASan + UBSan, coverage-instrumented shardlm_inputs)
# into build-fuzz/ and runs each one for N seconds (default 30) from its seed corpus.
#   bash jobs/fuzz.sh            # 30 s per target (smoke run)
#   bash jobs/fuzz.sh 3600       # an hour per target (a real campaign; run overnight or per release)
#   FUZZ_TARGETS="fuzz_tokenizer" bash jobs/fuzz.sh 600   # just one target
#   SHARDLM_FUZZ_TOKENIZER=/path/to/tok_dir bash jobs/fuzz.sh   # fuzz another tokenizer (':' separated list)
# Seeds are copied to a temporary corpus dir, so the repo is never modified; the inputs the run
# found are kept in build-fuzz/corpus/<target>/ (reused as extra seeds next time). A crash, leak,
# timeout or sanitizer report fails the script (exit 1) and leaves the input in
# build-fuzz/artifacts/<target>/; reproduce it with  build-fuzz/fuzz/<target> <that file>.
# Without the shared tokenizers (../shared/tokenizers/qwen2, ../shared/models/stories260K) the
# tokenizer target is skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
jobs="${SHARDLM_JOBS:-2}"

bash jobs/setup.sh
# clang + the compiler-rt runtimes (libFuzzer, ASan, UBSan); Debian 12 ships clang 14.
need=()
command -v clang >/dev/null && command -v clang++ >/dev/null || need+=(clang)
dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed" || need+=(libclang-rt-14-dev)
# OpenMP for clang (the CPU kernels use it).
dpkg-query -W -f='${Status}' libomp-dev 2>/dev/null | grep -q "install ok installed" || need+=(libomp-dev)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "[fuzz] installing: ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# -O1 with line tables only: sanitizer builds compile about twice as fast as at -O2 -g, and the
# reports still name file and line.
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -gline-tables-only"
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DSHARDLM_FUZZ=ON -DSHARDLM_TESTS=OFF -DSHARDLM_NATIVE=ON -DSHARDLM_CUDA=OFF >/dev/null
targets=(${FUZZ_TARGETS:-fuzz_safetensors_header fuzz_jsonl_request fuzz_tokenizer})
cmake --build build-fuzz -j"$jobs" --target "${targets[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMP_NUM_THREADS=1
# libinfinipath (pulled in via Open MPI) writes a <exe>.<pid>.btr backtrace file into the cwd on abort.
export IPATH_NO_BACKTRACE=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=()
for t in "${targets[@]}"; do
  if [ "$t" = fuzz_tokenizer ] && [ -z "${SHARDLM_FUZZ_TOKENIZER:-}" ] &&
     [ ! -f ../shared/tokenizers/qwen2/tokenizer.json ] && [ ! -f ../shared/models/stories260K/tokenizer.json ]; then
    echo "[fuzz] $t: SKIPPED: no tokenizer (../shared/tokenizers/qwen2, ../shared/models/stories260K) and SHARDLM_FUZZ_TOKENIZER unset"
    continue
  fi
  corpus="$tmp/$t"
  mkdir -p "$corpus" "build-fuzz/corpus/$t" "build-fuzz/artifacts/$t"
  cp -r "fuzz/corpus/$t/." "$corpus/"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "[fuzz] $t: ${secs}s"
  # New inputs go to $corpus (first dir); build-fuzz/corpus/$t seeds from earlier runs are read too.
  if ! "build-fuzz/fuzz/$t" "$corpus" "build-fuzz/corpus/$t" "${dict[@]}" \
      -max_total_time="$secs" -timeout=30 -rss_limit_mb=6144 -max_len=16384 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/artifacts/$t/" 2>"$tmp/$t.log"; then
    tail -n 60 "$tmp/$t.log"
    echo "[fuzz] $t: FAILED (input saved under build-fuzz/artifacts/$t/)"
    failed+=("$t")
  fi
  grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|loaded" "$tmp/$t.log" || true
  cp -n "$corpus"/* "build-fuzz/corpus/$t/" 2>/dev/null || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "[fuzz] FAILED: ${failed[*]}"
  exit 1
fi
echo "[fuzz] all targets ran ${secs}s without a crash"
