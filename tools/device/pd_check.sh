#!/usr/bin/env bash
# One device call (issue 40 items 4 and 8 on the H200): bench/pd_bench.sh with
# preset:deepseek-v2-lite (bf16, random weights) -- the colocated 1A1F deployment vs seed 004's
# 2P1A1F through `afd proxy` -- every process on GPU 0 under MPS (async connector between the
# decoder's roles), loads in 2048 / out 128 and in 8192 / out 256. Also the GPU fidelity of the
# transfer (16 greedy requests compared) and the transfer's bytes per token and rate, the KV rows
# over CUDA IPC (KV_TRANSPORT [cuda_ipc]; tools/device/pd_ipc_check.py checks that transport first).
# Usage (repo root there): tools/device/pd_check.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
REPORT="$OUT/pd_check.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
# The cuda_ipc transport itself first: CUDA IPC consumer == TCP consumer, producer blocks freed.
timeout 120 $PY tools/device/pd_ipc_check.py "$BIN/afd" models/demo "$OUT/pd_ipc_logs" 2>&1 | tee -a "$REPORT"
# 16 requests in flight of at most 8,448 tokens each: 2,200 blocks of 64 per instance.
AFD="$BIN/afd" PY="$PY" MODEL_PATH=preset:deepseek-v2-lite DEVICE=cuda GPUS="0 0 0 0" \
  LOADS="${LOADS:-2048:128 8192:256}" NUM_PROMPTS="${NUM_PROMPTS:-32}" \
  REQUEST_RATE="${REQUEST_RATE:-2}" MAX_CONCURRENCY=16 KV_TRANSPORT="${KV_TRANSPORT:-cuda_ipc}" \
  EXTRA_FLAGS="--max-model-len 8704 --num-gpu-blocks-override 2400 --max-num-seqs 64" \
  timeout 450 bash bench/pd_bench.sh "$OUT/pd" 2>&1 | tee -a "$REPORT"
for f in "$OUT"/pd/*.log "$OUT"/pd/pd_logs/*.log; do
  [ -f "$f" ] && { echo "--- $f"; tail -n 4 "$f"; } >>"$OUT/pd_log_tails.txt"
done
mps_off
true
