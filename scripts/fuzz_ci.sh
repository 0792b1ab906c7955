#!/bin/sh
# The libFuzzer targets (tests/fuzz/) built with clang and each run for a
# few seconds over its seeds and regressions (ctest's test_fuzz_*): their
# own build of only what they link, the kernels unsanitized (see
# CMakeLists.txt). About 100 s on 2 cores; scripts/test.sh runs it.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
fuzz_targets=$(for f in tests/fuzz/fuzz_*.c; do basename "$f" .c; done)
# no CUDA backend in the fuzz build (scripts/test.sh says why)
CC=clang cmake -S . -B build-fuzz -DKT_FUZZ=ON -DKETTLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
# shellcheck disable=SC2086 # a list of target names
cmake --build build-fuzz -j"$jobs" --target $fuzz_targets
(cd build-fuzz && ctest --output-on-failure -j"$jobs" -R '^test_fuzz_')
