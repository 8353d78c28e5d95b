#!/usr/bin/env bash
# Seed 004's multipod layout across three network namespaces -- three "hosts" with their own
# addresses on a bridge -- with recipes/multipod_4a_2f.sh as written: host 0 the FFN pod (DP 2,
# the rendezvous store), host 1 the API pod (DP ranks 0-1, the engine listener on its address),
# host 2 the headless pod (DP ranks 2-3). 100 requests to the API equal `afd run`; killing the
# headless host's rank is named by the API server, which stops (docs/deploy.md).
# Exits 77 (skipped) where the machine does not allow network namespaces.
set -u
AFD=${1:?usage: netns_multipod_test.sh path/to/afd path/to/recipes}
RECIPES=${2:?usage: netns_multipod_test.sh path/to/afd path/to/recipes}
AFD=$(readlink -f "$AFD")
RECIPE=$(readlink -f "$RECIPES")/multipod_4a_2f.sh
. "$(dirname "$(readlink -f "$0")")/../testing/netns.sh"
LOGDIR=$(mktemp -d)
cleanup() {
  netns_down
  rm -rf "$LOGDIR"
}
trap cleanup EXIT
netns_up "m$$" 3 10.214.0

# Several hosts: every process carries the join secret (the store and the engine listener are
# on the network).
export AFD_JOIN_SECRET="netns-multipod-secret-$(od -An -tx8 -N8 /dev/urandom | tr -d " ")"
export AFD="$AFD" MODEL_PATH=preset:tiny DEVICE=cpu AFD_CONNECTOR_HOST=10.214.0.1 \
  AFD_CONNECTOR_PORT=29617 ATTENTION_DP_ADDRESS=10.214.0.2 ATTENTION_DP_RPC_PORT=29618 \
  API_HOST=10.214.0.2 API_PORT=18017 EXTRA_FLAGS="--max-tokens 4 --ignore-eos"
pod() {  # host pod
  ip netns exec "${HOSTS[$1]}" env POD="$2" bash "$RECIPE" >"$LOGDIR/$2.log" 2>&1 &
}
pod 0 FFN_0
FFN=$!
pod 2 ATTENTION_1
HEADLESS=$!
pod 1 ATTENTION_0
API=$!
for _ in $(seq 600); do
  grep -q "the OpenAI API is up" "$LOGDIR/ATTENTION_0.log" && break
  kill -0 $API 2>/dev/null || break
  sleep 0.1
done
status=0
if ! grep -q "the OpenAI API is up" "$LOGDIR/ATTENTION_0.log"; then
  echo "FAIL: the API pod did not come up"
  for p in FFN_0 ATTENTION_0 ATTENTION_1; do echo "== $p"; cat "$LOGDIR/$p.log"; done
  exit 1
fi
# 100 prompts, 16 at a time from the API host, against `afd run` of the same prompts.
ip netns exec "${HOSTS[1]}" python3 - "$AFD" <<'PYEOF' || status=1
import json, random, subprocess, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
afd = sys.argv[1]
rng = random.Random(7)
prompts = [[rng.randrange(1, 1000) for _ in range(rng.randrange(1, 12))] for _ in range(100)]
cmd = [afd, "run", "--model", "preset:tiny", "--max-tokens", "4", "--ignore-eos", "--json"]
for p in prompts:
    cmd += ["--prompt-ids", ",".join(map(str, p))]
want = [json.loads(l)["output_ids"] for l in subprocess.run(
    cmd, check=True, capture_output=True, text=True).stdout.splitlines()]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy: a direct call
def ask(p):
    body = json.dumps({"prompt": p, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request("http://10.214.0.2:18017/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=120) as r:
        return json.load(r)["choices"][0]["token_ids"]
with ThreadPoolExecutor(16) as pool:
    got = list(pool.map(ask, prompts))
bad = [i for i in range(100) if got[i] != want[i]]
print(f"100 requests through the API pod: {100 - len(bad)} equal afd run" + (f"; differ: {bad[:10]}" if bad else ""))
sys.exit(1 if bad else 0)
PYEOF
# The headless pod's replicas took part: the API server waits for all four before it is up.
# Killing one of its ranks: the API server names it and stops; the other pods end too.
RANK=$(ip netns pids "${HOSTS[2]}" | while read -r p; do
  tr '\0' ' ' </proc/$p/cmdline | grep -q -- "worker .*--role-rank 2" && echo "$p"; done | head -1)
if [ -z "$RANK" ]; then
  echo "FAIL: no attention rank 2 on the headless host"
  status=1
else
  kill -9 "$RANK"
  for _ in $(seq 600); do kill -0 $API 2>/dev/null || break; sleep 0.1; done
  wait $API
  rc=$?
  if [ $rc -eq 0 ] || ! grep -Eq "attention replica 2|\(attention 2\)" "$LOGDIR/ATTENTION_0.log"; then
    echo "FAIL: the API pod exited $rc without naming attention rank 2:"
    cat "$LOGDIR/ATTENTION_0.log"
    status=1
  else
    echo "the API pod exited $rc naming: $(grep -Eo "[^:]*(attention replica 2|\(attention 2\))[^;]*" "$LOGDIR/ATTENTION_0.log" | head -1)"
  fi
fi
for pid in $HEADLESS $FFN; do
  for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then
    echo "FAIL: a pod command still runs 60 s after the API pod ended"
    status=1
  fi
done
[ $status -eq 0 ] && echo "PASS: seed 004's multipod layout across three network namespaces"
exit $status
