#!/usr/bin/env bash
# Prefill/decode disaggregation vs colocation under a prefill-heavy load (issue 40 item 8):
# `afd bench serve` against (1) the colocated 1A1F deployment -- one attention API server and
# one FFN role, prefill and decode in the same engine -- and (2) seed 004's 2P1A1F through
# `afd proxy` (recipes/pd_2p1a1f.sh: the same 1A1F deployment as the decoder, two prefill
# instances), for each load IN:OUT. Prints vLLM's summary lines (TTFT, TPOT, ITL percentiles),
# and for the disaggregated runs the KV transfer's bytes per prompt token and its rate (from the
# decoder's afd:kv_transfer_* metrics, counted over that load alone). First, on each side, 16
# greedy requests (prompts of 64-2,000 tokens, 32 new tokens) whose outputs are compared: the same
# ids on the CPU (exact by construction); on a GPU, the decoder computes the last prompt token
# alone where colocation computed it in the prefill, so bf16 sums may round differently -- the
# share of identical outputs and the mean common prefix are reported. Result JSONs and logs go to
# OUT_DIR.
#
#   bench/pd_bench.sh OUT_DIR
#   DEVICE=cpu MODEL_PATH=preset:tiny LOADS="2048:128 3840:256" bench/pd_bench.sh /tmp/pd
#
# Environment (defaults in brackets): AFD [build/afd], MODEL_PATH [preset:deepseek-v2-lite],
# DEVICE [cuda], LOADS [2048:128 8192:256], NUM_PROMPTS [64], REQUEST_RATE [4] (requests/s,
# Poisson), MAX_CONCURRENCY [16], GPUS [0 0 0 0] (prefill 0, prefill 1, attention, FFN; one GPU
# needs MPS running), AFD_CONNECTOR [AsyncAFDConnector on cuda, P2pHostAFDConnector on cpu],
# EXTRA_FLAGS (every serve command's, e.g. --num-gpu-blocks-override / --max-model-len),
# KV_TRANSPORT [tcp] (cuda_ipc: device to device between the GPU instances, recipes/pd_2p1a1f.sh).
set -euo pipefail
OUT=${1:?usage: bench/pd_bench.sh OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AFD=$(readlink -f "${AFD:-$ROOT/build/afd}")
MODEL_PATH=${MODEL_PATH:-preset:deepseek-v2-lite}
DEVICE=${DEVICE:-cuda}
read -r -a LOADS <<<"${LOADS:-2048:128 8192:256}"
NUM_PROMPTS=${NUM_PROMPTS:-64}
REQUEST_RATE=${REQUEST_RATE:-4}
MAX_CONCURRENCY=${MAX_CONCURRENCY:-16}
read -r -a GPUS <<<"${GPUS:-0 0 0 0}"
if [ "$DEVICE" = cuda ]; then CONNECTOR=${AFD_CONNECTOR:-AsyncAFDConnector}; else CONNECTOR=${AFD_CONNECTOR:-P2pHostAFDConnector}; fi
read -r -a EXTRA <<<"${EXTRA_FLAGS:-}"
PY=${PY:-python3}
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")
PIDS=()
# Whatever ends this script (an error, a signal) stops what it started.
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
metric() {  # port name: the value of the series (0 when absent)
  "$PY" - "$1" "$2" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
v = 0.0
for line in text.splitlines():
    if line.startswith(sys.argv[2] + "{") or line.startswith(sys.argv[2] + " "):
        v = float(line.rsplit(" ", 1)[1])
        break
print(v)
EOF
}
device_flags() {  # gpu
  if [ "$DEVICE" = cuda ]; then echo "--device cuda --cuda-device $1"; else echo "--device cpu"; fi
}
wait_for() {  # log pattern pid
  for _ in $(seq 2400); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "pd_bench: the process writing $1 ended:" >&2; tail -n 8 "$1" >&2; return 1; }
    sleep 0.25
  done
  echo "pd_bench: $1 never said '$2'" >&2
  return 1
}
greedy_ids() {  # tag port: 16 greedy outputs, saved as OUT/tag_ids.json
  "$PY" - "$2" "$OUT/$1_ids.json" <<'EOF'
import json, sys, urllib.request
port, path = sys.argv[1], sys.argv[2]
outs = []
for i in range(16):
    n = 64 + (i * 127) % 1937
    prompt = [(t * 31 + i * 7) % 997 + 3 for t in range(n)]
    body = {"prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    outs.append(json.load(urllib.request.urlopen(req, timeout=600))["choices"][0]["token_ids"])
json.dump(outs, open(path, "w"))
EOF
}
bench() {  # tag port in out
  "$AFD" bench serve --base-url "http://127.0.0.1:$2" --num-prompts "$NUM_PROMPTS" \
    --random-input-len "$3" --random-output-len "$4" --random-range-ratio 0 --ignore-eos \
    --request-rate "$REQUEST_RATE" --max-concurrency "$MAX_CONCURRENCY" --seed 1 --disable-tqdm \
    --metric-percentiles 50,90,99 --result-json "$OUT/$1_$3_$4.json" 2>&1 |
    grep -E "Successful|Failed|throughput|TTFT|TPOT|ITL|E2EL" | sed "s/^/[$1 in $3 out $4] /"
}

echo "== pd_bench $(date -u +%FT%TZ) model $MODEL_PATH device $DEVICE connector $CONNECTOR, $NUM_PROMPTS prompts per load at $REQUEST_RATE req/s, concurrency <= $MAX_CONCURRENCY"

# (1) Colocated 1A1F: two serve commands, the attention role's API answers everything.
PORT=$(free_port)
API=$(free_port)
cfg() { echo "{\"afd\": {\"role\": \"$1\", \"connector\": \"$CONNECTOR\", \"host\": \"127.0.0.1\", \"port\": $PORT, \"num_attention_ranks\": 1, \"num_ffn_ranks\": 1}}"; }
# shellcheck disable=SC2046
"$AFD" serve "$MODEL_PATH" $(device_flags "${GPUS[3]}") --additional-config "$(cfg ffn)" "${EXTRA[@]}" \
  >"$OUT/colocated_ffn.log" 2>&1 &
FFN=$!
PIDS+=("$FFN")
# shellcheck disable=SC2046
"$AFD" serve "$MODEL_PATH" $(device_flags "${GPUS[2]}") --host 127.0.0.1 --port "$API" \
  --additional-config "$(cfg attention)" "${EXTRA[@]}" >"$OUT/colocated_attention.log" 2>&1 &
ATT=$!
PIDS+=("$ATT")
if wait_for "$OUT/colocated_attention.log" "the OpenAI API is up" "$ATT"; then
  greedy_ids colocated "$API"
  for load in "${LOADS[@]}"; do bench colocated "$API" "${load%%:*}" "${load##*:}"; done
fi
kill -TERM "$ATT" "$FFN" 2>/dev/null || true
wait "$ATT" "$FFN" 2>/dev/null || true

# (2) 2P1A1F through the proxy.
PROXY=$(free_port)
DECODE=$(free_port)
env AFD="$AFD" MODEL_PATH="$MODEL_PATH" DEVICE="$DEVICE" AFD_CONNECTOR="$CONNECTOR" \
  PREFILL_PORTS="$(free_port) $(free_port)" KV_PORTS="$(free_port) $(free_port)" \
  DECODE_PORT="$DECODE" PROXY_PORT="$PROXY" AFD_CONNECTOR_PORT="$(free_port)" GPUS="${GPUS[*]}" \
  LOG_DIR="$OUT/pd_logs" READY_TIMEOUT_S=900 EXTRA_FLAGS="${EXTRA[*]}" KV_TRANSPORT="${KV_TRANSPORT:-tcp}" \
  bash "$ROOT/recipes/pd_2p1a1f.sh" >"$OUT/pd_recipe.log" 2>&1 &
RECIPE=$!
PIDS+=("$RECIPE")
if wait_for "$OUT/pd_recipe.log" "the proxy serves" "$RECIPE"; then
  greedy_ids pd_2p1a1f "$PROXY"
  "$PY" - "$OUT" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1] + "/colocated_ids.json"))
