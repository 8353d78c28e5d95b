#!/usr/bin/env python3
"""The thread-safety check (ctest `thread_safety_analysis`): every source under src/ that uses
afd/common/thread_annotations.h -- itself or through a header it includes from src/ -- is compiled
with clang (-fsyntax-only) and -Werror=thread-safety, with the flags of its entry in the build's
compile_commands.json (GCC's own flags dropped). Exit 77 (skipped) without clang.
Usage: tools/check_thread_safety.py BUILD_DIR"""
import json, os, re, shlex, shutil, subprocess, sys

build = sys.argv[1]
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
clang = shutil.which("clang++-14") or shutil.which("clang++")
if clang is None:
    print("no clang++: skipped")
    sys.exit(77)
commands = json.load(open(os.path.join(build, "compile_commands.json")))
src = os.path.join(root, "src")
include = re.compile(r'#include "(afd/[^"]+)"')
uses = {}
def annotated(path, seen=()):
    if path in uses:
        return uses[path]
    uses[path] = False
    try:
        text = open(path).read()
    except OSError:
        return False
    hit = "afd/common/thread_annotations.h" in text
    for h in include.findall(text):
        if hit:
            break
        hit = annotated(os.path.join(src, h))
    uses[path] = hit
    return hit
drop = re.compile(r"^(-o|-c|-MD|-MT|-MF|-fno-fat-lto-objects|-flto.*|-ffp-contract=off|-fopenmp|--param.*)$")
jobs = []
seen_files = set()
for c in commands:
    f = os.path.abspath(os.path.join(c["directory"], c["file"]))
    if not f.startswith(src + os.sep) or not f.endswith(".cpp") or f in seen_files:
        continue
    if not annotated(f):
        continue
    seen_files.add(f)
    args = c["arguments"] if "arguments" in c else shlex.split(c["command"])
    out, skip = [clang, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                 "-Wno-unknown-warning-option"], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MT", "-MF"):
            skip = True
            continue
        if drop.match(a) or a == f or a == c["file"]:
            continue
        out.append(a)
    # The build's -Werror (CI) is GCC's: clang's other warnings are reported, never fatal here.
    out += ["-Wno-error", "-Werror=thread-safety", f]
    jobs.append((f, out, c["directory"]))

def check(job):
    f, cmd, cwd = job
    return f, subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)

from concurrent.futures import ThreadPoolExecutor
checked, failed = 0, []
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for f, r in pool.map(check, jobs):
        checked += 1
        if r.returncode != 0:
            failed.append(f)
            sys.stderr.write(r.stderr)
print(f"thread-safety analysis: {checked} sources checked, {len(failed)} failed")
sys.exit(1 if failed or checked == 0 else 0)
