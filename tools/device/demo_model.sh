#!/usr/bin/env bash
# One device call (issue 39 item 6): trains the demo model (tools/demo_model/train_demo_model.py,
# about SECONDS_BUDGET [240] s on the GPU) into OUT_DIR/demo, after a 3-second smoke run that
# catches a broken script early; then checks `afd run` on the CPU against the script's
# reference.json (transformers' fp32 greedy ids) and prints the model's answers. The model comes
# back as OUT_DIR/demo.tgz (unpack it into models/).
# Usage (repo root there): tools/device/demo_model.sh BIN_DIR OUT_DIR
set -u
BIN=$(readlink -f "$1")
OUT=$2
mkdir -p "$OUT"
. "$(dirname "$(readlink -f "$0")")/env.sh"
export PYTHONUNBUFFERED=1
$PY tools/demo_model/train_demo_model.py --out /tmp/demo_smoke --seconds 3 --corpus-chars 400000 \
  >"$OUT/smoke.log" 2>&1 || { tail -40 "$OUT/smoke.log"; exit 1; }
tail -4 "$OUT/smoke.log"
rm -rf "$OUT/demo"
$PY tools/demo_model/train_demo_model.py --out "$OUT/demo" --seconds "${SECONDS_BUDGET:-240}" \
  2>&1 | grep -v "^step [0-9]*[1-9]00 " || exit 1
$PY - "$BIN/afd" "$OUT/demo" <<'PY'
import json, subprocess, sys
afd, d = sys.argv[1], sys.argv[2]
ref = json.load(open(d + "/reference.json"))
ok = 0
for c in ref["cases"]:
    cmd = [afd, "run", "--model", d, "--max-tokens", str(ref["max_new_tokens"]), "--ignore-eos",
           "--json", "--prompt-ids", ",".join(map(str, c["prompt_ids"]))]
    out = subprocess.run(cmd, capture_output=True, text=True)
    got = json.loads(out.stdout.splitlines()[0])["output_ids"] if out.returncode == 0 else out.stderr
    ok += got == c["greedy_ids"]
    print("afd run (cpu) == transformers:", got == c["greedy_ids"], "" if got == c["greedy_ids"] else got)
print(f"{ok}/{len(ref['cases'])} cases equal")
PY
du -sh "$OUT/demo"/*
# One archive: the tool brings back at most 8 files (the model directory has 7, plus the logs).
tar czf "$OUT/demo.tgz" -C "$OUT" demo && rm -rf "$OUT/demo"
