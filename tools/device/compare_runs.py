"""Compares two `afd run --json` outputs of the same prompts (a monolithic run and an AFD
deployment): greedy ids must be identical, and with "fp32" in the label every prompt and output
log-prob within 1e-5. Prints one line; exits 1 on a mismatch.
Usage: compare_runs.py MONO.json OTHER.json LABEL"""
import json
import sys

a = [json.loads(line) for line in open(sys.argv[1])]
b = [json.loads(line) for line in open(sys.argv[2])]
same = len(a) == len(b) and all(x["output_ids"] == y["output_ids"] for x, y in zip(a, b))
d = 0.0
for x, y in zip(a, b):
    for p, q in zip(x["prompt_logprobs"][1:] + x["logprobs"], y["prompt_logprobs"][1:] + y["logprobs"]):
        d = max(d, abs(p - q))
ok = same and (d <= 1e-5 if "fp32" in sys.argv[3] else True)
print(f"{sys.argv[3]}: greedy ids identical {same}; max |dlogprob| {d:.2e} -> {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
