#!/usr/bin/env bash
# One device call for two questions of the 32nd session (issue 37, 1A1F vs monolithic):
#  1. the FFN roles now declare their rows to the backend (SetStepRows), so an FFN item of <= 64
#     rows launches with programmatic dependent launch as the monolithic step does: BIN/afd vs
#     BIN/afd_prev (the build before), 1A1F at BATCHES, the monolithic bench in the same call;
#  2. at batch 256 the FFN's graphed gate/up GroupedMma took 305 us a call against 213 in the
#     monolithic graph and 216 eager in the FFN itself (the down GEMM equal): 1A1F traced with
#     and without the side stream (AFD_SIDE_STREAM=0: the shared experts inline), compared per
#     kernel with the monolithic trace (tools/kernel_compare.py).
# MPS on, every rank on GPU 0; preset:deepseek-v2-lite, 27 layers, bf16, context 128.
# BATCHES (default 1,16,64,256); SKIP_AB=1: question 2 only; SKIP_TRACE=1: question 1 only.
# Usage (repo root there): tools/device/ffn_ab.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
cupti_on
REPORT="$OUT/ffn_ab.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
M=(--model preset:deepseek-v2-lite --device cuda --context 128 --steps 16)
bench() {  # label, binary, timeout, then bench arguments
  local label=$1 bin=$2 limit=$3
  shift 3
  echo "== $label" | tee -a "$REPORT"
  timeout -k 5 "$limit" "$bin" bench decode "${M[@]}" "$@" 2>&1 |
    grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
}
if [ -z "${SKIP_AB:-}" ]; then
  B=${BATCHES:-1,16,64,256}
  bench "monolithic" "$BIN/afd" 150 --batch "$B"
  bench "1A1F, this build" "$BIN/afd" 240 --batch "$B" --topology 1A1F --additional-config "$ASYNC"
  [ -x "$BIN/afd_prev" ] &&
    bench "1A1F, afd_prev" "$BIN/afd_prev" 240 --batch "$B" --topology 1A1F --additional-config "$ASYNC"
fi
if [ -z "${SKIP_TRACE:-}" ]; then
  bench "monolithic 256, trace" "$BIN/afd" 150 --batch 256 --kernel-trace-csv "$OUT/mono.csv"
  bench "1A1F 256, trace" "$BIN/afd" 200 --batch 256 --topology 1A1F --additional-config "$ASYNC" \
    --kernel-trace-csv "$OUT/afd.csv"
  AFD_SIDE_STREAM=0 bench "1A1F 256, AFD_SIDE_STREAM=0, trace" "$BIN/afd" 200 --batch 256 \
    --topology 1A1F --additional-config "$ASYNC" --kernel-trace-csv "$OUT/afd_one_stream.csv"
fi
mps_off
if [ -z "${SKIP_TRACE:-}" ]; then
  for t in afd afd_one_stream; do
    [ -s "$OUT/$t.csv" ] || continue
    echo "== per kernel, monolithic (A) vs $t ffn0 (B)" | tee -a "$REPORT"
    python3 tools/kernel_compare.py "$OUT/mono.csv" "$OUT/$t.csv:ffn0" --top 14 | tee -a "$REPORT"
    python3 tools/afd_trace.py "$OUT/$t.csv" 2>&1 | grep -E "ffn item|step \(" | tee -a "$REPORT"
  done
  gzip -f "$OUT"/*.csv
fi
true
