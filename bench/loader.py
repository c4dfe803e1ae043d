#!/usr/bin/env python3
"""greenmim.pretrain's input pipeline alone: how many images per second one loader worker makes,
where its time goes, and the same for the pipeline it replaced, in the same run.

Each loader item is one micro-batch, made in one worker: the images read, decoded, randomly
cropped, resized and flipped (uint8; the step normalises on its device), the masks drawn, and
the plan made (padded to the capacity with --cuda_graphs). Three ways to make the images:

- new (``--decode cpu``, data.MicroBatches): libjpeg-turbo into tensors (torchvision.io.decode_jpeg),
  crop as a view, torch's uint8 antialiased bicubic resize, flip (greenmim.pretrain.crops);
- baseline, the pipeline before it: PIL decode, torchvision's RandomResizedCrop(0.2-1, bicubic) on
  the PIL image, RandomHorizontalFlip, PILToTensor (data.train_crops);
- the worker's part of ``--decode gpu``: read the bytes, parse the header, draw the crops; with
  --gpu_decode (CUDA only) also the device's part, ``decode.GpuDecoder`` on micro-batches made
  beforehand (pinned, as the loader pins them).

    python bench/make_jpegs.py /tmp/jpegs
    python bench/loader.py --data_path /tmp/jpegs [--model NAME] [--batch 128] [--reps 6] [--json]
                           [--workers N --batches 20] [--per_sample_masks] [--cuda_graphs] [--gpu_decode]

The per-worker figures are measured in this process with one thread, as a DataLoader worker
runs, the new and the baseline micro-batches alternating (ABAB...) so that a change in the
machine's load hits both; "speedup" is the median of the paired ratios, with their range.
--workers N (default 0: skipped) also times a DataLoader with N workers (the files are in the page
cache by then, as in a second epoch). Without --data_path the sample photographs are used (they
are decoded once and kept, so "read + decode" is then near zero). With --json the last line is one
JSON object.
"""
import argparse
import json
import statistics
import sys
import time

import torch

from greenmim import mask_plan, mim
from greenmim.pretrain import crops, data, decode


def _masks_and_plan(ds, batch, g, t):
    masks = mask_plan.random_masks(batch if ds.per_sample else None, grid=ds.geometry.grid, ratio=ds.mask_ratio,
                                 generator=g)
    t["masks"] += time.perf_counter()
    t["plan"] -= time.perf_counter()
    ds.geometry.plan(masks)


def _new_image(ds: data.MicroBatches, i: int, g: torch.Generator):
    """``crops.crop_one`` split open: (crop, seconds by part, 1 if DCT-scaled)."""
    S = ds.size
    t0 = time.perf_counter()
    raw = ds.images.raw(i)
    t1 = time.perf_counter()
    info = None if isinstance(raw, torch.Tensor) else crops.jpeg_info(raw)
    if info is not None:
        box, flip = crops.draw_crop(g, info[0], info[1]), crops.draw_flip(g)
    t2 = time.perf_counter()
    dct = int(info is not None and crops.dct_scale(box, S) > 1)
    if dct:
        img = crops.crop_dct(raw, info[:2], box, False, S, crops.dct_scale(box, S))   # decode + crop/resize
        t3 = t4 = time.perf_counter()
    else:
        img = raw if isinstance(raw, torch.Tensor) else crops.decode_full(raw)
        if info is None:
            box, flip = crops.draw_crop(g, img.shape[-2], img.shape[-1]), crops.draw_flip(g)
        t3 = time.perf_counter()
        img = crops.resize_crop(img, box, False, S)
        t4 = time.perf_counter()
    img = img.flip(-1) if flip else img
    t5 = time.perf_counter()
    return img, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), dct


def new_batch(ds: data.MicroBatches, idx, seed: int) -> dict:
    """One micro-batch of the new CPU path, timed by part (ms). The same calls as ``crops.crop_one``
    and ``MicroBatches.__getitem__``, split open to time them."""
    t = dict.fromkeys(("read", "header + draws", "decode", "crop/resize", "flip", "collate", "masks", "plan"), 0.0)
    S, g, dct = ds.size, torch.Generator().manual_seed(seed), 0
    out = torch.empty(len(idx), 3, S, S, dtype=torch.uint8)
    for k, i in enumerate(idx):
        state = g.get_state()
        try:
            img, parts, d = _new_image(ds, i, g)
        except (crops.Unreadable, OSError):     # an unreadable file: the pipeline's skip, timed whole
            g.set_state(state)
            t0 = time.perf_counter()
            img = ds._first_readable(i, g, lambda raw, g: crops.crop_one(raw, g, S))[1]
            parts, d = (0.0, 0.0, time.perf_counter() - t0, 0.0, 0.0), 0
        t5 = time.perf_counter()
        out[k] = img
        dct += d
        for part, dt in zip(t, parts + (time.perf_counter() - t5,)):
            t[part] += dt
    t["masks"] -= time.perf_counter()
    _masks_and_plan(ds, len(idx), torch.Generator().manual_seed(seed ^ 0x5DEECE66D), t)
    t["plan"] += time.perf_counter()
    return {k: 1e3 * v for k, v in t.items()}, dct


