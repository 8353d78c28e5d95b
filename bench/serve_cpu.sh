#!/usr/bin/env bash
# `afd bench serve` against a 2A1F `afd launch` and against a 1-process `afd serve` of
# preset:tiny on the CPU, with the same engine flags and the same requests (token-id prompts,
# greedy, ignore_eos), at request rate inf and at a finite rate. Prints each report and a table
# side by side. Not a test: nothing here asserts a speed (docs/perf-log/ has the log).
# Usage: bench/serve_cpu.sh [path/to/afd] [num_prompts (64)] [finite rate req/s (2)]
set -euo pipefail
AFD=${1:-build/afd}
NUM_PROMPTS=${2:-64}
RATE=${3:-2}
ENGINE=(--model preset:tiny --max-num-seqs 256 --max-num-batched-tokens 2048)
BENCH=(--model preset:tiny --num-prompts "$NUM_PROMPTS" --random-input-len 128
       --random-output-len 64 --random-vocab-size 1000 --ignore-eos --seed 0 --disable-tqdm
       --request-timeout-s 600)
WORK="$(mktemp -d -t afd-serve-bench.XXXXXX)"
SERVER_PID=""

cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true  # ranks die with it (--exit-with-parent)
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# serve NAME ARGS...: starts `afd ARGS` on an ephemeral port, runs the benchmarks, stops it.
serve() {
  local name=$1 url="" rc=0
  shift
  echo "== $name: afd $*"
  "$AFD" "$@" --host 127.0.0.1 --port 0 --log-dir "$WORK/$name-ranks" >"$WORK/$name.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do  # 60 s at most
    url=$(grep -o 'the OpenAI API is up on http://[0-9.:]*' "$WORK/$name.log" | grep -o 'http.*' || true)
    [ -n "$url" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$url" ]; then
    cat "$WORK/$name.log" >&2
    exit 1
  fi
  for rate in inf "$RATE"; do
    echo "== $name, request rate $rate: afd bench serve ${BENCH[*]} --request-rate $rate"
    "$AFD" bench serve --base-url "$url" "${BENCH[@]}" --request-rate "$rate" \
      --result-json "$WORK/$name-$rate.json"
  done
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  [ "$rc" -eq 0 ] || { echo "afd $1 exited with status $rc" >&2; exit 1; }
}

echo "machine: $(getconf _NPROCESSORS_ONLN) cores, $(lscpu | sed -n 's/^Model name: *//p'), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
serve 2A1F launch --topology 2A1F "${ENGINE[@]}"
serve 1proc serve "${ENGINE[@]}"

python3 - "$WORK" "$RATE" <<'EOF'
import json, sys
work, rate = sys.argv[1], sys.argv[2]
rows = [("request throughput (req/s)", "request_throughput"),
        ("output token throughput (tok/s)", "output_throughput"),
        ("mean / median / p99 TTFT (ms)", "ttft_ms"), ("mean / median / p99 TPOT (ms)", "tpot_ms"),
        ("mean / median / p99 ITL (ms)", "itl_ms"), ("mean / median / p99 E2E (ms)", "e2el_ms")]
runs = [(f"{n}, rate {r}", json.load(open(f"{work}/{n}-{r}.json")))
        for r in ("inf", rate) for n in ("2A1F", "1proc")]
print("| | " + " | ".join(name for name, _ in runs) + " |")
print("|---" * (len(runs) + 1) + "|")
for label, key in rows:
    cells = []
    for _, j in runs:
        if key.endswith("_ms"):
            cells.append(" / ".join(f"{j[p + key]:.1f}" for p in ("mean_", "median_", "p99_")))
        else:
            cells.append(f"{j[key]:.2f}")
    print(f"| {label} | " + " | ".join(cells) + " |")
print("| completed / failed | " + " | ".join(f"{j['completed']} / {j['failed']}" for _, j in runs) + " |")
EOF
