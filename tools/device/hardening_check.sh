#!/usr/bin/env bash
# One device call for the hardening round (issue 36) and the event-driven front end (issue 38):
#   1. the async connector's device flags still give the monolithic ids (async_quick_check.sh);
#   2. a wedged FFN rank (SIGSTOP) under device flags: the attention rank's stream wait is
#      released by the connector's watchdog and `afd run` fails within a bound, naming the peer;
#   3. `afd serve` on the GPU under issue 38's loads (random ids, ignore_eos), then SIGTERM.
# Usage (repo root there): tools/device/hardening_check.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
AFD="$BIN/afd"
REPORT="$OUT/hardening.txt"
nvidia-smi -L | tee "$REPORT"
status=0

echo "== 1. async connector, device flags, vs monolithic" | tee -a "$REPORT"
bash tools/device/async_quick_check.sh "$BIN" 2>&1 | tee -a "$REPORT" || status=1

echo "== 2. a wedged FFN rank under device flags (T = 8 s)" | tee -a "$REPORT"
CFG='{"afd": {"connector": "AsyncAFDConnector", "afd_process_group_timeout_s": 8}}'
start=$(date +%s.%N)
timeout 120 "$AFD" run --model preset:deepseek-v2-lite --num-layers 3 --device cuda \
  --topology 1A1F --additional-config "$CFG" --prompt-ids 1,2,3 --max-tokens 60000 --ignore-eos \
  >"$OUT/wedge.out" 2>"$OUT/wedge.err" &
RUN=$!
sleep 15
FFN=$(pgrep -f 'afd worker.*"role":"ffn"' | head -1)
echo "ffn pid: ${FFN:-none}" | tee -a "$REPORT"
[ -n "$FFN" ] && kill -STOP "$FFN"
stopped=$(date +%s.%N)
wait $RUN
rc=$?
end=$(date +%s.%N)
[ -n "$FFN" ] && kill -KILL "$FFN" 2>/dev/null
python3 -c "print(f'afd run exit {$rc}, {float($end) - float($stopped):.1f} s after the SIGSTOP')" |
  tee -a "$REPORT"
grep -h -E "timed out|CUDA stream|gave up|heartbeat|error" "$OUT/wedge.err" | head -8 | tee -a "$REPORT"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "wedge: FAIL (rc $rc)" | tee -a "$REPORT"; status=1; }

echo "== 3. afd serve on the GPU, issue 38's loads" | tee -a "$REPORT"
PORT=18300
MODEL=preset:deepseek-v2-lite
"$AFD" serve --model $MODEL --device cuda --host 127.0.0.1 --port $PORT --max-model-len 4096 \
  --max-num-seqs 256 >"$OUT/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 600); do
  grep -q "the OpenAI API is up" "$OUT/serve.log" && break
  kill -0 $SERVER 2>/dev/null || break
  sleep 0.5
done
grep "afd serve" "$OUT/serve.log" | tee -a "$REPORT"
bench() {  # input output concurrency prompts
  echo "-- in $1 / out $2, concurrency $3, $4 prompts" | tee -a "$REPORT"
  "$AFD" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts $4 \
    --random-input-len $1 --random-output-len $2 --random-range-ratio 0 \
    --random-vocab-size 100000 --ignore-eos --request-rate inf --max-concurrency $3 \
    --disable-tqdm --seed 1 2>&1 | grep -E "Successful|Failed|throughput|TTFT|TPOT|ITL|concurrent" |
    tee -a "$REPORT" || status=1
}
if grep -q "the OpenAI API is up" "$OUT/serve.log"; then
  bench 32 512 256 512
  bench 512 256 128 256
  bench 512 256 256 512
  bench 512 256 64 128
  start=$(date +%s.%N)
  curl -s -o /dev/null -w "health under no load: %{http_code} in %{time_total} s\n" \
    "http://127.0.0.1:$PORT/health" | tee -a "$REPORT"
else
  tail -20 "$OUT/serve.log" | tee -a "$REPORT"
  status=1
fi
kill -TERM $SERVER
for _ in $(seq 120); do kill -0 $SERVER 2>/dev/null || break; sleep 0.5; done
kill -0 $SERVER 2>/dev/null && { echo "server alive 60 s after SIGTERM" | tee -a "$REPORT"; kill -9 $SERVER; status=1; }
wait $SERVER
echo "server exit status after SIGTERM: $?" | tee -a "$REPORT"
"$AFD" bench decode --model $MODEL --device cuda --batch 64,256 --context 128 2>&1 | tail -4 |
  tee -a "$REPORT"
exit $status
