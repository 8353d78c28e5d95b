#!/usr/bin/env bash
# One device call on the async connector's hop (issue 12's one-GPU round trip): the hop
# primitives alone (bench/hop_latency.cpp), AFD over the async connector against the monolithic
# run (async_quick_check.sh), then under MPS the 1A1F round trip (afd connector-test --bench:
# device flags with the stream's own round trip, and host flags) ROUNDS times (default 2), the
# last followed by the v2-lite 8-layer decode, monolithic vs 1A1F (decode_mono_vs_afd.sh; DECODE=0
# skips it).
# Usage (repo root there): tools/device/hop_check.sh BIN_DIR
set -u
HERE=$(dirname "$(readlink -f "$0")")
BIN=$(readlink -f "$1")
. "$HERE/env.sh"  # LD_LIBRARY_PATH, PY
echo "== hop_latency_bench"
timeout 60 "$BIN/hop_latency_bench" --iters "${ITERS:-300}"
echo "== async_quick_check"
timeout 200 bash "$HERE/async_quick_check.sh" "$1"
rounds=${ROUNDS:-2}
for ((i = 1; i <= rounds; i++)); do
  then=""
  [ $i = "$rounds" ] && [ "${DECODE:-1}" != 0 ] && then="bash $HERE/decode_mono_vs_afd.sh $1"
  echo "== under MPS, round $i"
  ONLY=mps MPS_THEN="$then" timeout 280 bash "$HERE/x2_probe.sh" "$1" 2>&1 |
    grep -A4 "^== async\|^mono\|^1A1F\|did not start"
done
