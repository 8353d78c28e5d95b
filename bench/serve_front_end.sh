#!/usr/bin/env bash
# The event-driven front end on the CPU (issue 38's CPU targets), preset:tiny:
#   1. 2,000 concurrent streaming requests (one connection each) complete with 0 failures;
#   2. with 5,000 idle TCP connections open, a normal completion is answered within 1 s, and
#      /health and /metrics at once.
# Not a test: it prints what it measured (docs/perf-log/ has the log).
# Usage: bench/serve_front_end.sh [path/to/afd] [streams (2000)] [idle connections (5000)]
set -euo pipefail
AFD=${1:-build/afd}
STREAMS=${2:-2000}
IDLE=${3:-5000}
ulimit -n "$(ulimit -Hn)"
WORK="$(mktemp -d -t afd-front-end.XXXXXX)"
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill -KILL "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
echo "machine: $(getconf _NPROCESSORS_ONLN) cores, $(lscpu | sed -n 's/^Model name: *//p'); ulimit -n $(ulimit -n)"
"$AFD" serve --model preset:tiny --host 127.0.0.1 --port 0 --max-num-seqs 256 \
  --max-num-batched-tokens 2048 >"$WORK/serve.log" 2>&1 &
SERVER_PID=$!
url=""
for _ in $(seq 600); do
  url=$(grep -o 'the OpenAI API is up on http://[0-9.:]*' "$WORK/serve.log" | grep -o 'http.*' || true)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { cat "$WORK/serve.log"; exit 1; }
echo "== 1. $STREAMS concurrent streams: afd bench serve --max-concurrency $STREAMS"
"$AFD" bench serve --base-url "$url" --model preset:tiny --num-prompts "$STREAMS" \
  --max-concurrency "$STREAMS" --random-input-len 16 --random-output-len 16 \
  --random-vocab-size 1000 --ignore-eos --seed 0 --disable-tqdm --request-rate inf \
  --request-timeout-s 600 | grep -E "Successful|Failed|Benchmark duration|throughput|concurrent|TTFT|TPOT"
echo "== 2. $IDLE idle connections, then one completion, /health and /metrics"
python3 - "$url" "$IDLE" <<'PYEOF'
import json, resource, socket, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port = url.split("//")[1].split(":")
idle = []
t0 = time.time()
for _ in range(n):
    s = socket.create_connection((host, int(port)))
    idle.append(s)
print(f"opened {len(idle)} idle connections in {time.time() - t0:.2f} s")
time.sleep(0.5)
for path, body in [("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 8}),
                   ("/health", None), ("/metrics", None)]:
    t = time.time()
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        print(f"{path}: HTTP {r.status} in {1000 * (time.time() - t):.1f} ms")
alive = 0
for s in idle:
    s.setblocking(False)
    try:
        alive += 1 if s.recv(1) != b"" else 0
    except BlockingIOError:
        alive += 1
print(f"{alive} of the idle connections still open (closed at the 10 s header deadline)")
PYEOF
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" && echo "server exit 0 after SIGTERM"
SERVER_PID=""
