#!/usr/bin/env bash
# One device call for issue 37 items 3-4 (CUDA graphs in both AFD roles, async connector,
# device-sequenced slots). MODE check: on a golden checkpoint, every rank on GPU 0 under MPS --
# fp32 AFD (graphs) ids == monolithic ids and log-probs within 1e-5 for 1A1F 1A2F 2A1F 2A2F (and
# 1A1F with two micro-batches); bf16 AFD graphs == AFD eager ids for the same; a prefill of as
# many tokens as a graphed decode step (chunks of 4 tokens, 4 sequences) against the monolithic
# run. MODE bench: `afd bench decode` of preset:deepseek-v2-lite (27 layers, bf16, context 128)
# monolithic vs 1A1F (graphs and eager) and 2A1F, then the torch peer.
# MODE all: the prefill check and the bench; quick: check, and the bench of monolithic vs 1A1F.
# Usage (repo root there): [GOLDEN=checkpoint dir] tools/device/afd_graph_check.sh BIN_DIR OUT_DIR check|bench|all
set -u
BIN=$(readlink -f "$1")
OUT=$2
MODE=${3:-check}
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
REPORT="$OUT/afd_graph_$MODE.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
UB='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"async_moe_ubatching": true, "async_moe_num_ubatches": 2, "ring_depth": 2}}}'
compare() {  # label mode(strict|ids) a.json b.json
  python3 - "$@" <<'PYEOF' | tee -a "$REPORT"
import json, sys
label, mode, fa, fb = sys.argv[1:5]
try:
    a = [json.loads(l) for l in open(fa)]; b = [json.loads(l) for l in open(fb)]
except Exception as e:
    print(f"{label}: no results ({e}) -> FAIL"); sys.exit(0)
same = len(a) == len(b) and all(x["output_ids"] == y["output_ids"] for x, y in zip(a, b))
agree = sum(p == q for x, y in zip(a, b) for p, q in zip(x["output_ids"], y["output_ids"]))
total = sum(len(x["output_ids"]) for x in a)
d = max([abs(p - q) for x, y in zip(a, b) for p, q in zip(x["prompt_logprobs"][1:] + x["logprobs"], y["prompt_logprobs"][1:] + y["logprobs"])] or [0])
ok = same and (mode != "strict" or d <= 1e-5)
print(f"{label}: ids identical {same} ({agree}/{total}), max |dlogprob| {d:.2e} -> {'ok' if ok else 'FAIL'}")
PYEOF
}
if [ "$MODE" = check ] || [ "$MODE" = quick ]; then
  M=${GOLDEN:-tests/data/golden/v3_noaux_tc}
  P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --prompt-ids 11,12 --max-tokens 16 --ignore-eos --json --device cuda)
  for dt in fp32 bf16; do
    "$BIN/afd" run --model $M "${P[@]}" --dtype $dt >/tmp/mono_$dt.json 2>/tmp/err || tail -3 /tmp/err
    for topo in 1A1F 1A2F 2A1F 2A2F; do
      timeout 120 "$BIN/afd" run --model $M "${P[@]}" --dtype $dt --topology $topo --additional-config "$ASYNC" --stats >/tmp/g.json 2>/tmp/err || tail -8 /tmp/err
      grep -E "steps" /tmp/err | head -4 | tee -a "$REPORT"
      if [ $dt = fp32 ]; then
        compare "fp32 $topo graphs vs monolithic" strict /tmp/mono_fp32.json /tmp/g.json
      else
        timeout 120 "$BIN/afd" run --model $M "${P[@]}" --dtype $dt --topology $topo --additional-config "$ASYNC" --enforce-eager >/tmp/e.json 2>/tmp/err || tail -8 /tmp/err
        compare "bf16 $topo graphs vs eager AFD" ids /tmp/e.json /tmp/g.json
        compare "bf16 $topo graphs vs monolithic (report)" report /tmp/mono_bf16.json /tmp/g.json
      fi
    done
  done
  timeout 120 "$BIN/afd" run --model $M "${P[@]}" --dtype fp32 --topology 1A1F --additional-config "$UB" --stats >/tmp/g.json 2>/tmp/err || tail -8 /tmp/err
  grep -E "steps" /tmp/err | head -2 | tee -a "$REPORT"
  compare "fp32 1A1F two micro-batches, graphs vs monolithic" strict /tmp/mono_fp32.json /tmp/g.json
fi
if [ "$MODE" = check ] || [ "$MODE" = all ] || [ "$MODE" = quick ]; then
  # Without --json (which asks for every prompt row's log-probs, so prefills are graphed too):
  # the prefill chunks of 4 tokens run eagerly, the 4-sequence decode steps from graphs; the
  # FFN must replay only the latter (its graph count), and the text must be the monolithic one.
  M=${GOLDEN:-tests/data/golden/v3_noaux_tc}
  C=(--prompt-ids 1,2,3,4 --prompt-ids 5,6,7,8 --prompt-ids 9,10,11,12 --prompt-ids 13,14,15,16 --max-tokens 12 --ignore-eos --device cuda --dtype fp32 --max-num-batched-tokens 4 --enable-chunked-prefill)
  "$BIN/afd" run --model $M "${C[@]}" >/tmp/mono_c.txt 2>/tmp/err || tail -3 /tmp/err
  timeout 120 "$BIN/afd" run --model $M "${C[@]}" --topology 1A1F --additional-config "$ASYNC" --stats >/tmp/g.txt 2>/tmp/err || tail -8 /tmp/err
  grep -E "steps" /tmp/err | head -2 | tee -a "$REPORT"
  if cmp -s /tmp/mono_c.txt /tmp/g.txt; then r=ok; else r=FAIL; fi
  echo "fp32 1A1F eager 4-token prefill chunks + graphed 4-sequence decode: output identical to monolithic -> $r" | tee -a "$REPORT"
  head -3 /tmp/g.txt | tee -a "$REPORT"
fi
if [ "$MODE" = bench ] || [ "$MODE" = all ] || [ "$MODE" = quick ]; then
  B=(--model preset:deepseek-v2-lite --device cuda --batch 1,16,64,256 --context 128)
  echo "== monolithic" | tee -a "$REPORT"
  timeout 200 "$BIN/afd" bench decode "${B[@]}" 2>&1 | grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
  RUNS=("1A1F graphs" "1A1F eager" "2A1F graphs")
  [ "$MODE" = quick ] && RUNS=("1A1F graphs")
  for run in "${RUNS[@]}"; do
    set -- $run
    EXTRA=(); [ $2 = eager ] && EXTRA=(--enforce-eager)
    echo "== AFD $1 $2, async connector" | tee -a "$REPORT"
    timeout 240 "$BIN/afd" bench decode "${B[@]}" --topology $1 --additional-config "$ASYNC" "${EXTRA[@]}" 2>&1 |
      grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
  done
  mps_off
  [ "$MODE" = quick ] && exit 0
  echo "== torch peer (graphed, context 128)" | tee -a "$REPORT"
  timeout 300 $PY "$BIN/torch_peer.py" "$OUT/torch_peer.json" 128 1,16,64,256 2>&1 | tail -6 | tee -a "$REPORT"
fi
mps_off 2>/dev/null
true
