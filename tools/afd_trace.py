#!/usr/bin/env python3
"""Where an AFD decode step's time goes, from `afd bench decode --topology ... --kernel-trace-csv`.

Reads the merged trace (batch,rank,stream,graph,launch,start_us,end_us,kernel) and, per batch, the
last STEPS decode steps of attention rank 0 (its CUDA graph replays that wait for replies:
AwaitSlot kernels), and prints per step and per MoE layer (medians over the steps' layers):
  attention kernels   time the attention rank's kernels ran, AwaitSlot excluded
  a2f hop             the dispatch's PublishSlot end -> the first FFN kernel of that item
  ffn item            that first FFN kernel's start -> the FFN's reply PublishSlot end
  f2a hop             the FFN's PublishSlot end -> the attention's AwaitSlot end
  wait                AwaitSlot's own span (the attention stream stalled on the replies)
and whether the FFN items ran as graph replays (one launch each) or eager kernels, and how many
were claimed ahead (an FFN AwaitSlot in front of the item's graph). With
--timeline L, also every kernel of both roles around MoE layer L of the last step.

Usage: tools/afd_trace.py TRACE.csv [--batch B] [--steps 8] [--timeline L]
"""
import argparse
import csv
import statistics
import sys
from collections import defaultdict


def load(path):
    rows = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows[int(r["batch"])].append(
                dict(rank=r["rank"], stream=int(r["stream"]), graph=int(r["graph"]),
                     launch=int(r["launch"]), start=float(r["start_us"]), end=float(r["end_us"]),
                     name=r["kernel"]))
    return rows


def med(v):
    return statistics.median(v) if v else float("nan")


def union_length(spans):
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def analyse(spans, batch, steps, timeline):
    att = sorted((s for s in spans if s["rank"] == "attention0"), key=lambda s: s["start"])
    ffn = sorted((s for s in spans if s["rank"].startswith("ffn")), key=lambda s: s["start"])
    replays = defaultdict(list)
    for s in att:
        if s["graph"] != 0:
            replays[(s["graph"], s["launch"])].append(s)
    decode = sorted((v for v in replays.values() if any(k["name"] == "AwaitSlot" for k in v)),
                    key=lambda v: v[0]["start"])
    if not decode:
        print(f"batch {batch}: no graphed AFD decode step in the trace (eager run?)")
        return
    chosen = decode[-(steps + 1):-1] if len(decode) > steps else decode[:-1] or decode
    print(f"== batch {batch}: {len(decode)} graphed decode steps of attention0, "
          f"{len(chosen)} analysed; FFN ranks: {sorted({s['rank'] for s in ffn})}")
    rows = defaultdict(list)
    for i, step in enumerate(chosen):
        begin = step[0]["start"]
        nxt = decode[decode.index(step) + 1][0]["start"]
        end = max(k["end"] for k in step)
        pubs = [k for k in step if k["name"] == "PublishSlot"]
        waits = [k for k in step if k["name"] == "AwaitSlot"]
        work = [(k["start"], k["end"]) for k in step if k["name"] != "AwaitSlot"]
        rows["step (replay start to next)"].append(nxt - begin)
        rows["step kernels (first start to last end)"].append(end - begin)
        rows["attention kernels busy"].append(union_length(work))
        rows["attention AwaitSlot total"].append(sum(k["end"] - k["start"] for k in waits))
        # The FFN's own AwaitSlot kernels (items claimed ahead of their rows) wait, not work.
        window = [s for s in ffn if begin <= s["start"] < end and s["name"] != "AwaitSlot"]
        claims = [s for s in ffn if begin <= s["start"] < end and s["name"] == "AwaitSlot"]
        rows["ffn kernels busy"].append(union_length([(s["start"], s["end"]) for s in window]))
        rows["ffn item launches (distinct)"].append(len({(s["rank"], s["launch"]) for s in window}))
        rows["ffn kernels"].append(len(window))
        rows["ffn items claimed ahead (AwaitSlot)"].append(len(claims))
        # Per MoE layer with one FFN rank per publish: pair each dispatch publish with the FFN
        # kernels that follow it up to the FFN's reply publish.
        layers = []
        j = 0
        for p, w in zip(pubs, waits):
            while j < len(window) and window[j]["start"] < p["end"]:
                j += 1
            first = window[j] if j < len(window) else None
            k = j
            while k < len(window) and window[k]["name"] != "PublishSlot":
                k += 1
            reply = window[k] if k < len(window) else None
            if first is None or reply is None:
                break
            layers.append(dict(a2f=first["start"] - p["end"], ffn=reply["end"] - first["start"],
                               f2a=w["end"] - reply["end"], wait=w["end"] - w["start"],
                               dispatch_to_pub=p["start"] - step[0]["start"]))
            j = k + 1
        for L in layers:
            rows["per layer: a2f hop"].append(L["a2f"])
            rows["per layer: ffn item"].append(L["ffn"])
            rows["per layer: f2a hop"].append(L["f2a"])
            rows["per layer: AwaitSlot span"].append(L["wait"])
        rows["layers paired"].append(len(layers))
    for name, v in rows.items():
        print(f"  {name:42s} median {med(v):9.2f}  min {min(v):9.2f}  max {max(v):9.2f}"
              f"  (n={len(v)})")
    if timeline is not None:
        step = chosen[-1]
        pubs = [k for k in step if k["name"] == "PublishSlot"]
        if timeline >= len(pubs):
            print(f"  --timeline {timeline}: the step has {len(pubs)} dispatches")
            return
        lo = pubs[timeline - 1]["end"] if timeline > 0 else step[0]["start"]
        hi = pubs[timeline + 1]["start"] if timeline + 1 < len(pubs) else max(k["end"] for k in step)
        print(f"  -- every kernel between dispatch {timeline - 1} and {timeline + 1} (us from "
              f"the step's start)")
        t0 = step[0]["start"]
        for s in sorted([k for k in att + ffn if lo <= k["start"] <= hi], key=lambda s: s["start"]):
            print(f"  {s['rank']:11s} {s['start'] - t0:10.2f} {s['end'] - t0:10.2f} "
                  f"{s['end'] - s['start']:7.2f}  g{s['graph']} {s['name'][:70]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeline", type=int)
    a = ap.parse_args()
    rows = load(a.trace)
    if not rows:
        sys.exit(f"{a.trace}: no kernels")
    for b in a.batch or sorted(rows):
        if b not in rows:
            sys.exit(f"{a.trace}: no batch {b} (batches {sorted(rows)})")
        analyse(rows[b], b, a.steps, a.timeline)


if __name__ == "__main__":
    main()
