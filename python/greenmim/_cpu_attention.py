"""Grouped window attention for CPU tensors in torch's own batched kernels (the default CPU path
of :func:`greenmim.group_window_attention` and its packed twin).

Per group of G slots: S = scale * Q K^T + bias, cross-window and padding pairs set to -inf
(exactly zero weight, where the released code adds -100), softmax, P V; autograd gives the
backward. It runs the same batched matmuls as the released path but gathers a packed qkv once
and keeps each partition's masking term, so it is at least as fast; the Eigen reference (the
custom op's CPU kernel, and the oracle of the tests) loops over windows and loses to both.

A matmul multiplies masked weights (exact zeros) with every value of the group, so a NaN or inf
in one window's V would reach the other windows of its group, and in the backward a NaN in one
window's output gradient would reach every dq, dk, dv of its group (per sample: other samples).
As the CUDA kernels do with a non-finite tile, such numbers go to the exact path, which visits
each window's pairs only: a forward whose output is not all finite runs again as the custom op
(ops.py), and a backward whose gradients are not all finite runs again on the reference
(:class:`_Attention`).
"""
from __future__ import annotations

import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _attention_abi
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


def _scores_bias(bias: Optional[Tensor], structure, like: Tensor) -> Tensor:
    """One small ``[ng, H, G, G]`` term: the bias within windows, -inf across windows and to
    padding (a NaN score across windows then survives as NaN: the caller's finiteness check
    reruns exactly)."""
    same, allowed, rel = structure
    ng, G, _ = rel.shape
    dt, dev = like.dtype, like.device
    add = torch.where(allowed, torch.zeros((), dtype=dt, device=dev), torch.full((), float("-inf"), dtype=dt,
                                                                                  device=dev)).unsqueeze(1)
    if bias is not None:
        b = bias.to(dt).index_select(0, rel.reshape(-1)).view(ng, G, G, -1).permute(0, 3, 1, 2)
        add = torch.where(same.unsqueeze(1), b, add)
    return add


def _attend(qg: Tensor, kg: Tensor, vg: Tensor, bias: Optional[Tensor], structure,
            scale: float) -> Tuple[Tensor, Tensor]:
    """qg, kg, vg ``[B, ng, H, G, D]`` -> the output ``[B, ng, H, G, D]`` and the weights."""
    s = torch.matmul(qg * scale, kg.transpose(-1, -2)) + _scores_bias(bias, structure, qg)   # [B, ng, H, G, G]
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vg), p


def _slots(t: Tensor) -> Tensor:
    """``[B, ng, H, G, D]`` -> ``[B, ng * G, H, D]``: one row per slot."""
    B, ng, H, G, D = t.shape
    return t.permute(0, 1, 3, 2, 4).reshape(B, ng * G, H, D)


