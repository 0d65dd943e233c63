#!/usr/bin/env bash
# Builds the libFuzzer fuzzers of tests/fuzz with clang (ASan + UBSan, build-fuzz/) and runs
# each for SECONDS (default 10), printing one JSON line per fuzzer with its executions.
#
#   scripts/fuzz.sh [SECONDS] [ctest args]     e.g. scripts/fuzz.sh 3600 -R fuzz_record
#
# Fails when a fuzzer finds a crash or a broken property; the report and the input are in
# build-fuzz/tests/fuzz/work/NAME/ (log, crash-*). Replay an input with
# `build-fuzz/tests/fuzz/NAME_fuzzer INPUT`; keep it as a seed in make_seeds.py once fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true

export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
start=$(date +%s)
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DSPECLOOP_FUZZ=ON -DSPECLOOP_FUZZ_SECONDS="$seconds" >/dev/null
nice -n 10 cmake --build build-fuzz -j "$(nproc)" --target fuzz_targets
built=$(date +%s)
rm -f build-fuzz/tests/fuzz/work/*/summary.json
status=0
ctest --test-dir build-fuzz --output-on-failure -j "$(nproc)" -L reliability -R '^fuzz_' "$@" ||
  status=$?
cat build-fuzz/tests/fuzz/work/*/summary.json 2>/dev/null || true
echo "fuzz.sh: build $((built - start)) s, fuzzing $(($(date +%s) - built)) s"
exit $status
