#!/usr/bin/env python3
"""The fidelity of an AFD dispatch format against the monolithic model, with seed 001's method:
teacher-forced sequences, top-1 agreement and mean |p(next) - p_mono(next)| over the scored
positions (`afd run --json` prints every prompt position's log-prob and top-1 id).

Usage: dispatch_fidelity.py AFD MODEL SEQUENCES TOPOLOGY [afd run flags...]
  SEQUENCES: a JSON file with "sequences" (token ids) and "score_from" (a bf16 reference of
             tools/golden/make_bf16_reference.py), or random:N:LEN:VOCAB:SEED (N uniform
             random sequences of LEN ids in [2, VOCAB), scored from position 1).
Runs the monolithic model once, then the deployment TOPOLOGY over AsyncAFDConnector with
dispatch_dtype "auto" and "fp8", and prints one line per format."""
import json
import math
import random
import subprocess
import sys

afd, model, sequences, topology = sys.argv[1:5]
flags = sys.argv[5:]

if sequences.startswith("random:"):
    _, n, length, vocab, seed = sequences.split(":")
    vocab = int(vocab)
    rng = random.Random(int(seed))
    seqs = [[rng.randrange(2, vocab) for _ in range(int(length))] for _ in range(int(n))]
    score_from = 1
else:
    ref = json.load(open(sequences))
    seqs, score_from = ref["sequences"], max(1, ref.get("score_from", 1))

base = [afd, "run", "--model", model, "--max-tokens", "1", "--json"] + flags
for s in seqs:
    base += ["--prompt-ids", ",".join(map(str, s))]


def run(extra):
    p = subprocess.run(base + extra, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(extra) or 'monolithic'}: exit {p.returncode}\n{p.stderr[-4000:]}")
    return [json.loads(line) for line in p.stdout.splitlines()]


mono = run([])
name = model.rstrip("/").split("/")[-1]
for dtype in ("auto", "fp8"):
    cfg = {"afd": {"connector": "AsyncAFDConnector",
                   "connector_extra_config": {"dispatch_dtype": dtype}}}
    got = run(["--topology", topology, "--additional-config", json.dumps(cfg)])
    agree = total = 0
    diff = 0.0
    for a, m in zip(got, mono):
        for j in range(score_from, len(m["prompt_top1"])):
            total += 1
            agree += a["prompt_top1"][j] == m["prompt_top1"][j]
            diff += abs(math.exp(a["prompt_logprobs"][j]) - math.exp(m["prompt_logprobs"][j]))
    print(f"{name} {topology} dispatch_dtype {dtype} {' '.join(flags)}: {total} positions, "
          f"top-1 agreement with the monolithic run {100 * agree / total:.2f}%, "
          f"mean |dp| {100 * diff / total:.4f}%", flush=True)
