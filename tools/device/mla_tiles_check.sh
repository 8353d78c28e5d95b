#!/usr/bin/env bash
# One device call for a change to MLA decode: the whole check (gpu_check.sh: backend_ops_test,
# fp32/bf16 on the goldens, graph vs eager, v3_trained vs transformers bf16, afd bench decode at
# context 128 and 1024, the torch peer), then the tiled bf16 kernel against the chunked one
# (AFD_MLA_TILES=0) on preset:deepseek-v2-lite (DeepSeek's 512 + 64: no golden has that shape):
# the logits after a 300-token prompt (prefill attends through the same kernel) and 32 greedy ids,
# and backend_ops_test --perf for MlaAttention both ways.
# The comparison runs first (a few minutes), the whole check after it (decode_check.sh,
# CHECK_TIMEOUT 380 s).
# Usage (repo root there): tools/device/mla_tiles_check.sh BIN_DIR OUT_DIR   (SKIP_PEER=1: no peer)
set -u
BIN=$(readlink -f "$1")
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
. "$HERE/env.sh"  # LD_LIBRARY_PATH, PY
echo "== tiled vs chunked MLA on preset:deepseek-v2-lite (bf16)"
IDS=$(seq -s, 11 310)
M=(--model preset:deepseek-v2-lite --device cuda --dtype bf16)
for mode in tiles chunks; do
  env_set=()
  [ "$mode" = chunks ] && env_set=(AFD_MLA_TILES=0)
  env "${env_set[@]}" timeout 200 "$BIN/afd" run "${M[@]}" --prompt-ids "$IDS" --max-tokens 1 \
    --dump-logits "/tmp/logits_$mode.npy" >/dev/null 2>"/tmp/run_$mode.err" || tail -3 "/tmp/run_$mode.err"
  env "${env_set[@]}" timeout 200 "$BIN/afd" run "${M[@]}" --prompt-ids "$IDS" --prompt-ids 5,6,7 \
    --max-tokens 32 --ignore-eos --json >"/tmp/ids_$mode.json" 2>>"/tmp/run_$mode.err" ||
    tail -3 "/tmp/run_$mode.err"
done
$PY - <<'PYEOF'
import json
import numpy as np
a, b = np.load("/tmp/logits_tiles.npy"), np.load("/tmp/logits_chunks.npy")
print(f"last-position logits, tiles vs chunks: rel err {np.linalg.norm(a - b) / np.linalg.norm(b):.2e},"
      f" argmax {a.reshape(-1, a.shape[-1]).argmax(-1).tolist()} vs {b.reshape(-1, b.shape[-1]).argmax(-1).tolist()}")
t = [json.loads(l) for l in open("/tmp/ids_tiles.json")]
c = [json.loads(l) for l in open("/tmp/ids_chunks.json")]
for x, y in zip(t, c):
    same = sum(p == q for p, q in zip(x["output_ids"], y["output_ids"]))
    first = next((i for i, (p, q) in enumerate(zip(x["output_ids"], y["output_ids"])) if p != q), None)
    print(f"greedy ids equal: {same}/{len(y['output_ids'])} (first difference at {first})")
PYEOF

echo "== backend_ops_test --perf MlaAttention: tiles, then chunks"
"$BIN/backend_ops_test" --perf --backend cuda --iters 20 --op MlaAttention 2>&1 | tail -12
AFD_MLA_TILES=0 "$BIN/backend_ops_test" --perf --backend cuda --iters 20 --op MlaAttention 2>&1 | tail -12

SKIP_PEER=${SKIP_PEER:-} CHECK_TIMEOUT=${CHECK_TIMEOUT:-380} bash "$HERE/decode_check.sh" "$BIN" "$OUT/check"
