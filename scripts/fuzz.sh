#!/usr/bin/env bash
# Builds every libFuzzer target (tests/fuzz/fuzz_*.c) with clang, ASan and
# UBSan (UB is fatal) into build-fuzz, then runs each for FUZZ_SECONDS
# (default 15) over a fresh corpus seeded from tests/fuzz/seeds/<name>
# (fuzz_<name>; fuzz_config also gets configs/). Prints per target the
# executions per second, the executions and the corpus size; exits non-zero
# when any target crashed, leaked, tripped a sanitizer or failed to build,
# leaving the input that did it under FUZZ_ARTIFACTS.
#
#   FUZZ_SECONDS   seconds per target (default 15)
#   FUZZ_TARGETS   space-separated target names to run (default: all built)
#   FUZZ_BUILD     build directory (default build-fuzz)
#   FUZZ_ARTIFACTS where crash inputs go (default $FUZZ_BUILD/artifacts)
#   FUZZ_CORPUS    keep the corpora under this directory (default: a
#                  temporary one, removed at the end)
#   FUZZ_JOBS      build parallelism (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${FUZZ_SECONDS:-15}
build=${FUZZ_BUILD:-build-fuzz}
artifacts=${FUZZ_ARTIFACTS:-$build/artifacts}
jobs=${FUZZ_JOBS:-2}

# The build's own packages, then clang and its libFuzzer / sanitizer
# runtimes, installed when missing.
bash scripts/install-deps.sh
fuzzer_links() {
  local probe
  probe=$(mktemp -d)
  printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    > "$probe/p.c"
  clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1
  local rc=$?
  rm -rf "$probe"
  return $rc
}
if ! command -v clang >/dev/null || ! fuzzer_links; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "fuzz: installing clang and libclang-rt-14-dev"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
  fuzzer_links || { echo "fuzz: clang cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

targets=()
for src in tests/fuzz/fuzz_*.c; do
  targets+=("$(basename "$src" .c)")
done
if [ -n "${FUZZ_TARGETS:-}" ]; then read -r -a targets <<< "$FUZZ_TARGETS"; fi

flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all"
CC=clang CFLAGS="$flags" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHS_FUZZ=ON -DHS_WERROR=OFF -DHS_CUDA=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target "${targets[@]}" > "$build/fuzz-build.log" 2>&1 || {
  tail -30 "$build/fuzz-build.log" >&2
  echo "fuzz: the build failed (whole log: $build/fuzz-build.log)" >&2
  exit 1
}

mkdir -p "$artifacts"
if [ -n "${FUZZ_CORPUS:-}" ]; then
  corpora=$FUZZ_CORPUS
  mkdir -p "$corpora"
else
  corpora=$(mktemp -d)
  trap 'rm -rf "$corpora"' EXIT
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
printf '%-22s %10s %12s %14s\n' target exec/s executions corpus
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  corpus=$corpora/$name
  mkdir -p "$corpus"
  if [ -d "tests/fuzz/seeds/$name" ]; then cp -n tests/fuzz/seeds/"$name"/* "$corpus"/ 2>/dev/null || true; fi
  if [ "$name" = config ]; then cp -n configs/*.yaml "$corpus"/ 2>/dev/null || true; fi
  log=$build/$t.log
  rc=0
  "$build/$t" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$root/$artifacts/$t-" "$corpus" > "$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  files=$(find "$corpus" -type f | wc -l)
  bytes=$(du -sb "$corpus" | cut -f1)
  printf '%-22s %10s %12s %8s files, %s bytes\n' "$t" "${rate:-?}" "${execs:-?}" "$files" "$bytes"
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    grep -E "^==[0-9]+==ERROR|runtime error|SUMMARY|Test unit written|^(ERROR|.*does not name)" "$log" \
      | head -8 | sed 's/^/    /' >&2
    echo "    (exit $rc; whole log: $log)" >&2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}; inputs under $artifacts" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
