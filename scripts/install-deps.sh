#!/usr/bin/env bash
# Installs specloop's build and test dependencies from Debian packages. Idempotent: packages
# already present are left alone, so a second run costs one dpkg query.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libopenblas0-pthread            # LibTorch; OpenBLAS is ~17x faster than ref BLAS
  librocksdb-dev rocksdb-tools                 # replay buffer; ldb to inspect it
  libhiredis-dev redis-server                  # records through a Redis stream (many workers)
  libzmq3-dev cppzmq-dev                       # draft publication
  libcpp-httplib-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  libsentencepiece-dev libssl-dev
  libpcre2-dev libutf8proc-dev                 # tokenizer.json: regex pre-tokenizers, NFC
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus                                   # promtool checks; the e2e test runs a server
  libjs-chart.js                               # Chart.js, embedded in the status page
  chromium fonts-dejavu-core                   # e2e: the status page in headless Chromium
  gnuplot-nox                                  # bench/faster_over_time: the PNG plot
  clang libclang-rt-14-dev llvm                # libFuzzer fuzzers (scripts/fuzz.sh), llvm-symbolizer
)
# Node.js and npm run the openai client and tokenizers.js tests; a machine with its own Node
# (e.g. NodeSource's, which bundles npm and conflicts with Debian's npm) keeps it.
command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