b = json.load(open(sys.argv[1] + "/pd_2p1a1f_ids.json"))
same = sum(x == y for x, y in zip(a, b))
prefix = []
for x, y in zip(a, b):
    k = 0
    while k < min(len(x), len(y)) and x[k] == y[k]:
        k += 1
    prefix.append(k)
first = sum(x[:1] == y[:1] for x, y in zip(a, b))
print(f"[fidelity] 2P1A1F vs colocated, 16 greedy requests of 32 tokens: {same}/16 identical, "
      f"first token equal {first}/16, mean common prefix {sum(prefix) / len(prefix):.1f} tokens")
EOF
  for load in "${LOADS[@]}"; do
    b0=$(metric "$DECODE" afd:kv_transfer_bytes_total)
    p0=$(metric "$DECODE" afd:kv_transfer_positions_total)
    s0=$(metric "$DECODE" afd:kv_transfer_seconds_sum)
    n0=$(metric "$DECODE" afd:kv_transfer_seconds_count)
    bench pd_2p1a1f "$PROXY" "${load%%:*}" "${load##*:}"
    b1=$(metric "$DECODE" afd:kv_transfer_bytes_total)
    p1=$(metric "$DECODE" afd:kv_transfer_positions_total)
    s1=$(metric "$DECODE" afd:kv_transfer_seconds_sum)
    n1=$(metric "$DECODE" afd:kv_transfer_seconds_count)
    f=$(metric "$DECODE" afd:kv_transfer_failures_total)
    dv=$(metric "$DECODE" afd:kv_transfer_device_total)
    "$PY" -c "
b, p, s, n = $b1 - $b0, $p1 - $p0, $s1 - $s0, $n1 - $n0
print(f'[pd_2p1a1f in ${load%%:*} out ${load##*:}] KV transfers: {n:.0f} pulls, {b / 1e6:.1f} MB, '
      f'{b / max(p, 1):.0f} B per prompt token, {b / max(s, 1e-9) / 1e6:.1f} MB/s per pull '
      f'(mean pull {s / max(n, 1) * 1e3:.1f} ms), failures so far {$f:.0f}, over CUDA IPC so far {$dv:.0f}')"
  done
fi
kill -TERM "$RECIPE" 2>/dev/null || true
wait "$RECIPE" 2>/dev/null || true
