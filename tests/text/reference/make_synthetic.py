"""Generates the synthetic tokenizer.json files in tests/text/data/synthetic/, which cover the
components the DeepSeek-V3 and Qwen3 tokenizers do not use (Metaspace, ByteFallback, NFKC, NFD,
Lowercase, Replace, Prepend, Strip, Digits, Whitespace, TemplateProcessing, merges as pairs,
ignore_merges, unk/fuse_unk, continuing_subword_prefix, every Split behavior and invert, added
tokens with lstrip/rstrip/single_word/normalized). Vocabularies come from a tiny greedy BPE
training on a fixed text, so the files are small and deterministic.

Usage: python3 tests/text/reference/make_synthetic.py   (from the repository root)
"""
import collections
import json
import os
import re

OUT = "tests/text/data/synthetic"
TRAIN = ("The quick brown fox jumps over the lazy dog. Hello hello HELLO world, worlds! "
         "tokenizers split text into pieces; pieces become ids 12345 67890. "
         "Ça va très bien, merci. 你好世界。 naïve café résumé. the then there these those "
         "   indented    text\twith\ttabs\nand newlines\n\n") * 3


def byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(words, base, num_merges, sep=""):
    """Greedy BPE over `words` (lists of symbols); returns (vocab list, merges list)."""
    vocab = list(dict.fromkeys(base))
    merges = []
    words = [list(w) for w in words]
    for _ in range(num_merges):
        counts = collections.Counter()
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] += 1
        if not counts:
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + (b[len(sep):] if sep and b.startswith(sep) else b)
        merges.append((a, b))
        if merged not in vocab:
            vocab.append(merged)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [merged]
                i += 1
    return vocab, merges


def byte_level_model(num_merges=150, ignore_merges=False, pairs=False, text=None):
    bc = byte_chars()
    pieces = text.split(" ") if text else re.findall(r" ?\w+| ?[^\w\s]+|\s+", TRAIN)
    words = ["".join(bc[b] for b in w.encode()) for w in pieces]
    vocab, merges = train(words, [bc[b] for b in range(256)], num_merges)
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": ignore_merges, "vocab": {t: i for i, t in enumerate(vocab)},
            "merges": [list(m) for m in merges] if pairs else [f"{a} {b}" for a, b in merges]}


def char_model(text, byte_fallback, unk, num_merges=120, prefix=None, fuse_unk=False):
    words = text.replace(" ", "\u2581").split("\u2581")
    words = ["\u2581" + w for w in words if w]
    chars = sorted(set("".join(words)))[:80]  # leave some characters out: unk / byte fallback
    base = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars
    keep = set(chars)
    words = [[c for c in w if c in keep] for w in words]
    if prefix:
        words = [[w[0]] + [prefix + c for c in w[1:]] for w in words if w]
        base += [prefix + c for c in chars]
    vocab, merges = train(words, base, num_merges, sep=prefix or "")
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": prefix,
            "end_of_word_suffix": None, "fuse_unk": fuse_unk, "byte_fallback": byte_fallback,
            "vocab": {t: i for i, t in enumerate(vocab)}, "merges": [[a, b] for a, b in merges]}


def added(id_, content, special=True, **flags):
    t = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special}
    t.update(flags)
    return t


MISTRAL_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""


def write(name, tok, config=None, chat_template=None):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None}
    base.update(tok)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(base, f, ensure_ascii=False, indent=1)
    if config is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
    if chat_template is not None:
        with open(os.path.join(d, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(chat_template)


def byte_level_split(behavior, invert, pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def main():
    byte_decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    # Llama-2 / Mistral style: Prepend + Replace normalizer, byte fallback, decoder chain, template.
    m = char_model(TRAIN, byte_fallback=True, unk="<unk>")
    write("llama_byte_fallback", {
        "model": m,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"),
                         added(len(m["vocab"]), "[INST]", lstrip=True, rstrip=True),
                         added(len(m["vocab"]) + 1, "word", special=False, single_word=True)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    }, config={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
               "chat_template": "unused: chat_template.jinja replaces it"},
       chat_template=MISTRAL_TEMPLATE)
    # Metaspace pre-tokenizer and decoder, NFKC + Lowercase, Digits, unk with fuse_unk.
    m = char_model(TRAIN.lower(), byte_fallback=False, unk="<unk>", fuse_unk=True)
    write("metaspace_nfkc", {
        "model": m,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"),
                         added(len(m["vocab"]), "hello", special=False, normalized=True)],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                              "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
    })
    # Whitespace pre-tokenizer, NFD + Strip, continuing_subword_prefix, Digits contiguous.
    m = char_model(TRAIN, byte_fallback=False, unk="<unk>", prefix="##")
    write("whitespace_nfd", {
        "model": m,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFD"}, {"type": "Strip", "strip_left": True, "strip_right": True}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Whitespace"}, {"type": "Digits", "individual_digits": False}]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"Regex": "^##"}, "content": ""}, {"type": "Fuse"}]},
    })
    # GPT-2 style ByteLevel with its own regex and prefix space; ignore_merges; merges as pairs.
    m = byte_level_model(ignore_merges=True, pairs=True)
    write("gpt2_ignore_merges", {
        "model": m,
        "added_tokens": [added(len(m["vocab"]), "<|endoftext|>")],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": byte_decoder,
    })
    # Every Split behavior, with and without invert, regex and string patterns.
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            for kind, pattern in [("regex", {"Regex": r"\s+|\p{P}"}), ("string", {"String": " "})]:
                name = f"split_{behavior.lower()}_{kind}{'_invert' if invert else ''}"
                write(name, {"model": byte_level_model(num_merges=60),
                             "pre_tokenizer": byte_level_split(behavior, invert, pattern),
                             "decoder": byte_decoder})
    # Oniguruma's \w, \d and \s classes (inside and outside brackets) in a checkpoint's regex.
    # Its merges join letters with marks, connectors and numbers, so a different \w splits differently.
    marks = "a\u0301b x\u203fy \u216b\u216b \u00bd1 \u0e01\u0e34 \u0915\u093f A\u0308\u0323 z\u0300 e\u0301 "
    write("split_word_classes", {"model": byte_level_model(num_merges=80, text=marks * 5 + TRAIN),
                                 "pre_tokenizer": byte_level_split(
                                     "Isolated", False, {"Regex": r"\w+|\d|[^\w\s]+|\s+(?!\S)|\W"}),
                                 "decoder": byte_decoder})


if __name__ == "__main__":
    main()
