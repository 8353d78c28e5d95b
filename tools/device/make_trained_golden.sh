#!/usr/bin/env bash
# One device call: makes the v3_trained golden checkpoint (tools/golden/make_golden.py: v3 shapes
# trained briefly on a predictable synthetic language, so that its predictions are peaked like a
# real model's), its bf16 reference (transformers bf16 on the GPU, seed 001's method), and scores
# afd's bf16 and fp32 on the GPU against it (issue 10's fidelity: top-1 >= 99%, mean |dp| <= 1%).
# CASE (default v3_trained): the make_golden.py case, e.g. v3_trained_fp8 (sizes the GPU's FP8
# expert kernels read).
# Usage (repo root there): tools/device/make_trained_golden.sh BIN_DIR OUT_DIR
# Returns OUT_DIR/$CASE.tgz (to unpack into tests/data/golden/ and commit) and the logs.
set -u
BIN=$(readlink -f "$1")
OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/env.sh"  # CUBLAS_DIR, NCCL_DIR, LD_LIBRARY_PATH, PY
mkdir -p "$OUT"
status=0
C=${CASE:-v3_trained}
$PY tools/golden/make_golden.py --out /tmp/golden --cases $C >"$OUT/make_golden.log" 2>&1 ||
  { tail -20 "$OUT/make_golden.log"; exit 1; }
grep -E "train step|reference_check|max \|diff\||logit_std|margin" "$OUT/make_golden.log" | tail -15
rm -rf tests/data/golden/$C
cp -r /tmp/golden/$C tests/data/golden/
$PY tools/golden/make_bf16_reference.py --golden tests/data/golden --out /tmp/bf16_ref --cases $C \
  >"$OUT/bf16_ref.log" 2>&1 || { tail -20 "$OUT/bf16_ref.log"; exit 1; }
cp /tmp/bf16_ref/$C/bf16_reference.json tests/data/golden/$C/
tar czf "$OUT/$C.tgz" -C tests/data/golden $C
WORK=$(mktemp -d)
for dtype in bf16 fp32; do
  $PY "$HERE/score_bf16.py" "$BIN/afd" tests/data/golden/$C \
    tests/data/golden/$C/bf16_reference.json "$WORK" --device cuda --dtype $dtype ||
    status=1
done
exit $status
