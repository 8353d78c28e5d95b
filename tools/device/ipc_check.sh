#!/usr/bin/env bash
# One short device call for the CUDA IPC paths (one GPU, MPS on): the KV transport's
# (tools/device/pd_ipc_check.py: a cuda_ipc consumer == a tcp consumer, the producer's blocks
# freed) and the async connector's IPC windows (tools/device/async_quick_check.sh: AFD == the
# monolithic run). Usage (repo root there): tools/device/ipc_check.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
mps_on
status=0
timeout 150 $PY tools/device/pd_ipc_check.py "$BIN/afd" models/demo "$OUT/pd_ipc_logs" || status=1
timeout 150 bash tools/device/async_quick_check.sh "$BIN" || status=1
mps_off
echo "== exit status $status"
exit $status
