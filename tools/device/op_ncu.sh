#!/usr/bin/env bash
# One device call: Nsight Compute on one backend_ops_test perf case (cuda): every kernel launch
# of the case with its duration (3 timed iterations after the warm-up), then the detail sections
# (speed of light, occupancy, warp state, memory; every stall reason >= 0.05 cycles per issue)
# of the case's first launch matching KERNEL_REGEX.
# Usage (repo root there): tools/device/op_ncu.sh BIN_DIR OP CASE_TEXT KERNEL_REGEX
set -u
BIN=$(readlink -f "$1")
. "$(dirname "$(readlink -f "$0")")/env.sh"  # LD_LIBRARY_PATH
NCU=$(command -v ncu || find / -name ncu -type f -path '*nsight-compute*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
CASE=("$BIN/backend_ops_test" --backend cuda --perf --iters 3 --op "$2" --case "$3")
echo "== every launch: $2 / $3"
timeout 200 "$NCU" --clock-control none --metrics gpu__time_duration.sum \
  "${CASE[@]}" 2>&1 |
  awk '/^  [A-Za-z_].*\(/ {name=substr($0, 3, 100)} /gpu__time_duration.sum/ {print $NF, $(NF-1), name}' | tail -40
echo "== detail: $4"
timeout 200 "$NCU" --clock-control none --kernel-name "regex:$4" --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --metrics \
  'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,dram__bytes_read.sum,lts__t_bytes.sum' \
  "${CASE[@]}" 2>&1 |
  grep -vE '^\s*$|^==PROF==' |
  grep -E 'Duration|Throughput|Registers|Shared Memory|Occupancy|Stall|Warp Cycles|Block Limit|Active Warps|Waves|L1|L2|DRAM|Issued|Eligible|Grid|Block Size|bytes|^\s+[A-Za-z]' |
  awk '!/issue_stalled/ || $NF + 0 >= 0.05' | head -${LINES_MAX:-80}
