#!/usr/bin/env python3
"""Trains the demo model of `make demo` (issue 39 item 6): a small DeepSeek-V2-style MoE (MLA
attention, 1 dense + 3 MoE layers of 8 routed experts and 1 shared, top-2) on text that Debian
ships -- licenses, copyright files, READMEs, changelogs and manual pages of the machine it runs
on -- with its own byte-level BPE tokenizer (HF tokenizers) and a chat template, so that the
demo answers in words. Run on the GPU machine (tools/device/demo_model.sh); about five minutes.

Writes to --out: config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json
(bos/eos, the chat template), reference.json (prompts and transformers' fp32 greedy continuations
on the CPU, which `afd run` must reproduce: tests/e2e/demo_model_test.cpp), train_log.txt.

Usage: python3 tools/demo_model/train_demo_model.py --out DIR [--seconds 240]
Needs torch, transformers (5.x), tokenizers, safetensors.
"""
import argparse
import glob
import gzip
import hashlib
import json
import math
import os
import random
import re
import sys
import time

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS, USER, ASSISTANT = "<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>"
VOCAB = 4096
SEQ = 256
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
# The model: DeepSeek-V2-Lite's structure at a small size (about 5.5 M parameters).
CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=768,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    first_k_dense_replace=1,
    q_lora_rank=None,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    topk_method="greedy",
    scoring_func="softmax",
    n_group=1,
    topk_group=1,
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
    moe_layer_freq=1,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    attention_dropout=0.0,
    initializer_range=0.02,
    use_cache=True,
)
SOURCES = [
    "/usr/share/common-licenses/*",
    "/usr/share/doc/*/copyright",
    "/usr/share/doc/*/README*",
    "/usr/share/doc/*/NEWS*",
    "/usr/share/doc/*/changelog*",
    "/usr/share/man/man1/*.gz",
    "/usr/share/man/man5/*.gz",
    "/usr/share/man/man8/*.gz",
]


def log(*a):
    print(*a, flush=True)
    with open(os.path.join(ARGS.out, "train_log.txt"), "a") as f:
        print(*a, file=f)


def strip_roff(text):
    """Manual pages: the words of a roff source (requests and font escapes dropped)."""
    out = []
    for line in text.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith("."):
            parts = line.split(None, 1)
            if len(parts) < 2 or parts[0] not in (".SH", ".SS", ".B", ".I", ".BR", ".IR", ".IP",
                                                   ".TP", ".BI", ".RB", ".RI"):
                continue
            line = parts[1].replace('"', "")
        line = re.sub(r"\\f[BIRP]|\\f\(..|\\\(..|\\[-&e]|\\s[-+]?\d", "", line).replace("\\", "")
        out.append(line)
    return "\n".join(out)


def corpus(limit_chars):
    """Unique paragraphs of the machine's documentation, in a fixed order."""
    files = []
    for pattern in SOURCES:
        files += sorted(glob.glob(pattern))
    seen, paragraphs, used, total = set(), [], 0, 0
    for f in files:
        try:
            raw = gzip.open(f).read() if f.endswith(".gz") else open(f, "rb").read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if "/man/" in f:
            text = strip_roff(text)
        if not text or sum(c.isascii() for c in text) < 0.97 * len(text):
            continue
        used += 1
        for p in re.split(r"\n\s*\n", text):
            p = re.sub(r"[ \t]+", " ", p).strip()
            if len(p) < 40:
                continue
            h = hashlib.sha1(p.encode()).digest()
            if h in seen:
                continue
            seen.add(h)
            paragraphs.append(p)
            total += len(p)
        if total >= limit_chars:
            break
    return paragraphs, used, total


