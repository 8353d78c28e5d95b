#!/usr/bin/env python3
"""Generate small golden reference data for DeepSeek-V2 / DeepSeek-V3 from Hugging Face transformers.

For each case a tiny random model is built with transformers' own classes, its weights are
initialised deterministically (seeded), it is saved with save_pretrained() in bf16 (safetensors),
then RELOADED from disk in fp32 (eager attention) and the golden outputs are computed with the
reloaded fp32 model on the CPU:

  <out>/<case>/config.json, model.safetensors (or shards + model.safetensors.index.json)
  <out>/<case>/golden.json         prompts, greedy continuations, prompt logprobs, versions, stats
  <out>/<case>/logits_<i>.npy      float32 [prompt_len, vocab]: logits of every position of prompt i
  <out>/<case>/debug_<i>.npz       (only if the independent reference below matches transformers)
                                   per-layer hidden states and routed-expert choices for prompt i

The script also contains an independent plain-torch re-implementation of the forward pass that
reads the saved safetensors directly; it is run with several variants of the semantics that are
easy to get wrong, and the max |diff| against transformers' logits of every variant is printed and
recorded in golden.json ("reference_check"), to document which semantics transformers implements.

The semantics it documents are written up in tests/data/golden/README.md.

Usage:  python3 tools/golden/make_golden.py --out DIR [--cases v2_greedy_yarn,...]
Needs torch, transformers (5.x), numpy, safetensors.  Runs on the CPU in fp32, deterministic.
"""
import argparse
import glob
import inspect
import itertools
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file

VOCAB = 512
HIDDEN = 64
N_PROMPT = (5, 11, 23)
MAX_NEW = 12
SPECIAL_IDS = (0, 1)  # bos, eos

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=128,
    moe_intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    first_k_dense_replace=1,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
    attention_bias=False,
    attention_dropout=0.0,
    initializer_range=0.02,
    rope_theta=10000.0,
    use_cache=True,
)

YARN_ORIG = 128
YARN_FACTOR = 40

