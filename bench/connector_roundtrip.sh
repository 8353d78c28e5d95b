#!/usr/bin/env bash
# Round-trip time per MoE layer over the host transport (P2pHostAFDConnector, TCP loopback):
# 1, 16, 128 and 512 rows of 2048 bf16 values, for 1A1F and 4A2F. Prints one JSON line per
# attention rank with median / p10 / p90 microseconds per row count. Record results in
# docs/perf.md.
#   bench/connector_roundtrip.sh [path/to/afd] [iters]
set -euo pipefail
AFD=${1:-build/afd}
ITERS=${2:-200}
run() {
  local A=$1 F=$2 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  local pids=()
  for role in ffn attention; do
    local n=$F
    [ "$role" = attention ] && n=$A
    for ((r = 0; r < n; r++)); do
      "$AFD" connector-test --bench --bench-rows 1,16,128,512 --iters "$ITERS" --hidden 2048 \
        --dtype bf16 --role-rank "$r" --additional-config \
        "{\"afd\": {\"role\": \"$role\", \"connector\": \"P2pHostAFDConnector\", \"port\": $port, \"num_attention_ranks\": $A, \"num_ffn_ranks\": $F}}" \
        >"/tmp/afd_bench_${A}a${F}f_${role}${r}.json" &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "== ${A}A${F}F"
  for ((r = 0; r < A; r++)); do
    python3 -c "import json,sys; d=json.load(open('/tmp/afd_bench_${A}a${F}f_attention$r.json')); print('attention', $r, json.dumps(d['bench']))"
  done
}
run 1 1
run 4 2
