#!/usr/bin/env bash
# One device call: `afd bench decode` of preset:deepseek-v2-lite (27 layers, bf16, context 128)
# monolithic vs AFD 1A1F over the async connector (both ranks on GPU 0, under MPS), the ratio
# issue 37 targets. Usage (repo root there): tools/device/afd_vs_mono.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
AFD="$BIN/afd"
REPORT="$OUT/afd_vs_mono.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
B=(--model preset:deepseek-v2-lite --device cuda --batch 1,16,64,256 --context 128)
echo "== monolithic" | tee -a "$REPORT"
timeout 280 "$AFD" bench decode "${B[@]}" 2>&1 | grep -E "^ *[0-9]+ |batch" | tee -a "$REPORT"
echo "== AFD 1A1F, async connector" | tee -a "$REPORT"
timeout 280 "$AFD" bench decode "${B[@]}" --topology 1A1F \
  --additional-config '{"afd": {"connector": "AsyncAFDConnector"}}' 2>&1 |
  grep -E "^ *[0-9]+ |batch|error" | tee -a "$REPORT"
mps_off
