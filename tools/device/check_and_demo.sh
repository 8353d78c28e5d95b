#!/usr/bin/env bash
# One device call: what changed on the CUDA side since the last GPU run, then the demo model.
#   1. tools/device/gpu_check.sh without the perf pass (backend_ops_test, fp32/bf16 fidelity,
#      graph vs eager) -> OUT/check.log, summary printed;
#   2. tools/device/demo_model.sh with a training budget of DEMO_SECONDS [170] s -> OUT/demo.
# Usage (repo root there): tools/device/check_and_demo.sh BIN_DIR OUT_DIR
set -u
BIN=$1
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
SKIP_PERF=1 SKIP_PEER=1 timeout "${CHECK_S:-250}" bash "$HERE/gpu_check.sh" "$BIN" /tmp/chk \
  >"$OUT/check.log" 2>&1
echo "== check (rc $?)"
grep -v '^\[' "$OUT/check.log" | grep -vE 'Loading weights|^\s*$' |
  grep -E 'passed|failed|FAIL|greedy ids identical|top-1|exit status|differ' | cut -c1-200 | head -60
SECONDS_BUDGET=${DEMO_SECONDS:-170} timeout 320 bash "$HERE/demo_model.sh" "$BIN" "$OUT/demo_run" \
  >"$OUT/demo.log" 2>&1
echo "== demo model (rc $?)"
tail -30 "$OUT/demo.log"
