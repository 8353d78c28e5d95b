"""Seed 001's fidelity method, shared by the fidelity tools: teacher-forced sequences through
`afd run --json` (every prompt position's log-prob and top-1 id), then top-1 agreement and mean
|p(next) - p_ref(next)| over the scored positions."""
import json
import math
import random
import subprocess
import sys


def load_sequences(spec):
    """(sequences, score_from) of a JSON file with "sequences" and "score_from" (a bf16
    reference of tools/golden/make_bf16_reference.py), or of random:N:LEN:VOCAB:SEED (N uniform
    random sequences of LEN ids in [2, VOCAB), scored from position 1)."""
    if spec.startswith("random:"):
        _, n, length, vocab, seed = spec.split(":")
        rng = random.Random(int(seed))
        seqs = [[rng.randrange(2, int(vocab)) for _ in range(int(length))] for _ in range(int(n))]
        return seqs, 1
    ref = json.load(open(spec))
    return ref["sequences"], max(1, ref.get("score_from", 1))


def run(afd, args, seqs, label):
    """The JSON lines of `afd run ARGS` over the sequences (one new token each)."""
    cmd = [afd, "run", "--max-tokens", "1", "--json"] + args
    for s in seqs:
        cmd += ["--prompt-ids", ",".join(map(str, s))]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{label}: exit {p.returncode}\n{p.stderr[-4000:]}")
    return [json.loads(line) for line in p.stdout.splitlines()]


def score(got, ref, score_from):
    """(positions, top-1 agreement %, mean |dp| %) of `got` against `ref`."""
    agree = total = 0
    diff = 0.0
    for a, m in zip(got, ref):
        for j in range(score_from, len(m["prompt_top1"])):
            total += 1
            agree += a["prompt_top1"][j] == m["prompt_top1"][j]
            diff += abs(math.exp(a["prompt_logprobs"][j]) - math.exp(m["prompt_logprobs"][j]))
    return total, 100 * agree / total, 100 * diff / total
