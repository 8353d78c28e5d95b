#!/usr/bin/env bash
# One device call on a 2-GPU machine: what the async connector's round trip costs when the two
# roles sit on different GPUs (CUDA IPC over NVLink) vs one GPU (time-sliced contexts), with
# device flags (the default) and host flags (--host-flags), under MPS if the machine has it,
# and the P2P connector over NCCL (WITH_P2P=1); prints the machine's NCCL library and topology.
# ONLY=substring runs the matching benches only; MPS_THEN=command runs under MPS at the end.
# Usage (repo root there): x2_probe.sh BIN_DIR
set -u
BIN=$(readlink -f "$1")
. "$(dirname "$(readlink -f "$0")")/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
export AFD_JOIN_SECRET=device-bench-secret
echo "== machine"; nvidia-smi -L; nvidia-smi topo -m 2>&1 | head -8
echo "nccl: $NCCL_LIB"; ls -la "$NCCL_DIR"/libnccl* 2>&1 | head
nm -D "$NCCL_LIB" 2>/dev/null | grep -E "ncclCommWindowRegister|ncclDevCommCreate|ncclMemAlloc|ncclGetLsa|ncclGetPeer" | head
find / -name 'nccl_device.h' -not -path '*/proc/*' 2>/dev/null | head -3
echo "mps: $(command -v nvidia-cuda-mps-control || echo none)"

bench() {  # name connector device attn-cuda-device ffn-cuda-device [extra flags]
  local name=$1 conn=$2 dev=$3 adev=$4 fdev=$5
  shift 5
  [ -n "${ONLY:-}" ] && [[ $name != *$ONLY* ]] && return  # ONLY=substring: a subset
  local PORT=$((21000 + RANDOM % 4000))
  local CFG="{\"afd\":{\"role\":\"ffn\",\"connector\":\"$conn\",\"host\":\"127.0.0.1\",\"port\":$PORT,\"num_attention_ranks\":1,\"num_ffn_ranks\":1}}"
  local FLAGS=(--bench --hidden 2048 --dtype bf16 --bench-rows 1,16,128,512 --iters 200 --device $dev "$@")
  local FF=() AF=()
  [ -n "$fdev" ] && FF=(--cuda-device $fdev)
  [ -n "$adev" ] && AF=(--cuda-device $adev)
  timeout 120 "$BIN/afd" connector-test --additional-config "$CFG" --role-rank 0 "${FLAGS[@]}" "${FF[@]}" >/tmp/ffn_$name.json 2>&1 &
  timeout 120 "$BIN/afd" connector-test --additional-config "${CFG/ffn/attention}" --role-rank 0 "${FLAGS[@]}" "${AF[@]}" >/tmp/attn_$name.json 2>/tmp/attn_$name.err || { tail -5 /tmp/attn_$name.err; tail -5 /tmp/ffn_$name.json; }
  wait
  echo "== $name (median / p10 / p90 us per round trip; device flags: also the stream's own)"
  python3 -c 'import json,sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for b in d["bench"]:
    s = ""
    if "stream_median_us" in b:
        s = "   stream %8.1f %8.1f %8.1f" % (b["stream_median_us"], b["stream_p10_us"], b["stream_p90_us"])
    print("%4d rows: %8.1f %8.1f %8.1f%s" % (b["rows"], b["median_us"], b["p10_us"], b["p90_us"], s))' /tmp/attn_$name.json
}
bench async_ipc_two_gpus_device_flags AsyncAFDConnector cuda 0 1
bench async_ipc_two_gpus_host_flags AsyncAFDConnector cuda 0 1 --host-flags
bench async_ipc_one_gpu_device_flags AsyncAFDConnector cuda 0 0
bench async_shm_host AsyncAFDConnector cpu "" ""
[ -n "${WITH_P2P:-}" ] && bench p2p_nccl_two_gpus P2pNcclAFDConnector cuda 0 1
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d; then
    sleep 1
    bench async_ipc_one_gpu_mps_device_flags AsyncAFDConnector cuda 0 0
    bench async_ipc_one_gpu_mps_host_flags AsyncAFDConnector cuda 0 0 --host-flags
    [ -n "${MPS_THEN:-}" ] && eval "$MPS_THEN"
    echo quit | nvidia-cuda-mps-control
  else
    echo "mps daemon did not start"
  fi
fi
