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
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && sleep 1 && echo "MPS on"
status=0
timeout 150 $PY tools/device/pd_ipc_check.py "$BIN/afd" models/demo "$OUT/pd_ipc_logs" || status=1
timeout 150 bash tools/device/async_quick_check.sh "$BIN" || status=1
echo quit | nvidia-cuda-mps-control
echo "== exit status $status"
exit $status
