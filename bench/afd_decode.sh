#!/usr/bin/env bash
# Decode tokens/s and time per step of AFD deployments against the monolithic run, preset:tiny
# on the CPU (the cost of the split). Record results in docs/perf.md.
#   bench/afd_decode.sh [path/to/afd] [max_tokens]
set -euo pipefail
AFD=${1:-build/afd}
N=${2:-256}
PROMPTS=(--prompt-ids 1,2,3,4 --prompt-ids 5,6,7 --prompt-ids 8,9 --prompt-ids 10,11,12,13,14,15)
echo "== monolithic"
"$AFD" run --model preset:tiny --max-tokens "$N" --ignore-eos --stats "${PROMPTS[@]}" 2>&1 >/dev/null | grep -E "decode|prefill"
for topo in 1A1F 2A1F 3A2F; do
  echo "== $topo"
  "$AFD" run --model preset:tiny --topology "$topo" --max-tokens "$N" --ignore-eos --stats \
    "${PROMPTS[@]}" 2>&1 >/dev/null | grep -E "^attention rank"
done
