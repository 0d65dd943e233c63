#!/usr/bin/env bash
# Installs the dependencies, builds specloop, and runs the test suite: the README's first
# command and exactly what CI runs. Extra arguments go to ctest (e.g. -L engine); without them
# the LibTorch-free tests also run under ASan + UBSan and every fuzzer runs for 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600 "$@"
if [ $# -eq 0 ]; then
  bash scripts/sanitize.sh asan
  bash scripts/fuzz.sh 10
fi
