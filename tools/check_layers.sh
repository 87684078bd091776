#!/usr/bin/env bash
# Checks Note [Layers] (CMakeLists.txt): compiled against the include root of
# layer L (<build>/layers/L), one header of every folder L may see compiles,
# and one header of every other folder is not found.
#
#   tools/check_layers.sh <c++ compiler> <build dir>/layers [extra compiler flags...]
set -u -o pipefail
if [[ $# -lt 2 || $1 == -h || $1 == --help ]]; then
  echo "usage: tools/check_layers.sh <c++ compiler> <build dir>/layers [flags...]"
  exit 2
fi
cxx=$1
layers=$(cd "$2" && pwd)
shift 2
# Compile from an empty folder: a quoted include is first looked up beside the
# including file, and the repository root must not be that place.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
# Note [Include paths]: every header is reached as accrue/<folder>/<file>.
declare -A header=([core]=accrue/core/tensor.h [data]=accrue/data/token_shards.h
  [kernels]=accrue/kernels/ops.h [autograd]=accrue/autograd/ops.h [nn]=accrue/nn/module.h
  [optim]=accrue/optim/window.h [dist]=accrue/dist/reducer.h)
failed=0
checked=0
for root in "$layers"/*/; do
  layer=$(basename "$root")
  for folder in "${!header[@]}"; do
    echo "#include \"${header[$folder]}\"" > probe.cpp
    out=$("$cxx" -std=c++20 -fsyntax-only "$@" -I"$root" probe.cpp 2>&1)
    rc=$?
    checked=$((checked + 1))
    if [[ -e "$root/accrue/$folder" && $rc -ne 0 ]]; then
      echo "layer $layer: ${header[$folder]} should compile and does not:"
      echo "$out" | head -n 5
      failed=1
    elif [[ ! -e "$root/accrue/$folder" && ($rc -eq 0 || $out != *"No such file"*) ]]; then
      echo "layer $layer: ${header[$folder]} is above it and was found (exit $rc)"
      failed=1
    fi
  done
done
if [[ $checked -eq 0 ]]; then
  echo "check_layers: no layers under $layers"
  exit 1
fi
[[ $failed -eq 0 ]] && echo "check_layers: ok, $checked includes checked under $layers"
exit $failed
