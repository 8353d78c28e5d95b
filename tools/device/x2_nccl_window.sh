#!/usr/bin/env bash
# One device call on a machine with two GPUs (nvidia-h200-x2), binaries built elsewhere: the
# async connector across GPUs through NCCL symmetric-memory windows (issue 16).
#  1. The NCCL window refuses a libnccl other than the one it was built against (2.28.9).
#  2. Fidelity: for every golden checkpoint, `afd run --device cuda --topology 1A1F
#     --cuda-devices 0,1` (FFN rank on GPU 0, attention rank on GPU 1) with window "nccl", with
#     window "cuda_ipc" and with the P2P connector over NCCL (WINDOWS="nccl cuda_ipc p2p")
#     equals the monolithic run on GPU 0 (fp32: identical greedy ids, |dlogprob| <= 1e-5; bf16:
#     identical greedy ids).
#  3. Layer round trip attention -> FFN -> attention at 1/16/128/512 rows of 2048 and 7168 bf16:
#     async NCCL window vs async CUDA IPC window vs the P2P connector over NCCL vs raw
#     ncclSend/ncclRecv.
#  4. Decode: `afd bench decode --topology 1A1F --cuda-devices 0,1` (NCCL window, and the P2P
#     connector over NCCL) vs the monolithic model on one GPU and vs the monolithic model with
#     data parallelism + expert parallelism on both GPUs (DECODE=dpep; preset:deepseek-v2-lite,
#     bf16).
#  5. kill -9 of the FFN rank mid-run: the attention side exits naming it.
#  6. 2A1F, 2A2F, 3A2F, 1A2F with ranks sharing the two GPUs (CUDA IPC windows; FFN ranks on
#     GPU 0, attention ranks on GPU 1) equal the monolithic run (fp32 and bf16).
# Usage (repo root there): tools/device/x2_nccl_window.sh BIN_DIR OUT
# SECTIONS="1 2 3 5 6" runs those sections only (default: all); WINDOWS= and DECODE= subsets of
# "nccl cuda_ipc p2p" and "mono nccl p2p dpep" for sections 2 and 4.
set -u
HERE=$(dirname "$(readlink -f "$0")")
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
WORK=$(mktemp -d)
. "$HERE/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
VENV_NCCL=$NCCL_LIB  # env.sh: the venv's NCCL (the one built against); /usr/lib may hold another
OTHER_NCCL=$(find / -name 'libnccl.so.2' -not -path '*/proc/*' -not -path '*nvidia/nccl/lib*' 2>/dev/null | head -1)
export AFD_JOIN_SECRET=device-check-secret
AFD="$BIN/afd"
status=0
SECTIONS=${SECTIONS:-1 2 3 4 5 6}
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
echo "== machine"; nvidia-smi -L; nvidia-smi topo -m 2>&1 | head -4
echo "venv nccl: $VENV_NCCL; other: $OTHER_NCCL"; "$AFD" --version

NCCLW='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"window": "nccl"}}}'
IPCW='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"window": "cuda_ipc"}}}'
P2PN='{"afd": {"connector": "P2pNcclAFDConnector"}}'
WINDOWS=${WINDOWS:-nccl cuda_ipc p2p}

if on 1 && [ -n "$OTHER_NCCL" ]; then
  echo "== 1. the NCCL window on another libnccl ($OTHER_NCCL)"
  LD_LIBRARY_PATH="$BIN:$CUBLAS_DIR:$(dirname "$OTHER_NCCL")" timeout 120 "$AFD" run \
    --model tests/data/golden/v3_noaux_tc --prompt-ids 1,2,3 --max-tokens 2 --device cuda \
    --topology 1A1F --cuda-devices 0,1 --additional-config "$NCCLW" >"$WORK/mismatch.txt" 2>&1
  rc=$?
  grep -m2 -o "the NCCL window[^;]*" "$WORK/mismatch.txt" | head -2
  { [ $rc -ne 0 ] && grep -q "runs only on that exact version" "$WORK/mismatch.txt"; } &&
    echo "refused (exit $rc)" || { echo "mismatch check FAILED (exit $rc)"; tail -5 "$WORK/mismatch.txt"; status=1; }
fi

