#!/usr/bin/env python3
"""Whether a move of CUDA kernels between files changed any kernel: compares the PTX of every
.entry / .func of the old translation units with the new ones', names and bodies normalised for
what a move changes (the per-file anonymous-namespace and internal-linkage tags, branch labels,
local depot numbers). Prints the entries only one side has and those whose code differs; exit 1
if any.

  nvcc <the build's flags> -arch=compute_90a -ptx old.cu -o old.ptx      (and each new file)
  tools/ptx_same.py --old old.ptx --new new_a.ptx new_b.ptx ...
"""
import argparse
import re
import sys


def normalise(text):
    text = re.sub(r"\$L__BB\d+_", "L_", text)
    text = re.sub(r"__local_depot\d+", "DEPOT", text)
    text = re.sub(r"\d+_INTERNAL_[0-9a-f]+_\d+_[A-Za-z0-9_]+?_cu_[0-9a-f]+", "INTERNAL", text)
    return re.sub(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_[A-Za-z0-9_]+?_cu_[0-9a-f]+", "ANON", text)


def entries(path):
    out = {}
    for part in re.split(r"\n(?=(?:\.visible |\.weak |)\.(?:entry|func) )", normalise(open(path).read())):
        m = re.match(r"(?:\.visible |\.weak |)\.(?:entry|func) (?:\([^)]*\) )?(\S+?)\(", part)
        if m:
            out[m.group(1)] = re.sub(r"//.*", "", part).strip()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", nargs="+", required=True)
    ap.add_argument("--new", nargs="+", required=True)
    a = ap.parse_args()
    old, new = {}, {}
    for p in a.old:
        old.update(entries(p))
    for p in a.new:
        new.update(entries(p))
    only_old = sorted(set(old) - set(new))
    only_new = sorted(set(new) - set(old))
    differ = sorted(k for k in old if k in new and old[k] != new[k])
    print(f"{len(old)} old entries, {len(new)} new; {len(old) - len(only_old) - len(differ)} the same")
    for title, names in (("only old", only_old), ("only new", only_new), ("code differs", differ)):
        for n in names:
            print(f"{title}: {n}")
    return 1 if only_old or only_new or differ else 0


if __name__ == "__main__":
    sys.exit(main())
