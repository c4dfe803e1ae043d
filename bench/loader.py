#!/usr/bin/env python3
"""greenmim.pretrain's input pipeline alone: how many images per second its DataLoader delivers,
and where a worker's time goes. A step can go no faster than this; compare it with the step's own
rate (bench/gpu/train_step.py: batch / step time).

Each loader item is one micro-batch, made in one worker: the images read and decoded, randomly
cropped and flipped (uint8, `data.train_crops`; the step normalises on its device), the masks
drawn, and the plan made (and padded to the capacity with --cuda_graphs).

    python bench/loader.py [--data_path DIR] [--model NAME] [--batch 128] [--workers 8]
                           [--per_sample_masks] [--cuda_graphs] [--batches 40]

Without --data_path it reads scikit-image's sample photographs, as the trainer does (they are
decoded once and kept, so "read + decode" is then near zero). The loader's workers get no pinned
memory here; the trainer pins on CUDA.
"""
import argparse
import statistics
import sys
import time

import torch

from greenmim import indices, mim
from greenmim.pretrain import data


def _split(ds: data.MicroBatches, batch: int, reps: int) -> dict:
    """One worker's time per micro-batch, by part (median of ``reps``, in this process)."""
    n = len(ds.images)
    parts = {"read + decode": [], "crop + flip (uint8)": [], "masks": [], "plan": []}
    g = torch.Generator().manual_seed(1)
    for r in range(reps):
        idx = [(r * batch + i) % n for i in range(batch)]
        t0 = time.perf_counter()
        ims = [ds.images.load(i) for i in idx]
        t1 = time.perf_counter()
        torch.stack([ds.transform(im) for im in ims])
        t2 = time.perf_counter()
        masks = indices.random_masks(batch if ds.per_sample else None, grid=ds.geometry.grid, ratio=ds.mask_ratio,
                                     generator=g)
        t3 = time.perf_counter()
        ds.geometry.plan(masks)
        t4 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k].append(v * 1e3)
    return {k: statistics.median(v) for k, v in parts.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data_path", default=None)
    ap.add_argument("--model", default="green_mim_swin_base_patch4_dec512b1")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=data.worker_count(None))
    ap.add_argument("--per_sample_masks", action="store_true")
    ap.add_argument("--cuda_graphs", action="store_true", help="fixed G and plans padded to a capacity")
    ap.add_argument("--mask_ratio", type=float, default=0.75)
    ap.add_argument("--batches", type=int, default=40, help="micro-batches timed (after the first `workers`)")
    ap.add_argument("--split_reps", type=int, default=3)
    a = ap.parse_args(argv)
    if a.batch < 1 or a.workers < 0 or a.batches < 1 or a.split_reps < 1:
        ap.error("--batch, --batches and --split_reps must be at least 1, --workers at least 0")
    torch.set_num_threads(1)                       # as in a DataLoader worker
    images = data.ImageFiles(a.data_path) if a.data_path else data.SamplePhotographs()
    model = mim.create_model(a.model)
    geometry = data.Geometry(model, fixed_groups=a.cuda_graphs)
    if a.cuda_graphs:
        geometry.capacity = geometry.capacity_for(a.batch, a.per_sample_masks, a.mask_ratio, 0)
    ds = data.MicroBatches(images, geometry.img_size, geometry, a.mask_ratio, a.per_sample_masks, 0)
    masks = "per-sample masks" if a.per_sample_masks else "one mask per micro-batch"
    print(f"== loader: {a.model}, {geometry.img_size} px, batch {a.batch}, {masks}"
          f"{', plans padded (--cuda_graphs)' if a.cuda_graphs else ''}, {images.describe()}, torch {torch.__version__}")
    split = _split(ds, a.batch, a.split_reps)
    total = sum(split.values())
    print("one worker, per micro-batch (median of %d):" % a.split_reps)
    for k, v in split.items():
        print(f"  {k:22s} {v:8.1f} ms  {100 * v / total:5.1f}%")
    print(f"  {'total':22s} {total:8.1f} ms  -> {1e3 * a.batch / total:.0f} img/s per worker")
    need = a.batches + max(a.workers, 1)
    if len(images) < a.batch:
        print(f"loader: {len(images)} images, fewer than one micro-batch of {a.batch}")
        return 1
    # one loader across epochs, as the trainer runs it (StepSampler's end)
    sampler = data.StepSampler(len(images), a.batch, 1, 1, 0, seed=0, end=need)
    seen, t_start, t_end = 0, None, None
    for _ in data.make_loader(ds, sampler, a.workers, pin_memory=False):
        seen += 1
        t_end = time.perf_counter()             # the last item's arrival, not the workers' shutdown
        if seen == max(a.workers, 1):          # the workers' first items: start-up, not rate
            t_start = t_end
    if t_start is None or seen <= max(a.workers, 1):
        print("loader: too few micro-batches to time")
        return 1
    dt = t_end - t_start
    timed = seen - max(a.workers, 1)
    print(f"loader, {a.workers} workers: {timed} micro-batches in {dt:.2f} s = {timed * a.batch / dt:.0f} img/s "
          f"({1e3 * dt / timed:.1f} ms per micro-batch, {len(images) // a.batch} per epoch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
