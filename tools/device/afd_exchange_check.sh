#!/usr/bin/env bash
# One device call for the MoE exchange on the device (issue 37): AFD over the async connector on
# GPU 0 against the monolithic GPU run on a golden checkpoint -- fp32 1A2F / 2A2F / 2A1F greedy
# ids identical and log-probs within 1e-5; bf16 1A1F ids identical (one FFN rank: the same
# arithmetic); bf16 2A2F agreement reported (partial sums per FFN rank: not the monolithic
# order) -- then `afd bench decode` of preset:deepseek-v2-lite (27 layers, bf16, context 128)
# monolithic vs 1A1F and 2A1F under MPS, with --stats of one AFD run for the bytes per token.
# Usage (repo root there): tools/device/afd_exchange_check.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
REPORT="$OUT/afd_exchange_check.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
M=tests/data/golden/v3_noaux_tc
P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --max-tokens 16 --ignore-eos --json --device cuda)
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
for run in "fp32 1A2F strict" "fp32 2A2F strict" "fp32 2A1F strict" "bf16 1A1F ids" "bf16 2A1F ids" "bf16 2A2F report"; do
  set -- $run
  "$BIN/afd" run --model $M "${P[@]}" --dtype $1 >/tmp/mono.json 2>/tmp/err || tail -3 /tmp/err
  timeout 90 "$BIN/afd" run --model $M "${P[@]}" --dtype $1 --topology $2 --additional-config "$ASYNC" --stats >/tmp/afd.json 2>/tmp/err || tail -8 /tmp/err
  grep -E "layer 1 (A2F|F2A)" /tmp/err | head -3 | tee -a "$REPORT"
  python3 - "$1 $2 $3" <<'PYEOF' | tee -a "$REPORT"
import json, sys
mode = sys.argv[1].split()[2]
try:
    a = [json.loads(l) for l in open("/tmp/mono.json")]; b = [json.loads(l) for l in open("/tmp/afd.json")]
except Exception as e:
    print(f"{sys.argv[1]}: no results ({e}) -> FAIL"); sys.exit(0)
same = len(a) == len(b) and all(x["output_ids"] == y["output_ids"] for x, y in zip(a, b))
agree = sum(p == q for x, y in zip(a, b) for p, q in zip(x["output_ids"], y["output_ids"]))
total = sum(len(x["output_ids"]) for x in a)
d = max([abs(p - q) for x, y in zip(a, b) for p, q in zip(x["prompt_logprobs"][1:] + x["logprobs"], y["prompt_logprobs"][1:] + y["logprobs"])] or [0])
ok = {"strict": same and d <= 1e-5, "ids": same, "report": True}[mode]
print(f"{sys.argv[1]}: ids identical {same} ({agree}/{total}), max |dlogprob| {d:.2e} -> {'ok' if ok else 'FAIL'}")
PYEOF
done
B=(--model preset:deepseek-v2-lite --device cuda --batch 1,16,64,256 --context 128)
echo "== monolithic" | tee -a "$REPORT"
timeout 200 "$BIN/afd" bench decode "${B[@]}" 2>&1 | grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
for topo in 1A1F 2A1F; do
  echo "== AFD $topo, async connector" | tee -a "$REPORT"
  timeout 200 "$BIN/afd" bench decode "${B[@]}" --topology $topo --additional-config "$ASYNC" 2>&1 |
    grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
done
mps_off