P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --prompt-ids 11,12,13,14,15)
on 2 && echo "== 2. fidelity: 1A1F on two GPUs vs monolithic on one"
on 2 && for c in v2_greedy_yarn v2_group_limited v3_noaux_tc v3_sharded v3_trained; do
  M=tests/data/golden/$c
  for dt in fp32 bf16; do
    "$AFD" run --model "$M" "${P[@]}" --max-tokens 16 --ignore-eos --json --device cuda \
      --dtype $dt >"$WORK/${c}_${dt}_mono.json" 2>"$WORK/err" || { tail -3 "$WORK/err"; status=1; }
    for W in $WINDOWS; do
      CFG=$NCCLW; [ $W = cuda_ipc ] && CFG=$IPCW; [ $W = p2p ] && CFG=$P2PN
      # One failure of a window kind skips its later runs (fail fast: device time is scarce).
      [ -n "${BROKEN_WINDOW:-}" ] && [[ " $BROKEN_WINDOW " == *" $W "* ]] && continue
      timeout 120 "$AFD" run --model "$M" "${P[@]}" --max-tokens 16 --ignore-eos --json \
        --device cuda --dtype $dt --topology 1A1F --cuda-devices 0,1 --additional-config "$CFG" \
        >"$WORK/${c}_${dt}_$W.json" 2>"$WORK/err_$W" || { echo "$c $dt $W failed:"; tail -8 "$WORK/err_$W"; status=1; BROKEN_WINDOW="${BROKEN_WINDOW:-} $W"; continue; }
      $PY "$HERE/compare_runs.py" "$WORK/${c}_${dt}_mono.json" "$WORK/${c}_${dt}_$W.json" "$c $dt 1A1F window $W" || status=1
    done
  done
done
on 2 && echo "-- per-layer transfers, v3_noaux_tc fp32, NCCL window (--stats)"
on 2 && timeout 120 "$AFD" run --model tests/data/golden/v3_noaux_tc "${P[@]}" --max-tokens 32 --ignore-eos \
  --device cuda --dtype fp32 --topology 1A1F --cuda-devices 0,1 --additional-config "$NCCLW" --stats \
  2>&1 | grep -E "rank|layer" | head -8

on 3 && echo "== 3. layer round trip, 1A1F, attention on GPU 1, FFN on GPU 0 (median / p10 / p90 us)"
bench() {  # name connector hidden [extra connector-test flags] [-- extra afd json]
  local name=$1 conn=$2 hidden=$3 extra_cfg=$4
  shift 4
  local PORT=$((21000 + RANDOM % 4000))
  local CFG="{\"afd\":{\"role\":\"ffn\",\"connector\":\"$conn\",\"host\":\"127.0.0.1\",\"port\":$PORT,\"num_attention_ranks\":1,\"num_ffn_ranks\":1$extra_cfg}}"
  local FLAGS=(--bench --hidden $hidden --dtype bf16 --bench-rows 1,16,128,512 --iters 200 --device cuda "$@")
  timeout 120 "$AFD" connector-test --additional-config "$CFG" --role-rank 0 "${FLAGS[@]}" --cuda-device 0 >"$WORK/ffn_$name.json" 2>&1 &
  timeout 120 "$AFD" connector-test --additional-config "${CFG/ffn/attention}" --role-rank 0 "${FLAGS[@]}" --cuda-device 1 >"$WORK/attn_$name.json" 2>"$WORK/attn_$name.err" || { tail -5 "$WORK/attn_$name.err"; tail -5 "$WORK/ffn_$name.json"; status=1; }
  wait
  echo "-- $name"
  $PY -c 'import json,sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for b in d["bench"]:
    print("%4d rows: %8.1f %8.1f %8.1f" % (b["rows"], b["median_us"], b["p10_us"], b["p90_us"]))' "$WORK/attn_$name.json" || status=1
}
on 3 && for H in 2048 7168; do
  bench "async_nccl_window_h$H" AsyncAFDConnector $H ',"connector_extra_config":{"window":"nccl"}'
  bench "async_cuda_ipc_h$H" AsyncAFDConnector $H ''
  bench "async_nccl_window_host_flags_h$H" AsyncAFDConnector $H ',"connector_extra_config":{"window":"nccl"}' --host-flags
  bench "p2p_nccl_h$H" P2pNcclAFDConnector $H ''
  bench "raw_nccl_send_recv_h$H" P2pNcclAFDConnector $H '' --raw
done

