#!/usr/bin/env bash
# `make demo`: shows the main job on the built-in default deployment.
# For now: the rank map of a 3A2F deployment (3 attention ranks, 2 FFN ranks) and the
# validation of its configuration. Grows as the runtime grows (see the issues).
set -euo pipefail
BUILD_DIR=${1:-build}
AFD="$BUILD_DIR/afd"

echo "== afd --version"
"$AFD" --version
echo
echo "== afd topology --attention 3 --ffn 2"
"$AFD" topology --attention 3 --ffn 2
echo
echo "== afd config check (attention role of that deployment)"
"$AFD" config check '{"afd": {"role": "attention", "connector": "P2pHostAFDConnector",
  "host": "127.0.0.1", "port": 6239, "num_attention_ranks": 3, "num_ffn_ranks": 2}}'
