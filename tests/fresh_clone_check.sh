#!/bin/sh
# fresh_clone_check.sh SRC KETTLE: what a clone of the repository alone
# (no ../shared beside it) needs for its first command (ctest's
# test_fresh_clone):
#   - the default model scripts/run.sh names is in the repository (tracked
#     by git, where SRC is a checkout: an ignored file would not be cloned);
#   - no command in the README's examples reads ../shared;
#   - `kettle run` on that model, from SRC as run.sh runs it, generates.
set -eu
src=$1 kettle=$2
fail() { echo "test_fresh_clone: $*" >&2; exit 1; }

model=$(sed -n 's/.*kettle run -m "${1:-\([^}]*\)}".*/\1/p' "$src/scripts/run.sh")
[ -n "$model" ] || fail "cannot find the default model in scripts/run.sh (kettle run -m \"\${1:-PATH}\")"
[ -f "$src/$model" ] || fail "scripts/run.sh's default model $model is not in the repository"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$src" ls-files --error-unmatch "$model" >/dev/null 2>&1 ||
    fail "scripts/run.sh's default model $model is not tracked by git: a clone would not have it (.gitignore?)"
fi

# the README's examples: its lines indented by four spaces
if grep -n '^    .*\.\./shared' "$src/README.md" >&2; then
  fail "README examples above read ../shared, which only the CI checkout has"
fi

out=$(cd "$src" && "$kettle" run -m "$model" -p "Once upon a time" -n 16 --temp 0 -t 1 2>/dev/null) ||
  fail "kettle run -m $model failed"
[ -n "$out" ] || fail "kettle run -m $model printed nothing"
echo "test_fresh_clone: $model generates: $out"
