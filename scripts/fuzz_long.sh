#!/bin/sh
# The long fuzzing runs of docs/PERFORMANCE.md ("Fuzzing"): each
# target named (default: all) for SECONDS (default 600) at the lowest CPU
# priority, one at a time, from its committed seeds and regressions, into a
# scratch corpus under BUILD/fuzz-long/NAME (the committed corpus is never
# written). Logs: BUILD/fuzz-long/NAME.log, ending with libFuzzer's final
# stats. Needs a KT_FUZZ build: CC=clang cmake -S . -B BUILD -DKT_FUZZ=ON.
#   scripts/fuzz_long.sh BUILD [SECONDS] [NAME...]
set -u
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/fuzz_long.sh BUILD [SECONDS] [NAME...]}
secs=${2:-600}
[ $# -ge 2 ] && shift 2 || shift $#
names=${*:-"jinja openai json_schema gbnf gguf tokenize disk_cache"}
for n in $names; do
  out=$build/fuzz-long/$n
  mkdir -p "$out"
  dict=""
  [ -f tests/fuzz/$n.dict ] && dict="-dict=tests/fuzz/$n.dict"
  dirs="$out tests/fuzz/corpus/$n"
  [ -d tests/fuzz/regressions/$n ] && dirs="$dirs tests/fuzz/regressions/$n"
  echo "fuzz_long: $n for $secs s" >&2
  # shellcheck disable=SC2086 # dict and dirs are word lists
  nice -n 19 "$build/fuzz_$n" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out-" $dict $dirs >"$out.log" 2>&1
  echo "fuzz_long: $n exit $?; corpus $(ls "$out" | wc -l) files" >&2
done
