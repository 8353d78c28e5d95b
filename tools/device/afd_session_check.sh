#!/usr/bin/env bash
# One device call: the AFD device path's checks in one machine start --
#   1. tools/device/afd_graph_check.sh quick (fp32 AFD graphs == monolithic for 1A1F 1A2F 2A1F
#      2A2F, bf16 graphs == eager, the prefill-vs-decode graph key, 27-layer 1A1F vs monolithic);
#   2. tools/device/hardening_check.sh (device flags == monolithic, a wedged FFN named within the
#      bound, then afd serve's loads as far as the time allows).
# Usage (repo root there): tools/device/afd_session_check.sh BIN_DIR OUT_DIR
set -u
BIN=$1
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
timeout "${GRAPH_S:-330}" bash "$HERE/afd_graph_check.sh" "$BIN" "$OUT/graph" quick >"$OUT/graph.log" 2>&1
echo "== afd_graph_check quick (rc $?)"
cat "$OUT"/graph/afd_graph_quick.txt 2>/dev/null | grep -v "^GPU" | cut -c1-220 | tail -40
timeout "${HARDEN_S:-200}" bash "$HERE/hardening_check.sh" "$BIN" "$OUT/hard" >"$OUT/hard.log" 2>&1
echo "== hardening_check (rc $?)"
grep -v "^GPU" "$OUT/hard/hardening.txt" 2>/dev/null | cut -c1-220 | head -30
