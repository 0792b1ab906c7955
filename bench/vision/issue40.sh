#!/bin/sh
# issue40.sh - the vision tower's encode time, kettle against llama.cpp's
# llama-mtmd-cli, alternating, on the Qwen3.5-4B-shaped tower (issue 40;
# docs/PERFORMANCE.md, "Vision tower, issue 40").
#
#   bench/vision/issue40.sh KETTLE LLAMA_MTMD_CLI TEXT.gguf TOWER.gguf RUNS IMAGE...
#
# Prints one line per run: image, engine, encode ms, the 1-minute load
# before the run. Both engines get the same text model, tower, image and
# 2 threads; only the encode is timed (kettle: "the vision tower took X
# ms", encode of the preprocessed image; llama-mtmd-cli: "mtmd batch
# encoding done in X ms", mtmd_batch_encode of the preprocessed image).
set -u
kettle=$1 mtmd=$2 text=$3 tower=$4 runs=$5
shift 5
for img in "$@"; do
    r=1
    while [ "$r" -le "$runs" ]; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        ms=$("$kettle" run -m "$text" --mmproj "$tower" --image "$img" -p "<__media__> describe" -n 1 -t 2 2>&1 |
            sed -n 's/.*the vision tower took \([0-9.]*\) ms.*/\1/p')
        echo "$(basename "$img") kettle $ms ms (load $load)"
        load=$(cut -d' ' -f1 /proc/loadavg)
        out=$("$mtmd" -m "$text" --mmproj "$tower" --image "$img" -p describe -n 1 -t 2 2>&1)
        ms=$(echo "$out" | sed -n 's/.*mtmd batch encoding done in \([0-9]*\) ms.*/\1/p')
        fa=$(echo "$out" | grep -o "flash attention is [a-z]*" | head -1)
        echo "$(basename "$img") llama.cpp $ms ms (load $load; $fa)"
        r=$((r + 1))
    done
done
