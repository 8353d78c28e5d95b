// Encode throughput of HF's Rust tokenizer (@anush008/tokenizers) on JSON lines {"text": S}:
// prints "MB/s" of UTF-8 input, timing only the encode calls (one at a time, in order).
// Usage: NODE_PATH=.cache/npm/node_modules node bench/hf_encode_bench.js DIR < lines
"use strict";
const path = require("path");
const { Tokenizer } = require("@anush008/tokenizers");

async function main() {
  const tok = Tokenizer.fromFile(path.join(process.argv[2], "tokenizer.json"));
  const texts = require("fs").readFileSync(0, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l).text);
  let bytes = 0, ids = 0;
  for (const t of texts.slice(0, 50)) await tok.encode(t, null, { addSpecialTokens: false });  // warm-up
  const start = process.hrtime.bigint();
  for (const t of texts) {
    const enc = await tok.encode(t, null, { addSpecialTokens: false });
    ids += enc.getIds().length;
    bytes += Buffer.byteLength(t, "utf8");
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(`${(bytes / 1e6 / seconds).toFixed(2)} MB/s (${ids} ids, ${(bytes / 1e6).toFixed(2)} MB, ${seconds.toFixed(2)} s)`);
}
main();
