# Sourced by the device scripts after they set BIN (the folder of the carried binaries, an
# absolute path). Sets CUBLAS_DIR (cuBLAS 13 of the machine's CUDA), NCCL_DIR (the NCCL the
# binaries were built against, 2.28.9, which ships in the Python venv; /usr/lib may hold
# another, found only when the venv has none), exports LD_LIBRARY_PATH with BIN first, and sets
# PY (the python3 that holds torch and transformers).
CUBLAS_DIR=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
NCCL_LIB=$(find / -path '*nvidia/nccl/lib/libnccl.so.2' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$NCCL_LIB" ] || NCCL_LIB=$(find / -name 'libnccl.so.2*' -not -path '*/proc/*' 2>/dev/null | head -1)
NCCL_DIR=$(dirname "${NCCL_LIB:-/nonexistent/libnccl.so.2}")
export LD_LIBRARY_PATH="$BIN:$CUBLAS_DIR:$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PY=$(command -v python3)
[ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
# MPS for several ranks on one GPU (NCCL refuses two ranks on one GPU; the async connector's
# ranks share it): mps_on [REPORT] starts the daemon (its pipe and log folders exported, so every
# process started later finds it) and says "MPS on" (appended to REPORT when given); mps_off
# stops it.
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && sleep 1 && echo "MPS on" | tee -a "${1:-/dev/null}"
}
mps_off() { echo quit | nvidia-cuda-mps-control; }
# The CUPTI library for --kernel-trace-csv (the binaries load it at run time): BIN's copy, else
# the machine's CUDA one added to LD_LIBRARY_PATH.
cupti_on() {
  [ -e "$BIN/libcupti.so.13" ] && return 0
  local cupti
  cupti=$(find / -name 'libcupti.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [ -n "$cupti" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$cupti")"
  return 0
}
