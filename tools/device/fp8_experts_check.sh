#!/usr/bin/env bash
# One device call for FP8 routed experts held as FP8 on the GPU (issue 67 item 1, decode).
# AFD_FP8_EXPERTS=1 holds --quantization fp8 / FP8-checkpoint routed experts as E4M3 codes with
# 128 x 128 block scales; up to 256 rows an expert GroupedMmaFp8 runs them w8a8 (x and the SwiGLU
# product as E4M3 rows with a scale per 128, the e4m3 mma), above that they are dequantized to
# bf16 for the tiled form. MODE:
#   check (default):
#     1. backend_ops_test --backend cuda --op "GroupedExpertMlp FP8": w8a8 against its double
#        emulation, the prefill case against the dequantized experts (tol 0); then --perf beside
#        the bf16 MoE cases;
#     2. the v3_trained_fp8 golden (tools/golden: trained on the CPU, its bf16 reference from
#        transformers on the GPU), returned as OUT/v3_trained_fp8.tgz to commit;
#     3. tools/weight_fidelity.py on its `afd quantize` copy: the CPU fp32 run of the bf16
#        checkpoint is the reference; GPU bf16 with the FP8 experts held (w8a8) and dequantized,
#        and the CPU's dequantized FP8 weights;
#     4. afd run on preset:deepseek-v2-lite (LAYERS, default 4) --quantization fp8, greedy,
#        AFD_FP8_EXPERTS=0 and 1: how many generated ids agree.
#   bench: afd bench decode at BATCHES (default 1,16,64,256), context 128, LAYERS (default 27)
#     layers: bf16, --quantization fp8 with AFD_FP8_EXPERTS=0 (dequantized) and 1 (held FP8).
# Usage (repo root there): tools/device/fp8_experts_check.sh BIN_DIR OUT_DIR [check|bench]
set -u
BIN=$(readlink -f "$1")
OUT=$2
MODE=${3:-check}
mkdir -p "$OUT"
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
REPORT="$OUT/fp8_experts_$MODE.txt"
nvidia-smi -L | tee "$REPORT"
if [ "$MODE" = bench ]; then
  L=${LAYERS:-27}
  B=(--model preset:deepseek-v2-lite --num-layers "$L" --device cuda
    --batch "${BATCHES:-1,16,64,256}" --context 128)
  for form in bf16 fp8:0 fp8:1; do
    q=(); v=0
    [ "$form" != bf16 ] && q=(--quantization fp8) && v=${form#fp8:}
    echo "== bench decode, $L layers, $form (AFD_FP8_EXPERTS=$v)" | tee -a "$REPORT"
    AFD_FP8_EXPERTS=$v timeout 150 "$BIN/afd" bench decode "${B[@]}" "${q[@]}" 2>&1 |
      grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
  done
  exit 0
fi
echo "== backend_ops_test, FP8 experts" | tee -a "$REPORT"
timeout 120 "$BIN/backend_ops_test" --backend cuda --op "GroupedExpertMlp FP8" 2>&1 | tail -7 |
  tee -a "$REPORT"
echo "== --perf, V2-Lite's experts: bf16, then FP8" | tee -a "$REPORT"
for n in 1 16 64 256; do  # (the bf16 cases of 4096+ tokens are left out: minutes of iterations)
  timeout 60 "$BIN/backend_ops_test" --backend cuda --perf --op "MoE" --case "$n tok, top-6 of 64" \
    2>&1 | grep "MoE" | tee -a "$REPORT"
done
C=v3_trained_fp8
G=tests/data/golden/$C
if [ ! -f $G/bf16_reference.json ]; then
  echo "== making the $C golden" | tee -a "$REPORT"
  timeout 300 $PY tools/golden/make_golden.py --out /tmp/golden --cases $C >"$OUT/make_golden.log" \
    2>&1 || { tail -20 "$OUT/make_golden.log" | tee -a "$REPORT"; }
  grep -E "reference_check|max \|diff\||margin" "$OUT/make_golden.log" | tail -4 | tee -a "$REPORT"
  rm -rf $G && cp -r /tmp/golden/$C tests/data/golden/
  timeout 200 $PY tools/golden/make_bf16_reference.py --golden tests/data/golden --out /tmp/bf16_ref \
    --cases $C >"$OUT/bf16_ref.log" 2>&1 || tail -20 "$OUT/bf16_ref.log" | tee -a "$REPORT"
  cp /tmp/bf16_ref/$C/bf16_reference.json $G/
  tar czf "$OUT/$C.tgz" -C tests/data/golden $C
fi
echo "== fidelity of $C's afd quantize copy (reference: CPU fp32 of the bf16 checkpoint)" |
  tee -a "$REPORT"
rm -rf /tmp/q8 && "$BIN/afd" quantize --model $G --output /tmp/q8 2>&1 | tail -2 | tee -a "$REPORT"
for v in 1 0; do
  AFD_FP8_EXPERTS=$v timeout 200 $PY tools/weight_fidelity.py "$BIN/afd" $G/bf16_reference.json \
    --model $G :: --model /tmp/q8 --device cuda --dtype bf16 --max-num-seqs 1 2>&1 | tail -2 |
    sed "s/^/AFD_FP8_EXPERTS=$v: /" | tee -a "$REPORT"
done
timeout 200 $PY tools/weight_fidelity.py "$BIN/afd" $G/bf16_reference.json --model $G :: \
  --model /tmp/q8 :: --model $G --device cuda --dtype bf16 2>&1 | tail -3 | tee -a "$REPORT"
L=${LAYERS:-4}
P=(--model preset:deepseek-v2-lite --num-layers "$L" --quantization fp8 --device cuda
  --prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --max-tokens 16
  --ignore-eos --json)
for v in 0 1; do
  AFD_FP8_EXPERTS=$v timeout 200 "$BIN/afd" run "${P[@]}" >"$OUT/run_$v.jsonl" 2>"$OUT/run_$v.err"
  echo "afd run AFD_FP8_EXPERTS=$v: rc $? ($(wc -l <"$OUT/run_$v.jsonl") lines)" | tee -a "$REPORT"
  tail -2 "$OUT/run_$v.err" | tee -a "$REPORT"
done
$PY - "$OUT/run_0.jsonl" "$OUT/run_1.jsonl" <<'EOF' | tee -a "$REPORT"
import json, sys
a, b = ([json.loads(l).get("output_ids", []) for l in open(p) if l.strip()] for p in sys.argv[1:])
same = sum(x == y for r, s in zip(a, b) for x, y in zip(r, s))
total = sum(len(r) for r in a)
print(f"afd run: held FP8 (w8a8) vs dequantized: {same} of {total} generated ids equal")
EOF
true
