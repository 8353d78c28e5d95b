#!/usr/bin/env bash
# One device call (2 GPUs): the async connector's device-rows round trip with the stream-side
# flag store and wait as one-thread kernels or as stream memory operations (cuStreamWriteValue64 /
# cuStreamWaitValue64), attention on GPU 0 and FFN on GPU 1, then on one GPU under MPS.
# Usage (repo root there): flag_modes.sh BIN_DIR
set -u
for w in kernel memop; do
  for wt in kernel memop; do
    echo "## flag store: $w, flag wait: $wt"
    AFD_STREAM_FLAG_WRITE=$w AFD_STREAM_FLAG_WAIT=$wt ONLY=two_gpus_device bash "$(dirname "$0")/x2_probe.sh" "$1" 2>&1 |
      grep -A4 "== async"
  done
done
echo "## kernels, one GPU under MPS"
ONLY=mps bash "$(dirname "$0")/x2_probe.sh" "$1" 2>&1 | grep -A4 "== async"
