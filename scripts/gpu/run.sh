#!/usr/bin/env bash
# Builds and runs specloop's CUDA checks on a lent GPU machine (scripts/gpu/README.md), from the
# repository root: `bash scripts/gpu/run.sh`. Needs .gpu/ from scripts/gpu/prepare.sh (carried),
# and on the machine CUDA, cmake, ninja, g++ and a Python with pip torch; no network, no apt.
#
# Phases, each timed: machine (os-release, g++, cmake, nvidia-smi); torch (the machine's
# LibTorch and nvcc); deps (the carried Debian packages unpacked into a private prefix);
# configure (build-gpu/ with -DSPECLOOP_GPU_HARNESS=ON against those two, every dependency
# checked to come from the prefix); build (only the CUDA checks' targets); cuda-tests
# (`ctest -R Cuda`: a skipped test is a failure, the machine has a GPU); smoke (`specloop
# generate` with a draft, greedy, on a golden prompt, on CUDA and on the CPU: both must give the
# PyTorch reference's ids; scripts/gpu/smoke.py); gpu-bench (bench/gpu_bench on SMOKE_DEVICE:
# target-6m widened 16x, 1.2 B parameters, plain decoding at batch 1 / 16 against the card's
# memory bandwidth, speculative with draft-mix-1m at k auto, which must equal plain). A failed
# torch, deps, configure or build stops the phases after it; the others do not.
# Writes into $OUT (default /tmp/gpu-out), eight files: summary.txt (one line per phase and
# test, then PASS or FAIL), run.log (everything printed), build.log (the compiler's output),
# ctest.txt, generate-cuda.json, generate-cpu.json, gpu_bench.jsonl (its JSON lines) and
# gpu_bench.log (its progress). Exit status 0 only if every phase passed.
#
# Environment overrides: OUT; TORCH_CMAKE_PREFIX (LibTorch's CMake prefix; default: the
# torch of TORCH_PYTHON, /opt/torch/.venv/bin/python3, else python3); GPU_DEPS (the private
# prefix, default /tmp/gpu-deps, replaced on each run); JOBS (default: all cores);
# SMOKE_DEVICE (default cuda; cpu checks the smoke and gpu-bench phases themselves on a machine
# without a GPU); TORCH_PYTHON; GPU_BENCH_ARGS (more gpu_bench flags, e.g. "--widen 8 --reps 1";
# default none); GPU_BENCH=0 leaves the gpu-bench phase out.
set -uo pipefail

ROOT=$(pwd)
if [ ! -f "$ROOT/cmake/gpu_harness.cmake" ] || [ ! -f "$ROOT/scripts/gpu/run.sh" ]; then
  echo "run.sh: run it from the repository root (bash scripts/gpu/run.sh)" >&2
  exit 2
fi
OUT=${OUT:-/tmp/gpu-out}
DEPS=${GPU_DEPS:-/tmp/gpu-deps}
BUILD=$ROOT/build-gpu
JOBS=${JOBS:-$(nproc)}
SMOKE_DEVICE=${SMOKE_DEVICE:-cuda}
SHARED=$ROOT/.gpu/shared
# The targets that hold the CUDA checks (cmake/gpu_harness.cmake).
TEST_BINARIES=(tests/common/engine_test tests/spec/spec_engine_test tests/trainer/trainer_test)
TARGETS=(engine_test spec_engine_test trainer_test specloop gpu_bench)
# DecodeStep's chains verified on the logits' device against the host path
# (tests/spec/decode_step_device_verify_test.cc: SameTokensAsTheHostPathOnCuda).
TEST_BINARIES+=(tests/spec/decode_step_device_verify_test)
TARGETS+=(decode_step_device_verify_test)
# CUDA graphs against the eager forward (tests/common/batched_aten_test.cc:
# StaticShapeForwardOnCuda).
TEST_BINARIES+=(tests/common/batched_aten_test)
TARGETS+=(batched_aten_test)

mkdir -p "$OUT"
LOG=$OUT/run.log
SUMMARY=$OUT/summary.txt
rm -f "$OUT"/{build.log,ctest.txt,generate-cpu.json,generate-cuda.json,gpu_bench.jsonl,gpu_bench.log}
: > "$LOG"
: > "$SUMMARY"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

FAILED=0   # some phase failed
BLOCKED=0  # a phase the rest needs failed
note() { echo "$*" | tee -a "$SUMMARY"; }
# phase NAME FUNCTION [blocking]: runs FUNCTION in this shell, times it and records
# "PASS|FAIL NAME Ns" in the summary; after a blocking phase failed, records "SKIP NAME".
phase() {
  local name=$1 fn=$2 blocking=${3:-} start rc
  if [ "$BLOCKED" -ne 0 ]; then
    note "SKIP  $name (a phase it needs failed)"
    return
  fi
  echo
  echo "=== $name"
  start=$(date +%s)
  "$fn"
  rc=$?
  if [ $rc -eq 0 ]; then
    note "PASS  $name $(( $(date +%s) - start ))s"
  else
    note "FAIL  $name $(( $(date +%s) - start ))s (status $rc)"
    FAILED=1
    [ -z "$blocking" ] || BLOCKED=1
  fi
}

