#!/usr/bin/env bash
# One device call for decode at small batch, each choice against its alternative in the same
# call: backend_ops_test (cpu + cuda); the tiled MLA kernel's split count (`--perf --op
# MlaAttention` at 1-16 tokens x context 129-1024, the default choice, then --mla-splits s
# forced); the fp32 GEMV of 9-16 rows (the router gate) against cuBLAS (AFD_GEMV_F32_CHUNKS=0);
# `afd bench decode` (graphs) by default, with AFD_GEMV_F32_CHUNKS=0 and with AFD_ROUTER_PERMUTE=0
# (the router's grouping of the slots off; a binary without it runs the default again: the
# run-to-run noise).
# Usage (repo root there): tools/device/small_batch_ab.sh BIN OUT  (DEVICE: default cuda;
# MODEL: default preset:deepseek-v2-lite; BATCH: default 1,4,16,64; SPLITS: default "1 2 3 4 8")
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"  # LD_LIBRARY_PATH, PY
DEV=${DEVICE:-cuda}
echo "== backend_ops_test"
"$BIN/backend_ops_test" 2>&1 | grep -vE " OK $" | tail -6
mla() {  # [backend_ops_test flags]
  "$BIN/backend_ops_test" --perf --op MlaAttention --backend "$DEV" "$@" 2>&1 |
    grep -E "decode (1|4|16) x ctx (129|256|512|1024), 16 heads, tf32, bf16 cache" |
    sed -E 's/ +MlaAttention +decode/  decode/; s/, 16 heads, tf32, bf16 cache//'
}
echo "== MlaAttention (tiles), splits by the cost model"
mla
for s in ${SPLITS:-1 2 3 4 8}; do
  echo "== MlaAttention (tiles), --mla-splits $s"
  mla --mla-splits "$s"
done
for chunks in "" 0; do
  echo "== Linear f32 (router gate)${chunks:+, AFD_GEMV_F32_CHUNKS=0 (cuBLAS above 8 rows)}"
  AFD_GEMV_F32_CHUNKS=${chunks:-1} "$BIN/backend_ops_test" --perf --op Linear --backend "$DEV" 2>&1 |
    grep -E "f32 (1|8|16|64)x2048->64 "
done
for env in "" AFD_GEMV_F32_CHUNKS=0 AFD_ROUTER_PERMUTE=0; do
  echo "== afd bench decode ${env:-(default)}"
  env $env timeout 150 "$BIN/afd" bench decode --model "${MODEL:-preset:deepseek-v2-lite}" \
    --device "$DEV" --batch "${BATCH:-1,4,16,64}" --context 128 --steps "${STEPS:-32}" 2>&1 |
    grep -E "^ +[0-9]+ +[0-9.]+ " | cut -c1-60
done
