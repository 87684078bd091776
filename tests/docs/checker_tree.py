"""What the tests of the repository's checkers share: a checker run on a small
tree written to a temporary folder (tests/docs/check_notes_test.py,
tests/docs/check_readme_figures_test.py)."""
import os
import subprocess
import sys
import tempfile


def run_on_tree(checker, files, git=False):
    """Writes files ({relative path: text}) under a fresh folder (a git work
    tree, nothing committed, when git), runs `python checker ROOT` there, and
    returns (exit code, stdout + stderr)."""
    with tempfile.TemporaryDirectory() as root:
        if git:
            subprocess.run(["git", "init", "-q", root], check=True)
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        done = subprocess.run([sys.executable, checker, root], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr
