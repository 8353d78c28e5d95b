#!/usr/bin/env bash
# One device call: `afd bench decode --kernel-trace` (CUPTI's kernel records of the timed steps'
# CUDA graph replays: each kernel's time in the graph as it runs and the part no other kernel
# overlapped, the step's idle and overlapped time), then the same rows without the trace (its
# cost). Carry libcupti.so.13 in BIN (the CUDA toolkit's lib/) unless the machine has one.
# BATCH (default 1,16,64,256), CONTEXT (default 128), STEPS (default 16); CSV: also write every
# traced kernel there (--kernel-trace-csv).
# Usage (repo root there): tools/device/kernel_trace.sh BIN_DIR
set -u
BIN=$(readlink -f "$1")
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
cupti_on
ARGS=(--model preset:deepseek-v2-lite --device cuda --batch "${BATCH:-1,16,64,256}"
  --context "${CONTEXT:-128}" --steps "${STEPS:-16}")
echo "== afd bench decode --kernel-trace"
timeout 300 "$BIN/afd" bench decode "${ARGS[@]}" --kernel-trace ${CSV:+--kernel-trace-csv "$CSV"} 2>&1 | grep -v "loading weights"
echo "== the same without the trace"
timeout 200 "$BIN/afd" bench decode "${ARGS[@]}" 2>&1 | grep -E '^ +[0-9]+ '
