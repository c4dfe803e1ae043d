#!/usr/bin/env python3
"""Fine-tune GreenMIM-pretrained weights with timm: pretrain (or take a checkpoint), export the
encoder to timm's format, load it with timm's own loader, and train a classifier for a few steps.

    python examples/finetune_timm.py                          # a nano model, pretrained 20 steps here
    python examples/finetune_timm.py --checkpoint out/checkpoint-399.pth --steps 100

The classes here are the sample photographs of scikit-image (one class each, random crops): a
smoke run of the path from pretraining to fine-tuning, not an accuracy experiment. For ImageNet,
pass the printed create_model call to your timm training script (timm's train.py takes
--pretrained --pretrained-path OUT, or the same pretrained_cfg_overlay).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

import greenmim
from greenmim import export
from greenmim.pretrain import cli, data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None, help="a greenmim.pretrain checkpoint (default: pretrain a nano)")
    ap.add_argument("--steps", type=int, default=10, help="fine-tuning steps")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--workdir", default=None, help="where the checkpoint and export go (default: a temp dir)")
    a = ap.parse_args(argv)
    import timm

    work = a.workdir or tempfile.mkdtemp(prefix="greenmim-finetune-")
    ckpt = a.checkpoint
    if ckpt is None:
        out = os.path.join(work, "pretrain")
        rc = cli.main(["--model", "green_mim_swin_nano_patch4_dec128b1", "--batch_size", "8", "--epochs", "1",
                       "--warmup_epochs", "0", "--lr", "1e-3", "--max_steps", "20", "--output_dir", out,
                       "--num_workers", "0", "--overwrite"])
        if rc:
            return rc
        ckpt = os.path.join(out, "checkpoint-0-step20.pth")
    photos = data.SamplePhotographs(repeats=1)
    classes = len(photos.names)
    weights = os.path.join(work, "timm_weights.pth")
    name, kwargs = export.export(ckpt, weights, num_classes=classes)
    print("exported:", export.create_model_call(name, kwargs, weights))
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=weights), **kwargs)
    size = model.patch_embed.img_size[0]
    tf = data.train_transform(size)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.05)
    g = torch.Generator().manual_seed(0)
    model.train()
    for step in range(1, a.steps + 1):
        labels = torch.randint(classes, (a.batch,), generator=g)
        x = torch.stack([tf(photos.load(int(c))) for c in labels])
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"fine-tune step {step}/{a.steps}: loss {loss.item():.4f}")
    print(f"finetune_timm: done ({name}, {classes} classes, weights from {ckpt})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
