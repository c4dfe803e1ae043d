"""The released GreenMIM attention path, in plain PyTorch (a baseline, and an independent check).

Gather q, k, v into ``[B, groups, G, heads, D]`` (zero padding), build the dense relative-position
bias and the additive mask (0 within a window, -100 across windows and on padding, as released),
softmax, multiply by V, scatter the rows back. Nothing of greenmim's compiled code is used beyond
the partition indices, so agreeing with it is evidence, not a tautology.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

MASK_VALUE = -100.0


def dense_bias_and_mask(bias_table: Optional[Tensor], part, window: int, heads: int, dtype, device):
    """``[groups, heads, G, G]`` additive term: bias within windows (table lookup from the
    absolute coordinates), -100 across windows and on padding."""
    G, ng = part.group_size, part.num_groups
    sw = part.slot_window.view(ng, G).long()
    sc = part.slot_coord.view(ng, G).long()
    h, w = sc >> 16, sc & 0xFFFF
    same = (sw[:, :, None] == sw[:, None, :]) & (sw[:, :, None] >= 0)
    rel = ((h[:, :, None] - h[:, None, :]) + window - 1) * (2 * window - 1) + (w[:, :, None] - w[:, None, :]) + window - 1
    out = torch.where(same, torch.zeros((), dtype=dtype, device=device),
                      torch.full((), MASK_VALUE, dtype=dtype, device=device)).unsqueeze(1).expand(ng, heads, G, G)
    if bias_table is not None:
        idx = torch.where(same, rel, torch.zeros_like(rel))
        b = bias_table[idx.view(-1)].view(ng, G, G, heads).permute(0, 3, 1, 2).to(dtype)
        out = out + b * same.unsqueeze(1)
    return out


def released_group_attention(q: Tensor, k: Tensor, v: Tensor, bias_table: Optional[Tensor], part,
                             window: Optional[int] = None, scale: Optional[float] = None) -> Tensor:
    """``[B, N, heads, D]`` in and out, differentiable by autograd through plain torch ops."""
    B, N, H, D = q.shape
    window = part.window if window is None else window
    scale = D ** -0.5 if scale is None else scale
    G, ng = part.group_size, part.num_groups
    idx = part.gather.long()
    real = (idx >= 0).view(1, -1, 1, 1)

    def group(t):
        g = torch.where(real, t.index_select(1, idx.clamp(min=0)), torch.zeros((), dtype=t.dtype, device=t.device))
        return g.view(B, ng, G, H, D).permute(0, 1, 3, 2, 4)  # [B, ng, H, G, D]

    qg, kg, vg = group(q) * scale, group(k), group(v)
    attn = qg @ kg.transpose(-2, -1) + dense_bias_and_mask(bias_table, part, window, H, q.dtype, q.device)
    out = attn.softmax(dim=-1) @ vg                       # [B, ng, H, G, D]
    out = out.permute(0, 1, 3, 2, 4).reshape(B, ng * G, H, D)
    return out.index_select(1, part.scatter.long())
