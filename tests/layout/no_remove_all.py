#!/usr/bin/env python3
"""The product's code does not call std::filesystem::remove_all (use RemoveTree).

Why: LibTorch's pip wheels export their own copies of the std::filesystem functions from
libtorch.so; a binary linked against one calls those, and remove_all's there crashed (torch
2.11 + CUDA 13: `specloop up` on stop; common/base/remove_tree.h). CI never builds against such
a LibTorch, so this check is what keeps the call out.

Usage: no_remove_all.py REPO_ROOT; exit status 1 with one line per call found. It first checks
itself on a planted call.
"""
import os
import re
import sys
import tempfile

FOLDERS = ['common', 'serve', 'trainer', 'buffer', 'tests/testing']
CALL = re.compile(r'\bremove_all\s*\(')


def calls(root):
    found = []
    for folder in FOLDERS:
        for d, _, files in os.walk(os.path.join(root, folder)):
            for f in files:
                if not f.endswith(('.cc', '.h')):
                    continue
                path = os.path.join(d, f)
                for n, line in enumerate(open(path, encoding='utf-8'), 1):
                    code = line.split('//', 1)[0]
                    if CALL.search(code):
                        found.append('%s:%d: %s' % (os.path.relpath(path, root), n, line.strip()))
    return found


def main():
    with tempfile.TemporaryDirectory() as planted:
        os.makedirs(os.path.join(planted, 'buffer'))
        with open(os.path.join(planted, 'buffer', 'x.cc'), 'w') as f:
            f.write('void F() { std::filesystem::remove_all(p, ec); }\n')
        if len(calls(planted)) != 1:
            sys.exit('no_remove_all.py: missed a planted call')
    found = calls(sys.argv[1])
    for line in found:
        print(line + '  (use RemoveTree, common/base/remove_tree.h)')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
