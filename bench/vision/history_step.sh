#!/bin/sh
# history_step.sh - what the screenshots already in an agent's history cost
# a step when everything about them is cached (issue 40;
# docs/PERFORMANCE.md, "The screenshot loop"): one server at a time,
# started fresh; a prepared-step request (max_tokens 0) with N screenshots
# (bench/vision/history_req.py) sent once (every image encoded, its KV
# cached), then REPEAT more times, each timed by curl: the HTTP body, the
# images' bytes, the prompt, the prefix cache and the last block's
# prefill, nothing encoded again.
#
#   bench/vision/history_step.sh KETTLE TEXT.gguf TOWER.gguf N REPEAT [PORT]
set -eu
kettle=$1 text=$2 tower=$3 n=$4 repeat=$5 port=${6:-8095}
req=$(mktemp /tmp/history_req.XXXXXX.json)
python3 "$(dirname "$0")/history_req.py" "$n" "$req"
"$kettle" serve -m "$text" --mmproj "$tower" -t 2 --port "$port" --ctx 16384 > /dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$req"' EXIT
i=0
until curl -s "localhost:$port/health" | grep -q ok; do
    i=$((i + 1)); [ "$i" -gt 300 ] && { echo "history_step: the server did not start" >&2; exit 1; }; sleep 1
done
curl -s -o /dev/null -w "first (every image encoded) %{time_total} s\n" -H 'Content-Type: application/json' \
    --data-binary @"$req" "localhost:$port/v1/chat/completions"
r=1
while [ "$r" -le "$repeat" ]; do
    curl -s -o /dev/null -w "again %{time_total} s\n" -H 'Content-Type: application/json' \
        --data-binary @"$req" "localhost:$port/v1/chat/completions"
    r=$((r + 1))
done
curl -s "localhost:$port/metrics" | grep -E '^kettle_image_(encodes|decodes|decodes_skipped)_total ' || true
