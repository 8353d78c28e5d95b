#!/usr/bin/env bash
# One device call: AFD roles on one GPU through the async connector's CUDA IPC windows, with
# binaries built elsewhere. Usage (repo root there): tools/device/async_gpu_check.sh BIN_DIR OUT
# For every golden checkpoint: `afd run --device cuda --topology T` (T = 1A1F, 2A2F, 3A2F; every
# rank a process on GPU 0) equals the monolithic `afd run --device cuda` -- fp32: identical
# greedy ids and prompt log-probs within 1e-5; bf16: identical greedy ids. Then the per-layer
# round trip (--stats) and a decode comparison on preset:deepseek-v2-lite (8 layers).
set -u
HERE=$(dirname "$(readlink -f "$0")")
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
WORK=$(mktemp -d)
. "$HERE/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
AFD="$BIN/afd"
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --prompt-ids 11,12,13,14,15)
status=0
for c in v2_greedy_yarn v2_group_limited v3_noaux_tc v3_sharded v3_trained; do
  M=tests/data/golden/$c
  for dt in fp32 bf16; do
    "$AFD" run --model "$M" "${P[@]}" --max-tokens 16 --ignore-eos --json --device cuda \
      --dtype $dt >"$WORK/${c}_${dt}_mono.json" 2>"$WORK/err" || { tail -3 "$WORK/err"; status=1; }
    for T in 1A1F 2A2F 3A2F; do
      [ $dt = bf16 ] && [ $T = 3A2F ] && continue
      timeout 120 "$AFD" run --model "$M" "${P[@]}" --max-tokens 16 --ignore-eos --json \
        --device cuda --dtype $dt --topology $T --additional-config "$ASYNC" \
        >"$WORK/${c}_${dt}_$T.json" 2>"$WORK/err_$T" || { echo "$c $dt $T failed:"; tail -8 "$WORK/err_$T"; status=1; continue; }
      $PY "$HERE/compare_runs.py" "$WORK/${c}_${dt}_mono.json" "$WORK/${c}_${dt}_$T.json" "$c $dt $T" || status=1
    done
  done
done

echo "== per-layer round trip, 1A1F on one GPU (v3_noaux_tc, fp32, --stats)"
timeout 120 "$AFD" run --model tests/data/golden/v3_noaux_tc "${P[@]}" --max-tokens 32 \
  --ignore-eos --device cuda --dtype fp32 --topology 1A1F --additional-config "$ASYNC" --stats \
  2>&1 | grep -E "rank|layer" | head -12

echo "== decode: preset:deepseek-v2-lite (8 layers, bf16), 16 prompts of 64 tokens, 64 new tokens"
PROMPTS=()
for i in $(seq 16); do PROMPTS+=(--prompt-ids "$(seq -s, $((i * 100)) $((i * 100 + 63)))"); done
for T in mono 1A1F; do
  extra=()
  [ $T = 1A1F ] && extra=(--topology 1A1F --additional-config "$ASYNC")
  timeout 200 "$AFD" run --model preset:deepseek-v2-lite --num-layers 8 --device cuda "${PROMPTS[@]}" \
    --max-tokens 64 --ignore-eos --stats "${extra[@]}" >"$WORK/v2lite_$T.txt" 2>&1 || status=1
  echo "$T:"; grep -E "decode|ms/step|tokens/s" "$WORK/v2lite_$T.txt" | grep -v "loading" | head -4
done
diff <(grep -E "^prompt" "$WORK/v2lite_mono.txt") <(grep -E "^prompt" "$WORK/v2lite_1A1F.txt") >/dev/null &&
  echo "v2-lite 8 layers: 1A1F ids identical to monolithic" || echo "v2-lite 8 layers: ids differ (bf16)"
echo "== afd launch --device cuda --topology 2A1F (v3_noaux_tc, fp32): the API equals afd run"
LOG=$WORK/launch.log
"$AFD" launch --model tests/data/golden/v3_noaux_tc --topology 2A1F --device cuda --dtype fp32 \
  --host 127.0.0.1 --port 0 >"$LOG" 2>&1 &
