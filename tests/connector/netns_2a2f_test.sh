#!/usr/bin/env bash
# 2A2F spread over four network namespaces -- four "hosts" with their own addresses, joined by
# a bridge -- comes up and round-trips. Checks that every rank publishes its own host address
# (seed 001: subgroups are created at their first member's address, not the rendezvous host).
# Exits 77 (skipped) where the machine does not allow network namespaces.
set -u
AFD=${1:?usage: netns_2a2f_test.sh path/to/afd}
AFD=$(readlink -f "$AFD")
if ! command -v ip >/dev/null 2>&1; then
  echo "SKIP: ip (iproute2) is not installed"
  exit 77
fi
TAG="n$$"
BR="${TAG}br"
HOSTS=("${TAG}h0" "${TAG}h1" "${TAG}h2" "${TAG}h3")
LOGDIR=$(mktemp -d)
cleanup() {
  jobs -p | xargs -r kill -9 2>/dev/null
  for h in "${HOSTS[@]}"; do ip netns del "$h" 2>/dev/null; done
  ip netns del "$BR" 2>/dev/null
  rm -rf "$LOGDIR"
}
trap cleanup EXIT
if ! ip netns add "$BR" 2>"$LOGDIR/err"; then
  echo "SKIP: this machine does not allow network namespaces: $(cat "$LOGDIR/err")"
  exit 77
fi
set -e
ip -n "$BR" link add br0 type bridge
ip -n "$BR" link set br0 up
for i in 0 1 2 3; do
  h=${HOSTS[$i]}
  ip netns add "$h"
  ip link add "${TAG}a$i" netns "$h" type veth peer name "${TAG}b$i" netns "$BR"
  ip -n "$h" addr add "10.213.0.$((i + 1))/24" dev "${TAG}a$i"
  ip -n "$h" link set "${TAG}a$i" up
  ip -n "$h" link set lo up
  ip -n "$BR" link set "${TAG}b$i" master br0
  ip -n "$BR" link set "${TAG}b$i" up
done
set +e

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
