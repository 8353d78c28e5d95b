#!/usr/bin/env bash
# Tokens/s of `afd run` on preset:tiny (CPU): prefill and decode, best of N runs each.
# Usage: bench/afd_run_tiny.sh [path/to/afd] [runs]
# Prints one line per scenario; the numbers come from `afd run --stats` (model time only, the
# model load is excluded). Not a test: nothing here asserts a speed (docs/perf-log/ has the log).
set -euo pipefail
AFD=${1:-build/afd}
RUNS=${2:-3}

ids() {  # ids N SEED: N comma-separated token ids in [2, 1024)
  local n=$1 seed=$2 out="" i
  for ((i = 0; i < n; i++)); do out+="$(((i * 7919 + seed * 104729) % 1022 + 2)),"; done
  echo "${out%,}"
}

# best RATE_FIELD ARGS...: runs afd RUNS times, prints the best tokens/s of the field.
best() {
  local field=$1; shift
  local best=0 rate
  for ((r = 0; r < RUNS; r++)); do
    rate=$("$AFD" run --model preset:tiny --stats "$@" 2>&1 >/dev/null |
           awk -v f="$field:" '$1 == f { for (i = 1; i <= NF; i++) if ($i == "tokens/s") print $(i-1) }')
    best=$(awk -v a="$best" -v b="$rate" 'BEGIN { print (b > a) ? b : a }')
  done
  echo "$best"
}

prefill_args=()
for s in 1 2 3 4; do prefill_args+=(--prompt-ids "$(ids 256 $s)"); done
echo "prefill, 4 prompts x 256 tokens:      $(best prefill --max-tokens 1 "${prefill_args[@]}") tokens/s"
echo "prefill, 1 prompt x 1024 tokens:      $(best prefill --max-tokens 1 --prompt-ids "$(ids 1024 9)") tokens/s"
echo "decode, batch 1, 16 + 256 tokens:     $(best decode --max-tokens 256 --ignore-eos --prompt-ids "$(ids 16 5)") tokens/s"
decode_args=()
for s in 1 2 3 4 5 6 7 8; do decode_args+=(--prompt-ids "$(ids 16 $s)"); done
echo "decode, batch 8, 16 + 128 tokens each: $(best decode --max-tokens 128 --ignore-eos "${decode_args[@]}") tokens/s"
