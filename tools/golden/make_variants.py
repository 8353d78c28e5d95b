#!/usr/bin/env python3
"""Golden data for DeepSeek checkpoints whose shapes and options differ from make_golden.py's
cases: tied embeddings, no dense layer, one expert per token, fp16 / fp32 files, odd widths
(hidden 80 / 96, 3 or 5 heads, rope dims 4 / 16, vocab 700 / 1000), group-limited routing over
5 groups, V3 yarn with a small factor, two dense layers, shards of another size.

Each case is built, initialised, saved, reloaded in fp32 and evaluated exactly as make_golden.py
does (its functions are reused), and written in the same layout (config.json, safetensors,
golden.json with prompts / prompt_logprobs / greedy_output_ids, logits_<i>.npy), so
tests/model/golden_test.cpp reads these cases as it reads the others. The files are saved in the
case's `save_dtype` (make_golden.py saves bf16).

Usage:  python3 tools/golden/make_variants.py --out DIR [--cases a,b]
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402

CASES = {
    # V2: every layer MoE, one routed expert a token, lm_head tied to the embeddings, fp16 files,
    # rope theta 50000.
    "v2_tied_fp16": dict(
        arch="v2",
        seed=2001,
        save_dtype=torch.float16,
        cfg=dict(
            vocab_size=512,
            first_k_dense_replace=0,
            tie_word_embeddings=True,
            q_lora_rank=None,
            n_routed_experts=6,
            n_shared_experts=1,
            num_experts_per_tok=1,
            topk_method="greedy",
            scoring_func="softmax",
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            rope_theta=50000.0,
            max_position_embeddings=2048,
        ),
        rope=None,
        shard=None,
    ),
    # V3: other widths everywhere, two dense layers of four, yarn x4, fp32 files.
    "v3_wide_fp32": dict(
        arch="v3",
        seed=2002,
        save_dtype=torch.float32,
        cfg=dict(
            vocab_size=700,
            hidden_size=96,
            intermediate_size=160,
            moe_intermediate_size=40,
            num_hidden_layers=4,
            first_k_dense_replace=2,
            num_attention_heads=3,
            num_key_value_heads=3,
            kv_lora_rank=48,
            q_lora_rank=40,
            qk_nope_head_dim=32,
            qk_rope_head_dim=16,
            v_head_dim=24,
            n_routed_experts=12,
            n_shared_experts=1,
            num_experts_per_tok=3,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            n_group=3,
            topk_group=2,
            norm_topk_prob=False,
            routed_scaling_factor=1.5,
            rms_norm_eps=1e-5,
            rope_interleave=True,
            max_position_embeddings=1024,
        ),
        rope=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=256, beta_fast=32,
                  beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
        shard=None,
    ),
    # V2: odd widths (hidden 80, 5 heads, rope 4, v 12), vocab 1000, group-limited routing over
    # 5 groups, two shared experts, bf16 files in shards of 100 KB.
    "v2_odd_sharded": dict(
        arch="v2",
        seed=2003,
        save_dtype=torch.bfloat16,
        cfg=dict(
            vocab_size=1000,
            hidden_size=80,
            intermediate_size=96,
            moe_intermediate_size=16,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            num_attention_heads=5,
            num_key_value_heads=5,
            kv_lora_rank=20,
            q_lora_rank=None,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=12,
            n_routed_experts=10,
            n_shared_experts=2,
            num_experts_per_tok=4,
            topk_method="group_limited_greedy",
            scoring_func="softmax",
            n_group=5,
            topk_group=3,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            max_position_embeddings=4096,
        ),
        rope=None,
        shard="100KB",
    ),
}


def run_case(name, case, out_root):
    mg.log("\n================ case %s ================" % name)
    torch.manual_seed(case["seed"])
    cfg, notes = mg.make_config(case)
    _, model_cls = mg.classes(case["arch"])
    model = model_cls(cfg)
    model.eval()
    mg.init_weights(model, case)
    d = os.path.join(out_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.to(case["save_dtype"])
    saved = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
    mg.save_model(model, d, case["shard"])
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    del model

    model, info, load_kw = mg.load_model(case["arch"], d)
    model.eval()
    sd = model.state_dict()
    mism = [k for k, v in saved.items() if k not in sd or not torch.equal(sd[k].float(), v)]
    mism += [k + " (new)" for k in sd if k not in saved]
    mg.log("loading info:", {k: sorted(v) if isinstance(v, (set, list)) else str(v) for k, v in info.items()})
    mg.log("reload mismatches:", mism or "none")
    vocab = case["cfg"]["vocab_size"]
    rng = np.random.RandomState(case["seed"])
    prompts = [[int(t) for t in rng.randint(len(mg.SPECIAL_IDS), vocab, size=n)] for n in mg.N_PROMPT]
    logits_files, prompt_lps, greedy, gen_ids, margins = [], [], [], [], []
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            inp = torch.tensor([ids])
            lg = model(input_ids=inp, use_cache=False).logits[0].to(torch.float32).numpy()
            fn = "logits_%d.npy" % i
            np.save(os.path.join(d, fn), lg.astype(np.float32))
            logits_files.append(fn)
            lsm = torch.log_softmax(torch.from_numpy(lg), dim=-1)
            prompt_lps.append([None] + [float(lsm[j - 1, ids[j]]) for j in range(1, len(ids))])
            seq = list(ids)
            for _ in range(mg.MAX_NEW):
                last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
                top2 = torch.topk(last, 2).values
                margins.append(float(top2[0] - top2[1]))
                seq.append(int(torch.argmax(last)))
            greedy.append(seq[len(ids):])
            go = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                max_new_tokens=mg.MAX_NEW, min_new_tokens=mg.MAX_NEW,
                                pad_token_id=mg.COMMON["eos_token_id"])
            gen_ids.append([int(t) for t in go[0, len(ids):]])
    golden = {
        "case": name,
        "made_by": "tools/golden/make_variants.py",
        "save_dtype": str(case["save_dtype"]),
        "prompts": prompts,
        "prompt_logits_files": logits_files,
        "greedy_max_new_tokens": mg.MAX_NEW,
        "greedy_output_ids": greedy,
        "generate_with_cache_output_ids": gen_ids,
        "prompt_logprobs": prompt_lps,
        "stats": {"min_greedy_top1_top2_margin": min(margins)},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config_notes": notes,
        "load_kwargs": {k: str(v) for k, v in load_kw.items()},
        "reload_state_dict_mismatches": mism,
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    mg.log("greedy == generate:", greedy == gen_ids, "min margin %.4g" % min(margins))
    mg.log("files:", sorted((fn, os.path.getsize(os.path.join(d, fn))) for fn in os.listdir(d)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for n in a.cases.split(","):
        try:
            run_case(n, CASES[n], a.out)
        except Exception:  # noqa
            import traceback
            traceback.print_exc()
            failed.append(n)
    if failed:
        mg.log("FAILED cases:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
