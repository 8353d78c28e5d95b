# Several "hosts" on one machine, for the network-namespace tests (sourced, bash): a bridge
# namespace and COUNT host namespaces joined to it by veth pairs, each with its own address.
#
#   netns_up TAG COUNT SUBNET   # hosts ${TAG}h0.. at SUBNET.1, SUBNET.2, ... (a /24); sets HOSTS
#                               # and BR; exits 77 (skipped) where namespaces are not allowed
#   netns_down                  # kills what runs in them, removes them (install as a trap)
netns_up() {
  local tag=$1 count=$2 subnet=$3 i h
  if ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: ip (iproute2) is not installed"
    exit 77
  fi
  BR="${tag}br"
  HOSTS=()
  for ((i = 0; i < count; i++)); do HOSTS+=("${tag}h$i"); done
  local err
  if ! err=$(ip netns add "$BR" 2>&1); then
    echo "SKIP: this machine does not allow network namespaces: $err"
    exit 77
  fi
  set -e
  ip -n "$BR" link add br0 type bridge
  ip -n "$BR" link set br0 up
  for ((i = 0; i < count; i++)); do
    h=${HOSTS[$i]}
    ip netns add "$h"
    ip link add "${tag}a$i" netns "$h" type veth peer name "${tag}b$i" netns "$BR"
    ip -n "$h" addr add "$subnet.$((i + 1))/24" dev "${tag}a$i"
    ip -n "$h" link set "${tag}a$i" up
    ip -n "$h" link set lo up
    ip -n "$BR" link set "${tag}b$i" master br0
    ip -n "$BR" link set "${tag}b$i" up
  done
  set +e
}

netns_down() {
  local h
  jobs -p | xargs -r kill -9 2>/dev/null
  for h in "${HOSTS[@]}"; do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$h" 2>/dev/null
  done
  [ -n "${BR:-}" ] && ip netns del "$BR" 2>/dev/null
  return 0
}
