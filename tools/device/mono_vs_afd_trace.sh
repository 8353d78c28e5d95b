#!/usr/bin/env bash
# One device call: the kernel trace of the monolithic decode step and of AFD 1A1F (async
# connector, MPS, both ranks on GPU 0) at the same batch, so that the FFN item's kernels can be
# compared with the monolithic MoE's one by one (the 31st session's open question: at batch 256
# the FFN item took ~469 us a layer against ~350 for the monolithic MoE). preset:deepseek-v2-lite,
# 27 layers, bf16, context 128, 16 steps. BATCH (default 256); TOPO (default 1A1F).
# Usage (repo root there): tools/device/mono_vs_afd_trace.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
cupti_on
REPORT="$OUT/trace.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
B=(--model preset:deepseek-v2-lite --device cuda --batch "${BATCH:-256}" --context 128 --steps 16)
echo "== monolithic, kernel trace" | tee -a "$REPORT"
timeout -k 5 150 "$BIN/afd" bench decode "${B[@]}" --kernel-trace-csv "$OUT/mono.csv" 2>&1 |
  grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
TOPO=${TOPO:-1A1F}
echo "== AFD $TOPO, async connector, kernel trace" | tee -a "$REPORT"
timeout -k 5 200 "$BIN/afd" bench decode "${B[@]}" --topology "$TOPO" \
  --additional-config '{"afd": {"connector": "AsyncAFDConnector"}}' \
  --kernel-trace-csv "$OUT/afd.csv" 2>&1 | grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
mps_off
python3 tools/afd_trace.py "$OUT/afd.csv" 2>&1 | tail -25 | tee -a "$REPORT"
gzip -f "$OUT"/*.csv
true