def _grouped(packed: bool, features, part) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k, v gathered into groups, ``[B, ng, H, G, D]`` each. Padding slots read token 0."""
    G, idx = part.group_size, part.gather.long().clamp(min=0)
    ng = idx.numel() // G
    if packed:
        (qkv,) = features
        B, N, _, H, D = qkv.shape
        return tuple(qkv.index_select(1, idx).view(B, ng, G, 3, H, D).permute(3, 0, 1, 4, 2, 5))
    B, N, H, D = features[0].shape
    return tuple(t.index_select(1, idx).view(B, ng, G, H, D).permute(0, 1, 3, 2, 4) for t in features)


def _composite(packed: bool, part, window: int, scale: float, bias: Optional[Tensor], features) -> Tensor:
    structure = _structure(part, window)                    # checks the partition first
    og, _ = _attend(*_grouped(packed, features, part), bias, structure, scale)
    return _slots(og).index_select(1, part.scatter.long())


class _Attention(torch.autograd.Function):
    """The composite, with a backward written out whose gradients are checked. A masked weight is
    an exact zero, but a matmul still multiplies it with every value of the group: a NaN or inf in
    one window's output gradient would reach every dq, dk, dv of its group (per sample: other
    samples). When a gradient is not all finite, the backward runs again on the reference, which
    keeps each window's numbers in its window (the kernels do the same with a non-finite tile);
    otherwise the check costs one sum per gradient. Formulas (autograd's own, in its order):
    dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = dS^T (scale Q),
    d(bias) = dS summed over the batch into each same-window pair's row of the table. A double
    backward (``create_graph=True``) differentiates the composite itself, as before."""

    @staticmethod
    def forward(ctx, packed: bool, part, window: int, scale: float, bias: Optional[Tensor], *features: Tensor):
        structure = _structure(part, window)                # checks the partition first
        og, p = _attend(*_grouped(packed, features, part), bias, structure, scale)
        ctx.save_for_backward(p, bias, *features)
        ctx.packed, ctx.part, ctx.window, ctx.scale, ctx.structure = packed, part, window, scale, structure
        return _slots(og).index_select(1, part.scatter.long())

    @staticmethod
    def backward(ctx, d_o: Tensor):
        p, bias, *features = ctx.saved_tensors
        part, scale, packed = ctx.part, ctx.scale, ctx.packed
        need_bias = bias is not None and ctx.needs_input_grad[4]
        need = ctx.needs_input_grad[5:]
        if torch.is_grad_enabled():         # create_graph: autograd through the composite
            with torch.enable_grad():
                o = _composite(packed, part, ctx.window, scale, bias, features)
                wrt = [t for t, n in zip((bias, *features), ctx.needs_input_grad[4:]) if n]
                got = iter(torch.autograd.grad(o, wrt, d_o, create_graph=True))
            return (None,) * 4 + tuple(next(got) if n else None for n in ctx.needs_input_grad[4:])
        qg, kg, vg = _grouped(packed, features, part)
        B, ng, H, G, D = qg.shape
        sc = part.scatter.long()
        d_slots = d_o.new_zeros((B, ng * G, H, D)).index_copy_(1, sc, d_o)
        d_og = d_slots.view(B, ng, G, H, D).permute(0, 1, 3, 2, 4)
        dv = torch.matmul(p.transpose(-1, -2), d_og)
        dp = torch.matmul(d_og, vg.transpose(-1, -2))
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dq = torch.matmul(ds, kg) * scale
        dk = torch.matmul(ds.transpose(-1, -2), qg * scale)
        grads = [_slots(t).index_select(1, sc) for t in (dq, dk, dv)]
        db = None
        if need_bias:
            same, _, rel = ctx.structure
            rows = torch.where(same.unsqueeze(-1), ds.sum(0).permute(0, 2, 3, 1), torch.zeros((), dtype=ds.dtype))
            db = torch.zeros(bias.shape, dtype=ds.dtype).index_add_(0, rel.reshape(-1), rows.reshape(-1, H))
        if not all(finite(t) for t in grads + ([db] if need_bias else [])):
            q, k, v = features[0].unbind(2) if packed else features
            grads = [torch.empty(q.shape, dtype=q.dtype) for _ in range(3)]
            db = _exact_grads(d_o, q, k, v, bias, part, ctx.window, scale, need_bias, *grads)
        db = db.to(bias.dtype) if need_bias else None
        if packed:
            return (None,) * 4 + (db, torch.stack(grads, 2) if need[0] else None)
        return (None,) * 4 + (db, *(g if n else None for g, n in zip(grads, need)))


def _exact_grads(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], part, window: int,
                 scale: float, need_dbias: bool, dq: Tensor, dk: Tensor, dv: Tensor) -> Optional[Tensor]:
    """The reference's forward and backward (each window's pairs only): writes dq, dk, dv and
    returns d(bias) (or None)."""
    ix = _attention_abi.Index(part.gather, part.scatter, part.slot_window, part.slot_coord, part.group_size, window, scale)
    o, lse = _attention_abi.attention_fwd(q, k, v, bias, ix)
    return _attention_abi.attention_bwd(d_o.contiguous(), q, k, v, o, lse, bias, ix, dq, dk, dv, need_dbias)


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], part, window: int, scale: float) -> Tensor:
    """``[B, N, H, D]`` q, k, v -> ``[B, N, H, D]``. Padding slots read token 0 (masked keys,
    discarded queries)."""
    return _Attention.apply(False, part, window, scale, bias, q, k, v)


def attention_packed(qkv: Tensor, bias: Optional[Tensor], part, window: int, scale: float) -> Tensor:
    """The packed ``[B, N, 3, H, D]`` projection: one gather for q, k and v (one packed gradient
    in the backward)."""
    return _Attention.apply(True, part, window, scale, bias, qkv)


def finite(t: Tensor) -> bool:
    """True when ``t`` sums to a finite value: always so when every entry is finite (an
    overflowing sum of finite values only sends the call to the exact path, which is right too)."""
    return bool(torch.isfinite(t.detach().sum()))
