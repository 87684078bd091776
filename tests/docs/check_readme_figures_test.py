#!/usr/bin/env python3
"""tools/check_readme_figures.py against small trees with one fault each: every
fault fails the check (exit 1, naming the figure or the link), and the clean
tree passes (exit 0).

    python3 tests/docs/check_readme_figures_test.py tools/check_readme_figures.py
"""
import sys

from checker_tree import run_on_tree

RESULTS = "# Results\n\n## GEMMs beside llm.c: one H200, 2026-11-29\n\n### Call 2, the FP8 casts\n"
TABLE = ("## Headline figures\n\n| what | figure | section of `bench/RESULTS.md` |\n"
         "|---|---|---|\n")
DOCS = {"docs/FP8.md": "# FP8\n"}


def readme(rows, links="See [FP8](docs/FP8.md) and [CUDA](https://docs.nvidia.com/cuda/).\n"):
    return "# accrue\n\n" + links + "\n" + TABLE + "".join(r + "\n" for r in rows) + "\n## Next\n"


GOOD = '| GEMMs | 1.05x llm.c | "GEMMs beside llm.c" |'
CASES = [
    # (what, files, expected exit code, text the output must hold)
    ("rows naming a section and a subsection",
     {"README.md": readme([GOOD, '| casts | 0.8 of copy | "Call 2, the FP8 casts" |']),
      "bench/RESULTS.md": RESULTS, **DOCS}, 0, "ok"),
    ("a section that is no heading",
     {"README.md": readme([GOOD, '| casts | 0.8 | "The casts of last week" |']),
      "bench/RESULTS.md": RESULTS, **DOCS},
     1, "the figure 'casts' names the section 'The casts of last week', which is no heading"),
    ("a row naming no section",
     {"README.md": readme([GOOD, "| casts | 0.8 | the casts |"]),
      "bench/RESULTS.md": RESULTS, **DOCS}, 1, "the figure 'casts' names no section"),
    ("a link to a file that is not there",
     {"README.md": readme([GOOD], links="See [FP8](docs/FP9.md).\n"),
      "bench/RESULTS.md": RESULTS, **DOCS}, 1, "the link to docs/FP9.md leads nowhere"),
    ("no headline table", {"README.md": "# accrue\n", "bench/RESULTS.md": RESULTS},
     1, "no '## Headline figures' table"),
]


def main(argv):
    checker = argv[1]
    failures = 0
    for what, files, code, text in CASES:
        got, out = run_on_tree(checker, files)
        if got != code or text not in out:
            failures += 1
            print(f"FAIL {what}: exit {got} (expected {code}); output:\n{out}")
    if failures:
        print(f"check_readme_figures_test: {failures} failure(s)")
        return 1
    print(f"check_readme_figures_test: ok, {len(CASES)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
