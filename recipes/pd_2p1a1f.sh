#!/usr/bin/env bash
# Seed 004's "Step 4" on one host: prefill/decode disaggregation 2P1A1F, five processes --
# two prefill instances (KV producers, each a model in one process), one decode deployment of
# 1A1F (its attention role's API server is the KV consumer, its FFN role a second process) and
# `afd proxy` in front. For each request the proxy prefills on a prefiller (max_tokens 1,
# do_remote_decode), hands the returned kv_transfer_params to the decoder, which pulls the
# prompt's KV rows from that prefiller and decodes (docs/pd.md). Send traffic to the proxy.
#
#   recipes/pd_2p1a1f.sh        # on a GPU host: every instance on its own GPU (0-3)
#   DEVICE=cpu MODEL_PATH=preset:tiny recipes/pd_2p1a1f.sh
#
# The script waits until every server answers, prints "pd_2p1a1f: the proxy serves
# http://HOST:PORT", and runs until SIGTERM / SIGINT (every process stopped, exit 0) or until one
# of its processes ends (the others stopped, exit 1 naming it; the logs stay in LOG_DIR).
#
# Environment (defaults in brackets): MODEL_PATH [preset:deepseek-v2-lite], AFD [afd on PATH],
# DEVICE [cuda], HOST [127.0.0.1] (every instance's address), PREFILL_PORTS [18301 18302],
# KV_PORTS [14579 14580] (the prefillers' KV servers), DECODE_PORT [18303], PROXY_PORT [18305],
# AFD_CONNECTOR_PORT [6269] and AFD_CONNECTOR [P2pHostAFDConnector on cpu, P2pNcclAFDConnector
# on cuda] (the decode deployment's connector), GPUS [0 1 2 3] (prefill 0, prefill 1, attention,
# FFN; "0 0 0 0" shares one GPU, under MPS), LOG_DIR [a fresh temporary folder], READY_TIMEOUT_S
# [600], KV_TRANSPORT [tcp; cuda_ipc: rows stay in the prefillers' GPU caches and the decoder
# copies them device to device, for instances of one host on GPUs], EXTRA_FLAGS (appended to
# every serve command). Across hosts set AFD_JOIN_SECRET (or
# AFD_JOIN_SECRET_FILE) in every process's environment: KV transfers authenticate with it.
set -euo pipefail
AFD=${AFD:-afd}
MODEL_PATH=${MODEL_PATH:-preset:deepseek-v2-lite}
DEVICE=${DEVICE:-cuda}
HOST=${HOST:-127.0.0.1}
read -r -a PREFILL_PORTS <<<"${PREFILL_PORTS:-18301 18302}"
read -r -a KV_PORTS <<<"${KV_PORTS:-14579 14580}"
read -r -a GPUS <<<"${GPUS:-0 1 2 3}"
DECODE_PORT=${DECODE_PORT:-18303}
PROXY_PORT=${PROXY_PORT:-18305}
PORT=${AFD_CONNECTOR_PORT:-6269}
if [ "$DEVICE" = cuda ]; then CONNECTOR=${AFD_CONNECTOR:-P2pNcclAFDConnector}; else CONNECTOR=${AFD_CONNECTOR:-P2pHostAFDConnector}; fi
LOG_DIR=${LOG_DIR:-$(mktemp -d -t afd-pd-2p1a1f-XXXXXX)}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-600}
KV_TRANSPORT=${KV_TRANSPORT:-tcp}
read -r -a EXTRA <<<"${EXTRA_FLAGS:-}"
die() { echo "pd_2p1a1f.sh: $*" >&2; exit 2; }
[ "${#PREFILL_PORTS[@]}" = 2 ] || die "PREFILL_PORTS must name 2 ports, got '${PREFILL_PORTS[*]}'"
[ "${#KV_PORTS[@]}" = 2 ] || die "KV_PORTS must name 2 ports, got '${KV_PORTS[*]}'"
[ "${#GPUS[@]}" = 4 ] || die "GPUS must name 4 devices (prefill 0, prefill 1, attention, FFN), got '${GPUS[*]}'"
mkdir -p "$LOG_DIR"

