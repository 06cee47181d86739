#!/usr/bin/env python3
"""Docs that compile: every ```cpp block of README.md and docs/*.md must be
part of a program under examples/, which the build compiles and CTest runs.

A block matches a file when its lines appear there as consecutive lines,
each with the same added indentation (a fragment of README may sit inside a
function body in the example). Blank lines match blank lines. Any other
difference, a changed comment or a renamed variable, is a mismatch: edit
the example and the document together.

Usage: check_snippets.py [REPO_ROOT]   (default: the parent of this folder)
Exit status 0 when every block matches; 1 naming each block that does not
(document, line, first lines, and the example file closest to it).
"""
import difflib
import pathlib
import re
import sys

FENCE = re.compile(r"^```cpp\s*$")


def cpp_blocks(doc):
    """(first line number, [lines]) of each ```cpp block of `doc`."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if current is None:
            if FENCE.match(line):
                current, start = [], number + 1
        elif line.startswith("```"):
            blocks.append((start, current))
            current = None
        else:
            current.append(line)
    if current is not None:
        raise SystemExit(f"{doc}:{start - 1}: unterminated ```cpp block")
    return blocks


def matches_at(block, lines, at):
    """Whether block == lines[at:at+len(block)] up to one common indentation."""
    indent = None
    for want, have in zip(block, lines[at:at + len(block)]):
        if not want.strip():
            if have.strip():
                return False
            continue
        if not have.endswith(want):
            return False
        prefix = have[: len(have) - len(want)]
        if prefix.strip() or (indent is not None and prefix != indent):
            return False
        indent = prefix
    return True


def contains(block, lines):
    if not block:
        return True
    return any(matches_at(block, lines, at) for at in range(len(lines) - len(block) + 1))


def closest(block, sources):
    """(file, diff lines) for the example region most like `block`: the file
    with the longest common run of stripped lines, aligned on that run."""
    want = [l.strip() for l in block]
    best, best_size, diff = None, 0, []
    for path, lines in sources.items():
        have = [l.strip() for l in lines]
        m = difflib.SequenceMatcher(None, want, have, autojunk=False)
        match = m.find_longest_match(0, len(want), 0, len(have))
        if match.size > best_size:
            first = max(match.b - match.a, 0)
            region = have[first:first + len(want)]
            best, best_size = path, match.size
            diff = list(difflib.unified_diff(region, want, "example", "document", n=0,
                                             lineterm=""))[2:12]
    return best, diff


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    examples = root / "examples"
    sources = {p: p.read_text().splitlines()
               for p in sorted(examples.rglob("*")) if p.suffix in (".cc", ".h")}
    docs = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    failures, checked, missing = [], 0, 0
    for doc in docs:
        for start, block in cpp_blocks(doc):
            checked += 1
            if any(contains(block, lines) for lines in sources.values()):
                continue
            missing += 1
            head = next((l.strip() for l in block if l.strip()), "(empty)")
            near, diff = closest(block, sources)
            hint = f"; closest: {near.relative_to(root)}" if near else ""
            failures.append(f"{doc.relative_to(root)}:{start}: the ```cpp block starting "
                            f"'{head}' is not verbatim in any file under examples/{hint}")
            failures.extend("    " + d for d in diff)
    for f in failures:
        print(f)
    print(f"check_snippets: {checked - missing} of {checked} C++ blocks found in examples/")
    return 1 if missing or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
