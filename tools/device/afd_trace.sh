#!/usr/bin/env bash
# One device call for issue 37 item 7: where an AFD decode step's time goes. Under MPS, every
# rank on GPU 0: `afd bench decode --topology 1A1F --kernel-trace-csv` (preset:deepseek-v2-lite,
# 27 layers, bf16, context 128) -> tools/afd_trace.py (per MoE layer: the a2f hop, the FFN item,
# the f2a hop, the attention's wait; one layer's timeline of both ranks), the same bench without
# the trace (its cost) and the monolithic one. REPEAT_S > 0 first: async_repeat_check.sh fp32
# 2A2F for that many seconds. TOPOS (default "1A1F"), BATCH (default 1,64,256); SKIP_BENCH=1:
# the traced runs only. (2026-12-02: the 2A1F trace at batch 1 -- one attention rank idle --
# did not end; run 2A1F with BATCH of >= 2.)
# Usage (repo root there): tools/device/afd_trace.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
cupti_on
REPORT="$OUT/afd_trace.txt"
nvidia-smi -L | tee "$REPORT"
if [ "${REPEAT_S:-0}" -gt 0 ]; then
  TIME_S=$REPEAT_S "$HERE/async_repeat_check.sh" "$BIN" fp32 2A2F 2>&1 | tail -30 | tee -a "$REPORT"
fi
mps_on "$REPORT"
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
B=(--model preset:deepseek-v2-lite --device cuda --batch "${BATCH:-1,64,256}" --context 128 --steps 16)
if [ -z "${SKIP_BENCH:-}" ]; then
  echo "== monolithic" | tee -a "$REPORT"
  timeout -k 5 200 "$BIN/afd" bench decode "${B[@]}" 2>&1 | grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
fi
for topo in ${TOPOS:-1A1F}; do
  if [ -z "${SKIP_BENCH:-}" ]; then
    echo "== AFD $topo, async connector, no trace" | tee -a "$REPORT"
    timeout -k 5 240 "$BIN/afd" bench decode "${B[@]}" --topology $topo --additional-config "$ASYNC" 2>&1 |
      grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
  fi
  echo "== AFD $topo, kernel trace" | tee -a "$REPORT"
  timeout -k 5 240 "$BIN/afd" bench decode "${B[@]}" --topology $topo --additional-config "$ASYNC" \
    --kernel-trace-csv "$OUT/trace_$topo.csv" 2>&1 | grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
  python3 tools/afd_trace.py "$OUT/trace_$topo.csv" --timeline 3 2>&1 | tee -a "$REPORT"
  gzip -f "$OUT/trace_$topo.csv"
done
mps_off
true
