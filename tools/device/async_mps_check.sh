#!/usr/bin/env bash
# One device call (one GPU): backend_ops_test, then the async connector's device-rows round trip
# between two processes on GPU 0 under MPS (device flags and host flags), then the v2-lite 1A1F
# decode comparison under MPS (x2_probe.sh has the 2-GPU runs and the runs without MPS).
# Usage (repo root there): async_mps_check.sh BIN_DIR
set -u
HERE=$(dirname "$(readlink -f "$0")")
BIN=$(readlink -f "$1")
. "$HERE/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
"$BIN/backend_ops_test" 2>&1 | grep -E "FAIL|passed"
ONLY=mps MPS_THEN="echo '== decode under MPS'; bash $HERE/decode_mono_vs_afd.sh $1" \
  bash "$HERE/x2_probe.sh" "$1" 2>&1 | grep -A4 "^== a\|^== d\|^mono\|^1A1F"
