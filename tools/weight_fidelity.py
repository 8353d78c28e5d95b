#!/usr/bin/env python3
"""The fidelity of a model's weights in another form (an FP8 copy from `afd quantize`,
--quantization fp8, bf16 on a GPU, ...) against a reference run, with seed 001's method
(tools/fidelity.py).

Usage: weight_fidelity.py AFD SEQUENCES REFERENCE_ARGS :: CANDIDATE_ARGS [:: CANDIDATE_ARGS ...]
  SEQUENCES: see fidelity.load_sequences; *_ARGS: `afd run` arguments (--model DIR included).
Prints one line per candidate: positions scored, top-1 agreement with the reference, mean |dp|.
Example: weight_fidelity.py build/afd tests/data/golden/v3_trained/bf16_reference.json
         --model tests/data/golden/v3_trained :: --model /tmp/v3_trained_fp8"""
import sys

import fidelity

afd, sequences = sys.argv[1:3]
groups = [[]]
for a in sys.argv[3:]:
    if a == "::":
        groups.append([])
    else:
        groups[-1].append(a)
if len(groups) < 2 or not groups[0]:
    sys.exit(__doc__)
seqs, score_from = fidelity.load_sequences(sequences)
ref = fidelity.run(afd, groups[0], seqs, "reference")
for g in groups[1:]:
    total, agree, diff = fidelity.score(fidelity.run(afd, g, seqs, " ".join(g)), ref, score_from)
    print(f"{' '.join(g)} vs {' '.join(groups[0])}: {total} positions, top-1 agreement "
          f"{agree:.2f}%, mean |dp| {diff:.4f}%", flush=True)
