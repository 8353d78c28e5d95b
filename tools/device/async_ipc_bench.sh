#!/usr/bin/env bash
# One device call: `afd connector-test --bench` of the async connector with device rows (CUDA IPC
# windows) between two processes on GPU 0: the layer round trip attention -> FFN -> attention
# (the FFN echoes the rows) for 1, 16, 128, 512 rows of 2048 bf16; the same on host rows (POSIX
# shared memory) for comparison. Usage (repo root there): async_ipc_bench.sh BIN_DIR
set -u
BIN=$(readlink -f "$1")
. "$(dirname "$(readlink -f "$0")")/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
export AFD_JOIN_SECRET=device-bench-secret
status=0
for dev in cuda cpu; do
  PORT=$((21000 + RANDOM % 4000))
  CFG="{\"afd\":{\"role\":\"ffn\",\"connector\":\"AsyncAFDConnector\",\"host\":\"127.0.0.1\",\"port\":$PORT,\"num_attention_ranks\":1,\"num_ffn_ranks\":1}}"
  FLAGS=(--bench --hidden 2048 --dtype bf16 --bench-rows 1,16,128,512 --iters 100 --device $dev)
  [ $dev = cuda ] && FLAGS+=(--cuda-device 0)
  timeout 120 "$BIN/afd" connector-test --additional-config "$CFG" --role-rank 0 "${FLAGS[@]}" >/tmp/ffn_$dev.json 2>&1 &
  timeout 120 "$BIN/afd" connector-test --additional-config "${CFG/ffn/attention}" --role-rank 0 "${FLAGS[@]}" >/tmp/attn_$dev.json 2>/tmp/attn_$dev.err || { status=1; tail -5 /tmp/attn_$dev.err; tail -5 /tmp/ffn_$dev.json; }
  wait
  echo "== $dev rows (median / p10 / p90 us per round trip)"
  python3 -c 'import json,sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for b in d["bench"]:
    print("%4d rows: %8.1f %8.1f %8.1f" % (b["rows"], b["median_us"], b["p10_us"], b["p90_us"]))' /tmp/attn_$dev.json || status=1
done
exit $status
