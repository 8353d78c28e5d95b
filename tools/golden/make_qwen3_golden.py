#!/usr/bin/env python3
"""Golden reference data for Qwen3-MoE (Qwen3MoeForCausalLM) from Hugging Face transformers.

The same method and file layout as make_golden.py (whose helpers it uses): a tiny model built with
transformers' own classes, weights from a seeded generator, saved in bf16 with save_pretrained,
reloaded in fp32 (eager attention, eager experts), golden outputs from the reloaded model on the
CPU:  <out>/<case>/config.json, model*.safetensors, golden.json, logits_<i>.npy.

The cases cover what issue 42 names: GQA ratios (MHA, GQA 4, MQA), head_dim independent of
hidden / heads, decoder_sparse_step, mlp_only_layers, norm_topk_prob both ways, tied embeddings,
default and YaRN rope, a sharded checkpoint, and both config spellings: transformers 5 writes
`num_local_experts` and `rope_parameters`; the published checkpoints (transformers 4) write
`num_experts` and a top-level `rope_theta` (+ `rope_scaling`), which transformers 5 still reads: qwen3_legacy_config's
config.json is rewritten in that spelling after saving and reloaded, and its logits must not move
("legacy_config_check" in golden.json). qwen3_trained is trained briefly like v3_trained (peaked
predictions) for scoring bf16 against transformers (make_bf16_reference.py --cases qwen3_trained).

An independent plain-torch forward pass that reads the safetensors files is compared with
transformers' logits for a few variants of easy-to-get-wrong semantics ("reference_check").

Usage:  python3 tools/golden/make_qwen3_golden.py --out DIR [--cases qwen3_gqa,...]
"""
import argparse
import glob
import itertools
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402

VOCAB = mg.VOCAB
N_PROMPT = mg.N_PROMPT
MAX_NEW = mg.MAX_NEW

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=24,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
    attention_bias=False,
    attention_dropout=0.0,
    initializer_range=0.02,
    use_cache=True,
    use_sliding_window=False,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
)

CASES = {
    # GQA 4:1, head_dim 16 with hidden / heads = 8; the first layer dense (mlp_only_layers).
    "qwen3_gqa": dict(seed=2001, cfg=dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                                          head_dim=16, num_experts=8, num_experts_per_tok=2,
                                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                                          tie_word_embeddings=False),
                      rope=None, shard=None),
    # MHA, every second layer MoE (decoder_sparse_step 2), tied embeddings, no renormalisation,
    # YaRN, sharded.
    "qwen3_sparse_tied": dict(seed=2002, cfg=dict(num_hidden_layers=4, num_attention_heads=4,
                                                  num_key_value_heads=4, head_dim=32, num_experts=6,
                                                  num_experts_per_tok=3, norm_topk_prob=False,
                                                  decoder_sparse_step=2, mlp_only_layers=[],
                                                  tie_word_embeddings=True),
                              rope=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024),
                              shard="200KB"),
    # MQA (one KV head), the last layer dense, 16 experts top-4; config.json rewritten in the
    # published checkpoints' spelling (num_experts, rope_theta at the top level).
    "qwen3_legacy_config": dict(seed=2003, cfg=dict(num_hidden_layers=3, num_attention_heads=4,
                                                    num_key_value_heads=1, head_dim=16, num_experts=16,
                                                    num_experts_per_tok=4, norm_topk_prob=True,
                                                    decoder_sparse_step=1, mlp_only_layers=[2],
                                                    tie_word_embeddings=False),
                                rope=None, shard=None, legacy=True),
}
CASES["qwen3_trained"] = dict(seed=2004, cfg=dict(CASES["qwen3_gqa"]["cfg"]), rope=None, shard=None,
                              train=dict(steps=400, batch=16, length=48, lr=3e-3, p=0.9))


def log(*a):
    print(*a, flush=True)


def make_config(case):
    kw = dict(COMMON)
    kw.update(case["cfg"])
    rope = case["rope"]
    rp = dict(rope) if rope is not None else dict(rope_type="default")
    rp["rope_theta"] = kw["rope_theta"]
    kw["rope_parameters"] = rp
    return transformers.Qwen3MoeConfig(**kw)


