#!/usr/bin/env bash
# Decode on preset:deepseek-v2-lite (8 layers, bf16), 16 prompts of 64 tokens, 64 new tokens:
# monolithic vs AFD 1A1F with the async connector, device and host flags (every rank on
# --cuda-device 0). Prints the decode lines of --stats.
# Usage (repo root there, LD_LIBRARY_PATH set): decode_mono_vs_afd.sh BIN_DIR
set -u
AFD="$(readlink -f "$1")/afd"
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
PROMPTS=()
for i in $(seq 16); do PROMPTS+=(--prompt-ids "$(seq -s, $((i * 100)) $((i * 100 + 63)))"); done
HOSTF='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"device_flags": false}}}'
for T in mono 1A1F 1A1F_host_flags; do
  extra=()
  [ $T = 1A1F ] && extra=(--topology 1A1F --additional-config "$ASYNC")
  [ $T = 1A1F_host_flags ] && extra=(--topology 1A1F --additional-config "$HOSTF")
  timeout 200 "$AFD" run --model preset:deepseek-v2-lite --num-layers 8 --device cuda "${PROMPTS[@]}" \
    --max-tokens 64 --ignore-eos --stats "${extra[@]}" >/tmp/v2lite_$T.txt 2>&1 || tail -5 /tmp/v2lite_$T.txt
  echo "$T:"; grep -E "decode|ms/step|tokens/s" /tmp/v2lite_$T.txt | grep -v "loading" | head -4
done
