#!/usr/bin/env bash
# Prepares, on this (CPU, Debian 12) machine, what a lent GPU machine needs to build and run
# specloop's CUDA checks with scripts/gpu/run.sh (scripts/gpu/README.md). Fills .gpu/ in the
# repository, which the session carries there (`carry: [".gpu"]`):
#   .gpu/debs/    the Debian packages the harness build (-DSPECLOOP_GPU_HARNESS=ON) links
#                 against and the machine's image lacks (it has CUDA, cmake, ninja, g++ and a
#                 pip torch with its LibTorch);
#   .gpu/shared/  the fixtures the CUDA tests, the smoke run and gpu_bench read, laid out like
#                 ../shared (run.sh points SPECLOOP_SHARED at it), and tools/widen_llama.py,
#                 with which gpu_bench builds its large fixture there.
# Adds .gpu/ to .git/info/exclude, so it never shows in `git status`, and prints the total:
# .gpu and the working tree travel together under a 64 MiB limit.
#
# Usage: scripts/gpu/prepare.sh [ZOO_DIR ...]
#   ZOO_DIR: folders of models/zoo to carry as well (e.g. llama3-draft; "zoo/" in front is
#   accepted); default: the four zoo drafts and qwen3-target. `none` carries no zoo folder.
# Environment: SPECLOOP_SHARED (default: ../shared beside the repository).
# Needs apt-get with its package lists (`apt-get update` once) and the network.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${SPECLOOP_SHARED:-$ROOT/../shared}
GPU=$ROOT/.gpu
LIMIT_MIB=60   # .gpu alone
CARRY_MIB=64   # .gpu plus the working tree: what a session may send

# The harness build's dependencies besides LibTorch, CUDA and the compiler (cmake/gpu_harness.cmake):
# headers with their CMake/pkg-config files, and the shared libraries the -dev packages' .so
# links point at. pkgconf runs the pkg-config lookups (the image may have no pkg-config).
DEBS=(
  nlohmann-json3-dev                 # header-only, CMake config
  libcli11-dev                       # header-only, CMake config
  libgtest-dev                       # static libgtest.a / libgtest_main.a, CMake config
  libpcre2-dev libpcre2-8-0          # tokenizer.json pre-tokenizer regexes (pkg-config)
  libutf8proc-dev libutf8proc2       # NFC normalization (pkg-config)
  pkgconf-bin libpkgconf3            # the pkgconf binary and its library
)

# Whole model folders (config.json, tokenizer_config.json, tokenizer.model, model.safetensors,
# golden-greedy.jsonl and their small notes): what LlamaModel::Load, Tokenizer::Load and the
# golden checks read.
#   target-6m, draft-mix-1m: Golden.Target6mMatchesPyTorchReferenceOnCuda,
#     SpeculativeDecoder.RunsOnCuda, TrainingStep.OnCudaGivesTheCpusLossAndGradients, the
#     smoke run of `specloop generate --device cuda`.
MODELS=(target-6m draft-mix-1m)
# prompts/<domain>.jsonl that SpeculativeDecoder.RunsOnCuda and gpu_bench (python) read.
PROMPTS=(python legal)
ZOO=(llama3-draft qwen2-draft qwen3-draft mistral-draft qwen3-target)
if [ $# -gt 0 ]; then
  ZOO=()
  for z in "$@"; do
    [ "$z" = none ] || ZOO+=("${z#zoo/}")
  done
fi

die() { echo "prepare: $*" >&2; exit 1; }
[ -d "$SHARED/models" ] || die "no fixtures at $SHARED/models (set SPECLOOP_SHARED)"
for m in "${MODELS[@]}"; do
  [ -f "$SHARED/models/$m/config.json" ] || die "$SHARED/models/$m has no config.json"
done
for z in ${ZOO[@]+"${ZOO[@]}"}; do
  [ -f "$SHARED/models/zoo/$z/config.json" ] || die "$SHARED/models/zoo/$z has no config.json"
done
for p in "${PROMPTS[@]}"; do
  [ -f "$SHARED/prompts/$p.jsonl" ] || die "no $SHARED/prompts/$p.jsonl"
done
# tools/ that run on the GPU machine: gpu_bench widens target-6m with this script.
TOOLS=(widen_llama.py)
for t in "${TOOLS[@]}"; do
  [ -f "$SHARED/tools/$t" ] || die "no $SHARED/tools/$t"
done

# Fresh copies: a folder dropped from the lists must not travel on.
rm -rf "$GPU/debs" "$GPU/shared"
mkdir -p "$GPU/debs" "$GPU/shared/models/zoo" "$GPU/shared/prompts" "$GPU/shared/tools"

echo "prepare: downloading ${#DEBS[@]} packages into .gpu/debs"
(cd "$GPU/debs" && apt-get download -q "${DEBS[@]}") ||
  die "apt-get download failed (package lists missing? run apt-get update)"

copy_model() {  # $1: folder under models/
  cp -r "$SHARED/models/$1" "$GPU/shared/models/$1"
  [ -f "$GPU/shared/models/$1/model.safetensors" ] ||
    [ -f "$GPU/shared/models/$1/model.safetensors.index.json" ] || die "models/$1 has no weights"
}
for m in "${MODELS[@]}"; do copy_model "$m"; done
for z in ${ZOO[@]+"${ZOO[@]}"}; do copy_model "zoo/$z"; done
for p in "${PROMPTS[@]}"; do cp "$SHARED/prompts/$p.jsonl" "$GPU/shared/prompts/"; done
for t in "${TOOLS[@]}"; do cp "$SHARED/tools/$t" "$GPU/shared/tools/"; done
chmod -R u+w "$GPU"   # the fixtures are read-only; the next run replaces the copies

exclude=$(git -C "$ROOT" rev-parse --git-path info/exclude)
case $exclude in /*) ;; *) exclude=$ROOT/$exclude ;; esac
mkdir -p "$(dirname "$exclude")"
grep -qxF '.gpu/' "$exclude" 2>/dev/null || echo '.gpu/' >> "$exclude"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
bytes() { du -sb "$@" | awk '{ s += $1 } END { print s + 0 }'; }
echo "prepare: contents"
for d in "$GPU/debs" "$GPU/shared/prompts" "$GPU/shared/tools" "$GPU/shared/models"/* "$GPU/shared/models/zoo"/*; do
  [ "$d" = "$GPU/shared/models/zoo" ] && continue
  printf '  %6s MiB  %s\n' "$(mib "$(bytes "$d")")" "${d#"$ROOT"/}"
done
total=$(bytes "$GPU")
# The working tree as a session sends it: tracked files and untracked ones git does not ignore.
tree=$(git -C "$ROOT" ls-files -z -c -o --exclude-standard |
       (cd "$ROOT" && xargs -0 -r stat -c %s -- 2>/dev/null || true) | awk '{ s += $1 } END { print s + 0 }')
echo "prepare: .gpu is $(mib "$total") MiB (limit $LIMIT_MIB); with the working tree" \
     "($(mib "$tree") MiB) $(mib $((total + tree))) MiB of the $CARRY_MIB MiB a session may send"
[ "$total" -le $((LIMIT_MIB * 1048576)) ] || die ".gpu is over $LIMIT_MIB MiB: carry fewer zoo folders"
[ $((total + tree)) -le $((CARRY_MIB * 1048576)) ] ||
  die "over the $CARRY_MIB MiB a session may send: carry fewer zoo folders"
echo "prepare: done; on the GPU machine: bash scripts/gpu/run.sh  (carry: .gpu)"
