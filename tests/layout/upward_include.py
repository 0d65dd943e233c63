#!/usr/bin/env python3
"""Companion of layers_check: scripts/check_layers.py must fail on a tree whose lower library
includes its upper one, on a library that includes its peer (two on one layer), and on an
include that is not a path from the root; and pass on the same tree without them."""
import os
import subprocess
import sys
import tempfile

script = sys.argv[1]


def run(files):
    with tempfile.TemporaryDirectory() as root:
        files = dict(files)
        files['docs/architecture.md'] = ('# A\n\n## Layers\n\n- low: low\n- left: left | right: right\n'
                                         '- high: high\n')
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), 'w') as f:
                f.write(text)
        r = subprocess.run([sys.executable, script, root], capture_output=True, text=True)
        return r.returncode, r.stdout


ok_tree = {'low/a.h': '#pragma once\n', 'left/l.h': '#include "low/a.h"\n',
           'right/r.h': '#include "low/a.h"\n',
           'high/b.h': '#include "low/a.h"\n#include "left/l.h"\n#include "right/r.h"\n'}
code, out = run(ok_tree)
assert code == 0, out
code, out = run({**ok_tree, 'low/c.cc': '#include "high/b.h"\n'})
assert code == 1 and 'low/c.cc (low) includes "high/b.h" of high' in out, out
code, out = run({**ok_tree, 'left/c.cc': '#include "high/b.h"\n'})
assert code == 1 and 'left/c.cc (left) includes "high/b.h" of high, a higher layer' in out, out
code, out = run({**ok_tree, 'right/c.cc': '#include "left/l.h"\n'})
assert code == 1 and 'right/c.cc (right) includes "left/l.h" of left, a peer' in out, out
code, out = run({**ok_tree, 'high/d.cc': '#include "a.h"\n'})
assert code == 1 and 'not a path from the repository root' in out, out
print('check_layers catches an upward include, a peer include and a relative include')