def baseline_batch(ds: data.MicroBatches, idx, seed: int, transform) -> dict:
    """One micro-batch as the loader made it before: PIL decode, then data.train_crops' transforms
    one by one (timed by part), from torch's global generator seeded as it was."""
    t = dict.fromkeys(("read + decode (PIL)", "crop/resize (PIL)", "flip (PIL)", "to tensor", "collate", "masks",
                       "plan"), 0.0)
    rrc, flip, to_tensor = transform.transforms
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        ims = []
        for i in idx:
            t0 = time.perf_counter()
            im = ds.images.load(i)
            t1 = time.perf_counter()
            im = rrc(im)
            t2 = time.perf_counter()
            im = flip(im)
            t3 = time.perf_counter()
            ims.append(to_tensor(im))
            t4 = time.perf_counter()
            for part, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                t[part] += dt
        t["collate"] -= time.perf_counter()
        torch.stack(ims)
        t["collate"] += time.perf_counter()
    finally:
        torch.set_rng_state(state)
    t["masks"] -= time.perf_counter()
    _masks_and_plan(ds, len(idx), torch.Generator().manual_seed(seed ^ 0x5DEECE66D), t)
    t["plan"] += time.perf_counter()
    return {k: 1e3 * v for k, v in t.items()}


def _time_gpu_decode(ds_gpu: data.MicroBatches, n: int, batch: int, reps: int, device=None) -> dict:
    """The device's part of --decode gpu: GpuDecoder on micro-batches made beforehand, pinned as the
    loader pins them (ms, synchronised). ``device`` is CUDA but for the test of this function."""
    dev = torch.device(device or "cuda")
    cuda = dev.type == "cuda"
    dec = decode.GpuDecoder(dev, ds_gpu.size)
    encs = [ds_gpu[(1, r, 0, [(r * batch + i) % n for i in range(batch)])][0] for r in range(reps + 1)]
    if cuda:
        encs = [decode.EncodedBatch(*(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in e)) for e in encs]
    dec(encs[0])                                   # warm-up: nvJPEG's handles, the kernels
    ms = []
    for e in encs[1:]:
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        dec(e)
        if cuda:
            torch.cuda.synchronize(dev)
        ms.append(1e3 * (time.perf_counter() - t0))
    med = statistics.median(ms)
    return {"device": torch.cuda.get_device_name(dev) if cuda else str(dev), "ms_per_batch": round(med, 3),
            "images_per_s": round(1e3 * batch / med, 1), "fallbacks": dec.fallbacks, "failures": dec.failures}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data_path", default=None)
    ap.add_argument("--model", default="green_mim_swin_base_patch4_dec512b1")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--reps", "--split_reps", dest="reps", type=int, default=6,
                    help="micro-batches timed per pipeline, alternating")
    ap.add_argument("--workers", type=int, default=0, help="also time a DataLoader with this many workers")
    ap.add_argument("--batches", type=int, default=20, help="micro-batches the DataLoader is timed over")
    ap.add_argument("--per_sample_masks", action="store_true")
    ap.add_argument("--cuda_graphs", action="store_true", help="fixed G and plans padded to a capacity")
    ap.add_argument("--mask_ratio", type=float, default=0.75)
    ap.add_argument("--gpu_decode", action="store_true",
                    help="also time decode.GpuDecoder on the CUDA device (nvJPEG, crop, resize, flip)")
    ap.add_argument("--json", action="store_true", help="a JSON object as the last line")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.workers < 0 or a.batches < 1 or a.reps < 1:
        ap.error("--batch, --batches and --reps must be at least 1, --workers at least 0")
    if a.gpu_decode:
        try:
            decode.resolve_decode("gpu", torch.device("cuda"))
        except data.DataError as e:
            print(f"loader: {e}", file=sys.stderr)
            return 2
    torch.set_num_threads(1)                       # as in a DataLoader worker
    try:
        images = data.ImageFiles(a.data_path) if a.data_path else data.SamplePhotographs()
    except data.DataError as e:
        print(f"loader: {e}", file=sys.stderr)
        return 2
    if len(images) < a.batch:
        print(f"loader: {len(images)} images, fewer than one micro-batch of {a.batch}", file=sys.stderr)
        return 2
    model = mim.create_model(a.model)
    geometry = data.Geometry(model, fixed_groups=a.cuda_graphs)
    if a.cuda_graphs:
        geometry.capacity = geometry.capacity_for(a.batch, a.per_sample_masks, a.mask_ratio, 0)
    S = geometry.img_size
    ds = data.MicroBatches(images, S, geometry, a.mask_ratio, a.per_sample_masks, 0)
    ds_gpu = data.MicroBatches(images, S, geometry, a.mask_ratio, a.per_sample_masks, 0, decode="gpu")
    transform = data.train_crops(S)
    masks = "per-sample masks" if a.per_sample_masks else "one mask per micro-batch"
    padded = ", plans padded (--cuda_graphs)" if a.cuda_graphs else ""
    print(f"== loader: {a.model}, {S} px, batch {a.batch}, {masks}{padded}, {images.describe()}, "
          f"torch {torch.__version__}")
    n = len(images)
    for r in range(min(2, a.reps)):                # warm-up (page cache, first calls), untimed
        idx = [(r * a.batch + i) % n for i in range(a.batch)]
        new_batch(ds, idx, r)
        baseline_batch(ds, idx, r, transform)
    new_parts, base_parts, ratios, new_ms, base_ms, gpu_ms, dct = [], [], [], [], [], [], 0
    for r in range(a.reps):
        idx = [((r + 2) * a.batch + i) % n for i in range(a.batch)]
        item = (0, r, 0, idx)
        b = _timed(lambda: baseline_batch(ds, idx, r, transform))
        m = _timed(lambda: ds[item])
        g = _timed(lambda: ds_gpu[item])
        parts, d = new_batch(ds, idx, r)
        new_parts.append(parts)
        base_parts.append(baseline_batch(ds, idx, r, transform))
        new_ms.append(m)
        base_ms.append(b)
        gpu_ms.append(g)
        ratios.append(b / m)
        dct += d

    def med(rows):
        return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}

    split, base_split = med(new_parts), med(base_parts)
    rate = 1e3 * a.batch / statistics.median(new_ms)
    base_rate = 1e3 * a.batch / statistics.median(base_ms)
    gpu_rate = 1e3 * a.batch / statistics.median(gpu_ms)
    for title, sp, ms in (("new CPU path (--decode cpu)", split, new_ms), ("baseline (PIL + RandomResizedCrop)",
                                                                          base_split, base_ms)):
        total = sum(sp.values())
        print(f"{title}: one worker, per micro-batch (median of {a.reps}; parts timed separately):")
        for k, v in sp.items():
            print(f"  {k:22s} {v:8.1f} ms  {100 * v / total:5.1f}%")
        print(f"  {'item, end to end':22s} {statistics.median(ms):8.1f} ms  (range {min(ms):.1f}-{max(ms):.1f})"
              f" -> {1e3 * a.batch / statistics.median(ms):.0f} img/s per worker")
    print(f"--decode gpu, the worker's part (read, header, draws, masks, plan): {statistics.median(gpu_ms):.1f} ms "
          f"-> {gpu_rate:.0f} img/s per worker (the device's decode not included)")
    speedup = statistics.median(ratios)
    print(f"speedup of the new CPU path: {speedup:.2f}x (paired reps {min(ratios):.2f}-{max(ratios):.2f}x); "
          f"{dct} of {a.reps * a.batch} crops DCT-scaled")
    result = {"model": a.model, "batch": a.batch, "img_size": S, "data": images.describe(), "reps": a.reps,
              "images_per_s_per_worker": round(rate, 1), "split_ms_per_batch": split,
              "baseline_images_per_s_per_worker": round(base_rate, 1), "baseline_split_ms_per_batch": base_split,
              "speedup": round(speedup, 3), "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)],
              "gpu_decode_worker_images_per_s_per_worker": round(gpu_rate, 1),
              "dct_scaled_fraction": round(dct / (a.reps * a.batch), 4), "torch": torch.__version__}
    if a.workers > 0:
        need = a.batches + a.workers
        sampler = data.StepSampler(n, a.batch, 1, 1, 0, seed=0, end=need)
        seen, t_start, t_end = 0, None, None
        for _ in data.make_loader(ds, sampler, a.workers, pin_memory=False):
            seen += 1
            t_end = time.perf_counter()            # the last item's arrival, not the workers' shutdown
            if seen == a.workers:                  # the workers' first items: start-up, not rate
                t_start = t_end
        timed = seen - a.workers
        if t_start is not None and timed > 0:
            dt = t_end - t_start
            ips = timed * a.batch / dt
            print(f"loader, {a.workers} workers: {timed} micro-batches in {dt:.2f} s = {ips:.0f} img/s "
                  f"({1e3 * dt / timed:.1f} ms per micro-batch, {n // a.batch} per epoch)")
            result["loader"] = {"workers": a.workers, "images_per_s": round(ips, 1)}
    if a.gpu_decode:
        result["gpu_decode"] = _time_gpu_decode(ds_gpu, n, a.batch, a.reps)
        r = result["gpu_decode"]
        print(f"GpuDecoder on {r['device']}: {r['ms_per_batch']:.2f} ms per micro-batch of {a.batch} (median of "
              f"{a.reps}) = {r['images_per_s']:.0f} img/s; {r['fallbacks']} CPU fallbacks, {r['failures']} failures")
    if a.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
