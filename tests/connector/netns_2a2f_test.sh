#!/usr/bin/env bash
# 2A2F spread over four network namespaces -- four "hosts" with their own addresses, joined by
# a bridge -- comes up and round-trips. Checks that every rank publishes its own host address
# (seed 001: subgroups are created at their first member's address, not the rendezvous host).
# Exits 77 (skipped) where the machine does not allow network namespaces.
set -u
AFD=${1:?usage: netns_2a2f_test.sh path/to/afd}
AFD=$(readlink -f "$AFD")
. "$(dirname "$(readlink -f "$0")")/../testing/netns.sh"
LOGDIR=$(mktemp -d)
cleanup() {
  netns_down
  rm -rf "$LOGDIR"
}
trap cleanup EXIT
netns_up "n$$" 4 10.213.0

PORT=29517
# Several hosts: the store is reachable from the network, so every process needs the join secret.
export AFD_JOIN_SECRET="netns-test-secret-$(od -An -tx8 -N8 /dev/urandom | tr -d " ")"
cfg() {
  echo "{\"afd\": {\"role\": \"$1\", \"connector\": \"P2pHostAFDConnector\", \"host\": \"10.213.0.1\", \"port\": $PORT, \"num_attention_ranks\": 2, \"num_ffn_ranks\": 2, \"afd_process_group_timeout_s\": 30}}"
}
# host 0: FFN 0 (serves the rendezvous), host 1: FFN 1, host 2: attention 0, host 3: attention 1
ROLES=(ffn ffn attention attention)
RANKS=(0 1 0 1)
pids=()
for i in 0 1 2 3; do
  ip netns exec "${HOSTS[$i]}" "$AFD" connector-test --additional-config "$(cfg "${ROLES[$i]}")" \
    --role-rank "${RANKS[$i]}" --steps 3 >"$LOGDIR/$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in 0 1 2 3; do
  if ! wait "${pids[$i]}"; then
    echo "FAIL: ${ROLES[$i]} ${RANKS[$i]} on host $i exited non-zero:"
    status=1
  fi
  cat "$LOGDIR/$i.log"
  if ! grep -q "\"address\":\"10.213.0.$((i + 1))\"" "$LOGDIR/$i.log"; then
    echo "FAIL: host $i did not publish its own address 10.213.0.$((i + 1))"
    status=1
  fi
done
[ $status -eq 0 ] && echo "PASS: 2A2F across four network namespaces"
exit $status
