#!/usr/bin/env python3
"""bf16 reference of each golden checkpoint, made with Hugging Face transformers on the GPU.

Seed 001's scoring method: fixed token sequences are fed to the model (no generation), and for
every position the probability the model assigns to the next token of the sequence and its top-1
token are recorded. A runtime in bf16 is then scored on the same positions: top-1 agreement and
mean absolute probability difference (tools/device/gpu_check.sh does that for afd).

  <case>/bf16_reference.json: {"sequences": [[ids]], "p_next": [[float]], "top1": [[int]],
                               "versions": {...}}   (positions 0 .. len-2 of each sequence)

Usage: python3 tools/golden/make_bf16_reference.py --golden tests/data/golden --out DIR
       [--sequences 8 --length 129]   (8 x 128 = 1024 scored positions per case)
Needs a CUDA GPU, torch and transformers 5.x. The model runs as transformers loads it with
dtype=torch.bfloat16, attn_implementation="eager".
"""
import argparse
import json
import os

import torch
import transformers

CASES = ["v2_greedy_yarn", "v2_group_limited", "v3_noaux_tc", "v3_sharded"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--length", type=int, default=129)
    args = ap.parse_args()
    torch.manual_seed(0)
    for case in CASES:
        d = os.path.join(args.golden, case)
        cfg = json.load(open(os.path.join(d, "config.json")))
        gen = torch.Generator().manual_seed(1001)
        seqs = torch.randint(0, cfg["vocab_size"], (args.sequences, args.length), generator=gen)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.bfloat16, attn_implementation="eager").to("cuda").eval()
        p_next, top1 = [], []
        with torch.no_grad():
            for s in seqs:
                logits = model(s[None].to("cuda")).logits[0].float()  # [T, V]
                probs = logits.softmax(-1)
                nxt = s[1:].to("cuda")
                p_next.append(probs[:-1].gather(1, nxt[:, None])[:, 0].cpu().tolist())
                top1.append(logits[:-1].argmax(-1).cpu().tolist())
        out = {
            "sequences": seqs.tolist(),
            "p_next": p_next,
            "top1": top1,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "device": torch.cuda.get_device_name(0)},
        }
        os.makedirs(os.path.join(args.out, case), exist_ok=True)
        with open(os.path.join(args.out, case, "bf16_reference.json"), "w") as f:
            json.dump(out, f, separators=(",", ":"))
        print(case, "scored", sum(len(p) for p in p_next), "positions")


if __name__ == "__main__":
    main()
