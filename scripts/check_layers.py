#!/usr/bin/env python3
"""Checks the include graph against the layer order of docs/architecture.md.

The "Layers" section of docs/architecture.md lists the layers lowest first, one per line as
`- name: folder`, or `- name: folder | name: folder ...` for peers: libraries on one line share a
layer and may not include each other. A source file belongs to the library of the longest
folder that contains it; it may include headers of its own library and of libraries on lines
before its own, never of a peer or of one listed after it. Every quoted include of a
repository header must name it by its path from the repository root (e.g.
"common/spec/rrs.h"), so that the folder shows the library.
Files outside the listed folders (tests, fuzzers) may include anything.

Usage: scripts/check_layers.py [REPO_ROOT]; exit status 1 with one line per violation.
"""
import os
import re
import sys


def read_layers(root):
    text = open(os.path.join(root, 'docs', 'architecture.md'), encoding='utf-8').read()
    m = re.search(r'^## Layers\n(.*?)(?=^## |\Z)', text, re.S | re.M)
    if not m:
        sys.exit('docs/architecture.md has no "## Layers" section')
    pair = r'([a-z_]+): `?([A-Za-z0-9_/]+)`?'
    layers = []  # (name, folder, level): level is the line's index, shared by peers
    lines = re.findall(r'^- (' + pair + r'(?:\s*\|\s*' + pair + r')*)\s*$', m.group(1), re.M)
    for level, line in enumerate(lines):
        for name, folder in re.findall(pair, line[0]):
            layers.append((name, folder.rstrip('/'), level))
    if not layers:
        sys.exit('the Layers section lists no "- name: folder" line')
    return layers


def layer_of(path, layers):
    """Index of the library whose folder is the longest prefix of path, or None."""
    best, best_len = None, -1
    for i, (_, folder, _) in enumerate(layers):
        if (path == folder or path.startswith(folder + '/')) and len(folder) > best_len:
            best, best_len = i, len(folder)
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), '..'))
    layers = read_layers(root)
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    errors = []
    checked = 0
    for _, folder, _ in layers:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in names:
                if not name.endswith(('.h', '.cc')):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                mine = layer_of(path, layers)
                if layers[mine][1] != folder:
                    continue  # a subfolder that is its own library: checked on its own walk
                checked += 1
                text = open(os.path.join(root, path), encoding='utf-8').read()
                for inc in include.findall(text):
                    if not os.path.isfile(os.path.join(root, inc)):
                        errors.append(f'{path}: include "{inc}" is not a path from the '
                                      'repository root')
                        continue
                    theirs = layer_of(inc, layers)
                    if theirs is None:
                        errors.append(f'{path}: includes "{inc}", which is in no library')
                    elif layers[theirs][2] > layers[mine][2]:
                        errors.append(f'{path} ({layers[mine][0]}) includes "{inc}" of '
                                      f'{layers[theirs][0]}, a higher layer')
                    elif layers[theirs][2] == layers[mine][2] and theirs != mine:
                        errors.append(f'{path} ({layers[mine][0]}) includes "{inc}" of '
                                      f'{layers[theirs][0]}, a peer')
    for e in errors:
        print(e)
    print(f'check_layers: {checked} files in {len(layers)} libraries on '
          f'{layers[-1][2] + 1} layers, {len(errors)} violation(s)')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
