#!/usr/bin/env bash
# Repeats one AFD run over the async connector against the monolithic run (same prompts as
# async_quick_check.sh) until TIME_S [120] pass, under MPS, and prints every run whose output
# differs (output counts, ids and lengths of each differing prompt). Looks for rare
# differences. KEEP=DIR keeps each failing run's stderr, output and (on a timeout) the processes
# still running and nvidia-smi, as DIR/run_N.*. --stats on every run (per-rank counters).
# Usage (repo root there): [KEEP=DIR] async_repeat_check.sh BIN_DIR [DTYPE fp32] [TOPOLOGY 2A2F]
set -u
BIN=$(readlink -f "$1")
DT=${2:-fp32}
TOPO=${3:-2A2F}
. "$(dirname "$(readlink -f "$0")")/env.sh"
mps_on >/dev/null
M=tests/data/golden/v3_noaux_tc
P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --max-tokens 16 --ignore-eos --json --device cuda --dtype $DT)
ASYNC=${ASYNC_CFG:-'{"afd": {"connector": "AsyncAFDConnector"}}'}
"$BIN/afd" run --model $M "${P[@]}" >/tmp/mono.json 2>/tmp/mono.err || tail -3 /tmp/mono.err
end=$(( $(date +%s) + ${TIME_S:-120} ))
runs=0; bad=0
while [ "$(date +%s)" -lt "$end" ]; do
  runs=$((runs + 1))
  timeout -k 5 60 "$BIN/afd" run --model $M "${P[@]}" --topology $TOPO --additional-config "$ASYNC" --stats >/tmp/afd.json 2>/tmp/afd.err &
  pid=$!
  # Just before the timeout: what is still running, and the GPU's processes.
  ( sleep 58; kill -0 $pid 2>/dev/null && { ps -eo pid,ppid,stat,etime,args | grep -E "afd (run|worker)" | grep -v grep; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; } >/tmp/afd.hang 2>&1 ) &
  watcher=$!
  wait $pid
  rc=$?
  kill $watcher 2>/dev/null; wait $watcher 2>/dev/null
  python3 - "$runs" "$rc" <<'PYEOF' || bad=$((bad + 1))
import json, sys
a = [json.loads(l) for l in open("/tmp/mono.json")]
try:
    b = [json.loads(l) for l in open("/tmp/afd.json")]
except Exception as e:
    b = []
if sys.argv[2] == "0" and len(a) == len(b) and all(x["output_ids"] == y["output_ids"] for x, y in zip(a, b)):
    sys.exit(0)
print(f"run {sys.argv[1]}: rc {sys.argv[2]}, {len(a)} vs {len(b)} outputs")
for i, (x, y) in enumerate(zip(a, b)):
    if x["output_ids"] != y["output_ids"]:
        print(f"  prompt {i}: mono {len(x['output_ids'])} ids {x['output_ids']}")
        print(f"  prompt {i}: afd  {len(y['output_ids'])} ids {y['output_ids']}")
        lx, ly = x.get("logprobs", []), y.get("logprobs", [])
        print(f"  logprobs mono {lx[:3]}... afd {ly[:3]}... (lengths {len(lx)} {len(ly)})")
sys.exit(1)
PYEOF
  [ "$rc" -ne 0 ] && tail -3 /tmp/afd.err
  if [ -n "${KEEP:-}" ] && [ "$bad" -gt "${kept:-0}" ]; then
    kept=$bad
    mkdir -p "$KEEP"
    cp /tmp/afd.err "$KEEP/run_$runs.err"; cp /tmp/afd.json "$KEEP/run_$runs.json"
    [ "$rc" -eq 124 ] && [ -s /tmp/afd.hang ] && cp /tmp/afd.hang "$KEEP/run_$runs.hang"
    logs=$(grep -o 'all logs kept in [^)]*' /tmp/afd.err | sed 's/all logs kept in //' | head -1)
    [ -n "$logs" ] && [ -d "$logs" ] && cp -r "$logs" "$KEEP/run_${runs}_logs"
  fi
  rm -f /tmp/afd.hang
  [ "$rc" -ne 0 ] && { pkill -9 -f "afd (run|worker)" 2>/dev/null; sleep 1; }  # nothing of a failed run lives on
done
echo "$TOPO $DT: $runs runs, $bad differing"
mps_off