kv_config() {  # role [port]
  local extra="\"kv_connector_extra_config\": {\"transport\": \"$KV_TRANSPORT\"}"
  if [ -n "${2:-}" ]; then
    echo "{\"kv_connector\": \"AfdKvConnector\", \"kv_role\": \"$1\", \"kv_ip\": \"$HOST\", \"kv_port\": $2, $extra}"
  else
    echo "{\"kv_connector\": \"AfdKvConnector\", \"kv_role\": \"$1\", $extra}"
  fi
}
afd_config() {  # role
  echo "{\"afd\": {\"role\": \"$1\", \"connector\": \"$CONNECTOR\", \"host\": \"$HOST\", \"port\": $PORT, \"num_attention_ranks\": 1, \"num_ffn_ranks\": 1}}"
}
device_flags() {  # gpu
  if [ "$DEVICE" = cuda ]; then echo "--device cuda --cuda-device $1"; else echo "--device cpu"; fi
}

NAMES=()
PIDS=()
start() {  # name command...
  local name=$1
  shift
  "$@" >"$LOG_DIR/$name.log" 2>&1 &
  NAMES+=("$name")
  PIDS+=("$!")
  echo "pd_2p1a1f: started $name (pid $!), log $LOG_DIR/$name.log" >&2
}
stop_all() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
on_signal() {
  echo "pd_2p1a1f: stopping every process" >&2
  stop_all
  exit 0
}
trap on_signal TERM INT

for i in 0 1; do
  # shellcheck disable=SC2046
  start "prefill_$i" "$AFD" serve "$MODEL_PATH" $(device_flags "${GPUS[$i]}") --host "$HOST" \
    --port "${PREFILL_PORTS[$i]}" --kv-transfer-config "$(kv_config kv_producer "${KV_PORTS[$i]}")" \
    "${EXTRA[@]}"
done
# shellcheck disable=SC2046
start ffn "$AFD" serve "$MODEL_PATH" $(device_flags "${GPUS[3]}") --additional-config "$(afd_config ffn)" \
  "${EXTRA[@]}"
# shellcheck disable=SC2046
start attention "$AFD" serve "$MODEL_PATH" $(device_flags "${GPUS[2]}") --host "$HOST" \
  --port "$DECODE_PORT" --additional-config "$(afd_config attention)" \
  --kv-transfer-config "$(kv_config kv_consumer)" "${EXTRA[@]}"

# Ready: each API server logs "the OpenAI API is up" (the decode one once its FFN role joined).
ended() {  # the name of a process that ended, if any
  for k in "${!PIDS[@]}"; do
    if ! kill -0 "${PIDS[$k]}" 2>/dev/null; then echo "${NAMES[$k]}"; return; fi
  done
}
fail() {  # name
  echo "pd_2p1a1f: $1 ended; stopping the others (its log: $LOG_DIR/$1.log)" >&2
  tail -n 5 "$LOG_DIR/$1.log" >&2 || true
  stop_all
  exit 1
}
deadline=$((SECONDS + READY_TIMEOUT_S))
for name in prefill_0 prefill_1 attention; do
  until grep -q "the OpenAI API is up" "$LOG_DIR/$name.log" 2>/dev/null; do
    gone=$(ended)
    [ -z "$gone" ] || fail "$gone"
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "pd_2p1a1f: $name did not come up within $READY_TIMEOUT_S s (log $LOG_DIR/$name.log)" >&2
      stop_all
      exit 1
    fi
    sleep 0.2
  done
done
start proxy "$AFD" proxy --host "$HOST" --port "$PROXY_PORT" --prefiller-hosts "$HOST" "$HOST" \
  --prefiller-ports "${PREFILL_PORTS[@]}" --decoder-hosts "$HOST" --decoder-ports "$DECODE_PORT"
until grep -q "listening on" "$LOG_DIR/proxy.log" 2>/dev/null; do
  gone=$(ended)
  [ -z "$gone" ] || fail "$gone"
  sleep 0.1
done
echo "pd_2p1a1f: the proxy serves http://$HOST:$PROXY_PORT (logs in $LOG_DIR)" >&2
while true; do
  gone=$(ended)
  [ -z "$gone" ] || fail "$gone"
  sleep 0.5 &
  wait $! || true
done
