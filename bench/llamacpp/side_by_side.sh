#!/bin/bash
# side_by_side.sh - kettle bench and llama.cpp's own llama-bench on the same
# model files, interleaved per model, so that both see the machine in the
# same state (on a shared host its memory bandwidth moves by 2x within an
# hour: compare only figures taken side by side).
#
#   bench/llamacpp/side_by_side.sh LLAMA_BENCH[,LLAMA_BENCH...] KETTLE PASSES MODEL.gguf...
#
# LLAMA_BENCH: a llama-bench binary (docs/PERFORMANCE.md says how to build
# one from the llama.cpp sources node-llama-cpp ships), or several
# separated by commas (two llama.cpp builds, each run in turn before
# kettle); KETTLE: a kettle binary. Per model, each pass prints the read
# bandwidth of the moment (decode ratios shrink when the host's bandwidth
# falls and both engines meet it), each llama.cpp's pp512/tg128 (after a
# line naming the binary) and kettle's (2 threads, means of 3 runs).
# `node bench/llamacpp/ratios.mjs OUTPUT...` turns the output into the
# kettle / llama.cpp table.
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 LLAMA_BENCH[,LLAMA_BENCH...] KETTLE PASSES MODEL.gguf..." >&2
    exit 2
fi
IFS=, read -r -a LBS <<< "$1"
K=$2 PASSES=$3
shift 3
for pass in $(seq 1 "$PASSES"); do
    echo "=== pass $pass $(date +%T)"
    for m in "$@"; do
        echo "=== pass $pass $(basename "$m") $(date +%T) load $(cut -d' ' -f1 /proc/loadavg), $("$K" bench --membw -t 2 2>&1 | tail -1)"
        for lb in "${LBS[@]}"; do
            echo "--- $lb"
            "$lb" -m "$m" -p 512 -n 128 -t 2 -r 3 -o md 2>/dev/null | grep -E "pp512|tg128"
        done
        "$K" bench -m "$m" -p 512 -n 128 -t 2 -r 3 --md 2>/dev/null | grep -E "pp|tg"
    done
done
