"""Reference for chat-template rendering: Python's Jinja2 set up as transformers'
apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
tojson = json.dumps(ensure_ascii=False), raise_exception, strftime_now).

Usage: python3 render_template.py [TOKENIZER_DIR] < lines
Each input line is a JSON object of template variables (messages, tools, add_generation_prompt,
...); a "template" key gives the template source, else TOKENIZER_DIR/tokenizer_config.json's
chat_template (or TOKENIZER_DIR/chat_template.jinja) is used with its special tokens map and tools/documents defaulting to None, as
transformers' apply_chat_template renders. Prints {"prompt": S} or {"error": S} per line.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_content(t):
    return t.get("content") if isinstance(t, dict) else t


def main():
    env = make_env()
    default_template, special = None, {}
    if len(sys.argv) > 1:
        with open(os.path.join(sys.argv[1], "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        default_template = cfg.get("chat_template")
        jinja_path = os.path.join(sys.argv[1], "chat_template.jinja")
        if os.path.exists(jinja_path):  # transformers prefers the separate file
            with open(jinja_path, encoding="utf-8") as f:
                default_template = f.read()
        # transformers' special_tokens_map: the tokens that are set.
        for key in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                    "cls_token", "mask_token"]:
            if token_content(cfg.get(key)):
                special[key] = token_content(cfg.get(key))
        if isinstance(cfg.get("additional_special_tokens"), list):
            special["additional_special_tokens"] = [
                token_content(t) for t in cfg["additional_special_tokens"]]
    out = []
    for line in sys.stdin.read().split("\n"):
        if not line:
            continue
        try:
            ctx = json.loads(line)
            source = ctx.pop("template", default_template)
            ctx.setdefault("add_generation_prompt", False)
            if default_template is not None and "template" not in json.loads(line):
                # apply_chat_template passes tools/documents (None when not given).
                ctx.setdefault("tools", None)
                ctx.setdefault("documents", None)
            ctx = {**special, **ctx}
            out.append({"prompt": env.from_string(source).render(**ctx)})
        except Exception as e:  # noqa: BLE001 - every failure is reported on its line
            out.append({"error": f"{type(e).__name__}: {e}"})
    sys.stdout.write("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in out))


if __name__ == "__main__":
    main()
