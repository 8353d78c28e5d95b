#!/usr/bin/env python3
"""Hugging Face transformers eager decode on DeepSeek-V2-Lite shapes (27 layers, 64 routed experts
top-6 + 2 shared, bf16 random weights), the baseline of issue 10: for each batch size, B random
prompts of CONTEXT tokens are prefilled, then ms per decode step is timed (one token per sequence
per step, DynamicCache, attn_implementation="eager"), after 2 warm-up steps.
Usage: python3 tools/device/hf_decode_bench.py [--batch 1,16] [--context 128] [--steps 5]
Needs a CUDA GPU, torch and transformers 5.x."""
import argparse
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    cfg = transformers.DeepseekV2Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
        n_routed_experts=64, num_experts_per_tok=6, routed_scaling_factor=1.0, kv_lora_rank=512,
        q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
        first_k_dense_replace=1, norm_topk_prob=False, topk_method="greedy", n_group=1,
        topk_group=1, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params")
    for b in [int(x) for x in args.batch.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (b, args.context), device="cuda")
        with torch.no_grad():
            out = model(ids, use_cache=True)
            pkv = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            times = []
            for s in range(args.steps + 2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model(nxt, past_key_values=pkv, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                if s >= 2:
                    times.append(time.perf_counter() - t0)
        times.sort()
        print(f"transformers eager batch {b:4d} context {args.context}: "
              f"median {1e3 * times[len(times) // 2]:.1f} ms/step (min {1e3 * times[0]:.1f})")
        del out, pkv
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
