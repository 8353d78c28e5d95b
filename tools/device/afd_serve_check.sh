#!/usr/bin/env bash
# One device call (issue 37 item 7, serving): `afd serve` (one process) vs `afd launch --topology
# 1A1F` and `2A1F` (async connector, every rank on GPU 0 under MPS, decode steps in CUDA graphs)
# of preset:deepseek-v2-lite (bf16, random weights), each under `afd bench serve` at concurrency
# 64 (random prompts: in 512 / out 256, 128 prompts). Target: 2A1F TPOT <= 1.15x `afd serve`.
# Usage (repo root there): tools/device/afd_serve_check.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
AFD="$BIN/afd"
REPORT="$OUT/afd_serve_check.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
S=(--model preset:deepseek-v2-lite --device cuda --host 127.0.0.1 --port 0 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192)
# RUNS (default "serve;launch 1A1F;launch 2A1F"): which servers, separated by ';'.
IFS=';' read -ra RUN_LIST <<<"${RUNS:-serve;launch 1A1F;launch 2A1F}"
for run in "${RUN_LIST[@]}"; do
  set -- $run
  LOG=$OUT/$1${2:-}.log
  if [ $1 = serve ]; then
    "$AFD" serve "${S[@]}" >"$LOG" 2>&1 &
  else
    "$AFD" launch "${S[@]}" --topology $2 --additional-config "$ASYNC" >"$LOG" 2>&1 &
  fi
  P=$!
  for _ in $(seq 600); do grep -q "is up on" "$LOG" && break; kill -0 $P 2>/dev/null || break; sleep 0.25; done
  URL=$(grep -o "http://127.0.0.1:[0-9]*" "$LOG" | head -1)
  echo "== $run ($URL)" | tee -a "$REPORT"
  if [ -n "$URL" ]; then
    timeout 150 "$AFD" bench serve --base-url "$URL" --num-prompts 128 --random-input-len 512 \
      --random-output-len 256 --random-range-ratio 0 --random-vocab-size 100000 --ignore-eos \
      --request-rate inf --max-concurrency 64 --disable-tqdm --seed 1 2>&1 |
      grep -E "throughput|TPOT|ITL|TTFT|Successful|Failed" | tee -a "$REPORT"
  else
    echo "did not come up"; tail -8 "$LOG" | tee -a "$REPORT"
  fi
  kill -TERM $P 2>/dev/null; wait $P
done
mps_off
true
