#!/usr/bin/env bash
# One device call: makes the Qwen3-MoE golden checkpoints with transformers
# (tools/golden/make_qwen3_golden.py, on the CPU) and qwen3_trained's bf16 reference
# (make_bf16_reference.py, on the GPU); returns OUT_DIR/qwen3_golden.tgz (unpack into
# tests/data/golden/ and commit) and the logs. Then, for the binary in BIN_DIR, the device-path
# checks: afd_graph_check.sh check and the wedged-FFN check (hardening_check.sh part 2) unless SKIP_CHECKS.
# Usage (repo root there): tools/device/qwen3_golden.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
mkdir -p "$OUT"
status=0
CASES=qwen3_gqa,qwen3_sparse_tied,qwen3_legacy_config,qwen3_trained
$PY tools/golden/make_qwen3_golden.py --out /tmp/qg --cases $CASES >"$OUT/make_qwen3_golden.log" 2>&1 ||
  { tail -30 "$OUT/make_qwen3_golden.log"; status=1; }
grep -E "case |greedy ==|legacy config|best reference|train step 399|mismatches" "$OUT/make_qwen3_golden.log"
if [ -d /tmp/qg/qwen3_trained ]; then
  $PY tools/golden/make_bf16_reference.py --golden /tmp/qg --out /tmp/qg_bf16 --cases qwen3_trained \
    >"$OUT/bf16_ref.log" 2>&1 || { tail -20 "$OUT/bf16_ref.log"; status=1; }
  cp /tmp/qg_bf16/qwen3_trained/bf16_reference.json /tmp/qg/qwen3_trained/ 2>/dev/null
fi
tar czf "$OUT/qwen3_golden.tgz" -C /tmp/qg .
[ -n "${SKIP_CHECKS:-}" ] && exit $status
echo "== afd_graph_check check"
bash "$HERE/afd_graph_check.sh" "$BIN" "$OUT/graph" check 2>&1 | tail -40 || status=1
echo "== wedged FFN"
CFG='{"afd": {"connector": "AsyncAFDConnector", "afd_process_group_timeout_s": 8}}'
timeout 120 "$BIN/afd" run --model preset:deepseek-v2-lite --num-layers 3 --device cuda \
  --topology 1A1F --additional-config "$CFG" --prompt-ids 1,2,3 --max-tokens 60000 --ignore-eos \
  >"$OUT/wedge.out" 2>"$OUT/wedge.err" &
RUN=$!
sleep 15
FFN=$(pgrep -f 'afd worker.*"role":"ffn"' | head -1)
echo "ffn pid: ${FFN:-none}"
[ -n "$FFN" ] && kill -STOP "$FFN"
stopped=$(date +%s.%N)
wait $RUN
rc=$?
end=$(date +%s.%N)
[ -n "$FFN" ] && kill -KILL "$FFN" 2>/dev/null
python3 -c "print(f'afd run exit {$rc}, {float($end) - float($stopped):.1f} s after the SIGSTOP')"
grep -h -E "timed out|gave up|heartbeat|error|peer" "$OUT/wedge.err" | head -8
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "wedge: FAIL (rc $rc)"; status=1; }
exit $status
