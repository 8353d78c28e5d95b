#!/usr/bin/env bash
# One device call after a change to the prefill path (issue 11's 8 x 1024 prefill target):
# backend_ops_test on cuda, its perf cases for the prefill-sized ops (Linear, MoE, MlaAttention),
# v3_trained's bf16 score against transformers (1024 positions: prompts long enough for the
# prefill kernels), `afd bench decode --batch 8 --context 1024 --profile` (per-op time of the
# prefill step), and the decode bench at context 128 and (LONG_CONTEXT=1) 256 x 1024 so a
# decode regression shows.
# AB_ENV="NAME=0 ...": the MLA prefill op and the 8 x 1024 prefill again with those switches
# (a kernel choice off).
# Usage (repo root there): tools/device/prefill_check.sh BIN_DIR
set -u
BIN=$(readlink -f "$1")
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
WORK=$(mktemp -d)
status=0
echo "== backend_ops_test --backend cuda"
"$BIN/backend_ops_test" --backend cuda 2>&1 | grep -v " OK " | tail -6
for op in Linear "MoE (permute+experts+combine)"; do
  "$BIN/backend_ops_test" --backend cuda --perf --op "$op" 2>&1 | grep -E "8192|4096" | cut -c22-
done
"$BIN/backend_ops_test" --backend cuda --perf --op MlaAttention 2>&1 | grep prefill | cut -c22-
if [ -n "${AB_ENV:-}" ]; then
  echo "== MlaAttention prefill with $AB_ENV"
  env $AB_ENV "$BIN/backend_ops_test" --backend cuda --perf --op MlaAttention 2>&1 | grep prefill | cut -c22-
fi
echo "== v3_trained bf16 vs transformers bf16"
$PY "$HERE/score_bf16.py" "$BIN/afd" tests/data/golden/v3_trained \
  tests/data/golden/v3_trained/bf16_reference.json "$WORK" --device cuda --dtype bf16 || status=1
bench() { timeout 300 "$BIN/afd" bench decode --model preset:deepseek-v2-lite --device cuda "$@" 2>&1 | grep -v "loading weights"; }
echo "== prefill 8 x 1024, per-op profile"
bench --batch 8 --context 1024 --steps 4 --profile | sed -n 3,20p
if [ -n "${AB_ENV:-}" ]; then
  echo "== prefill 8 x 1024 with $AB_ENV"
  env $AB_ENV timeout 300 "$BIN/afd" bench decode --model preset:deepseek-v2-lite --device cuda --batch 8 --context 1024 --steps 4 2>&1 | tail -1
fi
echo "== decode, context 128"
bench --batch 1,16,64,256 --context 128 --steps 16 | tail -5
[ -n "${LONG_CONTEXT:-}" ] && bench --batch 256 --context 1024 --steps 8 | tail -1
exit $status
