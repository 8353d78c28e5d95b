#!/usr/bin/env bash
# Runs every fuzz target for SECONDS seconds each (`make fuzz FUZZ_SECONDS=N`), starting from the
# seeds in fuzz/corpus/<target>/ and a working corpus under BUILD/corpus/<target>/. Prints one
# line per target: executions, corpus size, crashes. A crash leaves its input in
# BUILD/artifacts/<target>/; copy it to tests/fuzz_regressions/<target>/ once fixed.
# Exit status: non-zero if any target crashed.
set -u
BUILD=${1:?usage: fuzz/run.sh BUILD_DIR SECONDS}
SECONDS_EACH=${2:?usage: fuzz/run.sh BUILD_DIR SECONDS}
SRC=$(cd "$(dirname "$0")" && pwd)
status=0
printf '%-20s %12s %10s %8s\n' target executions corpus crashes
for seeds in "$SRC"/corpus/*/; do
  name=$(basename "$seeds")
  bin="$BUILD/${name}_fuzz"
  [ -x "$bin" ] || { echo "fuzz/run.sh: $bin is missing (build it first)"; exit 2; }
  work="$BUILD/corpus/$name"
  art="$BUILD/artifacts/$name"
  rm -rf "$art"  # a crash is reported by the run that finds it; keep it in tests/fuzz_regressions
  mkdir -p "$work" "$art"
  log="$BUILD/$name.log"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$bin" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$art/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  corpus=$(find "$work" -type f | wc -l)
  crashes=$(find "$art" -type f | wc -l)
  printf '%-20s %12s %10s %8s\n' "$name" "${execs:-?}" "$corpus" "$crashes"
  if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
    status=1
    echo "  $name failed (exit $rc); log: $log"
    grep -m5 -E 'ERROR|SUMMARY|runtime error|terminate' "$log" | sed 's/^/    /'
  fi
done
exit $status
