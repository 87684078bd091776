#!/usr/bin/env python3
"""tools/check_notes.py against small trees with one fault each: every fault
fails the check (exit 1, naming the file and line), and the clean tree and
the allowed forms pass (exit 0); in a git work tree, the files git ignores
are not read and the ones not yet added are.

    python3 tests/docs/check_notes_test.py tools/check_notes.py
"""
import sys

from checker_tree import run_on_tree

# Spelled through NOTE so that this file cites nothing itself.
NOTE = "Note"
DEFINITION = f"// {NOTE} [Foo bar]\n// ~~~~~~~~~~~~~~\n// What holds.\n"


CASES = [
    # (what, files, expected exit code, text the output must hold)
    ("a citation of a written Note", {"a/x.h": DEFINITION, "b/y.cpp": f"// {NOTE} [Foo bar].\n"},
     0, "every citation written"),
    ("a citation wrapped over two comment lines, with its place",
     {"a/x.h": DEFINITION, "b/y.cpp": f"// see {NOTE} [Foo\n// bar] in a/x.h.\n"}, 0, "ok"),
    ("a place given as the path's tail, in backticks",
     {"a/x.h": DEFINITION, "README.md": f"{NOTE} [Foo bar] in `x.h`\n"}, 0, "ok"),
    ("a citation of a Note written nowhere", {"b/y.cpp": f"// {NOTE} [Missing one]\n"},
     1, f"b/y.cpp:1: {NOTE} [Missing one] is cited but defined nowhere"),
    ("a Note defined twice", {"a/x.h": DEFINITION, "a/z.h": DEFINITION},
     1, f"{NOTE} [Foo bar] is defined 2 times"),
    ("a citation that places the Note in the wrong file",
     {"a/x.h": DEFINITION, "b/y.cpp": f"int i;\n// {NOTE} [Foo bar] in a/old.h\n"},
     1, f"b/y.cpp:2: {NOTE} [Foo bar] is said to be in a/old.h, but it is written in a/x.h"),
    ("a wrong place in bench/RESULTS.md, which is history",
     {"a/x.h": DEFINITION, "bench/RESULTS.md": f"{NOTE} [Foo bar] in a/old.h\n"}, 0, "ok"),
    ("a citation of a Note written nowhere in bench/RESULTS.md",
     {"bench/RESULTS.md": f"{NOTE} [Gone]\n"}, 1, "defined nowhere"),
]
# In a git work tree: the files git ignores are not read, the others are,
# added or not.
GIT_CASES = [
    ("git: a citation of a Note written nowhere, in an ignored file",
     {".gitignore": "/scratch/\n", "a/x.h": DEFINITION, "scratch/p.patch": f"+// {NOTE} [Gone]\n"},
     0, "every citation written"),
    ("git: the same citation in a file not yet added",
     {".gitignore": "/scratch/\n", "a/x.h": DEFINITION, "b/p.cpp": f"// {NOTE} [Gone]\n"},
     1, f"b/p.cpp:1: {NOTE} [Gone] is cited but defined nowhere"),
    ("git: a citation in build-gpu/, not searched", {"a/x.h": DEFINITION,
     "build-gpu/gen.h": f"// {NOTE} [Gone]\n"}, 0, "ok"),
]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_notes_test.py tools/check_notes.py")
    failures = 0
    cases = [(c, False) for c in CASES] + [(c, True) for c in GIT_CASES]
    for (what, files, code, expected), git in cases:
        got, output = run_on_tree(sys.argv[1], files, git=git)
        ok = got == code and expected in output
        print(f"{'ok  ' if ok else 'FAIL'} {what}: exit {got} (expected {code})")
        if not ok:
            print(f"     expected output to hold: {expected}\n     got: {output.strip()}")
            failures += 1
    print(f"check_notes_test: {len(cases) - failures} of {len(cases)} cases as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
