#!/usr/bin/env bash
# One device call for issue 37 item 5 (the P2P connector over NCCL with FULL_DECODE_ONLY CUDA
# graphs): needs one GPU per rank (NCCL refuses two ranks on one GPU), so 2 GPUs for 1A1F and 3
# for 2A1F (run on nvidia-h200-x2 / -x4). On a golden checkpoint: fp32 P2P graphs ids ==
# monolithic ids, log-probs within 1e-5 (gate on the FFN, on the attention, DBO); bf16 graphs ==
# bf16 eager ids; eager 4-token prefill chunks beside graphed 4-sequence decode steps (the FFN
# must replay only the decode steps: its graph_steps) == monolithic text. Then `afd bench decode`
# of preset:deepseek-v2-lite (27 layers, bf16, context 128): monolithic vs P2P 1A1F graphs and
# eager. Usage (repo root there): [GOLDEN=dir] tools/device/p2p_graph_check.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
REPORT="$OUT/p2p_graph.txt"
nvidia-smi -L | tee "$REPORT"
GPUS=$(nvidia-smi -L | wc -l)
P2P='{"afd": {"connector": "P2pNcclAFDConnector"}}'
GATE='{"afd": {"connector": "P2pNcclAFDConnector", "compute_gate_on_attention": true}}'
compare() {  # label mode(strict|ids|report) a.json b.json
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
print(f"{label}: ids identical {same} ({agree}/{total}), max |dlogprob| {d:.2e} -> {'ok' if ok or mode == 'report' else 'FAIL'}")
PYEOF
}
M=${GOLDEN:-tests/data/golden/v3_noaux_tc}
P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --prompt-ids 11,12 --max-tokens 16 --ignore-eos --json --device cuda)
DBO=(--enable-dbo --dbo-decode-token-threshold 2 --dbo-prefill-token-threshold 2)
TOPOS="1A1F"
[ "$GPUS" -ge 3 ] && TOPOS="1A1F 2A1F"
for dt in fp32 bf16; do
  "$BIN/afd" run --model $M "${P[@]}" --dtype $dt >/tmp/mono_$dt.json 2>/tmp/err || tail -3 /tmp/err
  for topo in $TOPOS; do
    DEV=(--cuda-devices 0,1); [ $topo = 2A1F ] && DEV=(--cuda-devices 0,1,2)
    for variant in ffn_gate attention_gate dbo; do
      CFG=$P2P; EXTRA=()
      [ $variant = attention_gate ] && CFG=$GATE
      [ $variant = dbo ] && EXTRA=("${DBO[@]}")
      [ $dt = bf16 ] && [ $variant != ffn_gate ] && continue
      timeout 150 "$BIN/afd" run --model $M "${P[@]}" --dtype $dt --topology $topo "${DEV[@]}" --additional-config "$CFG" "${EXTRA[@]}" --stats >/tmp/g.json 2>/tmp/err || tail -8 /tmp/err
      grep -E "steps|graph" /tmp/err | head -4 | tee -a "$REPORT"
      if [ $dt = fp32 ]; then
        compare "fp32 P2P $topo $variant graphs vs monolithic" strict /tmp/mono_fp32.json /tmp/g.json
      else
        timeout 150 "$BIN/afd" run --model $M "${P[@]}" --dtype $dt --topology $topo "${DEV[@]}" --additional-config "$CFG" --enforce-eager >/tmp/e.json 2>/tmp/err || tail -8 /tmp/err
        compare "bf16 P2P $topo graphs vs eager P2P" ids /tmp/e.json /tmp/g.json
        compare "bf16 P2P $topo graphs vs monolithic (report)" report /tmp/mono_bf16.json /tmp/g.json
      fi
    done
  done
done
# Without --json (every prompt row's log-probs would graph the prefills too): the 4-token
# prefill chunks run eagerly (no kGraphReplay), the 4-sequence decode steps from graphs.
C=(--prompt-ids 1,2,3,4 --prompt-ids 5,6,7,8 --prompt-ids 9,10,11,12 --prompt-ids 13,14,15,16 --max-tokens 12 --ignore-eos --device cuda --dtype fp32 --max-num-batched-tokens 4 --enable-chunked-prefill)
"$BIN/afd" run --model $M "${C[@]}" >/tmp/mono_c.txt 2>/tmp/err || tail -3 /tmp/err
timeout 150 "$BIN/afd" run --model $M "${C[@]}" --topology 1A1F --cuda-devices 0,1 --additional-config "$P2P" --stats >/tmp/g.txt 2>/tmp/err || tail -8 /tmp/err
grep -E "steps|graph" /tmp/err | head -4 | tee -a "$REPORT"
if cmp -s /tmp/mono_c.txt /tmp/g.txt; then r=ok; else r=FAIL; fi
echo "fp32 P2P 1A1F eager 4-token prefill chunks + graphed 4-sequence decode == monolithic -> $r" | tee -a "$REPORT"
B=(--model preset:deepseek-v2-lite --device cuda --batch 1,16,64,256 --context 128)
echo "== monolithic" | tee -a "$REPORT"
timeout 200 "$BIN/afd" bench decode "${B[@]}" 2>&1 | grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
for mode in graphs eager; do
  EXTRA=(); [ $mode = eager ] && EXTRA=(--enforce-eager)
  echo "== P2P 1A1F $mode (NCCL, FFN on GPU 0, attention on GPU 1)" | tee -a "$REPORT"
  timeout 240 "$BIN/afd" bench decode "${B[@]}" --topology 1A1F --cuda-devices 0,1 --additional-config "$P2P" "${EXTRA[@]}" 2>&1 |
    grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
done
true
