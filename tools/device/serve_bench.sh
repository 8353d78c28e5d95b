#!/usr/bin/env bash
# One device call: the OpenAI server on the GPU machine with binaries built elsewhere.
# Usage (repo root there): tools/device/serve_bench.sh BIN_DIR OUT_DIR [MODEL]
#   BIN_DIR: afd and the shared libraries the machine lacks (libfmt, libgomp, libpcre2-8,
#            libutf8proc, libcpp-httplib and its libssl/libcrypto/libbrotli); cuBLAS and NCCL
#            come from the machine.
# Starts `afd serve` (one process, --device cuda, bf16, default preset:deepseek-v2-lite), checks a
# greedy completion against `afd run` on the same GPU, runs `afd bench serve` at several
# concurrencies (random token-id prompts: input 128, output 128), sends SIGTERM and checks the
# server exits 0. Reports go to OUT_DIR/serve_bench.txt, the server log to OUT_DIR/serve.log.
set -u
BIN=$(readlink -f "$1")
OUT=$2
MODEL=${3:-preset:deepseek-v2-lite}
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
AFD="$BIN/afd"
PORT=18200
REPORT="$OUT/serve_bench.txt"
nvidia-smi -L | tee "$REPORT"
status=0

"$AFD" serve --model "$MODEL" --device cuda --host 127.0.0.1 --port $PORT --max-model-len 4096 \
  --max-num-seqs 256 --max-num-batched-tokens 8192 >"$OUT/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 600); do
  grep -q "the OpenAI API is up" "$OUT/serve.log" && break
  kill -0 $SERVER 2>/dev/null || break
  sleep 0.5
done
if ! grep -q "the OpenAI API is up" "$OUT/serve.log"; then
  echo "server did not come up" | tee -a "$REPORT"
  tail -20 "$OUT/serve.log" | tee -a "$REPORT"
  kill -9 $SERVER 2>/dev/null
  exit 1
fi
grep "afd serve" "$OUT/serve.log" | tee -a "$REPORT"

echo "== a greedy completion equals afd run on the same GPU" | tee -a "$REPORT"
GOT=$(curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"prompt\": [1, 2, 3, 4, 5, 6, 7, 8], \"max_tokens\": 16,
       \"temperature\": 0, \"ignore_eos\": true, \"return_token_ids\": true}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["token_ids"])')
echo "server: $GOT" | tee -a "$REPORT"

for C in 1 16 64 256; do
  N=$((C * 4 < 64 ? 64 : C * 4))
  [ "$C" -eq 1 ] && N=16
  echo "== afd bench serve --max-concurrency $C --num-prompts $N" | tee -a "$REPORT"
  "$AFD" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts $N \
    --random-input-len 128 --random-output-len 128 --random-range-ratio 0 \
    --random-vocab-size 100000 --ignore-eos --request-rate inf --max-concurrency $C \
    --disable-tqdm --seed 1 >>"$REPORT" 2>&1 || status=1
done
kill -TERM $SERVER
for _ in $(seq 120); do kill -0 $SERVER 2>/dev/null || break; sleep 0.5; done
if kill -0 $SERVER 2>/dev/null; then
  echo "server still running 60 s after SIGTERM" | tee -a "$REPORT"
  kill -9 $SERVER
  status=1
fi
wait $SERVER
echo "server exit status after SIGTERM: $?" | tee -a "$REPORT"
"$AFD" run --model "$MODEL" --device cuda --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 16 \
  --ignore-eos --json 2>/dev/null |
  python3 -c 'import json,sys; print("afd run:", json.loads(sys.stdin.readline())["output_ids"])' |
  tee -a "$REPORT"
exit $status
