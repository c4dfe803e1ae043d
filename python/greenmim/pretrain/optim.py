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


def nonfinite(loss: torch.Tensor, params) -> torch.Tensor:
    """1.0 (a float32 tensor on the loss's device) when the loss or any gradient holds a NaN or an
    infinity, else 0.0; computed on the device, nothing read back. The gradients' largest
    magnitudes come from one multi-tensor kernel (``_foreach_norm``, ord inf), which propagates a
    NaN; FSDP2's sharded gradients are checked shard by shard (the caller all-reduces the flag)."""
    grads = [p.grad for p in params if p.grad is not None]
    grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    grads = [g for g in grads if g.numel()]          # FSDP2: a rank's shard of a small parameter may be empty
    worst = [loss.detach().float().reshape(1)]
    if grads:
        worst.append(torch.stack(torch._foreach_norm(grads, float("inf"))).float().max().reshape(1))
    return (~torch.isfinite(torch.cat(worst))).any().float()


def on_device_skip(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` skips a step on the device when ``opt.found_inf`` is 1 (torch's fused AdamW,
    as GradScaler drives it): then nothing waits for the host."""
    return bool(opt.defaults.get("fused"))


def step_unless(opt: torch.optim.Optimizer, found: torch.Tensor) -> None:
    """``opt.step()`` unless ``found`` (``nonfinite``) is 1: on the device with a fused AdamW (the
    step count is not advanced either), else decided on the host (one read of the flag)."""
    if on_device_skip(opt):
        opt.found_inf = found
        opt.step()
    elif not bool(found):
        opt.step()
