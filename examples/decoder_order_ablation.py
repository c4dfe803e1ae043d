#!/usr/bin/env python3
"""Does the released decoder's shuffled input matter? GreenMIM's decoder order (each visible
latent at its own unit) against the released one (a random permutation of the visible latents
among the visible units), at decoder depths 1, 2 and 4, over 3 seeds, on a CPU.

Every arm trains a nano Swin (embed 32) with greenmim.pretrain's recipe on scikit-image's sample
photographs, for the same steps, with the same seeds, data order, crops and masks (they derive
from (seed, epoch, step, micro-batch), not from the arm). At the end each model's masked-unit
loss is measured on the two held-out photographs under 32 fixed masks each (1.0 = predicting
each unit's mean). Writes into --out: results.md (the table), results.json, loss_curves.png,
reconstructions.png (held-out images: original, masked input, both orders).

    python examples/decoder_order_ablation.py                  # ~30 min on 2 cores
    python examples/decoder_order_ablation.py --steps 60 --seeds 0 --depths 1   # a quick look

What it cannot show: reconstruction is not fine-tuning accuracy. docs/pretraining.md gives the
torchrun command that runs the same comparison at scale on ImageNet.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from greenmim.pretrain import args as pargs
from greenmim.pretrain import data, dist, engine, report

COLORS = {"greenmim": (27, 94, 32), "released": (183, 28, 28)}


def run_arm(order: str, depth: int, seed: int, a) -> dict:
    argv = ["--model", "green_mim_swin_nano_patch4_dec128b1", "--decoder_order", order, "--decoder_depth",
            str(depth), "--seed", str(seed), "--batch_size", str(a.batch), "--epochs", str(a.epochs),
            "--warmup_epochs", "1", "--lr", str(a.lr), "--max_steps", str(a.steps), "--output_dir", "",
            "--num_workers", str(a.workers), "--vis_freq", "1000"]
    args = pargs.parser().parse_args(argv)
    pargs.validate(args)
    t = time.perf_counter()
    s = engine.run(args, dist.setup("cpu", False))
    model = s["model"]
    held = data.held_out_photographs(224).repeat(32, 1, 1, 1)
    masks = model.random_masks(len(held), 0.75, torch.Generator().manual_seed(12345))
    model.eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(777)
        loss = float(model(held, model.plan(masks, cache=False), g)[0])
    return dict(order=order, depth=depth, seed=seed, losses=s["losses"], held_out=loss,
                train_last50=statistics.mean(s["losses"][-50:]), seconds=time.perf_counter() - t, model=model)


def smooth(xs, k=20):
    return [statistics.mean(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def plot_curves(results, depths, path):
    """Training loss (moving mean of 20 steps, mean over seeds) per arm, one panel per depth."""
    from PIL import Image, ImageDraw
    W, H, pad = 420, 300, 46
    img = Image.new("RGB", (W * len(depths), H + 30), "white")
    d = ImageDraw.Draw(img)
    curves = {}
    for r in results:
        curves.setdefault((r["order"], r["depth"]), []).append(r["losses"])
    lo, hi = 0.6, 1.15
    for i, depth in enumerate(depths):
        x0 = i * W
        d.rectangle([x0 + pad, 10, x0 + W - 10, H - pad + 10], outline="black")
        d.text((x0 + W // 2 - 40, H - pad + 22), f"step (decoder depth {depth})", fill="black")
        for v in (0.7, 0.8, 0.9, 1.0, 1.1):
            y = 10 + (hi - v) / (hi - lo) * (H - pad)
            d.line([x0 + pad, y, x0 + W - 10, y], fill=(220, 220, 220))
            d.text((x0 + 8, y - 6), f"{v:.1f}", fill="black")
        for order, color in COLORS.items():
            runs = curves.get((order, depth))
            if not runs:
                continue
            mean = [statistics.mean(c) for c in zip(*runs)]
            ys = smooth(mean)
            n = len(ys)
            pts = [(x0 + pad + j / max(n - 1, 1) * (W - pad - 10), 10 + (hi - min(max(y, lo), hi)) / (hi - lo) * (H - pad))
                   for j, y in enumerate(ys)]
            d.line(pts, fill=color, width=2)
        for k, (order, color) in enumerate(COLORS.items()):
            d.line([x0 + W - 150, 20 + 14 * k, x0 + W - 130, 20 + 14 * k], fill=color, width=3)
            d.text((x0 + W - 125, 14 + 14 * k), order, fill="black")
    d.text((8, H + 12), "masked-unit training loss (norm_pix; 1.0 = each unit's mean), mean of seeds, "
                        "moving mean of 20 steps", fill="black")
    img.save(path)


def reconstructions(results, path):
    """Held-out photographs (4 masks each): original, masked input, greenmim order, released order
    (depth 1, the first seed)."""
    from torchvision.utils import save_image
    pick = {r["order"]: r["model"] for r in results if r["depth"] == min(x["depth"] for x in results)
            and r["seed"] == min(x["seed"] for x in results)}
    held = data.held_out_photographs(224).repeat(4, 1, 1, 1)
    masks = pick["greenmim"].random_masks(len(held), 0.75, torch.Generator().manual_seed(5))
    rows = [report.denormalize(held)]
    unit = pick["greenmim"].unit
    m = (~masks).float().view(-1, 1, 7, 7).repeat_interleave(unit, 2).repeat_interleave(unit, 3)
    rows.append(report.denormalize(held) * (1 - m) + 0.5 * m)
    for order in ("greenmim", "released"):
        model = pick[order].eval()
        with torch.no_grad():
            _, pred, mask = model(held, model.plan(masks, cache=False), torch.Generator().manual_seed(9))
            _, pasted = model.reconstruct(held, pred, mask)
        rows.append(report.denormalize(pasted))
    save_image(torch.cat(rows), path, nrow=len(held), padding=2, pad_value=1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--depths", default="1,2,4")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default="decoder_order_ablation")
    a = ap.parse_args(argv)
    a.epochs = max(1, -(-a.steps * a.batch // (15 * 64)))          # the schedule spans the run
    seeds = [int(s) for s in a.seeds.split(",")]
    depths = [int(d) for d in a.depths.split(",")]
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    for depth in depths:
        for seed in seeds:
            for order in ("greenmim", "released"):
                r = run_arm(order, depth, seed, a)
                results.append(r)
                print(f"ablation: order {order:8s} depth {depth} seed {seed}: train (last 50) {r['train_last50']:.4f}, "
                      f"held-out {r['held_out']:.4f} ({r['seconds']:.0f} s)", flush=True)
    lines = [f"{a.steps} steps x {a.batch} images, nano Swin, seeds {a.seeds}; held-out: 2 photographs x 32 masks; "
             f"mean +- std over seeds (min..max)", "",
             "| decoder order | depth | held-out masked-unit loss | training loss (last 50 steps) |", "|---|---|---|---|"]
    for depth in depths:
        for order in ("greenmim", "released"):
            rs = [r for r in results if r["order"] == order and r["depth"] == depth]
            h, t = [r["held_out"] for r in rs], [r["train_last50"] for r in rs]
            sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0
            lines.append(f"| {order} | {depth} | {statistics.mean(h):.4f} +- {sd(h):.4f} ({min(h):.4f}..{max(h):.4f}) | "
                         f"{statistics.mean(t):.4f} +- {sd(t):.4f} |")
    total = time.perf_counter() - t0
    lines += ["", f"wall time {total / 60:.1f} min ({os.cpu_count()} CPUs, torch {torch.__version__})"]
    open(os.path.join(a.out, "results.md"), "w").write("\n".join(lines) + "\n")
    json.dump([{k: v for k, v in r.items() if k != "model"} for r in results],
              open(os.path.join(a.out, "results.json"), "w"))
    plot_curves(results, depths, os.path.join(a.out, "loss_curves.png"))
    reconstructions(results, os.path.join(a.out, "reconstructions.png"))
    print("\n".join(lines))
    print(f"ablation: wrote {a.out}/results.md, results.json, loss_curves.png, reconstructions.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
