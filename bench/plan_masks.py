#!/usr/bin/env python3
"""Mask planning as the PyTorch package does it: one library call per mask that plans and indexes
every stage into one arena, for Swin-B (greenmim.plan_masks) and Twins-L (greenmim.plan_twins),
224 px, ratio 0.75. Prints, for a shared mask and per-sample batches, the median time of a cache
miss (library prepare + write + Python views), of its library part alone (Swin-B), and of a cache
hit.

    python bench/plan_masks.py [--batches 8,32,128] [--reps 50] [--models swin-b,twins-l]
"""
import argparse
import statistics
import sys
import time

import torch

import greenmim


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="8,32,128", help="per-sample batch sizes (a shared mask is always timed)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--models", default="swin-b,twins-l")
    a = ap.parse_args(argv)
    planners = {"swin-b": greenmim.plan_masks, "twins-l": greenmim.plan_twins}
    for model in a.models.split(","):
        if model not in planners:
            ap.error(f"--models: one of {', '.join(planners)}, got {model!r}")
    for model in a.models.split(","):
        plan = planners[model]
        g = torch.Generator().manual_seed(0)
        print(f"== {plan.__name__}, {model} 224 px / window 7 / ratio 0.75, torch {torch.__version__}, {a.reps} masks each")
        print("| masks | miss, median us | of which library (prepare) us | hit, median us | arena KiB |")
        print("|---|---|---|---|---|")
        for batch in [None] + [int(b) for b in a.batches.split(",") if b]:
            masks = [greenmim.random_masks(batch, generator=g) for _ in range(a.reps)]
            plan(masks[0], cache=False)                                  # warm the planner
            miss, lib = [], []
            for m in masks:
                t = time.perf_counter()
                p = plan(m, cache=False)
                miss.append((time.perf_counter() - t) * 1e6)
                lib.append(getattr(p, "build_us", float("nan")))
            greenmim.clear_cache()
            plan(masks[0])
            hit = []
            for _ in range(a.reps):
                t = time.perf_counter()
                plan(masks[0])
                hit.append((time.perf_counter() - t) * 1e6)
            name = "1 shared" if batch is None else f"{batch} per-sample"
            print(f"| {name} | {statistics.median(miss):.0f} | {statistics.median(lib):.0f} | {statistics.median(hit):.1f} "
                  f"| {p.arena.numel() * 4 / 1024:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
