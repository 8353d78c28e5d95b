#!/usr/bin/env bash
# One device call: the kernels of an eager decode step, each timed by Nsight Compute (ncu reads
# the hardware timer of every kernel; the clocks are left alone). The CUDA backend opens the
# profiler range around the decode steps of `afd bench decode --profile`, so prefill and loading
# are not profiled. Usage (repo root there): tools/device/kernel_profile.sh BIN_DIR OUT_DIR
#   BATCH="1 16 256" (default), STEPS=2, MODEL=preset:deepseek-v2-lite, TOP=30, CACHE=none (keep
#   the caches warm between kernels, as in a real step; default all: ncu flushes them)
# Writes OUT_DIR/ncu_b<batch>.csv and prints tools/device/ncu_kernels.py's table for each batch.
set -u
BIN=$(readlink -f "$1")
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
. "$HERE/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
NCU=$(command -v ncu || find / -name ncu -type f -path '*nsight-compute*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
STEPS=${STEPS:-2}
status=0
for B in ${BATCH:-1 16 256}; do
  echo "== batch $B: ncu over $STEPS eager decode steps of ${MODEL:-preset:deepseek-v2-lite}"
  timeout 400 "$NCU" --clock-control none --cache-control "${CACHE:-all}" --profile-from-start off --metrics gpu__time_duration.sum \
    --csv --page raw --print-kernel-base function \
    "$BIN/afd" bench decode --model "${MODEL:-preset:deepseek-v2-lite}" --device cuda --batch "$B" \
    --context 128 --steps "$STEPS" --profile >"$OUT/ncu_b$B.csv" 2>"$OUT/ncu_b$B.err" ||
    { tail -5 "$OUT/ncu_b$B.err"; status=1; continue; }
  python3 "$HERE/ncu_kernels.py" "$OUT/ncu_b$B.csv" "$STEPS" "${TOP:-30}" || status=1
done
exit $status
