#!/usr/bin/env bash
# Runs on a one-GPU machine (the device tool): shows how the NCCL communicator reports NCCL's
# refusal of two ranks on one GPU -- first our own check, then NCCL's own error with the check
# skipped. Usage: tools/device/nccl_one_gpu.sh DIR_WITH_AFD_AND_LIBS OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
AFD="$BIN/afd"
nvidia-smi -L
echo "NCCL used: $(ldd "$AFD" | grep nccl)"
"$AFD" --version
cfg() {
  echo "{\"afd\": {\"role\": \"$1\", \"connector\": \"P2pNcclAFDConnector\", \"port\": $2, \"num_attention_ranks\": 1, \"num_ffn_ranks\": 1, \"afd_process_group_timeout_s\": 60}}"
}
pair() {  # name port [env]
  local name=$1 port=$2
  "$AFD" connector-test --device cuda --cuda-device 0 --role-rank 0 \
    --additional-config "$(cfg ffn "$port")" >"$OUT/${name}_ffn0.log" 2>&1 &
  local f=$!
  "$AFD" connector-test --device cuda --cuda-device 0 --role-rank 0 \
    --additional-config "$(cfg attention "$port")" >"$OUT/${name}_attention0.log" 2>&1 &
  local a=$!
  local start=$SECONDS
  wait $f; local fs=$?
  wait $a; local as=$?
  echo "== $name: ffn exit $fs, attention exit $as, $((SECONDS - start)) s"
  cat "$OUT/${name}_ffn0.log" "$OUT/${name}_attention0.log"
}
pair shared_gpu_check 29611
AFD_NCCL_SKIP_SHARED_GPU_CHECK=1 NCCL_DEBUG=WARN pair shared_gpu_nccl 29612
# The host transport on the same machine, for comparison: must pass.
"$AFD" connector-test --role-rank 0 --additional-config "$(cfg ffn 29613 | sed 's/P2pNcclAFDConnector/P2pHostAFDConnector/')" >"$OUT/host_ffn0.log" 2>&1 &
"$AFD" connector-test --role-rank 0 --additional-config "$(cfg attention 29613 | sed 's/P2pNcclAFDConnector/P2pHostAFDConnector/')" >"$OUT/host_attention0.log" 2>&1
echo "== host transport 1A1F: attention exit $?"
wait
