#!/usr/bin/env bash
# Seed 004's two-pod 2A2F recipe with dual-batch overlap: an attention pod of one DP replica
# over two TP ranks (--enable-dbo) answering the OpenAI API, and an FFN pod of two ranks.
#
#   POD=FFN_0        recipes/multipod_2a_2f_dbo_tp2.sh
#   POD=ATTENTION_0  recipes/multipod_2a_2f_dbo_tp2.sh
#
# Environment as recipes/multipod_4a_2f.sh (MODEL_PATH, AFD, DEVICE, AFD_CONNECTOR_HOST,
# AFD_CONNECTOR_PORT, AFD_CONNECTOR, API_PORT, EXTRA_FLAGS); DBO_DECODE_THRESHOLD [32],
# DBO_PREFILL_THRESHOLD [512].
set -euo pipefail
PODS="FFN_0 ATTENTION_0"
if [ -z "${POD:-}" ]; then
  echo "multipod_2a_2f_dbo_tp2.sh: POD is not set: set it to one of $PODS" >&2
  exit 2
fi
AFD=${AFD:-afd}
MODEL_PATH=${MODEL_PATH:-preset:deepseek-v2-lite}
DEVICE=${DEVICE:-cuda}
HOST=${AFD_CONNECTOR_HOST:-vllm-ffn-p2p-service}
PORT=${AFD_CONNECTOR_PORT:-6269}
if [ "$DEVICE" = cuda ]; then CONNECTOR=${AFD_CONNECTOR:-P2pNcclAFDConnector}; else CONNECTOR=${AFD_CONNECTOR:-P2pHostAFDConnector}; fi
API_HOST=${API_HOST:-0.0.0.0}
API_PORT=${API_PORT:-8000}
read -r -a EXTRA <<<"${EXTRA_FLAGS:-}"
DBO=(--enable-dbo --dbo-decode-token-threshold "${DBO_DECODE_THRESHOLD:-32}"
     --dbo-prefill-token-threshold "${DBO_PREFILL_THRESHOLD:-512}")
config() {  # role
  echo "{\"afd\": {\"role\": \"$1\", \"connector\": \"$CONNECTOR\", \"host\": \"$HOST\", \"port\": $PORT, \"num_attention_ranks\": 2, \"num_ffn_ranks\": 2}}"
}
case "$POD" in
  FFN_0)
    exec "$AFD" serve "$MODEL_PATH" --device "$DEVICE" --data-parallel-size 2 \
      --tensor-parallel-size 1 --enable-expert-parallel "${DBO[@]}" \
      --additional-config "$(config ffn)" "${EXTRA[@]}" ;;
  ATTENTION_0)
    exec "$AFD" serve "$MODEL_PATH" --device "$DEVICE" --data-parallel-size 1 \
      --tensor-parallel-size 2 "${DBO[@]}" --host "$API_HOST" --port "$API_PORT" \
      --additional-config "$(config attention)" "${EXTRA[@]}" ;;
  *)
    echo "multipod_2a_2f_dbo_tp2.sh: POD=$POD is none of this recipe's pods: $PODS" >&2
    exit 2 ;;
esac
