#!/usr/bin/env python3
"""bf16 reference of each golden checkpoint, made with Hugging Face transformers on the GPU.

Seed 001's scoring method: for each of `--sequences` seeded prompts of `--prompt-length` ids,
transformers (bf16, greedy) generates `--generate` tokens; that whole token sequence is then fed
back as input (no generation), and for every generated position the probability the model
assigns to the generated token and its top-1 token are recorded. A runtime in bf16 is then
scored on the same positions: top-1 agreement and mean absolute probability difference
(tools/device/score_bf16.py; tools/device/gpu_check.sh runs it for afd).

  <case>/bf16_reference.json: {"sequences": [[ids]], "score_from": int, "p_next": [[float]],
                               "top1": [[int]], "versions": {...}}
  Row r of "p_next"/"top1" is the prediction at position score_from + r of the sequence (of its
  token score_from + r + 1): score_from = prompt length - 1.

Usage: python3 tools/golden/make_bf16_reference.py --golden tests/data/golden --out DIR
       [--sequences 8 --prompt-length 8 --generate 128] [--cases qwen3_trained,...]   (8 x 128 = 1024 scored positions)
Needs a CUDA GPU, torch and transformers 5.x. The model runs as transformers loads it with
dtype=torch.bfloat16, attn_implementation="eager".
"""
import argparse
import json
import os

import torch
import transformers

CASES = ["v2_greedy_yarn", "v2_group_limited", "v3_noaux_tc", "v3_sharded", "v3_trained",
         "v3_trained_fp8"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--prompt-length", type=int, default=8)
    ap.add_argument("--generate", type=int, default=128)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case folders")
    args = ap.parse_args()
    torch.manual_seed(0)
    for case in args.cases.split(","):
        d = os.path.join(args.golden, case)
        if not os.path.isdir(d):  # v3_trained until it is made (tools/golden/make_golden.py)
            print(f"{case}: no checkpoint in {args.golden}, skipped")
            continue
        cfg = json.load(open(os.path.join(d, "config.json")))
        gen = torch.Generator().manual_seed(1001)
        # Prompts of ordinary ids (not bos/eos: the low ids of the golden vocabularies).
        prompts = torch.randint(2, cfg["vocab_size"], (args.sequences, args.prompt_length),
                                generator=gen)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.bfloat16, attn_implementation="eager").to("cuda").eval()
        score_from = args.prompt_length - 1
        seqs, p_next, top1 = [], [], []
        with torch.no_grad():
            for prompt in prompts:
                ids = prompt[None].to("cuda")
                out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=args.generate, min_new_tokens=args.generate,
                                     do_sample=False, pad_token_id=cfg.get("eos_token_id", 1))
                seq = out[0]
                assert len(seq) == args.prompt_length + args.generate, len(seq)
                # Scored as a whole sequence, as the runtime scores it (--dump-logits).
                logits = model(seq[None]).logits[0].float()  # [T, V]
                probs = logits.softmax(-1)
                nxt = seq[1:]
                p = probs[:-1].gather(1, nxt[:, None])[:, 0]
                seqs.append(seq.cpu().tolist())
                p_next.append(p[score_from:].cpu().tolist())
                top1.append(logits[:-1].argmax(-1)[score_from:].cpu().tolist())
        out = {
            "sequences": seqs,
            "score_from": score_from,
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
