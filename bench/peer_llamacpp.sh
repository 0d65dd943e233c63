#!/usr/bin/env bash
# specloop against llama.cpp on the same models, prompts and thread count.
#
# Usage: bench/peer_llamacpp.sh LLAMA_DIR [--prompts N] [--reps R] [--tokens T] [--domain D]
#                               [--draft-max "3 6"] [--threads 1] [--work DIR] [--python PY]
#
# LLAMA_DIR is a llama.cpp source tree (with its build in LLAMA_DIR/build) or a build folder
# inside one; llama.cpp is not a dependency of specloop. Needed there: llama-speculative-simple
# and llama-completion (e.g. `cmake --build build --target llama-speculative-simple
# llama-completion`), and its converter with its Python packages: convert_hf_to_gguf.py (numpy,
# sentencepiece, torch, transformers) where PY imports them all, else
# examples/convert_legacy_llama.py (numpy and sentencepiece only; the same F32 tensors for a
# Llama checkpoint). The fixtures (target-wide-46m, draft-mix-1m under SPECLOOP_SHARED, default
# ../shared) are converted to F32 GGUF once into --work (default /tmp/specloop-peer-llamacpp).
#
# Arms, all greedy (temperature 0), --tokens tokens, --threads compute threads, each on the
# first --prompts prompts of SHARED/prompts/DOMAIN.jsonl:
#   specloop_auto   specloop generate --draft draft-mix-1m --k auto --json
#   specloop_plain  specloop generate (no draft) --json
#   llamacpp_dN     llama-speculative-simple --spec-type draft-simple --spec-draft-n-max N
#                   --spec-draft-n-min 0 --spec-draft-p-min 0, one arm per N in --draft-max
#   llamacpp_plain  llama-completion -no-cnv (its eval time: decoding, prompt excluded)
# llama.cpp runs with --no-escape: by default it turns "\x01" and "\n" written in a prompt into
# the bytes they name, and a prompt of Python source holds such text.
# Each repetition runs every (prompt, arm) pair once, the arms of a prompt back to back in an
# order that rotates with the repetition, so the machine's drift hits them alike.
# Decoding rate = generated tokens / decoding seconds (prompt processing excluded): specloop's
# decode_seconds, llama-speculative-simple's "decoded ... t/s", llama-completion's "eval time".
#
# Output: one JSON line per run and one per (prompt, arm) median, {"name", "params", "value",
# "unit"} as the other benches print, then a markdown table of medians. Every run's greedy
# text is checked against specloop_plain's (same target, so the same text up to float
# rounding): "agrees" in the run's line is the length of the common prefix in characters over
# the shorter of the two texts; a converter that loaded the weights wrong shows as agreement
# near 0. LLAMA_COMMIT names llama.cpp's commit where LLAMA_DIR is not a git checkout.
set -euo pipefail

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
LLAMA_DIR=$(cd "$1" && pwd) || { echo "peer_llamacpp: no folder $1" >&2; exit 2; }
shift
PROMPTS=3 REPS=3 TOKENS=96 DOMAIN=python DRAFT_MAX="3 6" THREADS=1
WORK=/tmp/specloop-peer-llamacpp PY=python3
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "peer_llamacpp: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --prompts) PROMPTS=$2 ;; --reps) REPS=$2 ;; --tokens) TOKENS=$2 ;; --domain) DOMAIN=$2 ;;
    --draft-max) DRAFT_MAX=$2 ;; --threads) THREADS=$2 ;; --work) WORK=$2 ;; --python) PY=$2 ;;
    *) echo "peer_llamacpp: unknown argument $1" >&2; usage ;;
  esac
  shift 2