def train_tokenizer(paragraphs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2,
                                  special_tokens=[BOS, EOS, USER, ASSISTANT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(paragraphs, trainer)
    return tok


def samples(tok, paragraphs, rng):
    """Token sequences: a stream of the paragraphs (each BOS ... EOS), and chat turns (BOS, the
    user's message: a paragraph's first words, then the assistant's answer: the rest of it, EOS)
    for half the paragraphs of 12 words or more."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    user, assistant = tok.token_to_id(USER), tok.token_to_id(ASSISTANT)
    ids = [e.ids for e in tok.encode_batch(paragraphs)]
    stream, chats = [], []
    for p, t in zip(paragraphs, ids):
        stream += [bos] + t + [eos]
        words = p.split(" ")
        if len(words) >= 12 and rng.random() < 0.5:
            k = rng.randint(3, 8)
            q = tok.encode(" ".join(words[:k])).ids
            a = tok.encode(" " + " ".join(words[k:])).ids
            chats.append([bos, user] + q + [assistant] + a[: SEQ - len(q) - 4] + [eos])
    return torch.tensor(stream, dtype=torch.long), chats


def batch(stream, chats, rng, size, device):
    rows = []
    for _ in range(size):
        if chats and rng.random() < 1 / 3:
            c = chats[rng.randrange(len(chats))]
            rows.append(c + [0] * (SEQ + 1 - len(c)))  # padded; the padding is not learnt
        else:
            s = rng.randrange(len(stream) - SEQ - 1)
            rows.append(stream[s:s + SEQ + 1].tolist())
    return torch.tensor(rows, device=device)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--corpus-chars", type=int, default=24_000_000)
    ARGS = ap.parse_args()
    os.makedirs(ARGS.out, exist_ok=True)
    open(os.path.join(ARGS.out, "train_log.txt"), "w").close()
    rng = random.Random(2026)
    torch.manual_seed(2026)
    paragraphs, files, chars = corpus(ARGS.corpus_chars)
    log(f"corpus: {len(paragraphs)} unique paragraphs, {chars / 1e6:.1f} M characters, from "
        f"{files} files; torch {torch.__version__}, transformers {transformers.__version__}")
    tok = train_tokenizer(paragraphs)
    tok.save(os.path.join(ARGS.out, "tokenizer.json"))
    json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False,
               "model_max_length": CONFIG["max_position_embeddings"],
               "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE},
              open(os.path.join(ARGS.out, "tokenizer_config.json"), "w"), indent=2)
    stream, chats = samples(tok, paragraphs, rng)
    log(f"tokens: {len(stream) / 1e6:.2f} M in the text stream, {len(chats)} chat samples")

    cfg = transformers.DeepseekV2Config(**CONFIG, bos_token_id=tok.token_to_id(BOS),
                                        eos_token_id=tok.token_to_id(EOS), pad_token_id=None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.DeepseekV2ForCausalLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters on {device}")
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    start, step = time.time(), 0
    pad = 0
    while True:
        elapsed = time.time() - start
        if elapsed >= ARGS.seconds:
            break
        frac = elapsed / ARGS.seconds
        lr = 2e-3 * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(stream, chats, rng, 64, device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        target = x[:, 1:].clone()
        # A chat row's padding (token 0 after its EOS) is not learnt.
        after_eos = torch.cumsum((x[:, :-1] == tok.token_to_id(EOS)).long(), 1) > 0
        target[after_eos & (target == pad)] = -100
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB),
                                                 target.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 200 == 0:
            log(f"step {step} {elapsed:.0f} s loss {float(loss):.3f} lr {lr:.2e}")
        step += 1
    log(f"trained {step} steps ({step * 64 * SEQ / 1e6:.0f} M tokens) in {time.time() - start:.0f} s, "
        f"last loss {float(loss):.3f}")

    model = model.to(torch.bfloat16).cpu()
    model.save_pretrained(ARGS.out, safe_serialization=True)
    # The reference: transformers' fp32 greedy continuation on the CPU of the saved bf16 weights.
    ref = transformers.DeepseekV2ForCausalLM.from_pretrained(ARGS.out, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    cases = []
    chat_prompts = ["What is free software?", "Who may copy this program?", "How do I report a bug?"]
    texts = ["The GNU General Public License", "This program is distributed in the hope",
             "Permission is hereby granted"]
    prompts = [[tok.token_to_id(BOS)] + tok.encode(t).ids for t in texts]
    for q in chat_prompts:
        prompts.append([tok.token_to_id(BOS), tok.token_to_id(USER)] + tok.encode(q).ids +
                       [tok.token_to_id(ASSISTANT)])
    with torch.no_grad():
        for p in prompts:
            seq, new = list(p), []
            for _ in range(24):  # greedy, no cache, never stopping early
                nxt = int(ref(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
                seq.append(nxt)
                new.append(nxt)
            cases.append({"prompt_ids": p, "greedy_ids": new})
            log(f"sample: {tok.decode(p, skip_special_tokens=False)!r} -> {tok.decode(new)!r}")
    json.dump({"max_new_tokens": 24, "cases": cases,
               "made_with": {"torch": torch.__version__, "transformers": transformers.__version__}},
              open(os.path.join(ARGS.out, "reference.json"), "w"), indent=1)
    hf = transformers.AutoTokenizer.from_pretrained(ARGS.out)
    chat = hf.apply_chat_template([{"role": "user", "content": chat_prompts[0]}],
                                  add_generation_prompt=True, tokenize=False)
    log(f"transformers' tokenizer: chat prompt {chat!r}; encode('{texts[0]}') = "
        f"{hf(texts[0])['input_ids']} (ours above: {prompts[0]})")
    for f in sorted(os.listdir(ARGS.out)):
        log(f"{f}: {os.path.getsize(os.path.join(ARGS.out, f)) / 1e6:.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
