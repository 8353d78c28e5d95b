#!/usr/bin/env bash
# One short device call: AFD over the async connector on GPU 0 (device flags) equals the
# monolithic GPU run on one golden checkpoint -- fp32 2A2F and bf16 1A1F greedy ids, fp32
# log-probs within 1e-5. Usage (repo root there): async_quick_check.sh BIN_DIR
set -u
BIN=$(readlink -f "$1")
. "$(dirname "$(readlink -f "$0")")/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
M=tests/data/golden/v3_noaux_tc
P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --max-tokens 16 --ignore-eos --json --device cuda)
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
status=0
for run in "fp32 2A2F" "bf16 1A1F"; do
  set -- $run
  "$BIN/afd" run --model $M "${P[@]}" --dtype $1 >/tmp/mono.json 2>/tmp/err || { tail -3 /tmp/err; status=1; }
  timeout 90 "$BIN/afd" run --model $M "${P[@]}" --dtype $1 --topology $2 --additional-config "$ASYNC" >/tmp/afd.json 2>/tmp/err || { tail -5 /tmp/err; status=1; }
  python3 - "$1 $2" <<'PYEOF' || status=1
import json, sys
a = [json.loads(l) for l in open("/tmp/mono.json")]; b = [json.loads(l) for l in open("/tmp/afd.json")]
same = len(a) == len(b) and all(x["output_ids"] == y["output_ids"] for x, y in zip(a, b))
d = max([abs(p - q) for x, y in zip(a, b) for p, q in zip(x["prompt_logprobs"][1:] + x["logprobs"], y["prompt_logprobs"][1:] + y["logprobs"])] or [0])
ok = same and (d <= 1e-5 or "bf16" in sys.argv[1])
print(f"{sys.argv[1]}: ids identical {same}, max |dlogprob| {d:.2e} -> {'ok' if ok else 'FAIL'}")
if not same:
    print(f"  {len(a)} monolithic outputs, {len(b)} AFD outputs")
    for i, (x, y) in enumerate(zip(a, b)):
        if x["output_ids"] != y["output_ids"]:
            print(f"  prompt {i}: monolithic {x['output_ids']}\n  prompt {i}: AFD        {y['output_ids']}")
sys.exit(0 if ok else 1)
PYEOF
done
exit $status
