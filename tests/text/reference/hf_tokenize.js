// Reference for `afd tokenize` (text and ids lines): HF's Rust tokenizers through the
// @anush008/tokenizers Node binding. Usage:
//   NODE_PATH=.cache/npm/node_modules node hf_tokenize.js DIR [--add-special-tokens] < lines
// Reads DIR/tokenizer.json; {"text": S} -> {"ids": [...]}, {"ids": [...]} -> {"text": S}
// (special tokens kept). When DIR/tokenizer_config.json sets add_bos_token / add_eos_token, the
// ids get bos/eos around them, as transformers' LlamaTokenizerFast post-processor does.
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");
const { Tokenizer } = require("@anush008/tokenizers");

const dir = process.argv[2];
const addSpecial = process.argv.includes("--add-special-tokens");
const tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
let bos = null, eos = null;
const cfgPath = path.join(dir, "tokenizer_config.json");
if (fs.existsSync(cfgPath)) {
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  const content = (t) => (t && typeof t === "object" ? t.content : t);
  if (cfg.add_bos_token && content(cfg.bos_token)) bos = tok.tokenToId(content(cfg.bos_token));
  if (cfg.add_eos_token && content(cfg.eos_token)) eos = tok.tokenToId(content(cfg.eos_token));
}

async function answer(line) {
  const input = JSON.parse(line);
  if ("text" in input) {
    const special = "add_special_tokens" in input ? input.add_special_tokens : addSpecial;
    const enc = await tok.encode(input.text, null, { addSpecialTokens: special });
    let ids = enc.getIds();
    if (special && (bos !== null || eos !== null)) {
      // transformers replaces tokenizer.json's post-processor by "[bos] $A [eos]".
      const plain = (await tok.encode(input.text, null, { addSpecialTokens: false })).getIds();
      ids = (bos !== null ? [bos] : []).concat(plain, eos !== null ? [eos] : []);
    }
    return { ids };
  }
  if ("ids" in input) return { text: await tok.decode(input.ids, false) };
  throw new Error("unsupported line");
}

async function main() {
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  const out = [];
  for await (const line of rl) {
    try {
      out.push(JSON.stringify(await answer(line)));
    } catch (e) {
      out.push(JSON.stringify({ error: String(e) }));
    }
  }
  process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
}
main();
