"""Grouped window attention for CPU tensors in torch's own batched kernels (the default CPU path
of :func:`greenmim.group_window_attention` and its packed twin).

Per group of G slots: S = scale * Q K^T + bias, cross-window and padding pairs set to -inf
(exactly zero weight, where the released code adds -100), softmax, P V; autograd gives the
backward. It runs the same batched matmuls as the released path but gathers a packed qkv once
and keeps each partition's masking term, so it is at least as fast; the Eigen reference (the
custom op's CPU kernel, and the oracle of the tests) loops over windows and loses to both.

A matmul multiplies masked weights (exact zeros) with every value of the group, so a NaN or inf
in one window's V would reach the other windows of its group. As the CUDA kernels do with a
non-finite tile, a forward whose output is not all finite runs again on the exact path (the
custom op, whose CPU kernel visits each window's pairs only).
"""
from __future__ import annotations

import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from ._lib import GreenmimError


def check_partition(part) -> None:
    """The partition is a bijection between tokens and real slots, as the kernels and the
    reference check before they run."""
    g, sc = part.gather, part.scatter
    S, N = g.numel(), sc.numel()
    bad = (S > 0 and (int(g.min()) < -1 or int(g.max()) >= N)) or (N > 0 and (int(sc.min()) < 0 or int(sc.max()) >= S))
    if not bad and N > 0:
        bad = not torch.equal(g.index_select(0, sc.long()).long(), torch.arange(N, device=g.device))
    if bad:
        raise GreenmimError("greenmim: attention forward: partition indices out of range or not each other's "
                            "inverse (gather/scatter of another stage or mask, or modified ones?)")


_structures: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # partition -> (window, structure)


def forget(part) -> None:
    """Drops what was derived from ``part``'s indices (they were overwritten: MaskPlan.copy_)."""
    _structures.pop(part, None)


def _structure(part, window: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Per group ``[ng, G, G]``: which (query, key) slot pairs share a window, which may attend
    (those, and each padding query to itself only, so that its softmax row stays finite), and
    each pair's row of the bias table. Kept on the partition (computed once per plan)."""
    cache = _structures.get(part)
    if cache is not None and cache[0] == window:
        return cache[1]
    check_partition(part)
    G = part.group_size
    ng = part.slot_window.numel() // G
    sw = part.slot_window.view(ng, G).long()
    sc = part.slot_coord.view(ng, G).long()
    h, w = sc >> 16, sc & 0xFFFF
    real = sw >= 0
    same = (sw.unsqueeze(2) == sw.unsqueeze(1)) & real.unsqueeze(2)
    pad_diag = (~real).unsqueeze(2) & torch.eye(G, dtype=torch.bool, device=sw.device).unsqueeze(0)
    rel = ((h.unsqueeze(2) - h.unsqueeze(1)) + window - 1) * (2 * window - 1) + (w.unsqueeze(2) - w.unsqueeze(1)) \
        + window - 1
    out = (same, same | pad_diag, torch.where(same, rel, torch.zeros_like(rel)))
    _structures[part] = (window, out)
    return out


def _attend(qg: Tensor, kg: Tensor, vg: Tensor, bias: Optional[Tensor], structure, scale: float) -> Tensor:
    """qg, kg, vg ``[B, ng, H, G, D]`` -> ``[B, ng, H, G, D]``."""
    same, allowed, rel = structure
    ng, G, _ = rel.shape
    dt, dev = qg.dtype, qg.device
    # one small [ng, H, G, G] term: the bias within windows, -inf across windows and to padding
    # (a NaN score across windows then survives as NaN: the caller's finiteness check reruns exactly)
    add = torch.where(allowed, torch.zeros((), dtype=dt, device=dev), torch.full((), float("-inf"), dtype=dt,
                                                                                  device=dev)).unsqueeze(1)
    if bias is not None:
        b = bias.to(dt).index_select(0, rel.reshape(-1)).view(ng, G, G, -1).permute(0, 3, 1, 2)
        add = torch.where(same.unsqueeze(1), b, add)
    s = torch.matmul(qg * scale, kg.transpose(-1, -2)) + add                  # [B, ng, H, G, G]
    return torch.matmul(torch.softmax(s, dim=-1), vg)


def _ungroup(o: Tensor, part) -> Tensor:
    B, ng, H, G, D = o.shape
    return o.permute(0, 1, 3, 2, 4).reshape(B, ng * G, H, D).index_select(1, part.scatter.long())


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], part, window: int, scale: float) -> Tensor:
    """``[B, N, H, D]`` q, k, v -> ``[B, N, H, D]``. Padding slots read token 0 (masked keys,
    discarded queries)."""
    B, N, H, D = q.shape
    structure = _structure(part, window)                    # checks the partition first
    G, idx = part.group_size, part.gather.long().clamp(min=0)
    ng = idx.numel() // G
    grp = lambda t: t.index_select(1, idx).view(B, ng, G, H, D).permute(0, 1, 3, 2, 4)
    return _ungroup(_attend(grp(q), grp(k), grp(v), bias, structure, scale), part)


def attention_packed(qkv: Tensor, bias: Optional[Tensor], part, window: int, scale: float) -> Tensor:
    """The packed ``[B, N, 3, H, D]`` projection: one gather for q, k and v (one scatter-add in
    the backward)."""
    B, N, _, H, D = qkv.shape
    structure = _structure(part, window)                    # checks the partition first
    G, idx = part.group_size, part.gather.long().clamp(min=0)
    ng = idx.numel() // G
    g = qkv.index_select(1, idx).view(B, ng, G, 3, H, D).permute(3, 0, 1, 4, 2, 5)  # [3, B, ng, H, G, D]
    return _ungroup(_attend(g[0], g[1], g[2], bias, structure, scale), part)


def finite(t: Tensor) -> bool:
    """True when ``t`` sums to a finite value: always so when every entry is finite (an
    overflowing sum of finite values only sends the call to the exact path, which is right too)."""
    return bool(torch.isfinite(t.detach().sum()))
