#!/bin/sh
# Builds kettle and runs its main job: generating text from the default
# model (models/stories260K.gguf, shipped in the repository so that a fresh
# clone runs; see models/README.md), or from the model and prompt given:
# scripts/run.sh [MODEL [PROMPT]]. Installs missing Debian packages first.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" >/dev/null
./build/kettle run -m "${1:-models/stories260K.gguf}" -p "${2:-Once upon a time}" -n 200
