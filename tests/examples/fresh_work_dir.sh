# Sourced by the example tests that take a WORK_DIR argument:
#   fresh_work_dir DIR
# empties DIR for this run, but only when DIR is absent, empty, or was made
# by these tests (it holds their marker file): a mistyped argument, say the
# source tree, is refused instead of deleted.
fresh_work_dir() {
  local dir=$1
  if [[ -d $dir && ! -e $dir/.accrue-test-work && -n $(ls -A "$dir") ]]; then
    echo "FAIL: work directory '$dir' holds files these tests did not make; give a new or empty one" >&2
    return 1
  fi
  rm -rf "$dir" && mkdir -p "$dir" && touch "$dir/.accrue-test-work"
}