# The machine as it is; fails without a working nvidia-smi (the CUDA tests would then skip).
machine() {
  cat /etc/os-release
  g++ --version | head -1
  cmake --version | head -1
  echo "ninja $(ninja --version)"
  echo "cores: $(nproc)"
  nvidia-smi
}

# A Python into PY (the smoke run's), LibTorch's CMake prefix into TORCH_CMAKE_PREFIX (unless
# given: then from that Python's torch), and nvcc on the PATH.
torch() {
  PY=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
  [ -x "$PY" ] || PY=$(command -v python3) || { echo "no python3"; return 1; }
  echo "python: $PY"
  if [ -z "${TORCH_CMAKE_PREFIX:-}" ]; then
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
               "available", torch.cuda.is_available())' || return 1
    TORCH_CMAKE_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  fi
  echo "LibTorch CMake prefix: $TORCH_CMAKE_PREFIX"
  [ -d "$TORCH_CMAKE_PREFIX" ] || { echo "no such folder"; return 1; }
  # CMake finds nvcc on the PATH (Torch's CMake enables CUDA); CUDA images keep it here.
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  fi
  command -v nvcc && nvcc --version | tail -2
  return 0
}

# The carried packages into $DEPS (never over /), their pkg-config files pointed at $DEPS, and a
# pkg-config that reads only those.
deps() {
  local debs=("$ROOT"/.gpu/debs/*.deb)
  [ -f "${debs[0]}" ] || { echo "no .gpu/debs/*.deb: run scripts/gpu/prepare.sh and carry .gpu"; return 1; }
  rm -rf "$DEPS" && mkdir -p "$DEPS" || return 1
  local deb member
  for deb in "${debs[@]}"; do
    echo "unpack $(basename "$deb")"
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$DEPS" || return 1
    else  # a .deb is an ar archive holding data.tar.{xz,zst,gz}
      member=$(ar t "$deb" | grep '^data\.tar') || return 1
      case $member in
        *.xz) ar p "$deb" "$member" | tar -xJ -C "$DEPS" ;;
        *.zst) ar p "$deb" "$member" | tar --zstd -x -C "$DEPS" ;;
        *) ar p "$deb" "$member" | tar -xz -C "$DEPS" ;;
      esac || return 1
    fi
  done
  local lib=$DEPS/usr/lib/x86_64-linux-gnu pc
  for pc in "$lib"/pkgconfig/*.pc "$DEPS"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i "s|^\([A-Za-z_]*\)=/usr|\1=$DEPS/usr|" "$pc"
  done
  cat > "$DEPS/pkg-config" <<EOF
#!/bin/sh
# pkgconf from .gpu/debs, reading only the packages unpacked here (scripts/gpu/run.sh).
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$DEPS/usr/share/pkgconfig"
exec "$DEPS/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$DEPS/pkg-config"
  echo "pkg-config: libpcre2-8 $("$DEPS/pkg-config" --modversion libpcre2-8)," \
       "libutf8proc $("$DEPS/pkg-config" --modversion libutf8proc)" || return 1
  "$DEPS/pkg-config" --cflags --libs libpcre2-8 libutf8proc
}

configure() {
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DSPECLOOP_GPU_HARNESS=ON \
    -DCMAKE_PREFIX_PATH="$DEPS/usr;$TORCH_CMAKE_PREFIX" \
    -DPKG_CONFIG_EXECUTABLE="$DEPS/pkg-config" \
    -DSPECLOOP_SHARED_DIR="$SHARED" || return 1
  # Where each dependency was found: all but LibTorch must come from $DEPS, or the carried
  # packages are incomplete and the build leans on whatever this machine happens to have.
  local found var bad=0
  found=$(grep -E '^(Torch|nlohmann_json|CLI11|GTest)_DIR:|^pkgcfg_lib_(PCRE2|UTF8PROC)_' \
          "$BUILD/CMakeCache.txt" | grep -v ADVANCED)
  echo "$found"
  for var in nlohmann_json_DIR CLI11_DIR GTest_DIR pkgcfg_lib_PCRE2_ pkgcfg_lib_UTF8PROC_; do
    echo "$found" | grep -q "^$var[^=]*=$DEPS/" || { echo "$var: not from $DEPS"; bad=1; }
  done
  return $bad
}

build() {
  echo "cmake --build -j$JOBS --target ${TARGETS[*]} (compiler output: build.log)"
  cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" > "$OUT/build.log" 2>&1
  local rc=$?
  grep -cE 'warning:' "$OUT/build.log" | sed 's/^/compiler warnings: /'
  [ $rc -eq 0 ] || { tail -60 "$OUT/build.log"; return $rc; }
}

# ctest -R Cuda: every matching test must pass; skipped, failed, not run or none found fails.
cuda_tests() {
  export SPECLOOP_SHARED=$SHARED
  local bin n bad=0
  for bin in "${TEST_BINARIES[@]}"; do  # each binary must still hold a CUDA test
    n=$("$BUILD/$bin" --gtest_list_tests --gtest_filter='*Cuda*' | grep -c '^  ')
    echo "$bin: $n CUDA test(s)"
    [ "$n" -gt 0 ] || { echo "  none: the harness lost this binary's CUDA tests"; bad=1; }
  done
  local ctest_out=$OUT/ctest.txt
  (cd "$BUILD" && ctest -R Cuda -j3 --output-on-failure --timeout 300) > "$ctest_out" 2>&1
  local rc=$?
  cat "$ctest_out"
  local passed failed skipped
  passed=$(grep -E 'Test +#[0-9]+: .* Passed' "$ctest_out" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/')
  failed=$(grep -E 'Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout|Not Run)' "$ctest_out" |
           sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/')
  skipped=$(grep -E 'Test +#[0-9]+: .*\*\*\*Skipped' "$ctest_out" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/')
  local line
  for line in $passed; do note "        passed  $line"; done
  for line in $skipped; do note "        SKIPPED $line (a skip on the GPU machine is a failure)"; done
  for line in $failed; do note "        FAILED  $line"; done
  [ -n "$passed" ] || { note "        no CUDA test ran"; bad=1; }
  [ -z "$skipped$failed" ] || bad=1
  [ $rc -eq 0 ] || bad=1
  return $bad
}

# `specloop generate --device cuda` (SMOKE_DEVICE) and on the CPU, with a draft, greedy, on a
# target-6m golden prompt: both must give the reference's ids (scripts/gpu/smoke.py).
smoke() {
  "$PY" "$ROOT/scripts/gpu/smoke.py" "$BUILD/serve/specloop" "$SHARED/models" "$SMOKE_DEVICE" "$OUT"
}

# bench/gpu_bench on SMOKE_DEVICE: it widens target-6m with .gpu/shared/tools/widen_llama.py,
# which needs numpy: the first of the smoke run's Python, python3 and /usr/bin/python3 that has
# it. Its JSON lines go to gpu_bench.jsonl, the figures also to the summary.
gpu_bench() {
  local py=""
  for p in "$PY" python3 /usr/bin/python3; do
    if "$p" -c 'import numpy' 2>/dev/null; then py=$p; break; fi
  done
  [ -n "$py" ] || { echo "no Python with numpy for widen_llama.py"; return 1; }
  echo "widening with $py"
  # shellcheck disable=SC2086  # GPU_BENCH_ARGS: separate flags
  "$BUILD/bench/gpu_bench" --device "$SMOKE_DEVICE" --python "$py" --shared "$SHARED" \
    ${GPU_BENCH_ARGS:-} > "$OUT/gpu_bench.jsonl" 2> "$OUT/gpu_bench.log"
  local rc=$?
  cat "$OUT/gpu_bench.log" "$OUT/gpu_bench.jsonl"
  local line
  while IFS= read -r line; do note "        $line"; done < <("$PY" - "$OUT/gpu_bench.jsonl" <<'PYEOF'
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    p = r["params"]
    where = ", ".join(f"{k} {p[k]}" for k in ("batch", "k", "cuda_graphs", "model", "name") if k in p)
    print(f'{r["name"]}{" (" + where + ")" if where else ""}: {r["value"]:.4g} {r["unit"]}')
PYEOF
  )
  return $rc
}

START=$(date +%s)
if HEAD=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); then
  HEAD="$HEAD, $(git -C "$ROOT" status --porcelain | wc -l) paths changed"
else
  HEAD="no .git"
fi
note "specloop GPU checks ($HEAD), $(date -u +%FT%TZ)"
phase machine machine
phase torch torch blocking
phase deps deps blocking
phase configure configure blocking
phase build build blocking
phase cuda-tests cuda_tests
phase smoke smoke
[ "${GPU_BENCH:-1}" = 0 ] || phase gpu-bench gpu_bench
if [ "$FAILED" -eq 0 ]; then
  note "PASS  all ($(( $(date +%s) - START ))s)"
else
  note "FAIL  ($(( $(date +%s) - START ))s; see run.log)"
fi
exec >&- 2>&-  # let tee finish run.log before the files are collected
wait "$TEE_PID"
exit $FAILED
