#!/usr/bin/env bash
# The thirtieth session's device call (one H200, every rank on GPU 0 under MPS): the FFN gathering
# several attention ranks' work items of one MoE layer into one expert pass (issue 37, 2A1F).
# check: on golden v3_noaux_tc, fp32 AFD (graphs, gathering on) ids == monolithic ids, log-probs
# within 1e-5, for 2A1F 3A1F 2A2F; bf16 graphs == eager ids for the same and 2A1F with
# ffn_gather false; the FFN's --stats line (how many items were gathered). bench: `afd bench
# decode` of preset:deepseek-v2-lite (27 layers, bf16, context 128) monolithic, 1A1F, 2A1F with
# gathering (default wait, and 1000 us) and without.
# Usage (repo root there): tools/device/session30_check.sh BIN_DIR OUT_DIR check|bench|all
set -u
BIN=$(readlink -f "$1")
OUT=$2
MODE=${3:-all}
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
. "$HERE/env.sh"
REPORT="$OUT/session30_$MODE.txt"
nvidia-smi -L | tee "$REPORT"
mps_on "$REPORT"
ASYNC='{"afd": {"connector": "AsyncAFDConnector"}}'
NOGATHER='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"ffn_gather": false}}}'
WAIT1000='{"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": {"ffn_gather_wait_us": 1000}}}'
cmp_runs() {  # mono other label
  python3 "$HERE/compare_runs.py" "$1" "$2" "$3" | tee -a "$REPORT"
}
if [ "$MODE" = check ] || [ "$MODE" = all ]; then
  M=tests/data/golden/v3_noaux_tc
  P=(--prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 90,80,70 --prompt-ids 5 --prompt-ids 11,12
     --prompt-ids 3,1,4,1,5 --prompt-ids 9,2,6 --max-tokens 16 --ignore-eos --json --device cuda)
  for dt in fp32 bf16; do
    "$BIN/afd" run --model $M "${P[@]}" --dtype $dt >/tmp/mono_$dt.json 2>/tmp/err || tail -3 /tmp/err
    for topo in 2A1F 3A1F 2A2F; do
      timeout 120 "$BIN/afd" run --model $M "${P[@]}" --dtype $dt --topology $topo \
        --additional-config "$ASYNC" --stats >/tmp/g.json 2>/tmp/err || tail -8 /tmp/err
      grep -E "^ffn" /tmp/err | tee -a "$REPORT"
      if [ $dt = fp32 ]; then
        cmp_runs /tmp/mono_fp32.json /tmp/g.json "fp32 $topo gather, graphs vs monolithic"
      else
        timeout 120 "$BIN/afd" run --model $M "${P[@]}" --dtype $dt --topology $topo \
          --additional-config "$ASYNC" --enforce-eager >/tmp/e.json 2>/tmp/err || tail -8 /tmp/err
        cmp_runs /tmp/e.json /tmp/g.json "bf16 $topo gather, graphs vs eager"
        cmp_runs /tmp/mono_bf16.json /tmp/g.json "bf16 $topo gather vs monolithic (report)"
      fi
    done
    timeout 120 "$BIN/afd" run --model $M "${P[@]}" --dtype $dt --topology 2A1F \
      --additional-config "$NOGATHER" --stats >/tmp/n.json 2>/tmp/err || tail -8 /tmp/err
    grep -E "^ffn" /tmp/err | tee -a "$REPORT"
    cmp_runs /tmp/mono_$dt.json /tmp/n.json "$dt 2A1F no gather vs monolithic"
  done
fi
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  # RUNS: "topology config batches" triples separated by ';' (config: ASYNC NOGATHER WAIT1000);
  # SKIP_MONO=1: no monolithic run.
  B=(--model preset:deepseek-v2-lite --device cuda --context 128)
  if [ -z "${SKIP_MONO:-}" ]; then
    echo "== monolithic" | tee -a "$REPORT"
    timeout -k 5 200 "$BIN/afd" bench decode "${B[@]}" --batch 1,16,64,256 2>&1 |
      grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
  fi
  IFS=';' read -ra RUN_LIST <<<"${RUNS:-1A1F ASYNC 1,16,64,256;2A1F ASYNC 16,64,256;2A1F NOGATHER 16,64,256}"
  for run in "${RUN_LIST[@]}"; do
    set -- $run
    echo "== AFD $1 graphs, $2, batch $3" | tee -a "$REPORT"
    timeout -k 5 240 "$BIN/afd" bench decode "${B[@]}" --batch $3 --topology $1 --additional-config "${!2}" 2>&1 |
      grep -E "^ *[0-9]+ |batch|rror" | tee -a "$REPORT"
  done
fi
mps_off
true
