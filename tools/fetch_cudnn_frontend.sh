#!/usr/bin/env bash
# Brings the header-only cuDNN frontend (the include/ folder of the
# nvidia-cudnn-frontend wheel on PyPI) into third_party/cudnn_frontend, where
# CMake finds it (cmake/FindCUDNNFrontend.cmake). Idempotent; without network
# it says so and exits 0: the build then runs attention on the composed path.
set -uo pipefail
cd "$(dirname "$0")/.."
VERSION=${CUDNN_FRONTEND_VERSION:-1.32.0}
DEST=third_party/cudnn_frontend
if [[ -f $DEST/include/cudnn_frontend.h ]]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$VERSION" >/dev/null 2>&1; then
  echo "fetch_cudnn_frontend: could not download nvidia-cudnn-frontend $VERSION;" \
       "attention will use the composed path" >&2
  exit 0
fi
mkdir -p "$DEST"
python3 - "$tmp" "$DEST" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("include/"):
            z.extract(name, sys.argv[2])
PY
echo "fetch_cudnn_frontend: cuDNN frontend $VERSION headers in $DEST/include"
