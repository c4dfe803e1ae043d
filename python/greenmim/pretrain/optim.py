"""The released recipe's optimizer and schedule: AdamW (0.9, 0.95), weight decay 0.05 except on
norms, biases, position tables and the mask token; lr = blr x effective batch / 256, a linear
warm-up per iteration, then a half-cycle cosine to min_lr."""
from __future__ import annotations

import math
from typing import List

import torch
from torch import nn

NO_DECAY_NAMES = ("relative_position_bias_table", "mask_token", "logit_scale", "cpb_mlp", "pos_embed")


def param_groups(model: nn.Module, weight_decay: float) -> List[dict]:
    """Two groups: decayed weights, and what timm and the released code exempt (1-D tensors:
    norms and biases; position tables; the mask token)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name.endswith(".bias") or any(n in name for n in NO_DECAY_NAMES):
            no_decay.append(p)
        else:
            decay.append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def adamw(model: nn.Module, lr: float, weight_decay: float, fused: bool = False,
          capturable: bool = False) -> torch.optim.AdamW:
    """``fused``: torch's fused AdamW (a few kernels per step instead of foreach's hundreds; on an
    H200 the foreach update took 19% of a GreenMIM Swin-B step's GPU time,
    docs/perf/NVIDIA_H200_2026-11-26b). The trainer asks for it on CUDA without FSDP; the update's
    arithmetic is AdamW's either way, not its bits. ``capturable``: the step count on the device,
    for a step captured in a CUDA graph (``--cuda_graphs``)."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95), fused=fused or None,
                             capturable=capturable)


def lr_at(epoch: float, lr: float, min_lr: float, warmup_epochs: float, epochs: float) -> float:
    """The learning rate at a fractional epoch (MAE's util/lr_sched.py)."""
    if epoch < warmup_epochs:
        return lr * epoch / warmup_epochs
    span = max(epochs - warmup_epochs, 1e-12)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup_epochs) / span))


def set_lr(opt: torch.optim.Optimizer, value: float) -> None:
    """A device-tensor learning rate (``--cuda_graphs``: a replayed AdamW reads it) is filled in
    place; a float is replaced."""
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(value)
        else:
            g["lr"] = value
