#!/usr/bin/env python3
"""tools/check_notes.py against small trees with one fault each: every fault
fails the check (exit 1, naming the file and line), and the clean tree and
the allowed forms pass (exit 0).

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


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_notes_test.py tools/check_notes.py")
    failures = 0
    for what, files, code, expected in CASES:
        got, output = run_on_tree(sys.argv[1], files)
        ok = got == code and expected in output
        print(f"{'ok  ' if ok else 'FAIL'} {what}: exit {got} (expected {code})")
        if not ok:
            print(f"     expected output to hold: {expected}\n     got: {output.strip()}")
            failures += 1
    print(f"check_notes_test: {len(CASES) - failures} of {len(CASES)} cases as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
