#!/usr/bin/env bash
# A/B of one kernel switch in one device call: the switch's correctness (backend_ops_test on
# cuda for CHECK_OPS under SWITCH), then PERF_OP's perf cases matching PERF_CASE and `afd bench
# decode` at BATCH x CONTEXT, with and without SWITCH, ROUNDS times (default 2) in alternation.
# SWITCH: "NAME=VALUE ..." (e.g. AFD_MLA_WG=1); CHECK_OPS: space-separated op filters (default
# PERF_OP); PERF_CASE: a case filter (default: every perf case of PERF_OP); BATCH (default
# 1,16,64,256), CONTEXT (default 128), STEPS (default 8).
# Usage (repo root there): SWITCH=... PERF_OP=... tools/device/switch_ab.sh BIN_DIR
set -u
BIN=$(readlink -f "$1")
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
: "${SWITCH:?SWITCH=NAME=VALUE is required}" "${PERF_OP:?PERF_OP=NAME is required}"
for op in ${CHECK_OPS:-$PERF_OP}; do
  echo "== $SWITCH: backend_ops_test --backend cuda --op $op"
  env $SWITCH "$BIN/backend_ops_test" --backend cuda --op "$op" 2>&1 | grep -v " OK " | tail -6
done
for round in $(seq "${ROUNDS:-2}"); do
  for with in yes no; do
    envs=
    [ $with = yes ] && envs=$SWITCH
    echo "== round $round, ${envs:-default}: $PERF_OP perf${PERF_CASE:+ ($PERF_CASE)}"
    env $envs "$BIN/backend_ops_test" --backend cuda --perf --op "$PERF_OP" \
      ${PERF_CASE:+--case "$PERF_CASE"} 2>&1 | grep " ms " | sed -E 's/ +[0-9.]+ GB\/s.*//'
    echo "== round $round, ${envs:-default}: afd bench decode --batch ${BATCH:-1,16,64,256} --context ${CONTEXT:-128}"
    env $envs timeout 240 "$BIN/afd" bench decode --model preset:deepseek-v2-lite --device cuda \
      --batch "${BATCH:-1,16,64,256}" --context "${CONTEXT:-128}" --steps "${STEPS:-8}" 2>&1 |
      grep -v "loading weights" | tail -5
  done
done
