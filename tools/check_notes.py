#!/usr/bin/env python3
"""Checks that every cited Note is written somewhere in the repository, and
written where a citation says it is.

The code documents its invariants as Notes: a definition is a comment line
holding only the Note's name in brackets, after the word Note, with a line of
tildes under it,

    // Note [<name>]
    // ~~~~~~~~~~~~~
    // What holds, and why.

(or the same with '#' comments in CMake, shell and Python files). Anywhere
else, the word Note followed by a bracketed name is a citation, which may wrap
across comment lines. A citation without a definition, or a name defined
twice, makes the check fail (exit 1) with file:line of each. So does a
citation that says where the Note is ("Note [<name>] in dir/file.h", the path
whole or its tail) and names another file than the definition's: a moved
Note takes its pointers along. bench/RESULTS.md is history, so its places
are not checked (its citations are). build*/, third_party/ and .git/ are not
searched; in a git work tree neither are the files git ignores (a scratch
folder of patches, say), so that a run here reads what a clean clone holds
plus the files not yet added.

Usage: check_notes.py [ROOT] [--list]
  ROOT    the repository root (default: the folder above this script's)
  --list  also print every defined Note with its place and citation count
"""

import os
import re
import subprocess
import sys

SKIP_DIRS = {".git", "third_party"}
MAX_BYTES = 4 << 20  # larger files are data (fixtures, shards), not code

# A name starts with a letter or digit, so that placeholders such as the
# docstring's "<name>" are neither citations nor definitions. A citation is
# "Note" then a bracketed name. Whitespace inside the name,
# including a line break, counts as one space.
CITATION = re.compile(r"\bNote\s+\[([A-Za-z0-9][^\[\]]{0,100}?)\]")
DEFINITION = re.compile(r"^\s*(?://+|#+)\s*Note \[([A-Za-z0-9][^\[\]]*)\]\s*$")
UNDERLINE = re.compile(r"^\s*(?://+|#+)\s*~{3,}\s*$")
# Comment leaders removed before lines are joined, so that a citation wrapped
# from one comment line to the next reads as one.
LEADER = re.compile(r"^\s*(?://+|#+|/?\*+|>+)?\s*")
# What may follow a citation to say where the Note is written: " in
# kernels/conv.h", " in `optim/window.h`".
PLACE = re.compile(r"\s+in\s+`?([\w./-]+\.(?:h|cpp|cu|cuh|inc|py|sh|cmake|txt|md))`?")
HISTORY = {os.path.join("bench", "RESULTS.md")}  # places as of when written


def git_files(root):
    """The files under root that git tracks or would (untracked, not ignored),
    relative to root; None outside a git work tree or without git."""
    try:
        done = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                               "--exclude-standard"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return sorted(p for p in done.stdout.decode("utf-8", errors="replace").split("\0") if p)


def skipped(rel):
    """Whether rel lies in a folder that is not searched (SKIP_DIRS, build*)."""
    folders = rel.split("/")[:-1]
    return any(d in SKIP_DIRS or d.startswith("build") for d in folders)


def walked_files(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build"))
        for name in sorted(files):
            yield os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")


def source_files(root):
    listed = git_files(root)
    for rel in walked_files(root) if listed is None else (r for r in listed if not skipped(r)):
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) > MAX_BYTES:
            continue  # deleted from the work tree, a link, or data
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data:
            continue  # binary
        yield rel, data.decode("utf-8", errors="replace")


def scan(rel, text, definitions, citations, placed=None):
    lines = text.splitlines()
    defining = set()  # line numbers of definitions, which cite nothing
    for i, line in enumerate(lines):
        m = DEFINITION.match(line)
        if m and i + 1 < len(lines) and UNDERLINE.match(lines[i + 1]):
            definitions.setdefault(m.group(1), []).append((rel, i + 1))
            defining.add(i + 1)
    # Join the lines without their comment leaders, remembering where each
    # line starts, so that a wrapped citation is found and placed on the line
    # where it begins.
    starts, parts, offset = [], [], 0
    for line in lines:
        body = LEADER.sub("", line, count=1)
        starts.append(offset)
        parts.append(body)
        offset += len(body) + 1
    joined = "\n".join(parts)
    line_no = 0
    for m in CITATION.finditer(joined):
        while line_no + 1 < len(starts) and starts[line_no + 1] <= m.start():
            line_no += 1
        if line_no + 1 in defining:
            continue
        name = " ".join(m.group(1).split())
        citations.setdefault(name, []).append((rel, line_no + 1))
        place = PLACE.match(joined, m.end())
        if place and placed is not None and rel not in HISTORY:
            placed.append((name, place.group(1), rel, line_no + 1))


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    flags = [a for a in argv[1:] if a.startswith("--")]
    unknown = [f for f in flags if f != "--list"]
    if unknown or len(args) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        print(f"check_notes: {root} is not a directory", file=sys.stderr)
        return 2

    definitions, citations, placed = {}, {}, []
    for rel, text in source_files(root):
        scan(rel, text, definitions, citations, placed)

    if "--list" in flags:
        for name in sorted(definitions, key=str.lower):
            where = ", ".join(f"{f}:{n}" for f, n in definitions[name])
            print(f"Note [{name}]  defined at {where}, cited {len(citations.get(name, []))} times")

    problems = []
    for name, places in sorted(citations.items()):
        if name not in definitions:
            for f, n in places:
                problems.append(f"{f}:{n}: Note [{name}] is cited but defined nowhere")
    for name, defined in sorted(definitions.items()):
        if len(defined) > 1:
            where = ", ".join(f"{f}:{n}" for f, n in defined)
            problems.append(f"Note [{name}] is defined {len(defined)} times: {where}")
    for name, place, f, n in placed:
        defined = definitions.get(name, [])
        if defined and not any(d == place or d.endswith("/" + place) for d, _ in defined):
            problems.append(f"{f}:{n}: Note [{name}] is said to be in {place}, "
                            f"but it is written in {defined[0][0]}")

    cited = sum(len(p) for p in citations.values())
    if problems:
        print("\n".join(problems))
        print(f"check_notes: {len(problems)} problem(s); {len(definitions)} Notes defined, "
              f"{cited} citations of {len(citations)} names", file=sys.stderr)
        return 1
    print(f"check_notes: ok, {len(definitions)} Notes defined, {cited} citations of "
          f"{len(citations)} names, every citation written (and where placed, placed right)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
