#!/usr/bin/env bash
# `make demo`: the main job on the built-in default -- a 3A2F AFD deployment (3 attention ranks,
# 2 FFN ranks, each its own process) of the preset:tiny DeepSeek-style model on the CPU.
# Prints the rank map, the generated token ids, and per-rank steps and per-layer transfer counts
# and times; then checks the output against the same model run in one process.
set -euo pipefail
BUILD_DIR=${1:-build}
AFD="$BUILD_DIR/afd"
PROMPTS=(--prompt-ids 1,2,3,4,5 --prompt-ids 100,200,300 --prompt-ids 7,8,9,10,11,12,13,14)

echo "== afd --version: $("$AFD" --version)"
echo "== afd run --model preset:tiny --topology 3A2F --max-tokens 16 (rank map, results, stats)"
"$AFD" run --model preset:tiny --topology 3A2F --max-tokens 16 --show-rank-map --stats \
  "${PROMPTS[@]}"
echo
echo "== the same prompts in one process (monolithic), for comparison"
"$AFD" run --model preset:tiny --max-tokens 16 "${PROMPTS[@]}"
if diff <("$AFD" run --model preset:tiny --topology 3A2F --max-tokens 16 --json "${PROMPTS[@]}") \
        <("$AFD" run --model preset:tiny --max-tokens 16 --json "${PROMPTS[@]}") >/dev/null; then
  echo "== 3A2F output is identical to the monolithic model"
else
  echo "== 3A2F output DIFFERS from the monolithic model" >&2
  exit 1
fi
