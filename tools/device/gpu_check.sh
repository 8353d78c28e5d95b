#!/usr/bin/env bash
# One device call: the CUDA backend on the GPU machine with binaries built elsewhere (it
# installs nothing). Usage (repo root there): tools/device/gpu_check.sh BIN_DIR OUT_DIR
#   BIN_DIR: afd, backend_ops_test and the shared libraries they need that the machine lacks
#            (libfmt, libgomp, libpcre2-8, libutf8proc); cuBLAS comes from the machine's CUDA.
# Runs: backend_ops_test (every op, cpu and cuda), fp32 on the GPU vs the CPU reference on every
# golden checkpoint (greedy ids, prompt logprobs, logits), bf16 on the GPU, and
# backend_ops_test --perf on the GPU (skipped with SKIP_PERF=1), CUDA-graph vs eager greedy ids,
# the torch peer when BIN_DIR holds torch_peer.py (skipped with SKIP_PEER=1),
# afd bench decode with graphs and (PROFILE=1) the eager per-op profile, the torch peer, and
# (HF_BATCH=1,16) transformers eager decode. Prints a summary; logs go to OUT_DIR.
# SCORE_CASES="a b": score only those checkpoints against transformers bf16 (default: all);
# PERF_OP=NAME: backend_ops_test --perf for that op only; LONG_CONTEXT=1: also afd bench decode
# at batch 256, context 1024 (issue 11's last row).
set -u
BIN=$(readlink -f "$1")
HERE=$(dirname "$(readlink -f "$0")")  # the helper scripts beside this one
OUT=$2
WORK=$(mktemp -d)  # scratch; only logs and references go to OUT (the tool returns 8 files)
mkdir -p "$OUT"
. "$HERE/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
AFD="$BIN/afd"
nvidia-smi -L
echo "cuBLAS from: $CUBLAS_DIR"
"$AFD" --version
status=0

echo "== backend_ops_test (cpu + cuda)"
"$BIN/backend_ops_test" 2>&1 | tee "$OUT/backend_ops.txt" | grep -v " OK " || true
tail -1 "$OUT/backend_ops.txt" | grep -q " 0 failed" || status=1
# Kernel forms chosen by shape: each forced on over the whole op suite (MLA decode: the wgmma
# tiles everywhere they can run, then never).
for form in AFD_MLA_WG=1 AFD_MLA_WG=0; do
  echo "== $form: backend_ops_test --backend cuda --op MlaAttention"
  env $form "$BIN/backend_ops_test" --backend cuda --op MlaAttention 2>&1 | grep -v " OK " |
    tee -a "$OUT/backend_ops_forms.txt" | tail -4
  tail -1 "$OUT/backend_ops_forms.txt" | grep -q " 0 failed" || status=1
done

echo "== fp32 on cuda vs the cpu reference, golden checkpoints"
for c in v2_greedy_yarn v2_group_limited v3_noaux_tc v3_sharded v3_trained; do
  M=tests/data/golden/$c
  P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5)
  "$AFD" run --model "$M" "${P[@]}" --max-tokens 20 --ignore-eos --json >"$WORK/${c}_cpu.json"
  "$AFD" run --model "$M" "${P[@]}" --max-tokens 20 --ignore-eos --json --device cuda \
    --dtype fp32 >"$WORK/${c}_cuda.json" 2>"$WORK/${c}_cuda.err" || { cat "$WORK/${c}_cuda.err"; status=1; }
  "$AFD" run --model "$M" --prompt-ids 3,1,4,1,5,9,2,6,5,3,5 --max-tokens 1 --dump-logits \
    "$WORK/${c}_cpu.npy" >/dev/null
  "$AFD" run --model "$M" --prompt-ids 3,1,4,1,5,9,2,6,5,3,5 --max-tokens 1 --device cuda \
    --dtype fp32 --dump-logits "$WORK/${c}_cuda.npy" >/dev/null 2>&1 || status=1
  "$AFD" run --model "$M" "${P[@]}" --max-tokens 20 --ignore-eos --json --device cuda \
    --dtype bf16 >"$WORK/${c}_cuda_bf16.json" 2>&1 || status=1
  "$AFD" run --model "$M" "${P[@]}" --max-tokens 20 --ignore-eos --json --device cuda \
    --dtype bf16 --enforce-eager >"$WORK/${c}_cuda_bf16_eager.json" 2>&1 || status=1
  $PY - "$WORK" "$c" <<'PYEOF' || status=1
