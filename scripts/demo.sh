#!/usr/bin/env bash
# `make demo`: a 3A2F AFD deployment (3 attention ranks, 2 FFN ranks, each its own process) of
# models/demo -- a small DeepSeek-V2-style MoE trained on the licences and manuals Debian ships
# (tools/demo_model/train_demo_model.py), with its own tokenizer and chat template -- on the CPU,
# serving the OpenAI API.
#   1. `afd launch` (the tokenizer is the model directory's): prints the rank map, waits for the API;
#   2. one chat request and one streamed completion with curl;
#   3. a short `afd bench serve` and its report;
#   4. SIGTERM: the deployment drains and exits 0 with no process left;
#   5. `afd run --topology 3A2F` against the same model in one process (identical ids).
set -euo pipefail
BUILD_DIR=${1:-build}
AFD="$BUILD_DIR/afd"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="$ROOT/models/demo"
WORK="$(mktemp -d -t afd-demo.XXXXXX)"
LAUNCH_PID=""

cleanup() {
  if [ -n "$LAUNCH_PID" ] && kill -0 "$LAUNCH_PID" 2>/dev/null; then
    kill -KILL "$LAUNCH_PID" 2>/dev/null || true  # its ranks die with it (--exit-with-parent)
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Processes a launcher started: their command line holds "--exit-with-parent PID".
ranks_of() {
  local f
  for f in /proc/[0-9]*/cmdline; do
    if tr '\0' ' ' <"$f" 2>/dev/null | grep -q -- "--exit-with-parent $1 "; then
      f=${f#/proc/}
      echo "${f%/cmdline}"
    fi
  done
}

echo "== afd --version: $("$AFD" --version)"
echo "== afd launch --model models/demo --topology 3A2F --port 0"
"$AFD" launch --model "$MODEL" --topology 3A2F --host 127.0.0.1 \
  --port 0 --log-dir "$WORK/ranks" >"$WORK/launch.log" 2>&1 &
LAUNCH_PID=$!
URL=""
for _ in $(seq 600); do  # 60 s at most
  URL=$(grep -o 'the OpenAI API is up on http://[0-9.:]*' "$WORK/launch.log" | grep -o 'http.*' || true)
  [ -n "$URL" ] && break
  kill -0 "$LAUNCH_PID" 2>/dev/null || break
  sleep 0.1
done
cat "$WORK/launch.log"
if [ -z "$URL" ]; then
  echo "== afd launch did not come up" >&2
  exit 1
fi
echo "== rank processes of afd launch (pid $LAUNCH_PID): $(ranks_of "$LAUNCH_PID" | wc -l)"
NAME=$(curl -sS --max-time 10 "$URL/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')

CHAT='{"model": "'"$NAME"'", "messages": [{"role": "user", "content": "What is free software?"}],
       "max_completion_tokens": 40, "temperature": 0}'
echo
echo "== curl $URL/v1/chat/completions -d '$(echo "$CHAT" | tr -s ' \n' ' ')'"
curl -sS --max-time 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "$CHAT" | python3 -m json.tool
STREAM='{"model": "'"$NAME"'", "prompt": "This program is distributed in the hope", "max_tokens": 24,
         "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}'
echo
echo "== curl -N $URL/v1/completions -d '$(echo "$STREAM" | tr -s ' \n' ' ')'"
echo "   (one SSE chunk per token)"
curl -sSN --max-time 60 "$URL/v1/completions" -H 'Content-Type: application/json' -d "$STREAM" |
  python3 -u -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("data: "):
        continue
    data = line[6:].strip()
    if data == "[DONE]":
        print("   data: [DONE]")
        continue
    chunk = json.loads(data)
    for c in chunk["choices"]:
        print("   chunk: text=%r finish_reason=%s" % (c["text"], c["finish_reason"]))
    if not chunk["choices"] and chunk.get("usage"):
        print("   usage: %s" % json.dumps(chunk["usage"]))
'

echo
echo "== afd bench serve --num-prompts 32 --random-input-len 64 --random-output-len 32 --request-rate inf"
"$AFD" bench serve --base-url "$URL" --model "$NAME" --num-prompts 32 \
  --random-input-len 64 --random-output-len 32 --random-vocab-size 4000 --request-rate inf \
  --ignore-eos --disable-tqdm --request-timeout-s 120

echo
echo "== SIGTERM to afd launch (pid $LAUNCH_PID)"
kill -TERM "$LAUNCH_PID"
for _ in $(seq 600); do  # 60 s at most
  kill -0 "$LAUNCH_PID" 2>/dev/null || break
  sleep 0.1
done
rc=0
wait "$LAUNCH_PID" || rc=$?
tail -n 2 "$WORK/launch.log"
left=$(ranks_of "$LAUNCH_PID" | wc -l)
LAUNCH_PID=""
if [ "$rc" -ne 0 ] || [ "$left" -ne 0 ]; then
  echo "== afd launch exited with status $rc, $left rank process(es) left" >&2
  exit 1
fi
echo "== afd launch exited with status 0; no rank process left"

# Token ids of "The GNU General Public License", "This program is distributed in the hope" and
# the chat prompt of "What is free software?" (models/demo/reference.json's first cases).
PROMPTS=(--prompt-ids 0,2709,922,1100,1013,662 --prompt-ids 0,3652,1271,437,2118,305,300,3045
         --prompt-ids 0,2,58,1844,437,1207,849,34,3)
echo
echo "== afd run --model models/demo --topology 3A2F --max-tokens 16 (rank map, results, stats)"
"$AFD" run --model "$MODEL" --topology 3A2F --max-tokens 16 --show-rank-map --stats \
  "${PROMPTS[@]}"
echo
echo "== the same prompts in one process (monolithic), for comparison"
"$AFD" run --model "$MODEL" --max-tokens 16 "${PROMPTS[@]}"
if diff <("$AFD" run --model "$MODEL" --topology 3A2F --max-tokens 16 --json "${PROMPTS[@]}") \
        <("$AFD" run --model "$MODEL" --max-tokens 16 --json "${PROMPTS[@]}") >/dev/null; then
  echo "== 3A2F output is identical to the monolithic model"
else
  echo "== 3A2F output DIFFERS from the monolithic model" >&2
  exit 1
fi
