#!/bin/sh
# gpu_check.sh - the one prepared script for a session lent a GPU (issue
# 41; the `device` tool's machine: one H100, sm_90, 16 cores, no network,
# only this repository: ../shared does not travel). Under 8 minutes there:
#   1. the machine: GPU, driver, nvcc, cmake, compilers (printed, for the record);
#   2. a Release build of test_cuda alone, CUDA for sm_90 (KT_DEVICE_CHECK:
#      cmake/device_check.cmake), which needs nvcc, CMake and a C compiler
#      and none of the Debian dev packages of the full build (jansson,
#      pcre2, xxhash, png, jpeg, webp, microhttpd, curl, nettle, cmocka:
#      scripts/deps.sh installs them; that machine has no apt access);
#   3. test_cuda with KT_CUDA_REQUIRE=1: every kernel against its CPU twin
#      (a missing GPU fails instead of skipping), then the matmul speed table;
#   4. where compute-sanitizer is there, test_cuda again under its memcheck
#      without the timing (time-boxed; not finishing is reported, not
#      failed), also after a failure in 3, which it may explain.
# Everything goes to stdout; the exit status is non-zero on any failure.
#
#   scripts/gpu_check.sh                      # sm_90
#   KT_CUDA_ARCH=90a scripts/gpu_check.sh     # another CMAKE_CUDA_ARCHITECTURES
#
# From the device tool: run(command="sh scripts/gpu_check.sh 2>&1", timeout_s=480),
# from a checkout that holds this branch (the tool sends the session's
# own checkout). Not yet here: the goldens through the GPU, the GPU forward
# pass, llama.cpp beside it (issue 41's later steps).
set -eu
cd "$(dirname "$0")/.."
t0=$(date +%s)
arch=${KT_CUDA_ARCH:-90}
jobs=${KT_JOBS:-$(nproc 2>/dev/null || echo 4)} # KT_JOBS: a shared machine
step() { printf '\n== %s (%ss)\n' "$1" $(( $(date +%s) - t0 )); }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv 2>&1 || echo "nvidia-smi: not there"
NVCC=$(command -v nvcc 2>/dev/null || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then
  echo "gpu_check: no nvcc on PATH or in /usr/local/cuda/bin: this script needs the CUDA toolkit" >&2
  exit 1
fi
"$NVCC" --version | tail -2
ls "$(dirname "$NVCC")"/../lib64/libcudart_static.a 2>&1 || true
cmake --version | head -1
cc --version | head -1
git log -1 --format='commit %h %s' 2>/dev/null || true

step "configure + build test_cuda (Release, CUDA architectures $arch, -j$jobs)"
gen=""
command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
# shellcheck disable=SC2086 # gen is one option pair or nothing
cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DKT_DEVICE_CHECK=ON -DKETTLE_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$arch"
cmake --build build-gpu -j"$jobs" --target test_cuda

step "test_cuda: every kernel against its CPU twin, then the matmul speed"
# a failure does not stop the script: memcheck below is what explains a crash
set +e
KT_CUDA_REQUIRE=1 ./build-gpu/test_cuda
test_rc=$?
set -e
[ "$test_rc" -ne 0 ] && echo "gpu_check: test_cuda failed (exit $test_rc)"

CS=$(command -v compute-sanitizer 2>/dev/null || true)
[ -z "$CS" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && CS=/usr/local/cuda/bin/compute-sanitizer
if [ -n "$CS" ]; then
  step "test_cuda under compute-sanitizer memcheck (checks only, at most 150 s)"
  set +e
  KT_CUDA_REQUIRE=1 KT_CUDA_NO_TIMING=1 timeout 150 "$CS" --tool memcheck --error-exitcode 3 ./build-gpu/test_cuda
  rc=$?
  set -e
  if [ "$rc" -eq 124 ]; then
    echo "gpu_check: memcheck did not finish in 150 s: inconclusive, not a failure"
  elif [ "$rc" -ne 0 ]; then
    echo "gpu_check: memcheck run failed (exit $rc)"
    test_rc=1
  fi
else
  echo "gpu_check: no compute-sanitizer: memcheck skipped"
fi
if [ "$test_rc" -ne 0 ]; then
  step "done: FAILED (see above)"
  exit 1
fi
step "done: every check passed"
