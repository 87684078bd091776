#!/usr/bin/env bash
# Builds the Python module into build/python-venv (pip install ., the C++
# objects in build/python, reused by later runs) and runs python/tests with
# pytest. `make test` calls it after the C++ tests; without python3 and its
# venv and pip it says so and stops, without failing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1 || ! "$PY" -c "import venv, ensurepip" >/dev/null 2>&1; then
  echo "python tests: skipped (no $PY with venv and pip)"
  exit 0
fi
# Both overridable, to measure a build from nothing (CI's first run).
VENV=${ACCRUE_PYTHON_VENV:-build/python-venv}
BUILD_DIR=${ACCRUE_PYTHON_BUILD_DIR:-build/python}
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# The build requirements, pinned once in pyproject.toml.
mapfile -t requires < <("$VENV/bin/python" - <<'PYEOF'
import re
text = open("pyproject.toml").read()
block = re.search(r"^requires = \[(.*?)\]", text, re.M | re.S).group(1)
print("\n".join(re.findall(r'"([^"]+)"', block)))
PYEOF
)
"$VENV/bin/pip" install -q --disable-pip-version-check "${requires[@]}" numpy pytest
# Warnings are errors here, as in the C++ build (the same flags, so ccache
# reuses build/ci's objects).
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} ACCRUE_WERROR=ON "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation -Cbuild-dir="$BUILD_DIR" .
built=$(date +%s)
# From outside the source tree, so that the installed package is the one tested.
python=$(cd "$VENV" && pwd)/bin/python
(cd python/tests && "$python" -m pytest -q -p no:cacheprovider .)
echo "python tests: module built in $((built - start)) s, tests in $(($(date +%s) - built)) s"
