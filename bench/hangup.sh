#!/bin/sh
# bench/hangup.sh KETTLE MODEL: how long a request waits behind one whose
# client hung up during prefill (issue 15's measurement).
#
# kettle serve --parallel 1; a ~2,500-token prompt whose client hangs up
# after 1 s (curl --max-time 1), then at once a short request (1 token):
# its wall time is the wait the abandoned prefill costs. Once non-streaming,
# once streaming. Prints one line per case.
set -eu
BIN=${1:?usage: bench/hangup.sh KETTLE MODEL}
MODEL=${2:?usage: bench/hangup.sh KETTLE MODEL}
LOG=$(mktemp)
"$BIN" serve -m "$MODEL" --port 0 --parallel 1 --ctx 4096 -t 2 2>"$LOG" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -f "$LOG"' EXIT
PORT=
for _ in $(seq 600); do
  PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$LOG")
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || { cat "$LOG"; exit 1; }
URL=http://127.0.0.1:$PORT
LONG=$(python3 -c 'print(" ".join(["the quick brown fox jumps over a lazy dog"] * 270))')
N=$(curl -s "$URL/tokenize" -d "{\"content\":\"$LONG\"}" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["tokens"]))')
T=$(curl -s -o /dev/null -w '%{time_total}' "$URL/v1/completions" \
  -d '{"prompt":"Hello","max_tokens":1,"temperature":0}')
echo "baseline: the short request alone took $T s"
for STREAM in false true; do
  curl -s -o /dev/null --max-time 1 "$URL/v1/completions" \
    -d "{\"prompt\":\"$LONG\",\"max_tokens\":16,\"stream\":$STREAM}" || true
  T=$(curl -s -o /dev/null -w '%{time_total}' "$URL/v1/completions" \
    -d '{"prompt":"Hello","max_tokens":1,"temperature":0}')
  echo "stream=$STREAM: prompt of $N tokens abandoned after 1 s; the next request took $T s"
  sleep 1
done
