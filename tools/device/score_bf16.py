#!/usr/bin/env python3
"""Scores afd against a bf16 reference (tools/golden/make_bf16_reference.py) with seed 001's
method: for each sequence (a prompt and the reference's greedy continuation), afd's logits of
every position (afd run --dump-logits), then top-1 agreement and mean |p_afd(next) -
p_ref(next)| over the scored positions (the reference's "score_from" on).
Usage: score_bf16.py AFD CASE_DIR REFERENCE_JSON WORK_DIR [afd run flags...]
Prints one line and exits 1 when top-1 agreement < 99% or the mean difference > 1%."""
import json
import subprocess
import sys

import numpy as np

afd, case_dir, ref_path, work = sys.argv[1:5]
flags = sys.argv[5:]
ref = json.load(open(ref_path))
agree = total = 0
diff = 0.0
for i, seq in enumerate(ref["sequences"]):
    npy = f"{work}/score_{i}.npy"
    subprocess.run([afd, "run", "--model", case_dir, "--prompt-ids", ",".join(map(str, seq)),
                    "--max-tokens", "1", "--dump-logits", npy] + flags,
                   check=True, stdout=subprocess.DEVNULL)
    # Positions score_from.. (the generated part with seed 001's method; older references
    # scored every position).
    start = ref.get("score_from", 0)
    logits = np.load(npy).astype(np.float64)[:-1][start:]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    nxt = np.array(seq[1:][start:])
    p = probs[np.arange(len(nxt)), nxt]
    diff += float(np.abs(p - np.array(ref["p_next"][i])).sum())
    agree += int((logits.argmax(-1) == np.array(ref["top1"][i])).sum())
    total += len(nxt)
top1, mean_diff = agree / total, diff / total
print(f"{case_dir.rstrip('/').split('/')[-1]} {' '.join(flags)}: {total} positions, top-1 agreement "
      f"{100 * top1:.2f}%, mean |dp| {100 * mean_diff:.3f}%")
sys.exit(0 if top1 >= 0.99 and mean_diff <= 0.01 else 1)
