#!/usr/bin/env bash
# The device driver: one entry point for a device call, over the recipes beside it (each sources
# env.sh for the libraries, PY and MPS). Build here (sm_90a, static cudart), copy afd,
# backend_ops_test and the Debian libraries the machine lacks into .devbin, then
#   run(carry [".devbin"], command "tools/device/run.sh WHAT .devbin $OUT [ARGS...]")
# WHAT:
#   check      backend_ops_test, fp32 vs the CPU and bf16 graph vs eager on the goldens, bf16 vs
#              transformers, afd bench decode and the torch peer (gpu_check.sh)
#   decode     check, then the decode bench again under AB_ENV / AB_ARGS (decode_check.sh)
#   afd        the AFD roles on one GPU under MPS: fp32 AFD == monolithic, bf16 graphs == eager;
#              ARGS: check | bench | all | quick (afd_graph_check.sh)
#   fp8        FP8 experts: ops, fidelity on v3_trained_fp8, decode bench; ARGS: check | bench
#              (fp8_experts_check.sh)
#   trace      CUPTI kernel trace of the decode step (kernel_trace.sh)
#   afd-trace  where an AFD decode step's time goes, per MoE layer (afd_trace.sh)
#   serve      afd serve + afd bench serve (serve_bench.sh; ARGS: [MODEL])
#   pd         prefill/decode disaggregation vs colocation (pd_check.sh)
#   golden     a trained golden checkpoint and its bf16 reference (make_trained_golden.sh;
#              CASE=...)
#   qwen3      the Qwen3-MoE goldens and bench (qwen3_check.sh)
# Other recipes in this folder are A/B and profiling tools named by what they compare; the
# session-numbered scripts of earlier sessions are gone (docs/perf-log/ keeps their commands;
# `git show 7ada5b4:tools/device/<name>` their text).
set -u
if [ $# -lt 3 ]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
WHAT=$1
shift
HERE=$(dirname "$(readlink -f "$0")")
case "$WHAT" in
  check) exec "$HERE/gpu_check.sh" "$@" ;;
  decode) exec "$HERE/decode_check.sh" "$@" ;;
  afd) exec "$HERE/afd_graph_check.sh" "$@" ;;
  fp8) exec "$HERE/fp8_experts_check.sh" "$@" ;;
  trace) exec "$HERE/kernel_trace.sh" "$@" ;;
  afd-trace) exec "$HERE/afd_trace.sh" "$@" ;;
  serve) exec "$HERE/serve_bench.sh" "$@" ;;
  pd) exec "$HERE/pd_check.sh" "$@" ;;
  golden) exec "$HERE/make_trained_golden.sh" "$@" ;;
  qwen3) exec "$HERE/qwen3_check.sh" "$@" ;;
  *)
    echo "tools/device/run.sh: unknown WHAT '$WHAT' (check, decode, afd, fp8, trace, afd-trace," \
      "serve, pd, golden, qwen3)" >&2
    exit 2
    ;;
esac