done
for n in "$PROMPTS" "$REPS" "$TOKENS" "$THREADS" $DRAFT_MAX; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "peer_llamacpp: '$n' is not a positive integer" >&2; exit 2; }
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SPECLOOP_SHARED:-$REPO/../shared}
SPECLOOP=${SPECLOOP:-$REPO/build/serve/specloop}
TARGET=$SHARED/models/target-wide-46m
DRAFT=$SHARED/models/draft-mix-1m
PROMPT_FILE=$SHARED/prompts/$DOMAIN.jsonl
for f in "$SPECLOOP" "$TARGET/config.json" "$DRAFT/config.json" "$PROMPT_FILE"; do
  [ -e "$f" ] || { echo "peer_llamacpp: missing $f" >&2; exit 2; }
done

# llama.cpp's binaries and converter: LLAMA_DIR may be the source tree or a build inside it.
find_bin() {
  local d
  for d in "$LLAMA_DIR/build/bin" "$LLAMA_DIR/bin" "$LLAMA_DIR"; do
    [ -x "$d/$1" ] && { echo "$d/$1"; return; }
  done
  echo "peer_llamacpp: no $1 under $LLAMA_DIR (build it: cmake --build BUILD --target $1)" >&2
  exit 2
}
SPEC_BIN=$(find_bin llama-speculative-simple)
PLAIN_BIN=$(find_bin llama-completion)
SRC=$LLAMA_DIR
[ -e "$SRC/convert_hf_to_gguf.py" ] || SRC=$(cd "$LLAMA_DIR/.." && pwd)
[ -e "$SRC/convert_hf_to_gguf.py" ] || { echo "peer_llamacpp: no convert_hf_to_gguf.py in $LLAMA_DIR or its parent" >&2; exit 2; }
if "$PY" -c 'import numpy, sentencepiece, torch, transformers' 2>/dev/null; then
  CONVERT=(convert_hf_to_gguf.py)
elif "$PY" -c 'import numpy, sentencepiece' 2>/dev/null; then
  CONVERT=(examples/convert_legacy_llama.py)
else
  echo "peer_llamacpp: $PY lacks numpy and sentencepiece (llama.cpp's converters need them; --python PY)" >&2
  exit 2
fi

mkdir -p "$WORK"
convert() {  # $1 model dir, $2 output name: converts once, keeps the GGUF
  local out=$WORK/$2.gguf
  if [ ! -s "$out" ]; then
    (cd "$SRC" && "$PY" "${CONVERT[@]}" --outtype f32 --outfile "$out.tmp" "$1") > "$WORK/$2.convert.log" 2>&1 \
      || { echo "peer_llamacpp: converting $1 failed (log: $WORK/$2.convert.log)" >&2; exit 1; }
    mv "$out.tmp" "$out"
  fi
  echo "$out"
}
TARGET_GGUF=$(convert "$TARGET" target-wide-46m)
DRAFT_GGUF=$(convert "$DRAFT" draft-mix-1m)

export PROMPTS REPS TOKENS DOMAIN DRAFT_MAX THREADS WORK SPECLOOP TARGET DRAFT PROMPT_FILE
export SPEC_BIN PLAIN_BIN TARGET_GGUF DRAFT_GGUF
LLAMA_COMMIT=${LLAMA_COMMIT:-$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)}
export LLAMA_COMMIT
export SPECLOOP_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
export CONVERTER=${CONVERT[0]}
exec "$PY" - <<'EOF'
import json, os, re, statistics, subprocess, sys

E = os.environ
tokens, threads = int(E['TOKENS']), int(E['THREADS'])
prompts = [json.loads(l)['prompt'] for l in open(E['PROMPT_FILE'], encoding='utf-8')][:int(E['PROMPTS'])]
arms = ['specloop_auto', 'specloop_plain'] + ['llamacpp_d%s' % n for n in E['DRAFT_MAX'].split()] + ['llamacpp_plain']
common = {'target': 'target-wide-46m', 'draft': 'draft-mix-1m', 'domain': E['DOMAIN'], 'tokens': tokens,
          'threads': threads, 'temperature': 0, 'specloop_commit': E['SPECLOOP_COMMIT'],
          'llamacpp_commit': E['LLAMA_COMMIT'], 'converter': E['CONVERTER'], 'gguf': 'F32'}


