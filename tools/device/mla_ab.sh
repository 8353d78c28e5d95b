#!/usr/bin/env bash
# One device call: the MLA decode kernel of one build (NEW_DIR) against another (OLD_DIR): NEW's
# backend_ops_test, MlaAttention (tiled, bf16 cache) perf of both, `afd bench decode` of both
# (context 128 at batch 1 / 64 / 256, context 1024 at 64 / 256), then NEW's bf16 fidelity on two
# goldens (graph == eager, ids vs the fp32 CPU run, v3_trained vs transformers bf16).
# LONG_BATCH: the batches at context 1024 (default 64,256); CASES: the goldens (default
# "v3_trained v2_greedy_yarn").
# Usage (repo root there; shared libraries in OLD_DIR): tools/device/mla_ab.sh NEW_DIR OLD_DIR
set -u
HERE=$(dirname "$(readlink -f "$0")")
NEW=$(readlink -f "$1")
OLD=$(readlink -f "$2")
BIN=$OLD
. "$HERE/env.sh"  # LD_LIBRARY_PATH, PY
echo "== backend_ops_test (new)"
"$NEW/backend_ops_test" 2>&1 | grep -vE " OK $" | tail -6
for b in OLD NEW; do
  echo "== MlaAttention perf ($b)"
  "${!b}/backend_ops_test" --perf --op MlaAttention --backend cuda 2>&1 |
    grep -E "decode (1|16|64|256) x ctx (128|129|512|1024), 16 heads, tf32, bf16 cache" |
    sed -E 's/ +MlaAttention +decode/  decode/; s/, 16 heads, tf32, bf16 cache//'
done
for b in OLD NEW; do
  echo "== afd bench decode ($b)"
  timeout 150 "${!b}/afd" bench decode --model preset:deepseek-v2-lite --device cuda \
    --batch 1,64,256 --context 128 --steps 16 2>&1 | grep -E "^ +[0-9]+ +[0-9.]+ " | cut -c1-60
  timeout 150 "${!b}/afd" bench decode --model preset:deepseek-v2-lite --device cuda \
    --batch "${LONG_BATCH:-64,256}" --context 1024 --steps 8 2>&1 | grep -E "^ +[0-9]+ +[0-9.]+ " | cut -c1-60
done
echo "== bf16 fidelity (new)"
W=$(mktemp -d)
for c in ${CASES:-v3_trained v2_greedy_yarn}; do
  M=tests/data/golden/$c
  P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --max-tokens 20 --ignore-eos --json)
  "$NEW/afd" run --model "$M" "${P[@]}" >"$W/cpu.json"
  "$NEW/afd" run --model "$M" "${P[@]}" --device cuda --dtype bf16 >"$W/g.json" 2>/dev/null
  "$NEW/afd" run --model "$M" "${P[@]}" --device cuda --dtype bf16 --enforce-eager >"$W/e.json" 2>/dev/null
  $PY - "$W" "$c" <<'PYEOF'
import json, sys
w, c = sys.argv[1], sys.argv[2]
cpu, g, e = ([json.loads(l) for l in open(f"{w}/{n}.json")] for n in ("cpu", "g", "e"))
agree = sum(p == q for x, y in zip(cpu, g) for p, q in zip(x["output_ids"], y["output_ids"]))
total = sum(len(x["output_ids"]) for x in cpu)
same = len(g) == len(e) and all(x["output_ids"] == y["output_ids"] for x, y in zip(g, e))
print(f"{c}: bf16 ids equal to fp32 cpu {agree}/{total}; graph vs eager identical {same}")
PYEOF
done
$PY "$HERE/score_bf16.py" "$NEW/afd" tests/data/golden/v3_trained \
  tests/data/golden/v3_trained/bf16_reference.json "$W" --device cuda --dtype bf16
