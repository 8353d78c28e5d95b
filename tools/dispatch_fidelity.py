#!/usr/bin/env python3
"""The fidelity of an AFD dispatch format against the monolithic model, with seed 001's method
(tools/fidelity.py).

Usage: dispatch_fidelity.py AFD MODEL SEQUENCES TOPOLOGY [afd run flags...]
  SEQUENCES: see fidelity.load_sequences.
Runs the monolithic model once, then the deployment TOPOLOGY over AsyncAFDConnector with
dispatch_dtype "auto" and "fp8", and prints one line per format."""
import json
import sys

import fidelity

afd, model, sequences, topology = sys.argv[1:5]
flags = sys.argv[5:]
seqs, score_from = fidelity.load_sequences(sequences)
base = ["--model", model] + flags
mono = fidelity.run(afd, base, seqs, "monolithic")
name = model.rstrip("/").split("/")[-1]
for dtype in ("auto", "fp8"):
    cfg = {"afd": {"connector": "AsyncAFDConnector",
                   "connector_extra_config": {"dispatch_dtype": dtype}}}
    got = fidelity.run(afd, base + ["--topology", topology, "--additional-config", json.dumps(cfg)],
                       seqs, f"dispatch_dtype {dtype}")
    total, agree, diff = fidelity.score(got, mono, score_from)
    print(f"{name} {topology} dispatch_dtype {dtype} {' '.join(flags)}: {total} positions, "
          f"top-1 agreement with the monolithic run {agree:.2f}%, mean |dp| {diff:.4f}%",
          flush=True)