CASES = {
    "v2_greedy_yarn": dict(
        arch="v2",
        seed=1001,
        cfg=dict(
            q_lora_rank=None,
            n_routed_experts=8,
            n_shared_experts=2,
            num_experts_per_tok=2,
            topk_method="greedy",
            scoring_func="softmax",
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            moe_layer_freq=1,
            max_position_embeddings=YARN_FACTOR * YARN_ORIG,
        ),
        rope=dict(rope_type="yarn", factor=YARN_FACTOR, original_max_position_embeddings=YARN_ORIG,
                  beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
        shard=None,
    ),
    "v2_group_limited": dict(
        arch="v2",
        seed=1002,
        cfg=dict(
            q_lora_rank=48,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=3,
            topk_method="group_limited_greedy",
            scoring_func="softmax",
            n_group=4,
            topk_group=2,
            # transformers 5.17's DeepseekV2 router ignores norm_topk_prob (never normalises, always scales);
            # the original DeepSeek-V2 code normalises and then does NOT scale.  Both agree only for False,
            # which is also what the real DeepSeek-V2 / V2-Lite checkpoints use.
            norm_topk_prob=False,
            routed_scaling_factor=2.5,
            moe_layer_freq=1,
            max_position_embeddings=4096,
        ),
        rope=None,
        shard=None,
    ),
    "v3_noaux_tc": dict(
        arch="v3",
        seed=1003,
        cfg=dict(
            q_lora_rank=48,
            n_routed_experts=16,
            n_shared_experts=1,
            num_experts_per_tok=4,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_interleave=True,
            max_position_embeddings=YARN_FACTOR * YARN_ORIG,
        ),
        # mscale != mscale_all_dim on purpose so that the cos/sin attention_factor is != 1
        rope=dict(rope_type="yarn", factor=YARN_FACTOR, original_max_position_embeddings=YARN_ORIG,
                  beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.8),
        shard=None,
    ),
    "v3_sharded": dict(
        arch="v3",
        seed=1004,
        cfg=dict(
            q_lora_rank=None,
            n_routed_experts=16,
            n_shared_experts=2,
            num_experts_per_tok=4,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_interleave=False,
            max_position_embeddings=4096,
        ),
        rope=None,
        shard="200KB",
    ),
}

# v3_noaux_tc's shapes, trained briefly on a predictable synthetic language (train_weights):
# peaked predictions, as a real checkpoint has, for scoring bf16 against transformers.
CASES["v3_trained"] = dict(
    arch="v3",
    seed=1005,
    cfg=dict(CASES["v3_noaux_tc"]["cfg"], max_position_embeddings=4096),
    rope=None,
    shard=None,
    train=dict(steps=400, batch=16, length=48, lr=3e-3, p=0.9),
)

# v3_trained with sizes the GPU's FP8 expert kernels read (hidden and moe_intermediate multiples
# of 32; 160 and 96 are not multiples of 128: partial FP8 blocks): `afd quantize` of it is issue
# 43's trained FP8 checkpoint.
CASES["v3_trained_fp8"] = dict(
    arch="v3",
    seed=1006,
    cfg=dict(CASES["v3_trained"]["cfg"], hidden_size=160, moe_intermediate_size=96,
             intermediate_size=192),
    rope=None,
    shard=None,
    train=dict(steps=400, batch=16, length=48, lr=3e-3, p=0.9),
)


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------------
# building / saving / reloading with transformers
# ----------------------------------------------------------------------------------------------
def classes(arch):
    if arch == "v2":
        return transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM
    return transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM


def make_config(case):
    cfg_cls, _ = classes(case["arch"])
    kw = dict(COMMON)
    kw.update(case["cfg"])
    sig = inspect.signature(cfg_cls.__init__)
    params = sig.parameters
    has_varkw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    rope = case["rope"]
    rope_param_name = "rope_parameters" if "rope_parameters" in params else "rope_scaling"
    if rope_param_name == "rope_parameters":
        rp = dict(rope) if rope is not None else dict(rope_type="default")
        rp["rope_theta"] = kw["rope_theta"]
        kw["rope_parameters"] = rp
    elif rope is not None:
        rp = dict(rope)
        rp["type"] = rp["rope_type"]
        kw["rope_scaling"] = rp
    not_in_sig = sorted(k for k in kw if k not in params)
    notes = {"config_init_param_for_rope": rope_param_name, "kwargs_not_in_config_signature": not_in_sig,
             "config_init_has_var_kwargs": has_varkw}
    try:
        cfg = cfg_cls(**kw)
    except TypeError as e:
        log("config init with all kwargs failed (%s); retrying with signature kwargs only" % e)
        notes["dropped_kwargs"] = not_in_sig
        cfg = cfg_cls(**{k: v for k, v in kw.items() if k in params})
    return cfg, notes


def init_weights(model, case):
    """Deterministic, non-degenerate init: every sub-layer contributes O(1) to the residual."""
    g = torch.Generator().manual_seed(case["seed"])
    c = dict(COMMON)
    c.update(case["cfg"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            shp = tuple(p.shape)
            if p.ndim == 1:
                if "norm" in name:
                    v = 1.0 + 0.1 * torch.randn(shp, generator=g)
                else:
                    v = 0.02 * torch.randn(shp, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(shp, generator=g)
            elif "lm_head" in name:
                v = torch.randn(shp, generator=g) * (2.0 / math.sqrt(shp[-1]))
            elif p.ndim == 3:  # fused expert tensors (transformers 5.x in-memory layout)
                fan_in = c["moe_intermediate_size"] if "down" in name else c["hidden_size"]
                v = torch.randn(shp, generator=g) / math.sqrt(fan_in)
            else:
                v = torch.randn(shp, generator=g) / math.sqrt(shp[-1])
            p.copy_(v.to(p.dtype))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_((0.1 * torch.randn(tuple(b.shape), generator=g)).to(b.dtype))


def train_weights(model, case):
    """Cases with "train": a few hundred deterministic AdamW steps (fp32, CPU) on a synthetic
    language whose next token is predictable (token t is followed by succ[t] with probability
    `p`, else by a random token), so that the model's predictions are peaked like a trained
    model's, not near-uniform like random weights' (where bf16 rounding flips the top-1 token of
    a few percent of positions in any implementation: docs/perf.md, issue 10's fidelity)."""
    t = case["train"]
    g = torch.Generator().manual_seed(case["seed"] + 7)
    n_special = len(SPECIAL_IDS)
    succ = n_special + torch.randperm(VOCAB - n_special, generator=g)  # successor of each token
    succ = torch.cat([torch.full((n_special,), n_special, dtype=torch.long), succ])
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=0.0)
    model.train()
    for step in range(t["steps"]):
        seq = torch.empty((t["batch"], t["length"]), dtype=torch.long)
        seq[:, 0] = torch.randint(n_special, VOCAB, (t["batch"],), generator=g)
        for j in range(1, t["length"]):
            follow = torch.rand((t["batch"],), generator=g) < t["p"]
            rand = torch.randint(n_special, VOCAB, (t["batch"],), generator=g)
            seq[:, j] = torch.where(follow, succ[seq[:, j - 1]], rand)
        logits = model(input_ids=seq, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == t["steps"] - 1:
            log("train step %d loss %.4f" % (step, float(loss)))
    model.eval()


def save_model(model, d, shard):
    kw = dict(safe_serialization=True)
    if shard:
        kw["max_shard_size"] = shard
    try:
        model.save_pretrained(d, **kw)
    except TypeError as e:
        log("save_pretrained(%s) failed: %s; retrying without safe_serialization" % (kw, e))
        kw.pop("safe_serialization")
        model.save_pretrained(d, **kw)


def load_model(arch, d):
    _, cls = classes(arch)
    base = dict(attn_implementation="eager", output_loading_info=True)
    tries = [dict(dtype=torch.float32, experts_implementation="eager"), dict(dtype=torch.float32),
             dict(torch_dtype=torch.float32)]
    last = None
    for t in tries:
        try:
            model, info = cls.from_pretrained(d, **base, **t)
            return model, info, t
        except (TypeError, ValueError) as e:
            last = e
            log("from_pretrained with %s failed: %s" % (list(t), e))
    raise last


# ----------------------------------------------------------------------------------------------
# independent reference implementation (reads the safetensors files directly)
# ----------------------------------------------------------------------------------------------
def get_mscale(scale, m=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * m * math.log(scale) + 1.0


def ref_rope(case, dim, base):
    """returns inv_freq [dim/2] (fp32), attention_factor (cos/sin multiplier), softmax mscale^2"""
    rp = case["rope"]
    exps = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    pos_freqs = base ** exps
    if rp is None:
        return 1.0 / pos_freqs, 1.0, 1.0
    factor = float(rp["factor"])
    mscale, mad = rp.get("mscale"), rp.get("mscale_all_dim")
    att = get_mscale(factor, mscale) / get_mscale(factor, mad) if (mscale and mad) else get_mscale(factor)
    omax = rp["original_max_position_embeddings"]

    def corr_dim(nrot):
        return (dim * math.log(omax / (nrot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(rp["beta_fast"])), 0)
    high = min(math.ceil(corr_dim(rp["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv_extra = 1.0 / pos_freqs
    inv_inter = 1.0 / (factor * pos_freqs)
    inv = inv_inter * (1 - extra) + inv_extra * extra
    sm = get_mscale(factor, mad) ** 2 if mad else 1.0
    return inv, float(att), float(sm)


def load_state(d):
    sd = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        sd.update(load_file(f))
    return sd


def ref_forward(sd, case, ids, flags, want_debug=False):
    c = dict(COMMON)
    c.update(case["cfg"])
    W = sd  # name -> fp32 tensor, as read from the safetensors files
    H, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    L, E, I = c["num_hidden_layers"], c["n_routed_experts"], c["moe_intermediate_size"]
    eps = c["rms_norm_eps"]
    T = len(ids)
    inv, att, sm = ref_rope(case, dr, c["rope_theta"])
    pos = torch.arange(T, dtype=torch.float32)
    fr = torch.outer(pos, inv)
    cos, sin = fr.cos() * att, fr.sin() * att
    scale = (dn + dr) ** -0.5 * (sm if flags["softmax_mscale"] else 1.0)

    def rms(x, w, e=eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e))

    def rope(x):
        if flags["interleave"]:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            x1, x2 = x[..., : dr // 2], x[..., dr // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def mlp(h, p):
        return (torch.nn.functional.silu(h @ W[p + "gate_proj.weight"].T) * (h @ W[p + "up_proj.weight"].T)) @ \
            W[p + "down_proj.weight"].T

    def expert_w(p, e):
        if p + "experts.%d.gate_proj.weight" % e in W:
            q = p + "experts.%d." % e
            return W[q + "gate_proj.weight"], W[q + "up_proj.weight"], W[q + "down_proj.weight"]
        gu, dw = W[p + "experts.gate_up_proj"][e], W[p + "experts.down_proj"][e]
        if gu.shape[0] != 2 * I:
            gu = gu.T
        if dw.shape[0] != c["hidden_size"]:
            dw = dw.T
        return gu[:I], gu[I:], dw

    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    dbg = {"hidden": [x.clone()]}
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(L):
        p = "model.layers.%d." % l
        h = rms(x, W[p + "input_layernorm.weight"])
        a = p + "self_attn."
        if c["q_lora_rank"] is None:
            q = h @ W[a + "q_proj.weight"].T
        else:
            q = rms(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], 1e-6) @ W[a + "q_b_proj.weight"].T
        q = q.view(T, H, dn + dr).transpose(0, 1)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        ckv = h @ W[a + "kv_a_proj_with_mqa.weight"].T
        cc, k_pe = ckv[:, : c["kv_lora_rank"]], ckv[:, c["kv_lora_rank"]:]
        kv = (rms(cc, W[a + "kv_a_layernorm.weight"], 1e-6) @ W[a + "kv_b_proj.weight"].T).view(T, H, dn + dv)
        kv = kv.transpose(0, 1)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        q_pe = rope(q_pe)
        k_pe = rope(k_pe)[None]
        s = (q_nope @ k_nope.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * scale
        s = s.masked_fill(causal, float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(T, H * dv)
        x = x + o @ W[a + "o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        if l < c["first_k_dense_replace"]:
            x = x + mlp(h, m)
        else:
            logits = h @ W[m + "gate.weight"].T
            scores = torch.softmax(logits, -1) if c["scoring_func"] == "softmax" else torch.sigmoid(logits)
            k, G, TG = c["num_experts_per_tok"], c["n_group"], c["topk_group"]
            meth = c["topk_method"]
            if meth == "greedy":
                idx = torch.topk(scores, k, dim=-1).indices
            else:
                sc = scores
                if meth == "noaux_tc":
                    sc = scores + W[m + "gate.e_score_correction_bias"][None]
                grp = sc.view(T, G, E // G)
                gs = grp.max(-1).values if flags["group_max"] else grp.topk(2, dim=-1).values.sum(-1)
                gidx = torch.topk(gs, TG, dim=-1).indices
                gmask = torch.zeros(T, G, dtype=torch.bool)
                gmask.scatter_(1, gidx, True)
                emask = gmask[:, :, None].expand(T, G, E // G).reshape(T, E)
                fill = float("-inf") if flags["mask_neg_inf"] else 0.0
                idx = torch.topk(sc.masked_fill(~emask, fill), k, dim=-1).indices
            idx = torch.sort(idx, dim=-1).values
            w = scores.gather(1, idx)
            # NB transformers 5.17's V2 router never normalises (ignores norm_topk_prob); all V2 cases use False
            if c["norm_topk_prob"]:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
                if flags["rsf_always"]:
                    w = w * c["routed_scaling_factor"]
            else:
                w = w * c["routed_scaling_factor"]
            out = torch.zeros_like(h)
            for t in range(T):
                for j in range(k):
                    g_, u_, d_ = expert_w(m, int(idx[t, j]))
                    ht = h[t:t + 1]
                    out[t] += (w[t, j] * ((torch.nn.functional.silu(ht @ g_.T) * (ht @ u_.T)) @ d_.T))[0]
            x = x + out + mlp(h, m + "shared_experts.")
            dbg["layer%d_topk_idx" % l] = idx.clone()
            dbg["layer%d_topk_w" % l] = w.clone()
        dbg["hidden"].append(x.clone())
    x = rms(x, W["model.norm.weight"])
    dbg["hidden"].append(x.clone())
    lg = x @ W["lm_head.weight"].T
    return (lg, dbg) if want_debug else lg


FLAG_NAMES = ["interleave", "group_max", "rsf_always", "softmax_mscale", "mask_neg_inf"]


def reference_check(d, case, prompts, hf_logits):
    sd = {k: v.to(torch.float32) for k, v in load_state(d).items()}
    res = []
    for combo in itertools.product([False, True], repeat=len(FLAG_NAMES)):
        flags = dict(zip(FLAG_NAMES, combo))
        md = 0.0
        for ids, lg in zip(prompts, hf_logits):
            r = ref_forward(sd, case, ids, flags)
            md = max(md, float((r - torch.from_numpy(lg)).abs().max()))
        res.append((md, flags))
    res.sort(key=lambda t: t[0])
    return sd, res


# ----------------------------------------------------------------------------------------------
def run_case(name, case, out_root):
    log("\n================ case %s ================" % name)
    torch.manual_seed(case["seed"])
    cfg, notes = make_config(case)
    _, model_cls = classes(case["arch"])
    model = model_cls(cfg)
    model.eval()
    init_weights(model, case)
    if case.get("train"):
        train_weights(model, case)
    d = os.path.join(out_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.to(torch.bfloat16)
    ref_sd_mem = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
    save_model(model, d, case["shard"])
    gc = os.path.join(d, "generation_config.json")
    gen_cfg_text = open(gc).read() if os.path.exists(gc) else None
    if os.path.exists(gc):
        os.remove(gc)
    del model

    model, info, load_kw = load_model(case["arch"], d)
    model.eval()
    log("loading info:", {k: (sorted(v) if isinstance(v, (set, list)) else str(v)) for k, v in info.items()})
    log("load kwargs used:", list(load_kw))
    # reloaded fp32 weights must equal the bf16-rounded in-memory weights
    sd2 = model.state_dict()
    mism = []
    for k, v in ref_sd_mem.items():
        if k not in sd2:
            mism.append(k + " (missing after reload)")
        elif not torch.equal(sd2[k].to(torch.float32), v):
            mism.append(k + " (values differ)")
    for k in sd2:
        if k not in ref_sd_mem:
            mism.append(k + " (new after reload)")
    log("reload state-dict mismatches:", mism if mism else "none")
    log("param dtypes after reload:", sorted({str(v.dtype) for v in sd2.values()}))
    log("config after reload:", json.dumps(model.config.to_dict(), sort_keys=True, default=str))
    log("attn impl:", getattr(model.config, "_attn_implementation", None),
        "experts impl:", getattr(model.config, "_experts_implementation", None))
    rot = getattr(model.model, "rotary_emb", None)
    try:
        log("rotary: type=%s inv_freq=%s attention_scaling=%s" % (
            getattr(rot, "rope_type", None), rot.inv_freq.tolist(), getattr(rot, "attention_scaling", None)))
        att0 = model.model.layers[0].self_attn
        log("attention module scaling attr:", getattr(att0, "scaling", None), " qk_head_dim^-0.5 =",
            (COMMON["qk_nope_head_dim"] + COMMON["qk_rope_head_dim"]) ** -0.5)
        my_inv, my_att, my_sm = ref_rope(case, COMMON["qk_rope_head_dim"], COMMON["rope_theta"])
        log("my rope: inv_freq=%s attention_factor=%r softmax_mscale2=%r" % (my_inv.tolist(), my_att, my_sm))
        inv_diff = float((rot.inv_freq.float().cpu() - my_inv).abs().max())
        log("max |inv_freq(hf) - inv_freq(mine)| =", inv_diff)
    except Exception as e:  # noqa
        log("rope introspection failed:", repr(e))
    rng = np.random.RandomState(case["seed"])
    prompts = [[int(t) for t in rng.randint(len(SPECIAL_IDS), VOCAB, size=n)] for n in N_PROMPT]
    logits_files, all_logits, prompt_lps, greedy, gen_ids, margins = [], [], [], [], [], []
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            inp = torch.tensor([ids])
            lg = model(input_ids=inp, use_cache=False).logits[0].to(torch.float32).numpy()
            fn = "logits_%d.npy" % i
            np.save(os.path.join(d, fn), lg.astype(np.float32))
            logits_files.append(fn)
            all_logits.append(lg)
            lsm = torch.log_softmax(torch.from_numpy(lg), dim=-1)
            prompt_lps.append([None] + [float(lsm[j - 1, ids[j]]) for j in range(1, len(ids))])
            # manual greedy, full sequence each step, no cache
            seq = list(ids)
            for _ in range(MAX_NEW):
                last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].to(torch.float32)
                top2 = torch.topk(last, 2).values
                margins.append(float(top2[0] - top2[1]))
                seq.append(int(torch.argmax(last)))
            greedy.append(seq[len(ids):])
            # generate() with the KV cache
            try:
                go = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                    max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, pad_token_id=COMMON["eos_token_id"])
                gen_ids.append([int(t) for t in go[0, len(ids):]])
            except Exception as e:  # noqa
                gen_ids.append("generate failed: %r" % (e,))
        # does transformers honour norm_topk_prob?  reload with it flipped and compare logits
        flip = None
        try:
            _, fcls = classes(case["arch"])
            fm = fcls.from_pretrained(d, attn_implementation="eager", norm_topk_prob=not case["cfg"]["norm_topk_prob"],
                                      **{k: v for k, v in load_kw.items()})
            fm.eval()
            flg = fm(input_ids=torch.tensor([prompts[-1]]), use_cache=False).logits[0].to(torch.float32).numpy()
            flip = {"flipped_norm_topk_prob_to": bool(fm.config.norm_topk_prob),
                    "max_abs_logit_change": float(np.abs(flg - all_logits[-1]).max())}
            del fm
        except Exception as e:  # noqa
            flip = {"error": repr(e)}
        log("norm_topk_prob flip probe:", flip)
        # does a sequence longer than original_max_position_embeddings change rope state?
        long_note = None
        if case["rope"] is not None and rot is not None:
            before = rot.inv_freq.clone()
            n = YARN_ORIG + 22
            lids = torch.tensor([[int(t) for t in rng.randint(2, VOCAB, size=n)]])
            full = model(input_ids=lids, use_cache=False).logits[0]
            pre = model(input_ids=lids[:, :40], use_cache=False).logits[0]
            long_note = {"len": n, "inv_freq_changed": bool(not torch.equal(before, rot.inv_freq)),
                         "prefix_logits_maxdiff_vs_short_forward": float((full[:40] - pre).abs().max())}
            log("long-sequence check:", long_note)

    allcat = np.concatenate(all_logits, 0)
    stats = {"logit_std": float(allcat.std()), "max_abs_logit": float(np.abs(allcat).max()),
             "min_greedy_top1_top2_margin": float(min(margins))}
    log("greedy (manual, no cache):", greedy)
    log("generate() (cache)       :", gen_ids)
    log("greedy == generate:", greedy == gen_ids)
    log("stats:", stats)

    # independent reference
    try:
        sd, res = reference_check(d, case, prompts, all_logits)
    except Exception as e:  # noqa
        import traceback
        traceback.print_exc()
        sd, res = None, [(float("inf"), {"error": repr(e)})]
    log("reference-implementation variants, best first (max |ref - hf| over all prompt logits):")
    for md, fl in res:
        log("  %.3e  %s" % (md, fl))
    best_md, best_flags = res[0]
    if best_md < 1e-3:
        for i, ids in enumerate(prompts):
            lg, dbg = ref_forward(sd, case, ids, best_flags, want_debug=True)
            arrs = {"hidden_states": torch.stack(dbg["hidden"]).numpy().astype(np.float32)}
            for k, v in dbg.items():
                if k != "hidden":
                    arrs[k] = v.numpy().astype(np.int32 if "idx" in k else np.float32)
            np.savez(os.path.join(d, "debug_%d.npz" % i), **arrs)

    tensors = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        for k, v in load_file(f).items():
            tensors[k] = [str(v.dtype).replace("torch.", ""), list(v.shape), os.path.basename(f)]

    golden = {
        "case": name,
        "prompts": prompts,
        "prompt_logits_files": logits_files,
        "greedy_max_new_tokens": MAX_NEW,
        "greedy_output_ids": greedy,
        "generate_with_cache_output_ids": gen_ids,
        "prompt_logprobs": prompt_lps,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "stats": stats,
        "reference_check": {"best_max_abs_diff": best_md, "best_flags": best_flags,
                            "all": [[md, fl] for md, fl in res]},
        "long_sequence_check": long_note,
        "norm_topk_prob_flip_probe": flip,
        "init": {"seed": case["seed"], "embed": "N(0,1)", "linear": "N(0,1/fan_in)",
                 "lm_head": "N(0,4/fan_in)", "norm_weights": "1+0.1*N(0,1)",
                 "e_score_correction_bias": "0.1*N(0,1)", "saved_dtype": "bfloat16"},
        "config_notes": notes,
        "load_kwargs": {k: str(v) for k, v in load_kw.items()},
        "reload_state_dict_mismatches": mism,
        "dropped_generation_config_json": gen_cfg_text,
        "tensors": tensors,
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    log("config.json:\n" + open(os.path.join(d, "config.json")).read())
    log("files:", sorted((fn, os.path.getsize(os.path.join(d, fn))) for fn in os.listdir(d)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    log("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
        "numpy", np.__version__)
    for cls_name in ("DeepseekV2Config", "DeepseekV3Config"):
        cls = getattr(transformers, cls_name)
        log(cls_name, "signature:", str(inspect.signature(cls.__init__)))
        try:
            log(cls_name, "defaults:", json.dumps(cls().to_dict(), sort_keys=True, default=str))
        except Exception as e:  # noqa
            log(cls_name, "default construction failed:", e)
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
