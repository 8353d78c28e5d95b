#!/usr/bin/env bash
# Seed 004's three-pod 4A2F split, one role per pod: two attention pods (global DP 4, two local
# DP ranks each; the second pod headless, starting at rank 2) and one FFN pod (DP 2). Run it in
# each pod with POD set; the rendezvous host and the API pod's engine listener are Kubernetes
# Services (docs/deploy.md), or any addresses (all 127.0.0.1 on one machine).
#
#   POD=FFN_0        recipes/multipod_4a_2f.sh     # FFN ranks 0-1; rank 0 serves the store
#   POD=ATTENTION_0  recipes/multipod_4a_2f.sh     # the OpenAI API, DP ranks 0-1
#   POD=ATTENTION_1  recipes/multipod_4a_2f.sh     # headless, DP ranks 2-3
#
# Environment (defaults in brackets): MODEL_PATH [preset:deepseek-v2-lite], AFD [afd on PATH],
# DEVICE [cuda], AFD_CONNECTOR_HOST [vllm-ffn-p2p-service], AFD_CONNECTOR_PORT [6269],
# AFD_CONNECTOR [P2pHostAFDConnector on cpu, P2pNcclAFDConnector on cuda],
# ATTENTION_DP_ADDRESS [vllm-attention-dp-service] and ATTENTION_DP_RPC_PORT [13345] (the API
# pod listens there, the headless pod connects), ATTENTION_HEADLESS [1 on ATTENTION_1],
# API_HOST [0.0.0.0],
# ATTENTION_DP_START_RANK [0 / 2], API_PORT [8000], EXTRA_FLAGS (appended to every command).
# A deployment across hosts needs AFD_JOIN_SECRET (or AFD_JOIN_SECRET_FILE) on every pod.
set -euo pipefail
PODS="FFN_0 ATTENTION_0 ATTENTION_1"
if [ -z "${POD:-}" ]; then
  echo "multipod_4a_2f.sh: POD is not set: set it to one of $PODS" >&2
  exit 2
fi
AFD=${AFD:-afd}
MODEL_PATH=${MODEL_PATH:-preset:deepseek-v2-lite}
DEVICE=${DEVICE:-cuda}
HOST=${AFD_CONNECTOR_HOST:-vllm-ffn-p2p-service}
PORT=${AFD_CONNECTOR_PORT:-6269}
if [ "$DEVICE" = cuda ]; then CONNECTOR=${AFD_CONNECTOR:-P2pNcclAFDConnector}; else CONNECTOR=${AFD_CONNECTOR:-P2pHostAFDConnector}; fi
DP_ADDRESS=${ATTENTION_DP_ADDRESS:-vllm-attention-dp-service}
DP_RPC_PORT=${ATTENTION_DP_RPC_PORT:-13345}
API_HOST=${API_HOST:-0.0.0.0}
API_PORT=${API_PORT:-8000}
read -r -a EXTRA <<<"${EXTRA_FLAGS:-}"
config() {  # role
  echo "{\"afd\": {\"role\": \"$1\", \"connector\": \"$CONNECTOR\", \"host\": \"$HOST\", \"port\": $PORT, \"num_attention_ranks\": 4, \"num_ffn_ranks\": 2}}"
}
attention() {  # headless start_rank
  local flags=(--data-parallel-size 4 --data-parallel-size-local 2
               --data-parallel-start-rank "$2" --data-parallel-address "$DP_ADDRESS"
               --data-parallel-rpc-port "$DP_RPC_PORT")
  [ "$1" = 1 ] && flags+=(--headless) || flags+=(--host "$API_HOST" --port "$API_PORT")
  exec "$AFD" serve "$MODEL_PATH" --device "$DEVICE" --tensor-parallel-size 1 \
    "${flags[@]}" --additional-config "$(config attention)" "${EXTRA[@]}"
}
case "$POD" in
  FFN_0)
    exec "$AFD" serve "$MODEL_PATH" --device "$DEVICE" --data-parallel-size 2 \
      --tensor-parallel-size 1 --enable-expert-parallel --additional-config "$(config ffn)" \
      "${EXTRA[@]}" ;;
  ATTENTION_0)
    attention "${ATTENTION_HEADLESS:-0}" "${ATTENTION_DP_START_RANK:-0}" ;;
  ATTENTION_1)
    attention "${ATTENTION_HEADLESS:-1}" "${ATTENTION_DP_START_RANK:-2}" ;;
  *)
    echo "multipod_4a_2f.sh: POD=$POD is none of this recipe's pods: $PODS" >&2
    exit 2 ;;
esac
