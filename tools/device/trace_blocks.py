#!/usr/bin/env python3
"""Reads `afd bench decode --kernel-trace-csv` output: where each decode step's time goes.

Per batch:
  * each kernel's share of the step's critical time: the kernels taken in order of their end,
    each charged the time from the latest end before it (or its own start, if later) to its own
    end. The shares add up to the step's busy time. Under programmatic dependent launch a
    kernel starts while the one ahead of it runs, so its own span (start to end) counts its
    wait too; this share does not.
  * the step cut at the two RMSNorm / combine boundaries of every MoE layer: the attention
    block (the previous layer's combine end -> this layer's post-attention RMSNorm end: norm,
    projections, rope, cache write, attention, o projection) and the MoE block (that RMSNorm's
    end -> this layer's combine end: router, permute, gather, the routed and shared experts).

Usage: trace_blocks.py TRACE.csv [TOP]
"""
import collections
import csv
import sys


def steps_of(spans):
    """The batch's spans cut into decode steps, each opening with the embedding."""
    steps, cur = [], []
    for s in spans:
        if s[2] == "Embedding" and cur:
            steps.append(cur)
            cur = []
        cur.append(s)
    steps.append(cur)
    return steps


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    by_batch = collections.defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            by_batch[int(r["batch"])].append(
                (float(r["start_us"]), float(r["end_us"]), r["kernel"]))
    for batch in sorted(by_batch):
        spans = sorted(by_batch[batch])
        steps = steps_of(spans)
        if len(steps) > 1:
            steps = steps[:-1]  # the last one may be cut short by the trace's end
        n = len(steps)
        share = collections.defaultdict(float)
        calls = collections.Counter()
        attention, moe, step_us = [], [], 0.0
        for st in steps:
            step_us += max(e for _, e, _ in st) - st[0][0]
            latest = None
            for s, e, k in sorted(st, key=lambda x: x[1]):
                calls[k] += 1
                if latest is None or e > latest:
                    share[k] += e - (s if latest is None else max(latest, s))
                    latest = e
            marks = sorted((e, k.split("<")[0]) for _, e, k in st
                           if k.startswith("RmsNorm") or k.startswith("Combine"))
            for i in range(len(marks) - 3):
                kinds = [m[1] for m in marks[i:i + 4]]
                if kinds == ["Combine", "RmsNorm", "RmsNorm", "Combine"]:
                    attention.append(marks[i + 2][0] - marks[i][0])
                    moe.append(marks[i + 3][0] - marks[i + 2][0])
        print(f"batch {batch}: {n} steps, {step_us / n / 1e3:.3f} ms a step")
        if attention:
            a, m = sum(attention) / len(attention), sum(moe) / len(moe)
            print(f"  per MoE layer ({len(attention) // n} a step measured): attention block "
                  f"{a:.1f} us, MoE block {m:.1f} us; per step the rest (dense layer, first MoE "
                  f"layer's attention, lm_head, sampling) "
                  f"{(step_us - sum(attention) - sum(moe)) / n / 1e3:.3f} ms")
        print("  critical ms a step, calls, kernel")
        for k in sorted(share, key=lambda k: -share[k])[:top]:
            print(f"  {share[k] / n / 1e3:8.3f}  {calls[k] / n:6.1f}  {k}")


if __name__ == "__main__":
    main()