def run(cmd, needs=None):
    """Runs cmd; with `needs`, a regex its standard error must match, runs it again (3 tries in
    all) where the line is missing: llama.cpp logs from a thread of its own, and a process that
    exits before that thread writes loses its last lines now and then."""
    for attempt in range(3):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit('peer_llamacpp: %s failed (%d): %s' % (cmd[0], p.returncode, p.stderr[-2000:]))
        if needs is None or re.search(needs, p.stderr):
            return p
        print('peer_llamacpp: no %r in %s\'s output, running it again' % (needs, os.path.basename(cmd[0])),
              file=sys.stderr)
    sys.exit('peer_llamacpp: %s printed no %r in 3 runs: %s' % (cmd[0], needs, p.stderr[-2000:]))


def run_arm(arm, i, prompt):
    """Returns (decode tokens/s, generated text, extras) of one run."""
    if arm.startswith('specloop'):
        cmd = [E['SPECLOOP'], 'generate', '--model', E['TARGET'], '--prompt', prompt, '--temperature', '0',
               '--max-tokens', str(tokens), '--threads', str(threads), '--json']
        if arm == 'specloop_auto':
            cmd += ['--draft', E['DRAFT'], '--k', 'auto']
        d = json.loads(run(cmd).stdout)
        extra = {'generated': len(d['tokens']), 'prompt_tokens': len(d['prompt_tokens'])}
        if arm == 'specloop_auto':
            extra.update(k_mean=round(d['k_mean'], 2), tokens_per_step=round(d['tokens_per_step'], 2))
        return len(d['tokens']) / d['decode_seconds'], d['text'], extra
    path = os.path.join(E['WORK'], 'prompt%d.txt' % i)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(prompt + '\n')  # llama.cpp's -f drops a file's last newline: this one
    base = ['-m', E['TARGET_GGUF'], '-f', path, '-n', str(tokens), '--temp', '0', '-t', str(threads),
            '-tb', str(threads), '-fa', 'off', '-c', '1024', '--seed', '0', '--no-escape']
    if arm == 'llamacpp_plain':
        eval_time = r'\beval time =\s*([\d.]+) ms /\s*(\d+) runs'
        p = run([E['PLAIN_BIN']] + base + ['-no-cnv', '--no-warmup'], needs=eval_time)
        m = re.search(eval_time, p.stderr)
        return int(m.group(2)) / (float(m.group(1)) / 1e3), p.stdout, {'generated': int(m.group(2))}
    n = arm[len('llamacpp_d'):]
    p = run([E['SPEC_BIN']] + base + ['-md', E['DRAFT_GGUF'], '-td', str(threads), '-tbd', str(threads),
            '--spec-type', 'draft-simple', '--spec-draft-n-max', n, '--spec-draft-n-min', '0',
            '--spec-draft-p-min', '0'], needs=r'decoded\s+\d+ tokens in.*\n(.*\n)*.*n_accept')
    m = re.search(r'decoded\s+(\d+) tokens in\s+([\d.]+) seconds', p.stderr)
    enc = re.search(r'encoded\s+(\d+) tokens', p.stderr)
    acc = re.search(r'n_drafted = (\d+).*?n_accept\s+= (\d+)', p.stderr, re.S)
    if not m:
        sys.exit('peer_llamacpp: no "decoded ... tokens" in llama-speculative-simple\'s output')
    extra = {'generated': int(m.group(1)), 'prompt_tokens': int(enc.group(1)) if enc else None}
    if acc:
        extra.update(drafted=int(acc.group(1)), accepted=int(acc.group(2)))
    return int(m.group(1)) / float(m.group(2)), p.stdout, extra