if on 4; then
  echo "== 4. decode, preset:deepseek-v2-lite bf16, context 128: monolithic on GPU 0 vs AFD 1A1F on GPUs 0+1"
  for D in ${DECODE:-mono nccl p2p dpep}; do
    extra=()
    [ $D = nccl ] && extra=(--topology 1A1F --cuda-devices 0,1 --additional-config "$NCCLW")
    [ $D = p2p ] && extra=(--topology 1A1F --cuda-devices 0,1 --additional-config "$P2PN")
    [ $D = dpep ] && extra=(--data-parallel-size 2 --enable-expert-parallel --cuda-devices 0,1)
    timeout 400 "$AFD" bench decode --model preset:deepseek-v2-lite --device cuda \
      --batch 1,16,64,256 --steps 32 --json "${extra[@]}" >"$OUT/decode_$D.json" 2>"$WORK/d_$D.err" ||
      { tail -8 "$WORK/d_$D.err"; status=1; }
    echo "$D:"; cat "$OUT/decode_$D.json"
  done
fi

if on 5; then
  echo "== 5. kill -9 of the FFN rank (NCCL window) mid-run"
  timeout 200 "$AFD" run --model preset:deepseek-v2-lite --num-layers 4 --device cuda --prompt-ids 1,2,3 \
    --max-tokens 20000 --ignore-eos --topology 1A1F --cuda-devices 0,1 --additional-config "$NCCLW" \
    >"$WORK/kill.txt" 2>&1 &
  RUN=$!
  FFN=""
  for _ in $(seq 240); do FFN=$(pgrep -f '"role":"ffn"' | head -1); [ -n "$FFN" ] && break; sleep 0.25; done
  sleep 10
  if [ -n "$FFN" ] && kill -9 "$FFN"; then
    T0=$(date +%s.%N)
    wait $RUN; rc=$?
    echo "afd run exited $rc, $($PY -c "import sys; print('%.1f s' % (float(sys.argv[2]) - float(sys.argv[1])))" $T0 $(date +%s.%N)) after the kill"
    grep -iE "ffn rank 0" "$WORK/kill.txt" | head -3
    { [ $rc -ne 0 ] && grep -q "ffn rank 0" "$WORK/kill.txt"; } || { echo "kill check FAILED"; tail -5 "$WORK/kill.txt"; status=1; }
  else
    echo "no FFN process to kill"; tail -5 "$WORK/kill.txt"; status=1; kill -9 $RUN 2>/dev/null
  fi
  pgrep -f "afd worker" >/dev/null && { echo "worker processes left behind"; pkill -9 -f "afd worker"; status=1; }
fi
if on 6; then
  # Issue 16's topologies on the GPUs this machine has: several ranks share a GPU through the
  # async connector's CUDA IPC windows (NCCL cannot put two ranks on one GPU), the FFN ranks on
  # GPU 0 and the attention ranks on GPU 1, so every layer's rows cross NVLink.
  echo "== 6. xAyF with ranks sharing GPUs (CUDA IPC windows): FFN ranks on GPU 0, attention on GPU 1"
  mkdir -p "$WORK/topo"
  for c in v3_trained v2_group_limited; do
    M=tests/data/golden/$c
    for dt in fp32 bf16; do
      [ -f "$WORK/${c}_${dt}_mono.json" ] || "$AFD" run --model "$M" "${P[@]}" --max-tokens 16 \
        --ignore-eos --json --device cuda --dtype $dt >"$WORK/${c}_${dt}_mono.json" 2>"$WORK/err" ||
        { tail -3 "$WORK/err"; status=1; }
      for TD in 2A1F:0,1,1 2A2F:0,0,1,1 3A2F:0,0,1,1,1 1A2F:0,0,1; do
        T=${TD%%:*}; DEV=${TD#*:}
        timeout 120 "$AFD" run --model "$M" "${P[@]}" --max-tokens 16 --ignore-eos --json \
          --device cuda --dtype $dt --topology $T --cuda-devices $DEV --additional-config "$IPCW" \
          >"$WORK/topo/${c}_${dt}_$T.json" 2>"$WORK/topo/err_$T" ||
          { echo "$c $dt $T failed:"; tail -8 "$WORK/topo/err_$T"; status=1; continue; }
        $PY "$HERE/compare_runs.py" "$WORK/${c}_${dt}_mono.json" "$WORK/topo/${c}_${dt}_$T.json" \
          "$c $dt $T (cuda:$DEV) window cuda_ipc" || status=1
      done
    done
  done
fi

cp "$WORK"/*.json "$OUT/" 2>/dev/null
echo "== exit status $status"
exit $status
