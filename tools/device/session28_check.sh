#!/usr/bin/env bash
# The twenty-eighth session's device calls (one H200): PART 1 -- backend_ops_test and
# afd_graph_check.sh quick (monolithic graphs after CudaGraphRunner's Plan hook, the async AFD
# graphs, the bench of monolithic vs 1A1F); PART 2 -- ipc_check.sh (the driver entry points of
# common/cuda_driver.h on the IPC path) and the 2A2F async repeat run with failing runs' logs.
# Usage (repo root there): tools/device/session28_check.sh BIN_DIR OUT_DIR 1|2
set -u
BIN=$(readlink -f "$1")
OUT=$2
PART=${3:-1}
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
. "$HERE/env.sh"
if [ "$PART" = 1 ]; then
  echo "== backend_ops_test"
  timeout 200 "$BIN/backend_ops_test" 2>&1 | grep -vE " OK $" | tail -6
  echo "== afd_graph_check quick"
  timeout 380 bash "$HERE/afd_graph_check.sh" "$BIN" "$OUT" quick >"$OUT/graph_quick.log" 2>&1
  echo "rc $?"
  grep -vE "^\s*$" "$OUT/afd_graph_quick.txt" | cut -c1-160
else
  echo "== ipc_check"
  timeout 200 bash "$HERE/ipc_check.sh" "$BIN" "$OUT/ipc" >"$OUT/ipc.log" 2>&1
  echo "rc $?"
  grep -vE "^\s*$" "$OUT/ipc.log" | grep -vE "Loading|^\[" | tail -12 | cut -c1-160
  echo "== async repeat 2A2F fp32"
  KEEP="$OUT/repeat" TIME_S=${TIME_S:-150} timeout 260 bash "$HERE/async_repeat_check.sh" "$BIN" fp32 2A2F 2>&1 | tail -20
fi
