#!/usr/bin/env bash
# Installs the dependencies, builds specloop, and runs the test suite: the README's first
# command and exactly what CI runs. Extra arguments go to ctest (e.g. -L engine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600 "$@"
