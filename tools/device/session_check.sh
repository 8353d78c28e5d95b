#!/usr/bin/env bash
# The first device call of a session (one H200), binaries built elsewhere: everything that
# changed since the last GPU run, in one machine start.
#   1. tools/device/gpu_check.sh (backend_ops_test, fp32/bf16 fidelity, graph vs eager, bf16 vs
#      transformers, afd bench decode, the torch peer) -> OUT/check.log
#   2. tools/device/kernel_profile.sh at batch 1 and 256 (ncu per kernel) -> OUT/prof.log
#   3. tools/device/make_trained_golden.sh (the v3_trained golden, its bf16 reference and afd's
#      scores) -> OUT/trained/v3_trained.tgz and logs, OUT/trained.log
# Usage (repo root there): tools/device/session_check.sh BIN_DIR OUT_DIR   (at most 8 files back)
set -u
BIN=$1
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
SKIP_PERF=1 timeout 330 bash "$HERE/gpu_check.sh" "$BIN" /tmp/session_chk >"$OUT/check.log" 2>&1
echo "== check (rc $?)"
grep -v '^\[' "$OUT/check.log" | grep -vE 'Loading weights|^\s*$' |
  grep -E 'passed|greedy ids identical|top-1|batch|^ +[0-9]+ |^[0-9]+ \{|exit status' | cut -c1-200
BATCH="1 256" TOP=14 timeout 150 bash "$HERE/kernel_profile.sh" "$BIN" /tmp/session_prof >"$OUT/prof.log" 2>&1
echo "== kernel profile (rc $?)"
grep -E '^== batch|kernels per step' "$OUT/prof.log"
timeout 300 bash "$HERE/make_trained_golden.sh" "$BIN" "$OUT/trained" >"$OUT/trained.log" 2>&1
echo "== v3_trained (rc $?)"
tail -8 "$OUT/trained.log"
