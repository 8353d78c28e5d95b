#!/usr/bin/env bash
# The twenty-ninth session's device call (one H200): the FP8 dispatch (issue 37 item 2).
# PART 1 -- backend_ops_test (AfdDispatch's FP8 rows and DequantFp8Rows: the CPU's bytes on the
# GPU); the fidelity of dispatch_dtype auto / fp8 against the monolithic run on the trained
# checkpoint (tools/dispatch_fidelity.py, fp32 and bf16, 1A1F and 2A2F, every rank on GPU 0
# under MPS); the A2F bytes per token; `afd bench decode` of preset:deepseek-v2-lite (27 layers,
# bf16, context 128) monolithic vs 1A1F auto vs 1A1F fp8. PART 2 -- the torch peer.
# Usage (repo root there): tools/device/session29_check.sh BIN_DIR OUT_DIR 1|2
set -u
BIN=$(readlink -f "$1")
OUT=$2
PART=${3:-1}
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
. "$HERE/env.sh"
REPORT="$OUT/session29_$PART.txt"
nvidia-smi -L | tee "$REPORT"
if [ "$PART" = 2 ]; then
  echo "== torch peer (graphed, context 128)" | tee -a "$REPORT"
  timeout 300 $PY "$BIN/torch_peer.py" "$OUT/torch_peer.json" 128 1,16,64,256 2>&1 | tail -6 | tee -a "$REPORT"
  exit 0
fi
echo "== backend_ops_test" | tee -a "$REPORT"
timeout 200 "$BIN/backend_ops_test" 2>&1 | grep -vE " OK $" | tail -6 | tee -a "$REPORT"
timeout 60 "$BIN/backend_ops_test" --op AfdDispatch 2>&1 | tail -3 | tee -a "$REPORT"
mps_on "$REPORT"
M=tests/data/golden/v3_trained
for dt in fp32 bf16; do
  for topo in 1A1F 2A2F; do
    timeout 200 python3 tools/dispatch_fidelity.py "$BIN/afd" $M $M/bf16_reference.json $topo \
      --device cuda --dtype $dt 2>&1 | tail -3 | tee -a "$REPORT"
  done
done
FP8='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"dispatch_dtype": "fp8"}}}'
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --max-tokens 8 --ignore-eos --device cuda)
timeout 120 "$BIN/afd" run --model $M "${P[@]}" --topology 1A1F --additional-config "$FP8" --stats 2>&1 >/dev/null |
  grep -E "layer 1 |graph" | head -4 | tee -a "$REPORT"
B=(--model preset:deepseek-v2-lite --device cuda --batch 1,16,64,256 --context 128)
echo "== monolithic" | tee -a "$REPORT"
timeout 150 "$BIN/afd" bench decode "${B[@]}" 2>&1 | grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
for cfg in ASYNC FP8; do
  echo "== AFD 1A1F graphs, async connector, dispatch $cfg" | tee -a "$REPORT"
  timeout 200 "$BIN/afd" bench decode "${B[@]}" --topology 1A1F --additional-config "${!cfg}" 2>&1 |
    grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
done
mps_off
true
