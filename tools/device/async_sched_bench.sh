#!/usr/bin/env bash
# One device call for the engine's asynchronous scheduling: backend_ops_test (cpu + cuda), then
# `afd bench decode` (preset:deepseek-v2-lite, bf16, CUDA graphs) with and without
# --no-async-scheduling at context 128 (batches $BATCH, default 1,16,64,256) and at batch 256 x
# context 1024, as JSON rows: ms/step, device ms (upload to the ids' copy back), host ms (the
# device idle), graph and ahead steps. Usage (repo root there):
#   tools/device/async_sched_bench.sh BIN OUT   (MODEL: default preset:deepseek-v2-lite; DEVICE)
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"  # LD_LIBRARY_PATH, PY
echo "== backend_ops_test"
"$BIN/backend_ops_test" 2>&1 | grep -vE " OK $" | tail -8
rows() {  # the JSON rows, one line each (the JSON also kept under $OUT)
  tee -a "$OUT/bench.jsonl" | $PY -c "$(cat <<'PYEOF'
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    for r in json.loads(line)["rows"]:
        print("  batch %4d  %7.3f ms/step  device %7.3f  host %6.3f  graph %d  ahead %d  prefill %.1f TFLOP/s"
              % (r["batch"], r["ms_per_step"], r["device_ms_per_step"], r["host_ms_per_step"],
                 r["graph_steps"], r["ahead_steps"], r["prefill_tflops"]))
PYEOF
)"
}
for mode in "" "--no-async-scheduling"; do
  echo "== afd bench decode ${mode:-(async scheduling)}, context 128"
  timeout 200 "$BIN/afd" bench decode --model "${MODEL:-preset:deepseek-v2-lite}" --device "${DEVICE:-cuda}" \
    --batch "${BATCH:-1,16,64,256}" --context 128 --steps 32 --json $mode 2>/dev/null | rows
  echo "== afd bench decode ${mode:-(async scheduling)}, batch 256 x context 1024"
  timeout 200 "$BIN/afd" bench decode --model "${MODEL:-preset:deepseek-v2-lite}" --device "${DEVICE:-cuda}" \
    --batch 256 --context 1024 --steps 16 --json $mode 2>/dev/null | rows
done
