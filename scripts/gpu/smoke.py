#!/usr/bin/env python3
"""The GPU harness's smoke run (scripts/gpu/run.sh): `specloop generate` end to end on a device.

Takes the target-6m golden row (golden-greedy.jsonl: the PyTorch reference's greedy ids) with the
widest top-1 margin among those whose prompt is under 200 tokens (their text encodes to
`input_ids` exactly), and runs `specloop generate --draft draft-mix-1m --temperature 0` on the
CPU and on DEVICE. Each run's prompt ids must equal the row's `input_ids` and its tokens the
row's `generated` (greedy speculative decoding gives plain greedy output). Writes each run's
JSON to OUT_DIR/generate-<device>.json. Exit status 0 if both match, 1 otherwise.

Usage: smoke.py SPECLOOP_BINARY MODELS_DIR DEVICE OUT_DIR   (standard library only)
"""
import json
import os
import subprocess
import sys


def pick_row(golden_path):
    rows = [json.loads(line) for line in open(golden_path, encoding='utf-8') if line.strip()]
    usable = [r for r in rows if len(r['input_ids']) < 200]
    if not usable:
        sys.exit(f'smoke: no golden row under 200 tokens in {golden_path}')

    def margin(r):  # smallest top-1 minus top-2 log-prob over the generated positions
        return min(top[0][1] - top[1][1] for top in r['top5_logprobs'])

    best = max(usable, key=margin)
    return best, margin(best)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    binary, models, device, out_dir = sys.argv[1:]
    row, margin = pick_row(os.path.join(models, 'target-6m', 'golden-greedy.jsonl'))
    expected = row['generated']
    print(f'smoke: golden {row["domain"]} row, {len(row["input_ids"])} prompt ids, '
          f'{len(expected)} generated, top-1 margin {margin:.3f}')
    ok = True
    for dev in dict.fromkeys(['cpu', device]):  # the CPU first; once if DEVICE is cpu
        cmd = [binary, 'generate', '--model', os.path.join(models, 'target-6m'),
               '--draft', os.path.join(models, 'draft-mix-1m'), '--device', dev,
               '--prompt', row['prompt'], '--max-tokens', str(len(expected)),
               '--temperature', '0', '--ignore-eos', '--k', '4', '--json']
        run = subprocess.run(cmd, capture_output=True, text=True)
        with open(os.path.join(out_dir, f'generate-{dev}.json'), 'w', encoding='utf-8') as f:
            f.write(run.stdout)
        if run.returncode != 0:
            print(f'smoke: {dev}: exit status {run.returncode}: {run.stderr.strip()}')
            ok = False
            continue
        r = json.loads(run.stdout)
        tokens = r.get('tokens', [])
        print(f'smoke: {dev}: {r.get("tokens_per_second", 0):.0f} tokens/s, acceptance '
              f'{r.get("acceptance_rate")}, {r.get("tokens_per_step")} tokens/step')
        if r.get('prompt_tokens') != row['input_ids']:
            print(f'smoke: {dev}: prompt ids differ from the golden input_ids')
            ok = False
        if tokens != expected:
            first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b),
                         min(len(tokens), len(expected)))
            print(f'smoke: {dev}: tokens differ from the golden ids from position {first}: '
                  f'{tokens[first:first + 5]} vs {expected[first:first + 5]}')
            ok = False
        else:
            print(f'smoke: {dev}: the {len(tokens)} tokens equal the golden greedy ids')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
