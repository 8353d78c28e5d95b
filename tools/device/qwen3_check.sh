#!/usr/bin/env bash
# One device call for issue 42 (Qwen3-MoE) on the GPU:
#   0. the qwen3_legacy_config golden (published config spelling; transformers on the CPU);
#   1. backend_ops_test on cuda (the GQA ops among every op);
#   2. each Qwen3 golden: GPU fp32 greedy ids == the CPU's; bf16 CUDA graphs == bf16 eager;
#   3. AFD on the GPU (afd_graph_check.sh check on qwen3_sparse_tied: async connector, graphs in
#      both roles, fp32 == monolithic, bf16 graphs == eager);
#   4. qwen3_trained scored in bf16 and fp32 against transformers' bf16 (score_bf16.py);
#   5. MODE bench: `afd bench decode` of preset:qwen3-30b-a3b (bf16) at contexts 128 and 4096,
#      and the PyTorch peer bench/qwen3_torch_peer.py in the same call (LAYERS: layers of both;
#      PROFILE=B: also the per-op profile of batch B; CONTEXTS: the contexts, default "128 4096").
# Usage (repo root there): tools/device/qwen3_check.sh BIN_DIR OUT_DIR [check|bench|all]
set -u
BIN=$(readlink -f "$1")
OUT=$2
MODE=${3:-all}
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
mkdir -p "$OUT"
REPORT="$OUT/qwen3_$MODE.txt"
nvidia-smi -L | tee "$REPORT"
status=0
AFD="$BIN/afd"
LAYERS=${LAYERS:-48}
if [ "$MODE" != bench ]; then
  echo "== 0. qwen3_legacy_config golden" | tee -a "$REPORT"
  $PY tools/golden/make_qwen3_golden.py --out /tmp/qg --cases qwen3_legacy_config \
    >"$OUT/make_legacy.log" 2>&1 || { tail -20 "$OUT/make_legacy.log"; status=1; }
  grep -E "legacy config check|best reference|greedy ==" "$OUT/make_legacy.log" | tee -a "$REPORT"
  [ -d /tmp/qg/qwen3_legacy_config ] && tar czf "$OUT/qwen3_legacy_config.tgz" -C /tmp/qg qwen3_legacy_config
  echo "== 1. backend_ops_test --backend cuda" | tee -a "$REPORT"
  "$BIN/backend_ops_test" --backend cuda >"$OUT/backend_ops.txt" 2>&1 || status=1
  grep -E "Gqa|Router|FAIL|passed" "$OUT/backend_ops.txt" | tee -a "$REPORT"
  echo "== 2. GPU vs CPU, bf16 graphs vs eager" | tee -a "$REPORT"
  P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --prompt-ids 11,12,13,14,15 --max-tokens 16 --ignore-eos --json)
  for M in tests/data/golden/qwen3_gqa tests/data/golden/qwen3_sparse_tied tests/data/golden/qwen3_trained /tmp/qg/qwen3_legacy_config; do
    c=$(basename $M)
    "$AFD" run --model $M "${P[@]}" >/tmp/cpu.json 2>/tmp/err || { tail -3 /tmp/err; status=1; }
    "$AFD" run --model $M "${P[@]}" --device cuda --dtype fp32 >/tmp/gpu.json 2>/tmp/err || { tail -3 /tmp/err; status=1; }
    $PY "$HERE/compare_runs.py" /tmp/cpu.json /tmp/gpu.json "$c gpu-f32 vs cpu" | tee -a "$REPORT" || status=1
    "$AFD" run --model $M "${P[@]}" --device cuda --dtype bf16 >/tmp/g.json 2>/tmp/err || { tail -3 /tmp/err; status=1; }
    "$AFD" run --model $M "${P[@]}" --device cuda --dtype bf16 --enforce-eager >/tmp/e.json 2>/tmp/err || { tail -3 /tmp/err; status=1; }
    $PY "$HERE/compare_runs.py" /tmp/e.json /tmp/g.json "$c bf16 graphs vs eager" | tee -a "$REPORT" || status=1
  done
  echo "== 3. AFD on the GPU" | tee -a "$REPORT"
  GOLDEN=tests/data/golden/qwen3_sparse_tied bash "$HERE/afd_graph_check.sh" "$BIN" "$OUT/afd" check 2>&1 |
    grep -E "ok|FAIL|rror" | tee -a "$REPORT"
  grep -q FAIL "$OUT/afd/afd_graph_check.txt" && status=1
  echo "== 4. qwen3_trained scored against transformers bf16" | tee -a "$REPORT"
  WORK=$(mktemp -d)
  for dtype in bf16 fp32; do
    $PY "$HERE/score_bf16.py" "$AFD" tests/data/golden/qwen3_trained \
      tests/data/golden/qwen3_trained/bf16_reference.json "$WORK" --device cuda --dtype $dtype 2>&1 |
      tail -2 | tee -a "$REPORT" || status=1
  done
fi
if [ "$MODE" != check ]; then
  echo "== 5. decode bench, preset:qwen3-30b-a3b, $LAYERS layers" | tee -a "$REPORT"
  for ctx in ${CONTEXTS:-128 4096}; do
    B=1,16,64,256
    [ $ctx = 4096 ] && B=1,16,64
    timeout 280 "$AFD" bench decode --model preset:qwen3-30b-a3b --device cuda --num-layers $LAYERS \
      --batch $B --context $ctx 2>&1 | grep -E "^ *[0-9]+ |batch|floor|rror" | tee -a "$REPORT"
    timeout 200 $PY bench/qwen3_torch_peer.py "$OUT/peer_$ctx.json" $ctx $B $LAYERS 2>&1 | tail -4 |
      tee -a "$REPORT"
  done
  if [ -n "${PROFILE:-}" ]; then  # per-op device time (eager) of a 12-layer model at PROFILE batch
    timeout 200 "$AFD" bench decode --model preset:qwen3-30b-a3b --device cuda --num-layers 12 \
      --batch "$PROFILE" --context 128 --profile 2>&1 | head -40 | tee -a "$REPORT"
  fi
fi
exit $status
