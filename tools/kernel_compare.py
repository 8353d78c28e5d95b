#!/usr/bin/env python3
"""Per kernel, the median duration of one call in two kernel traces (`afd bench decode
--kernel-trace-csv`), split by graph replay vs eager launch: which kernels of an AFD rank run
slower than the same kernels of the monolithic step (the 32nd session's question: the FFN's
gate/up GroupedMma at batch 256 took 305 us a call graphed, 220 eager, 213 in the monolithic
graph).

A trace is the monolithic CSV (batch,stream,start_us,end_us,kernel) or a merged AFD one
(batch,rank,stream,graph,launch,start_us,end_us,kernel); RANK picks an AFD trace's rank (e.g.
ffn0; default: every rank). The monolithic bench traces only graph replays.

Usage: tools/kernel_compare.py A.csv[:RANK] B.csv[:RANK] [--top 25] [--batch N]
"""
import argparse
import csv
import gzip
import statistics
from collections import defaultdict


def load(spec, batch):
    path, _, rank = spec.partition(":")
    opener = gzip.open if path.endswith(".gz") else open
    calls = defaultdict(list)  # (kernel, "graph" | "eager") -> durations, us
    with opener(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            if batch is not None and int(r["batch"]) != batch:
                continue
            if rank and r.get("rank", "") != rank:
                continue
            mode = "eager" if r.get("graph", "1") == "0" else "graph"
            calls[(r["kernel"], mode)].append(float(r["end_us"]) - float(r["start_us"]))
    return calls


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--batch", type=int)
    args = p.parse_args()
    a, b = load(args.a, args.batch), load(args.b, args.batch)
    names = sorted({k for k, _ in a} | {k for k, _ in b},
                   key=lambda k: -sum(sum(d.get((k, m), [])) for d in (a, b)
                                      for m in ("graph", "eager")))
    print(f"{'kernel':48s} {'mode':5s} {'A calls':>8s} {'A med us':>9s} {'B calls':>8s} "
          f"{'B med us':>9s} {'B/A':>6s}")
    for k in names[:args.top]:
        for mode in ("graph", "eager"):
            da, db = a.get((k, mode), []), b.get((k, mode), [])
            if not da and not db:
                continue
            ma = statistics.median(da) if da else float("nan")
            mb = statistics.median(db) if db else float("nan")
            ratio = mb / ma if da and db and ma > 0 else float("nan")
            print(f"{k[:48]:48s} {mode:5s} {len(da):8d} {ma:9.1f} {len(db):8d} {mb:9.1f} "
                  f"{ratio:6.2f}")


if __name__ == "__main__":
    main()
