#!/usr/bin/env bash
# A/B of two builds on the prefill path, one device call: NEW's backend_ops MlaAttention and
# MoePermute cases (correctness), then for each build the MlaAttention prefill and MoE 8192-token
# perf cases and the 8 x 1024 prefill of `afd bench decode` (TFLOP/s, last column), ROUNDS
# times (default 2) in alternation.
# OLD_ENV="NAME=0 ...": set for the OLD runs (OLD may then be NEW itself: a switch's A/B).
# Usage (repo root there): tools/device/prefill_ab.sh NEW_BIN_DIR OLD_BIN_DIR
set -u
NEW=$(readlink -f "$1")
OLD=$(readlink -f "$2")
BIN=$NEW
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
for op in MlaAttention MoePermute; do
  echo "== NEW backend_ops_test --backend cuda --op $op"
  "$NEW/backend_ops_test" --backend cuda --op $op 2>&1 | grep -v " OK " | tail -4
done
if [ -n "${OLD_ENV:-}" ]; then
  for op in MlaAttention MoePermute Linear; do
    echo "== NEW with $OLD_ENV: backend_ops_test --backend cuda --op $op"
    env $OLD_ENV "$NEW/backend_ops_test" --backend cuda --op $op 2>&1 | grep -v " OK " | tail -4
  done
fi
for round in $(seq "${ROUNDS:-2}"); do
  for b in NEW OLD; do
    dir=$NEW envs=
    [ $b = OLD ] && dir=$OLD envs=${OLD_ENV:-}
    echo "== $b (round $round) $envs"
    env $envs LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" "$dir/backend_ops_test" --backend cuda \
      --perf --op MlaAttention --case prefill 2>&1 | grep prefill | cut -c40-
    env $envs LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" "$dir/backend_ops_test" --backend cuda \
      --perf --op MoE --case "8192 tok" 2>&1 | grep 8192 | cut -c40-
    env $envs LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" timeout 300 "$dir/afd" bench decode \
      --model preset:deepseek-v2-lite --device cuda --batch 8 --context 1024 --steps 4 2>&1 | tail -1
  done
done
