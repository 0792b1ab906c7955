#!/bin/sh
# Builds kettle and runs every test twice: an optimized build, then a build
# with AddressSanitizer + UBSan; then each libFuzzer target (tests/fuzz/,
# clang) for a few seconds over its seeds and regressions; then the engine and server tests once more
# under ThreadSanitizer (a report makes the test, or the kettle serve it
# started, exit non-zero). Installs missing Debian packages first.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
# The openai npm package for test_openai_js, when missing or older than the lockfile.
if [ ! -f tests/js/node_modules/.package-lock.json ] ||
   [ -n "$(find tests/js/package-lock.json -newer tests/js/node_modules/.package-lock.json)" ]; then
  npm ci --prefix tests/js --no-audit --no-fund
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
cmake -S . -B build-asan -DKT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs")
# The fuzz targets: their own clang build of only what they link (the
# kernels unsanitized, see CMakeLists.txt), 3 s of fuzzing each.
fuzz_targets=$(for f in tests/fuzz/fuzz_*.c; do basename "$f" .c; done)
CC=clang cmake -S . -B build-fuzz -DKT_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
# shellcheck disable=SC2086 # a list of target names
cmake --build build-fuzz -j"$jobs" --target $fuzz_targets
(cd build-fuzz && ctest --output-on-failure -j"$jobs" -R '^test_fuzz_')
tsan_tests='test_engine test_server test_server_held'
cmake -S . -B build-tsan -DKT_TSAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan -j"$jobs" --target kettle $tsan_tests
(cd build-tsan && ctest --output-on-failure -j"$jobs" -R "^($(echo $tsan_tests | tr ' ' '|'))\$")
