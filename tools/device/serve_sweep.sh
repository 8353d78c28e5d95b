#!/usr/bin/env bash
# One device call: `afd serve` (preset:deepseek-v2-lite, bf16, cuda) at concurrency 1024 with
# --max-num-seqs 1024 (issue 38), and in 512 / out 256 at concurrency 64 under several
# --max-num-batched-tokens (the chunk of prefill a step carries: TPOT and P99 ITL against TTFT).
# Usage (repo root there): tools/device/serve_sweep.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
AFD="$BIN/afd"
REPORT="$OUT/serve_sweep.txt"
PORT=18400
MODEL=preset:deepseek-v2-lite
status=0
start_server() {  # flags...
  "$AFD" serve --model $MODEL --device cuda --host 127.0.0.1 --port $PORT --max-model-len 4096 \
    "$@" >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  local t0=$(date +%s.%N)
  for _ in $(seq 600); do
    grep -q "the OpenAI API is up" "$OUT/serve.log" && break
    kill -0 $SERVER 2>/dev/null || break
    sleep 0.5
  done
  python3 -c "print(f'server up in {float($(date +%s.%N)) - float($t0):.1f} s: $*')" | tee -a "$REPORT"
}
stop_server() {
  kill -TERM $SERVER
  wait $SERVER
  echo "server exit after SIGTERM: $?" | tee -a "$REPORT"
}
bench() {  # input output concurrency prompts
  echo "-- in $1 / out $2, concurrency $3, $4 prompts" | tee -a "$REPORT"
  "$AFD" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts $4 \
    --random-input-len $1 --random-output-len $2 --random-range-ratio 0 \
    --random-vocab-size 100000 --ignore-eos --request-rate inf --max-concurrency $3 \
    --disable-tqdm --seed 1 2>&1 |
    grep -E "Successful|Failed|Output token|Peak|Mean TTFT|P99 TTFT|Mean TPOT|Median ITL|P99 ITL" |
    tee -a "$REPORT" || status=1
}
nvidia-smi -L | tee "$REPORT"
start_server --max-num-seqs 1024
bench 32 512 1024 1024
bench 32 512 256 512
stop_server
for T in 512 1024 4096; do
  start_server --max-num-seqs 256 --max-num-batched-tokens $T
  bench 512 256 64 128
  stop_server
done
exit $status