LAUNCH=$!
for _ in $(seq 240); do grep -q "is up on" "$LOG" && break; kill -0 $LAUNCH 2>/dev/null || break; sleep 0.25; done
URL=$(grep -o "http://127.0.0.1:[0-9]*" "$LOG" | head -1)
if [ -n "$URL" ]; then
  $PY - "$URL" "$WORK/v3_noaux_tc_fp32_mono.json" <<'PYEOF' || status=1
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url, mono = sys.argv[1], [json.loads(l) for l in open(sys.argv[2])]
def ask(m):
    body = {"model": "tests/data/golden/v3_noaux_tc", "prompt": m["prompt_ids"], "max_tokens": 16,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["token_ids"]
with ThreadPoolExecutor(8) as ex:
    got = list(ex.map(ask, mono * 4))
ok = all(g == m["output_ids"] for g, m in zip(got, mono * 4))
print(f"{len(got)} concurrent API requests equal afd run: {ok}")
sys.exit(0 if ok else 1)
PYEOF
else
  echo "launch did not come up:"; tail -15 "$LOG"; status=1
fi
kill -TERM $LAUNCH 2>/dev/null; wait $LAUNCH; echo "afd launch exit status after SIGTERM: $?"
tail -3 "$LOG"

echo "== host-side flags (device_flags false): 2A2F fp32 equals the monolithic run"
HOSTF='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"device_flags": false}}}'
M=tests/data/golden/v3_noaux_tc
timeout 120 "$AFD" run --model "$M" "${P[@]}" --max-tokens 16 --ignore-eos --json --device cuda \
  --dtype fp32 --topology 2A2F --additional-config "$HOSTF" >"$WORK/hostflags.json" 2>"$WORK/err_hf" || { tail -5 "$WORK/err_hf"; status=1; }
$PY -c 'import json,sys
a=[json.loads(l)["output_ids"] for l in open(sys.argv[1])]; b=[json.loads(l)["output_ids"] for l in open(sys.argv[2])]
print("host flags 2A2F ids identical:", a == b); sys.exit(0 if a == b else 1)' "$WORK/v3_noaux_tc_fp32_mono.json" "$WORK/hostflags.json" || status=1

echo "== kill -9 of the FFN rank while the attention stream waits on a device flag"
LOG=$WORK/launch_kill.log
"$AFD" launch --model preset:deepseek-v2-lite --num-layers 4 --topology 1A1F --device cuda \
  --host 127.0.0.1 --port 0 --max-model-len 4096 >"$LOG" 2>&1 &
LAUNCH=$!
for _ in $(seq 480); do grep -q "is up on" "$LOG" && break; kill -0 $LAUNCH 2>/dev/null || break; sleep 0.25; done
URL=$(grep -o "http://127.0.0.1:[0-9]*" "$LOG" | head -1)
FFN=$(for p in $(pgrep -P $LAUNCH); do tr '\0' ' ' </proc/$p/cmdline | grep -q '"role":"ffn"' && echo $p; done | head -1)
if [ -n "$URL" ] && [ -n "$FFN" ]; then
  curl -s -m 60 "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "preset:deepseek-v2-lite", "prompt": [1,2,3], "max_tokens": 3000, "ignore_eos": true}' >/dev/null &
  sleep 2; kill -9 $FFN; T0=$(date +%s.%N)
  timeout 60 tail --pid=$LAUNCH -f /dev/null; rc=$?
  wait $LAUNCH; lrc=$?
  echo "launch exited with $lrc $(python3 -c "import sys; print('%.1f s' % (float(sys.argv[2]) - float(sys.argv[1])))" $T0 $(date +%s.%N)) after the kill (timeout rc $rc)"
  grep -iE "ffn rank 0|exited|error" "$LOG" | head -4
  { [ $lrc -ne 0 ] && [ $rc -eq 0 ] && grep -q "ffn rank 0" "$LOG"; } || { echo "kill check FAILED"; status=1; }
  pgrep -f "afd worker" >/dev/null && { echo "worker processes left behind"; pkill -9 -f "afd worker"; status=1; }
else
  echo "launch did not come up or no FFN child:"; tail -15 "$LOG"; status=1; kill -9 $LAUNCH 2>/dev/null
fi
echo "== exit status $status"
exit $status