def load_model(d):
    kw = dict(attn_implementation="eager", output_loading_info=True, dtype=torch.float32)
    try:
        return transformers.Qwen3MoeForCausalLM.from_pretrained(d, experts_implementation="eager", **kw)
    except (TypeError, ValueError) as e:
        log("experts_implementation refused:", e)
        return transformers.Qwen3MoeForCausalLM.from_pretrained(d, **kw)


def write_legacy_config(d):
    """Rewrites config.json in the spelling of the published Qwen3 checkpoints (transformers 4):
    num_experts (transformers 5 writes num_local_experts), top-level rope_theta (and rope_scaling
    for a non-default rope), no rope_parameters."""
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["num_experts"] = cfg.pop("num_local_experts")
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    if rp.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = rp
    json.dump(cfg, open(p, "w"), indent=2, sort_keys=True)
    return cfg


# ------------------------------------------------------------------------------------------------
# independent reference (reads the safetensors files)
# ------------------------------------------------------------------------------------------------
def ref_inv_freq(case, dim, base):
    exps = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    pos_freqs = base ** exps
    rp = case["rope"]
    if rp is None:
        return 1.0 / pos_freqs, 1.0
    factor, omax = float(rp["factor"]), rp["original_max_position_embeddings"]
    att = 0.1 * math.log(factor) + 1.0

    def corr_dim(nrot):
        return (dim * math.log(omax / (nrot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(32)), 0)
    high = min(math.ceil(corr_dim(1)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, att


def ref_forward(W, case, ids, flags):
    c = dict(COMMON)
    c.update(case["cfg"])
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    L, k = c["num_hidden_layers"], c["num_experts_per_tok"]
    eps = c["rms_norm_eps"]
    T = len(ids)
    inv, att = ref_inv_freq(case, hd, c["rope_theta"])
    fr = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = fr.cos() * att, fr.sin() * att

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x):  # [heads, T, hd]
        if flags["interleave"]:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def mlp(h, p):
        return (torch.nn.functional.silu(h @ W[p + "gate_proj.weight"].T) * (h @ W[p + "up_proj.weight"].T)) @ \
            W[p + "down_proj.weight"].T

    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(L):
        p = "model.layers.%d." % l
        h = rms(x, W[p + "input_layernorm.weight"])
        a = p + "self_attn."
        q = (h @ W[a + "q_proj.weight"].T).view(T, nh, hd)
        kk = (h @ W[a + "k_proj.weight"].T).view(T, nkv, hd)
        v = (h @ W[a + "v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
        if flags["qk_norm"]:
            q, kk = rms(q, W[a + "q_norm.weight"]), rms(kk, W[a + "k_norm.weight"])
        q, kk = rope(q.transpose(0, 1)), rope(kk.transpose(0, 1))
        rep = nh // nkv
        kk, v = kk.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        s = (q @ kk.transpose(-1, -2)) * hd ** -0.5
        s = s.masked_fill(causal, float("-inf"))
        o = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(T, nh * hd)
        x = x + o @ W[a + "o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        moe = l not in c["mlp_only_layers"] and (l + 1) % c["decoder_sparse_step"] == 0
        if not moe:
            x = x + mlp(h, m)
            continue
        probs = torch.softmax(h @ W[m + "gate.weight"].T, -1)
        w, idx = torch.topk(probs, k, dim=-1)
        if c["norm_topk_prob"] != flags["flip_norm"]:
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for t in range(T):
            for j in range(k):
                out[t] += w[t, j] * mlp(h[t:t + 1], m + "experts.%d." % int(idx[t, j]))[0]
        x = x + out
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


FLAGS = ["interleave", "qk_norm", "flip_norm"]


# ------------------------------------------------------------------------------------------------
def run_case(name, case, out_root):
    log("\n================ case %s ================" % name)
    torch.manual_seed(case["seed"])
    cfg = make_config(case)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    mg_case = dict(seed=case["seed"], cfg=dict(COMMON, **case["cfg"]))
    mg.init_weights(model, mg_case)
    if case.get("train"):
        mg.train_weights(model, dict(mg_case, train=case["train"]))
    d = os.path.join(out_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.to(torch.bfloat16)
    mem = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
    mg.save_model(model, d, case["shard"])
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    del model
    model, info = load_model(d)
    model.eval()
    log("loading info:", {k: sorted(v) if isinstance(v, (set, list)) else str(v) for k, v in info.items()})
    sd2 = model.state_dict()
    mism = [k for k, v in mem.items() if k not in sd2 or not torch.equal(sd2[k].float(), v)]
    log("reload state-dict mismatches:", mism or "none")
    log("config after reload:", json.dumps(model.config.to_dict(), sort_keys=True, default=str))

    rng = np.random.RandomState(case["seed"])
    prompts = [[int(t) for t in rng.randint(len(mg.SPECIAL_IDS), VOCAB, size=n)] for n in N_PROMPT]
    files, all_logits, lps, greedy, gen_ids, margins = [], [], [], [], [], []
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            inp = torch.tensor([ids])
            lg = model(input_ids=inp, use_cache=False).logits[0].float().numpy()
            fn = "logits_%d.npy" % i
            np.save(os.path.join(d, fn), lg.astype(np.float32))
            files.append(fn)
            all_logits.append(lg)
            lsm = torch.log_softmax(torch.from_numpy(lg), -1)
            lps.append([None] + [float(lsm[j - 1, ids[j]]) for j in range(1, len(ids))])
            seq = list(ids)
            for _ in range(MAX_NEW):
                last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
                top2 = torch.topk(last, 2).values
                margins.append(float(top2[0] - top2[1]))
                seq.append(int(torch.argmax(last)))
            greedy.append(seq[len(ids):])
            go = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, pad_token_id=1)
            gen_ids.append([int(t) for t in go[0, len(ids):]])
    log("greedy == generate:", greedy == gen_ids)

    legacy = None
    if case.get("legacy"):
        written = write_legacy_config(d)
        lm, _ = load_model(d)
        with torch.no_grad():
            lg2 = lm(input_ids=torch.tensor([prompts[-1]]), use_cache=False).logits[0].float().numpy()
        legacy = {"config_keys": sorted(written), "num_experts_read": int(getattr(lm.config, "num_local_experts", 0) or lm.config.num_experts),
                  "max_abs_logit_change": float(np.abs(lg2 - all_logits[-1]).max())}
        log("legacy config check:", legacy)
        assert legacy["max_abs_logit_change"] == 0.0, legacy

    W = {k: v.float() for k, v in mg.load_state(d).items()}
    res = []
    for combo in itertools.product([False, True], repeat=len(FLAGS)):
        flags = dict(zip(FLAGS, combo))
        md = max(float((ref_forward(W, case, ids, flags) - torch.from_numpy(lg)).abs().max())
                 for ids, lg in zip(prompts, all_logits))
        res.append((md, flags))
    res.sort(key=lambda t: t[0])
    for md, fl in res:
        log("  %.3e  %s" % (md, fl))
    allcat = np.concatenate(all_logits, 0)
    tensors = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        for k, v in mg.load_file(f).items():
            tensors[k] = [str(v.dtype).replace("torch.", ""), list(v.shape), os.path.basename(f)]
    golden = {
        "case": name, "prompts": prompts, "prompt_logits_files": files, "greedy_max_new_tokens": MAX_NEW,
        "greedy_output_ids": greedy, "generate_with_cache_output_ids": gen_ids, "prompt_logprobs": lps,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "stats": {"logit_std": float(allcat.std()), "max_abs_logit": float(np.abs(allcat).max()),
                  "min_greedy_top1_top2_margin": float(min(margins))},
        "reference_check": {"best_max_abs_diff": res[0][0], "best_flags": res[0][1],
                            "all": [[md, fl] for md, fl in res]},
        "legacy_config_check": legacy,
        "init": {"seed": case["seed"], "embed": "N(0,1)", "linear": "N(0,1/fan_in)", "lm_head": "N(0,4/fan_in)",
                 "norm_weights": "1+0.1*N(0,1)", "saved_dtype": "bfloat16", "trained": case.get("train")},
        "reload_state_dict_mismatches": mism, "tensors": tensors,
    }
    json.dump(golden, open(os.path.join(d, "golden.json"), "w"), indent=1)
    log("config.json:\n" + open(os.path.join(d, "config.json")).read())
    log("best reference variant:", res[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    log("torch", torch.__version__, "transformers", transformers.__version__)
    log("Qwen3MoeConfig defaults:", json.dumps(transformers.Qwen3MoeConfig().to_dict(), sort_keys=True, default=str))
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
        log("FAILED cases:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
