#!/usr/bin/env python3
"""Checks that every measured figure in README.md and docs/*.md names the command that printed it.

A measured figure is a speed ratio ("1.84x", "0.95x"), a rate ("235 tokens/s", "26.1 GB/s",
"83,000 steps/s", "36.9 MB per CPU second") or a latency ("325 ms") written as a number.
The text is cut into blocks: a paragraph, a list item or a table row. A block that holds a
measured figure passes when it names a command in inline code, or when the section it stands
in (the text from its heading to the next heading of any level) holds an ```sh block with a
command, as each benchmark's section of docs/benchmarks.md does. A command starts with
`build/`, `./build/`, `bench/`, `ctest`, `specloop ` or `scripts/`. A table whose header has
a "command" column is checked row by row, each row by its own command cell alone. Defaults
and limits (a "4096" or "30 s") are not figures here: the check looks only for the units
above, so it never flags a contract. It checks that a command is named, not that it prints
the figure: that is bench/RESULTS.md's record of each run.

README.md's "## Measured" table is RESULTS' digest: every decimal number of a row's figure
cell ("1.84", "0.986") must also stand in bench/RESULTS.md, so a row cannot quote a figure no
recorded run printed (integers are too common to tell anything and are not checked).

Usage: scripts/check_figures.py [REPO_ROOT]; exit status 1 with one line per figure
without a command (file:line: text) or Measured figure missing from RESULTS.md, 0 when
there is none.
"""
import glob
import os
import re
import sys

FIGURE = re.compile(
    r'\b\d+(?:\.\d+)?x\b'                       # a ratio: 1.84x
    r'|\b\d[\d,.]*\s*(?:tokens/s|GB/s|MB/s|steps/s|records/s|requests/s)'
    r'|\b\d[\d,.]*\s*MB per CPU second'
    r'|\b\d[\d,.]*\s*(?:ms|us)\b')
COMMAND = re.compile(r'`(?:\./)?(?:build/|bench/|ctest\b|specloop |scripts/)[^`]*`')
SH_BLOCK = re.compile(r'^```sh\n(.*?)^```', re.S | re.M)
SH_COMMAND = re.compile(r'^(?:\./)?(?:build/|bench/|ctest\b|specloop |scripts/)', re.M)


def sections(lines):
    """Yields (first line index, lines) per section: a heading and the text up to the next."""
    start = 0
    for i, line in enumerate(lines):
        if line.startswith('#') and i > start:
            yield start, lines[start:i]
            start = i
    yield start, lines[start:]


def blocks(lines):
    """Yields (line index, text, is_table_row) per paragraph, list item or table row;
    fenced code is skipped."""
    para, para_start, fenced = [], 0, False
    for i, line in enumerate(lines):
        if line.startswith('```'):
            fenced = not fenced
            continue
        if fenced:
            continue
        new_item = re.match(r'^\s*(?:[-*]|\d+\.)\s', line) or line.startswith('|')
        if not line.strip() or new_item or line.startswith('#'):
            if para:
                yield para_start, ' '.join(para), False
            para = []
        if line.startswith('|'):
            yield i, line, True
            continue
        if line.strip() and not line.startswith('#'):
            if not para:
                para_start = i
            para.append(line)
    if para:
        yield para_start, ' '.join(para), False


def check_file(path, rel):
    text = open(path, encoding='utf-8').read()
    lines = text.split('\n')
    problems = []
    for sec_start, sec_lines in sections(lines):
        sec_text = '\n'.join(sec_lines)
        section_has_command = any(SH_COMMAND.search(b) for b in SH_BLOCK.findall(sec_text))
        command_column = None
        for offset, block, is_row in blocks(sec_lines):
            if is_row:
                cells = [c.strip() for c in block.strip().strip('|').split('|')]
                if re.match(r'^[-: ]+$', ''.join(cells)):
                    continue
                lowered = [c.lower() for c in cells]
                if command_column is None and 'command' in lowered:
                    command_column = lowered.index('command')
                    continue
            else:
                command_column = None
            figures = [m.group(0) for m in FIGURE.finditer(block)]
            if not figures:
                continue
            if is_row and command_column is not None:
                cells = [c.strip() for c in block.strip().strip('|').split('|')]
                ok = command_column < len(cells) and COMMAND.search(cells[command_column])
            else:
                ok = section_has_command or COMMAND.search(block)
            if not ok:
                problems.append('%s:%d: %s (no command for %s)' % (
                    rel, sec_start + offset + 1, block[:100], ', '.join(figures[:3])))
    return problems


def check_measured_table(readme_path, results_path):
    """Decimals of README's Measured rows that bench/RESULTS.md does not hold."""
    readme = open(readme_path, encoding='utf-8').read()
    if not os.path.exists(results_path):
        return ['bench/RESULTS.md: missing']
    results = open(results_path, encoding='utf-8').read()
    m = re.search(r'^## Measured.*?(?=^## |\Z)', readme, re.S | re.M)
    if not m:
        return ['README.md: no "## Measured" section']
    start = readme[:m.start()].count('\n')
    problems = []
    for offset, line in enumerate(m.group(0).split('\n')):
        if not line.startswith('|') or set(line) <= set('|-: '):
            continue
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) < 2 or cells[0] == 'what':
            continue
        for d in re.findall(r'(?<![\w.])\d+\.\d+(?![\d.])', cells[1]):
            if not re.search(r'(?<![\d.])' + re.escape(d) + r'(?!\d)', results):
                problems.append('README.md:%d: %s (%s is not in bench/RESULTS.md)' % (
                    start + offset + 1, cells[0][:60], d))
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    files = [os.path.join(root, 'README.md')] + sorted(
        glob.glob(os.path.join(root, 'docs', '*.md')))
    problems = []
    for path in files:
        problems += check_file(path, os.path.relpath(path, root))
    problems += check_measured_table(os.path.join(root, 'README.md'),
                                     os.path.join(root, 'bench', 'RESULTS.md'))
    for p in problems:
        print(p)
    if problems:
        print('%d figure(s) without a command or a recorded run' % len(problems))
        return 1
    print('every figure in %d files names its command' % len(files))
    return 0


if __name__ == '__main__':
    sys.exit(main())
