#!/usr/bin/python3
"""Every reference to a project file in the tree resolves.

  check_links.py SOURCE_DIR

Looks, in the tracked text files, for paths under docs/ ("docs/errors.md")
anywhere, and for relative Markdown links ("[errors](docs/errors.md)",
"[x](../README.md#part)") in *.md files; each must name an existing file
(docs/ paths from the repository root, Markdown links from the linking
file's folder). Prints every broken one with its file and line; exit 1 if
any. Run by CTest as docs_links.
"""
import re
import subprocess
import sys
from pathlib import Path

DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.md")
MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def tracked_files(root):
    """The repository's files (git ls-files), or a walk without build output."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files"], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        return [root / f for f in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "build-debian", "out"}
        return [p for p in root.rglob("*") if p.is_file() and not set(p.parts) & skip]


def main(root):
    root = Path(root).resolve()
    broken = []
    for path in tracked_files(root):
        rel = path.relative_to(root)
        if rel.parts[0] == "bench" and "results" in rel.parts:
            continue  # recorded commands, not references
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in DOCS_PATH.finditer(line):
                if not (root / m.group(0)).exists():
                    broken.append(f"{rel}:{n}: {m.group(0)} does not exist")
            if path.suffix != ".md":
                continue
            for m in MD_LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue  # https:, mailto:
                if not (path.parent / target).exists():
                    broken.append(f"{rel}:{n}: link {target} does not exist")
    for b in broken:
        print(b)
    print(f"check_links: {len(broken)} broken reference(s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]))
