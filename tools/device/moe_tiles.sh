set -u
BIN=$PWD/.devbin
CUBLAS_DIR=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$BIN:$CUBLAS_DIR"
$BIN/backend_ops_test 2>&1 | grep -E "FAIL|passed"
for t in default 1 2 4; do
  if [ $t = default ]; then unset AFD_MOE_TILES; else export AFD_MOE_TILES=$t; fi
  echo "## tiles $t"
  $BIN/backend_ops_test --perf --backend cuda --op MoE 2>&1 | grep "of 64"
  timeout 150 $BIN/afd bench decode --model preset:deepseek-v2-lite --device cuda --batch 16,64,256 --context 128 --steps 16 2>&1 | grep -E "^ +[0-9]+ +[0-9.]+"
done
