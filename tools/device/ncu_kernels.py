#!/usr/bin/env python3
"""Per-kernel device time of one decode step, from `ncu --csv --page raw` output.

Usage: ncu_kernels.py NCU_CSV STEPS [TOP]
NCU_CSV: ncu run with --profile-from-start off on `afd bench decode --profile --steps STEPS`
(the CUDA backend opens the profiler range around the decode steps only). Prints, per kernel
name and per (name, grid), the calls and microseconds per step, longest first, and the sum of
all kernel durations per step (what a CUDA graph of this step cannot go below, gaps aside).
"""
import csv
import sys
from collections import defaultdict


def main():
    path, steps = sys.argv[1], float(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines too
    rows = list(csv.DictReader(lines))
    tcol = next(c for c in rows[0] if c.startswith("gpu__time_duration"))
    by_name, by_shape = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    total = 0.0
    for r in rows:
        if not r.get("ID", "").isdigit():
            continue  # the units row
        ns = float(r[tcol].replace(",", ""))
        name = r["Kernel Name"]
        for key, table in ((name, by_name), ((name, r.get("Grid Size", "")), by_shape)):
            table[key][0] += 1
            table[key][1] += ns
        total += ns
    print(f"kernels per step {sum(v[0] for v in by_name.values()) / steps:.0f}, "
          f"sum of kernel time per step {total / steps / 1e3:.1f} us")
    for title, table in (("by kernel", by_name), ("by kernel and grid", by_shape)):
        print(f"-- {title}: calls/step, us/step, us/call")
        for key, (n, ns) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
            label = key if isinstance(key, str) else f"{key[0]} grid{key[1]}"
            print(f"{n / steps:7.1f} {ns / steps / 1e3:9.1f} {ns / n / 1e3:8.2f}  {label[:110]}")


if __name__ == "__main__":
    main()
