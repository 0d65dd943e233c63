#!/usr/bin/env python3
"""Companion of figures_check: scripts/check_figures.py must fail on a page with a measured
figure and no command beside it (in its paragraph, its section's sh block, or its table row's
command column), and on a README Measured row quoting a decimal that bench/RESULTS.md does not
hold; name the file and line; and pass on the same pages with the commands and the record."""
import os
import subprocess
import sys
import tempfile

script = sys.argv[1]


def run(readme, doc, results='152 tokens/s, 1.11x one\n'):
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, 'docs'))
        os.makedirs(os.path.join(root, 'bench'))
        with open(os.path.join(root, 'bench', 'RESULTS.md'), 'w') as f:
            f.write(results)
        with open(os.path.join(root, 'README.md'), 'w') as f:
            f.write(readme)
        with open(os.path.join(root, 'docs', 'page.md'), 'w') as f:
            f.write(doc)
        r = subprocess.run([sys.executable, script, root], capture_output=True, text=True)
        return r.returncode, r.stdout


TABLE = '# R\n\n## Measured\n\n| what | figure | command |\n|---|---|---|\n| plain | 152 tokens/s, 1.11x | %s |\n'
SECTION = '# D\n\n## bench\n\n```sh\n%s\n```\n\nHeadline: 1.84x plain.\n\n## other\n\nDefault 4096, 30 s.\n'
PARAGRAPH = '# P\n\nIt ran at 0.95x %s.\n'

ok_readme = TABLE % '`build/bench/engine_bench --reps 31`'
ok_doc = SECTION % 'build/bench/serve_bench --reps 3'
code, out = run(ok_readme, ok_doc)
assert code == 0, out
code, out = run(ok_readme, PARAGRAPH % '(`ctest --test-dir build -R X -V`)')
assert code == 0, out
# A table row whose command cell names no command.
code, out = run(TABLE % 'the same', ok_doc)
assert code == 1 and 'README.md:7:' in out and '152 tokens/s' in out, out
# A headline whose section has no sh block with a command.
code, out = run(ok_readme, SECTION % 'echo hello')
assert code == 1 and 'docs/page.md:9:' in out and '1.84x' in out, out
# A paragraph with a figure and prose alone; a default elsewhere is not a figure.
code, out = run(ok_readme, PARAGRAPH % 'in one run')
assert code == 1 and 'docs/page.md:3:' in out and out.count('no command') == 1, out
# A Measured row whose decimal no recorded run holds.
code, out = run(ok_readme, ok_doc, results='152 tokens/s, 1.12x one\n')
assert code == 1 and 'README.md:7:' in out and '1.11 is not in bench/RESULTS.md' in out, out
print('check_figures: passes with commands and the record, fails without (4 cases)')
