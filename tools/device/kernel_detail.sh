#!/usr/bin/env bash
# One device call: Nsight Compute's detail sections (speed of light, occupancy, warp stall
# reasons, launch) for one launch of one kernel inside the eager decode steps of `afd bench
# decode --profile` (the CUDA backend opens the profiler range around those steps only).
# CONTEXT: the decode context (default 128; e.g. CONTEXT=1024 for AttentionTiles at long context).
# COUNT: launches profiled (default 1; 2 for a MoE layer's gate/up and down GEMMs).
# STALLS=1: also every warp stall reason's cycles per issued instruction (>= 0.05 printed) and
#   the DRAM / L2 bytes read.
# Usage (repo root there): tools/device/kernel_detail.sh BIN_DIR KERNEL_REGEX BATCH
set -u
BIN=$(readlink -f "$1")
. "$(dirname "$(readlink -f "$0")")/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
NCU=$(command -v ncu || find / -name ncu -type f -path '*nsight-compute*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
EXTRA=()
[ "${STALLS:-0}" = 1 ] && EXTRA=(--metrics
  'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,dram__bytes_read.sum,lts__t_bytes.sum')
timeout 200 "$NCU" --clock-control none --profile-from-start off --kernel-name "regex:$2" \
  --launch-skip 5 --launch-count "${COUNT:-1}" --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis "${EXTRA[@]}" \
  "$BIN/afd" bench decode --model "${MODEL:-preset:deepseek-v2-lite}" --device cuda --batch "$3" \
  --context "${CONTEXT:-128}" --steps 2 --profile 2>&1 | grep -vE '^\s*$|loading weights|^==PROF==|^batch|^ +[0-9]+ +[0-9.]+ ' |
  grep -E 'Duration|Throughput|Registers|Shared Memory|Occupancy|Stall|Warp Cycles|Block Limit|Active Warps|Waves|L1|L2|DRAM|Issued|Eligible|Grid|Block Size|^\s+[A-Za-z]' |
  awk '!/issue_stalled/ || $NF + 0 >= 0.05' | head -${LINES_MAX:-90}