import json, sys
import numpy as np
out, c = sys.argv[1], sys.argv[2]
cpu = [json.loads(l) for l in open(f"{out}/{c}_cpu.json")]
gpu = [json.loads(l) for l in open(f"{out}/{c}_cuda.json")]
bf = [json.loads(l) for l in open(f"{out}/{c}_cuda_bf16.json")]
eg = [json.loads(l) for l in open(f"{out}/{c}_cuda_bf16_eager.json")]
a, b = np.load(f"{out}/{c}_cpu.npy"), np.load(f"{out}/{c}_cuda.npy")
rel = float(np.linalg.norm(a - b) / np.linalg.norm(a))
same = all(x["output_ids"] == y["output_ids"] for x, y in zip(cpu, gpu)) and len(cpu) == len(gpu)
lp = max(abs(p - q) for x, y in zip(cpu, gpu) for p, q in zip(x["logprobs"], y["logprobs"]))
bf_agree = sum(p == q for x, y in zip(cpu, bf) for p, q in zip(x["output_ids"], y["output_ids"]))
total = sum(len(x["output_ids"]) for x in cpu)
graph_same = len(bf) == len(eg) and all(x["output_ids"] == y["output_ids"] for x, y in zip(bf, eg))
glp = max(abs(p - q) for x, y in zip(bf, eg) for p, q in zip(x["logprobs"], y["logprobs"]))
print(f"{c}: fp32 greedy ids identical: {same}; logits rel err {rel:.2e}; max |dlogprob| {lp:.2e};"
      f" bf16 greedy ids equal to fp32 cpu: {bf_agree}/{total}; bf16 graph vs eager ids"
      f" identical: {graph_same}, max |dlogprob| {glp:.2e}")
sys.exit(0 if same and rel <= 1e-4 and graph_same else 1)
PYEOF
done

echo "== bf16 fidelity vs transformers bf16 on this GPU (seed 001's scoring, >= 1024 positions)"
if [ -n "${MAKE_BF16_REFERENCE:-}" ]; then
  $PY tools/golden/make_bf16_reference.py --golden tests/data/golden --out "$OUT/bf16_ref" || status=1
fi
for c in ${SCORE_CASES:-v2_greedy_yarn v2_group_limited v3_noaux_tc v3_sharded v3_trained}; do
  [ -d tests/data/golden/$c ] || { echo "$c: no checkpoint (tools/golden/make_golden.py --cases $c)"; continue; }
  REF=tests/data/golden/$c/bf16_reference.json
  [ -f "$REF" ] || REF=$OUT/bf16_ref/$c/bf16_reference.json
  [ -f "$REF" ] || { echo "$c: no bf16 reference"; continue; }
  $PY $HERE/score_bf16.py "$AFD" tests/data/golden/$c "$REF" "$WORK" --device cuda --dtype bf16 || status=1
  $PY $HERE/score_bf16.py "$AFD" tests/data/golden/$c "$REF" "$WORK" --device cuda --dtype fp32 || true
done

if [ -z "${SKIP_PERF:-}" ]; then
  echo "== backend_ops_test --perf --backend cuda"
  "$BIN/backend_ops_test" --perf --backend cuda --iters 20 ${PERF_OP:+--op $PERF_OP} 2>&1 | tee "$OUT/perf_cuda.txt"
fi

echo "== afd bench decode on cuda (preset:deepseek-v2-lite, bf16)"
timeout 420 "$AFD" bench decode --model preset:deepseek-v2-lite --device cuda --batch 1,16,64,256 --context 128 --steps 16 ${BENCH_LAYERS:+--num-layers $BENCH_LAYERS} 2>&1 | grep -v "loading weights \[" | tee "$OUT/bench_decode.txt"
if [ -n "${LONG_CONTEXT:-}" ]; then
  timeout 300 "$AFD" bench decode --model preset:deepseek-v2-lite --device cuda --batch 256 --context 1024 --steps 8 2>&1 | grep -v "loading weights \[" | tail -2 | tee -a "$OUT/bench_decode.txt"
fi
if [ -n "${PROFILE:-}" ]; then
  echo "== afd bench decode --enforce-eager --profile (per-op device time of a decode step)"
  timeout 300 "$AFD" bench decode --model preset:deepseek-v2-lite --device cuda --batch 1,16,64,256 --context 128 --steps 8 --profile 2>&1 | grep -v "loading weights \[" | tee "$OUT/bench_profile.txt"
fi

if [ -f "$BIN/torch_peer.py" ] && [ -z "${SKIP_PEER:-}" ]; then  # the PyTorch peer (shared/bench), same GPU
  echo "== torch_peer.py (PyTorch + CUDA graphs), context 128"
  timeout 200 $PY "$BIN/torch_peer.py" "$WORK/peer.json" 128 2>&1 | tail -12
fi
if [ -n "${HF_BATCH:-}" ]; then
  echo "== transformers eager decode ($HERE/hf_decode_bench.py), batch $HF_BATCH"
  timeout 240 $PY $HERE/hf_decode_bench.py --batch "$HF_BATCH" --context 128 2>&1 | grep -v Warning | tail -6
fi
echo "== exit status $status"
exit $status
