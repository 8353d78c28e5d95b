#!/usr/bin/env bash
# One device call: what the front end costs the engine under load (issue 38 item 4). `afd serve`
# (preset:deepseek-v2-lite, bf16, cuda) under `afd bench serve` at concurrency 256 (in 32 / out
# 512) and 64 (in 512 / out 256); /metrics' afd:engine_step_seconds and
# afd:engine_output_delivery_seconds before and after each run give the engine thread's share
# spent handing outputs to the front end.
# Usage (repo root there): tools/device/front_end_cost.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
AFD="$BIN/afd"
REPORT="$OUT/front_end_cost.txt"
PORT=18500
nvidia-smi -L | tee "$REPORT"
"$AFD" serve --model preset:deepseek-v2-lite --device cuda --host 127.0.0.1 --port $PORT \
  --max-model-len 4096 --max-num-seqs 256 >"$OUT/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 600); do
  grep -q "the OpenAI API is up" "$OUT/serve.log" && break
  kill -0 $SERVER 2>/dev/null || break
  sleep 0.5
done
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" '$1 ~ "^"n"[{ ]" {print $2}'; }
status=0
run() {  # in out concurrency prompts
  local s0 d0 s1 d1
  s0=$(metric afd:engine_step_seconds); d0=$(metric afd:engine_output_delivery_seconds)
  echo "-- in $1 / out $2, concurrency $3, $4 prompts" | tee -a "$REPORT"
  "$AFD" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts $4 \
    --random-input-len $1 --random-output-len $2 --random-range-ratio 0 \
    --random-vocab-size 100000 --ignore-eos --request-rate inf --max-concurrency $3 \
    --disable-tqdm --seed 1 2>&1 | grep -E "Successful|Failed|duration|Output token|Mean TPOT" |
    tee -a "$REPORT" || status=1
  s1=$(metric afd:engine_step_seconds); d1=$(metric afd:engine_output_delivery_seconds)
  python3 -c "s=$s1-$s0; d=$d1-$d0; print(f'engine steps {s:.3f} s, output delivery {d*1e3:.2f} ms = {100*d/max(s,1e-9):.3f}% of the steps')" | tee -a "$REPORT"
}
run 32 512 256 512
run 512 256 64 128
kill -TERM $SERVER
wait $SERVER
echo "server exit after SIGTERM: $?" | tee -a "$REPORT"
exit $status
