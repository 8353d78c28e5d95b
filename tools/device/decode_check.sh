#!/usr/bin/env bash
# One device call after a change to the decode kernels: gpu_check.sh (backend_ops_test, fp32 vs
# the CPU and bf16 graph vs eager on the goldens, v3_trained vs transformers bf16, afd bench decode
# at context 128 and 1024; the torch peer unless SKIP_PEER=1), its summary printed, then
# `afd bench decode` again under AB_ENV (e.g. "AFD_MOE_WGMMA=0": a kernel choice turned off, to
# compare in the same call) and/or with AB_ARGS (e.g. "--no-async-scheduling") at AB_BATCH
# (default 1,16,64); PREFILL=1: also the 8 x 1024 prefill with its per-op profile (issue 11's
# prefill target); SYNC_CHECK=1: afd run's JSON with and without asynchronous scheduling.
# Usage (repo root there): tools/device/decode_check.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
. "$HERE/env.sh"  # LD_LIBRARY_PATH, PY
SCORE_CASES=${SCORE_CASES:-v3_trained} SKIP_PERF=1 SKIP_PEER=${SKIP_PEER:-} LONG_CONTEXT=1 \
  timeout "${CHECK_TIMEOUT:-450}" bash "$HERE/gpu_check.sh" "$BIN" /tmp/decode_chk >"$OUT/check.log" 2>&1
echo "== gpu_check (rc $?)"
grep -v '^\[' "$OUT/check.log" | grep -vE 'Loading weights|^\s*$' |
  grep -E '^== AFD_|passed|failed|FAIL|greedy ids identical|top-1|batch|^ +[0-9]+ |exit status|ms/step|torch|peer|graph_ms' |
  cut -c1-220 | tail -40
if [ -n "${AB_ENV:-}${AB_ARGS:-}" ]; then
  echo "== afd bench decode with ${AB_ENV:-} ${AB_ARGS:-}"
  env ${AB_ENV:-} timeout 240 "$BIN/afd" bench decode --model preset:deepseek-v2-lite --device cuda \
    --batch "${AB_BATCH:-1,16,64}" --context 128 --steps 16 ${AB_ARGS:-} 2>&1 |
    grep -v "loading weights \[" | tail -6
fi
if [ -n "${SYNC_CHECK:-}" ]; then
  # Asynchronous scheduling against waiting for each step's ids: the same JSON (ids, logprobs)
  # on a golden checkpoint, bf16 with graphs, greedy and sampled, several prompts.
  echo "== async scheduling vs --no-async-scheduling (afd run, cuda)"
  M=tests/data/golden/v3_trained
  P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --prompt-ids 11,12)
  for extra in "" "--temperature 0.8 --top-p 0.9 --seed 7"; do
    "$BIN/afd" run --model "$M" "${P[@]}" --max-tokens 24 --ignore-eos --json --device cuda \
      --dtype bf16 $extra >/tmp/async.json 2>/tmp/async.err || cat /tmp/async.err
    "$BIN/afd" run --model "$M" "${P[@]}" --max-tokens 24 --ignore-eos --json --device cuda \
      --dtype bf16 $extra --no-async-scheduling >/tmp/sync.json 2>/tmp/sync.err || cat /tmp/sync.err
    if cmp -s /tmp/async.json /tmp/sync.json && [ -s /tmp/sync.json ]; then
      echo "async == sync ($extra): identical JSON, $(wc -l </tmp/sync.json) prompts"
    else
      echo "async != sync ($extra) FAIL"; diff /tmp/async.json /tmp/sync.json | head -5
    fi
  done
fi
if [ -n "${PREFILL:-}" ]; then
  echo "== afd bench decode --batch 8 --context 1024 --profile (the prefill step's ops)"
  timeout 200 "$BIN/afd" bench decode --model preset:deepseek-v2-lite --device cuda --batch 8 \
    --context 1024 --steps 4 --profile 2>&1 | grep -v "loading weights" | sed -n 3,14p
fi
