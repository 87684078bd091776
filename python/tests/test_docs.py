"""docs/PYTHON.md's Python snippets run as written."""

import pathlib
import re

import accrue

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "PYTHON.md"


def test_python_snippets_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/PYTHON.md has no python snippet"
    for code in blocks:
        scope = {}
        exec(compile(code, str(DOC), "exec"), scope)
    printed = capsys.readouterr().out
    assert printed.count("WindowReport(window=") == 2
    assert "WindowReport(window=2" in printed
    assert scope["window"].windows_closed == 2
    assert isinstance(scope["model"], accrue.nn.Module)