def agreement(text, reference, prompt):
    """Common prefix of a run's generated text and the reference's, over the shorter one's length.
    llama.cpp prints the prompt before its output: its text is taken after the prompt's end."""
    tail = prompt.rstrip()[-48:]
    at = text.rfind(tail, 0, len(prompt) + 16)  # the prompt's own end, not an earlier repeat
    if at < 0:
        return 0.0
    got, ref = text[at + len(tail):].lstrip(), reference.lstrip()
    if not ref:
        return 1.0
    m = min(len(got), len(ref))
    if m == 0:
        return 0.0
    n = 0
    while n < m and got[n] == ref[n]:
        n += 1
    return round(n / m, 3)


rates, agree = {}, {}
for rep in range(int(E['REPS'])):
    for i, prompt in enumerate(prompts):
        order = arms[rep % len(arms):] + arms[:rep % len(arms)]
        results = {}
        for arm in order:
            results[arm] = run_arm(arm, i, prompt)
        ref = results['specloop_plain'][1]
        for arm in arms:
            rate, text, extra = results[arm]
            rates.setdefault((i, arm), []).append(rate)
            # specloop prints its output alone: its text is matched from the start.
            agrees = agreement(prompt.rstrip()[-48:] + text if arm.startswith('specloop') else text, ref, prompt)
            agree.setdefault(arm, []).append(agrees)
            params = dict(common, arm=arm, prompt=i, rep=rep, agrees=agrees, **extra)
            print(json.dumps({'name': 'peer_llamacpp_run', 'params': params, 'value': round(rate, 1),
                              'unit': 'tokens/s'}), flush=True)

med = {key: statistics.median(v) for key, v in rates.items()}
for (i, arm), v in sorted(med.items()):
    print(json.dumps({'name': 'peer_llamacpp_median', 'params': dict(common, arm=arm, prompt=i, reps=len(rates[(i, arm)])),
                      'value': round(v, 1), 'unit': 'tokens/s'}))
print()
print('| prompt | ' + ' | '.join(arms) + ' |')
print('|---' * (len(arms) + 1) + '|')
for i in range(len(prompts)):
    print('| %d | ' % i + ' | '.join('%.0f' % med[(i, a)] for a in arms) + ' |')
means = {a: statistics.mean(med[(i, a)] for i in range(len(prompts))) for a in arms}
print('| mean | ' + ' | '.join('%.0f' % means[a] for a in arms) + ' |')
print('| text agreeing with specloop_plain (min) | ' + ' | '.join('%.2f' % min(agree[a]) for a in arms) + ' |')
best_llama = max(means[a] for a in arms if a.startswith('llamacpp_d'))
# The same two ratios within each repetition (means over the prompts): their spread.
per_rep = []
for rep in range(int(E['REPS'])):
    m = {a: statistics.mean(rates[(i, a)][rep] for i in range(len(prompts))) for a in arms}
    per_rep.append((m['specloop_auto'] / max(m[a] for a in arms if a.startswith('llamacpp_d')),
                    m['specloop_plain'] / m['llamacpp_plain']))
for name, k in (('specloop_auto_over_best_llamacpp_speculative', 0), ('specloop_plain_over_llamacpp_plain', 1)):
    print(json.dumps({'name': 'peer_llamacpp_' + name, 'params': dict(common, reps=len(per_rep),
                      per_rep=[round(r[k], 3) for r in per_rep]), 'value': round(statistics.median(r[k] for r in per_rep), 3),
                      'unit': 'ratio'}))
print()
print('specloop_auto / best llama.cpp speculative arm (means): %.2fx (repetitions %.2f-%.2f); '
      'specloop_plain / llamacpp_plain: %.2fx (%.2f-%.2f)'
      % (means['specloop_auto'] / best_llama, min(r[0] for r in per_rep), max(r[0] for r in per_rep),
         means['specloop_plain'] / means['llamacpp_plain'], min(r[1] for r in per_rep), max(r[1] for r in per_rep)))
EOF
