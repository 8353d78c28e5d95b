#!/usr/bin/env bash
# Several kernel switches measured against the default in one device call: `afd bench decode`
# at BATCH x CONTEXT with the default, then with each of SWITCHES (space-separated NAME=VALUE
# items, each turning one new form off), ROUNDS times (default 2) in alternation, so every
# configuration sees the machine in the same state. The switches' correctness is the default
# suite's (decode_check.sh / gpu_check.sh run the new forms, which are the default).
# BATCH (default 1,16,64,256), CONTEXT (default 128), STEPS (default 8); TOPOLOGIES (default
# "mono"): the deployments measured, e.g. "mono 1A1F" (xAyF over the async connector, every rank
# on GPU 0 under MPS).
# Usage (repo root there): SWITCHES="A=0 B=0" tools/device/switches_ab.sh BIN_DIR
set -u
BIN=$(readlink -f "$1")
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"
: "${SWITCHES:?SWITCHES=\"NAME=VALUE ...\" is required}"
TOPOLOGIES=${TOPOLOGIES:-mono}
[ "$TOPOLOGIES" != mono ] && mps_on
for round in $(seq "${ROUNDS:-2}"); do
  for topo in $TOPOLOGIES; do
    deploy=()
    [ "$topo" != mono ] &&
      deploy=(--topology "$topo" --additional-config '{"afd": {"connector": "AsyncAFDConnector"}}')
    for sw in default $SWITCHES; do
      envs=
      [ "$sw" != default ] && envs=$sw
      echo "== round $round, $topo, $sw: afd bench decode --batch ${BATCH:-1,16,64,256} --context ${CONTEXT:-128}"
      env $envs timeout 200 "$BIN/afd" bench decode --model preset:deepseek-v2-lite --device cuda \
        --batch "${BATCH:-1,16,64,256}" --context "${CONTEXT:-128}" --steps "${STEPS:-8}" \
        "${deploy[@]}" 2>&1 | grep -E '^ +[0-9]+ ' || echo "(no rows: exit status $?)"
    done
  done
done
