#!/usr/bin/env python3
"""Checks that the README's headline figures point at their evidence.

Each row of README.md's "Headline figures" table names, in its last column,
the section of bench/RESULTS.md that holds the run (in double quotes, a part
of the section's heading). The check fails (exit 1) when a named section is
not a heading of bench/RESULTS.md, when a row names none, or when a link of
the README to a file of the repository (docs/FP8.md, ...) leads nowhere, so a
figure cannot outlive the record it came from.

Usage: check_readme_figures.py [ROOT]   (default: the folder above this script's)
"""

import os
import re
import sys

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def headline_rows(readme):
    """The rows of the table under '## Headline figures', header and rule left out."""
    part = readme.split("## Headline figures", 1)
    if len(part) < 2:
        return None
    rows = []
    for line in part[1].splitlines():
        if line.startswith("## "):
            break
        if line.startswith("|") and not line.startswith("|---") and not line.startswith("| what"):
            rows.append(line)
    return rows


def problems(root):
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(root, "bench", "RESULTS.md"), encoding="utf-8") as f:
        headings = [line for line in f.read().splitlines() if line.startswith("#")]
    found = []
    rows = headline_rows(readme)
    if not rows:
        found.append("README.md: no '## Headline figures' table")
    for row in rows or []:
        what = row.split("|")[1].strip()
        names = re.findall(r'"([^"]+)"', row.rstrip().rstrip("|").rsplit("|", 1)[-1])
        if not names:
            found.append(f"README.md: the figure '{what}' names no section of bench/RESULTS.md")
        for name in names:
            if not any(name in h for h in headings):
                found.append(f"README.md: the figure '{what}' names the section '{name}', "
                             "which is no heading of bench/RESULTS.md")
    for target in LINK.findall(readme):
        if "://" in target:
            continue
        if not os.path.exists(os.path.join(root, target)):
            found.append(f"README.md: the link to {target} leads nowhere")
    return found


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..")
    found = problems(root)
    for p in found:
        print(p)
    if found:
        print(f"check_readme_figures: {len(found)} problem(s)")
        return 1
    print("check_readme_figures: ok, every headline figure names a section of bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
