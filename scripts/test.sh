#!/bin/sh
# Builds kettle and runs every test twice: an optimized build, then a build
# with AddressSanitizer + UBSan; the fault-injection test in a build of its
# own, and the libFuzzer targets' short runs; then
# the engine and server tests once more under ThreadSanitizer (a report
# makes the test, or the kettle serve it started, exit non-zero). Installs
# missing Debian packages first.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
# Disk: at the peak (the ASan stage) the builds, the tests' scratch files
# and the node_modules below take about 4.4 GB (a clean clone, 2026-12-07:
# node_modules 1.2 GB, the ASan build 1.4 GB and its tests' scratch 1.4 GB,
# the rest 0.4 GB; 5.7 GB before the stages emptied their scratch). Say so
# once, up front, rather than let tests fail one by one with "No space
# left on device"; what is already built counts as had.
need_mb=5000
have_mb=$(du -smc build build-asan build-fault build-fuzz build-tsan tests/js/node_modules \
               tests/agents/node_modules 2>/dev/null | tail -1 | cut -f1)
free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
if [ $((free_mb + have_mb)) -lt "$need_mb" ]; then
  echo "scripts/test.sh: the tests need about $need_mb MB of disk in $(pwd) and there are" \
       "$free_mb MB free (plus $have_mb MB already built): free some space first" >&2
  exit 1
fi
# The openai npm package for test_openai_js, when missing or older than the lockfile.
if [ ! -f tests/js/node_modules/.package-lock.json ] ||
   [ -n "$(find tests/js/package-lock.json -newer tests/js/node_modules/.package-lock.json)" ]; then
  npm ci --prefix tests/js --no-audit --no-fund
fi
# The four agent command-line clients for test_agent_* (tests/agents, about
# 1 GB of native binaries, kept apart from tests/js), likewise, but with
# `npm install`: their lockfile pins every version yet lacks the other
# platforms' optional binaries (the registry here serves none of them),
# which `npm ci` takes for a lockfile out of sync and refuses.
if [ ! -f tests/agents/node_modules/.package-lock.json ] ||
   [ -n "$(find tests/agents/package-lock.json -newer tests/agents/node_modules/.package-lock.json)" ]; then
  npm install --prefix tests/agents --no-audit --no-fund
fi
jobs=$(nproc 2>/dev/null || echo 2)
# Each stage's tests write their scratch files (generated models, session
# and cache files) under BUILD/tmp; nothing reads them once the stage has
# passed, so each passing stage empties its own (a failing one keeps them
# for a look, since set -e stops the script there).
# The optimized build compiles the CUDA backend (src/cuda) when nvcc is
# there (KETTLE_CUDA=AUTO); test_cuda reports SKIP without a GPU. The
# sanitizer, fault-injection, fuzz and TSan builds below leave it out
# (-DKETTLE_CUDA=OFF; CMake forces it so anyway): ASan's shadow memory and
# the CUDA driver's address reservations collide, TSan and the fault
# build's --wrap would reach into the static CUDA runtime's own threads
# and allocations, the sanitizers cannot see device code, and nvcc would
# add its compile to each build. src/cuda's C side is built and tested in
# them all the same (test_cuda_host), against cuda_none.c.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
find build/tmp -mindepth 1 -delete
cmake -S . -B build-asan -DKT_SANITIZE=ON -DKETTLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs")
find build-asan/tmp -mindepth 1 -delete
# Fault injection: test_fault makes each allocation and I/O call of model
# load, session files, the disk cache and the server's request path fail
# in turn, in a build of its own (ASan + UBSan, the kernels plain); ctest
# runs every point of the small scenarios and a fixed stride of the large
# ones, about a minute (KT_FAULT_ALL=1 runs them all: docs/ARCHITECTURE.md,
# "Fault injection").
cmake -S . -B build-fault -DKT_FAULT=ON -DKETTLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fault -j"$jobs" --target test_fault
(cd build-fault && ctest --output-on-failure -R '^test_fault$')
find build-fault/tmp -mindepth 1 -delete
# The libFuzzer targets, each a few seconds over its seeds and regressions
# (clang; their own build, see scripts/fuzz_ci.sh).
./scripts/fuzz_ci.sh
tsan_tests='test_engine test_server test_server_held'
cmake -S . -B build-tsan -DKT_TSAN=ON -DKETTLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan -j"$jobs" --target kettle $tsan_tests
(cd build-tsan && ctest --output-on-failure -j"$jobs" -R "^($(echo $tsan_tests | tr ' ' '|'))\$")
find build-tsan/tmp -mindepth 1 -delete
