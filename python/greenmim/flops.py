"""Counting a visible-token encoder's FLOPs with torch's own counter
(``torch.utils.flop_counter.FlopCounterMode``), stage by stage.

torch's counter knows aten's matmuls and convolutions, not greenmim's custom ops nor (in the
torch this was written against) the CPU flash SDPA kernel: :func:`register_flop_formulas`
gives it their formulas (shape-only, in torch's convention: 2 FLOPs per multiply-add).
On the CPU, eager, the grouped attention and the block conv run in torch's matmuls, which the
counter sees as they are (padded groups included); the depthwise conv is the custom op.

    macs = greenmim.flops.stage_macs(model, images, plan)     # [4] multiply-adds per stage
    macs = greenmim.flops.stage_macs(timm_twins, images)      # the same names: timm's all-token Twins

Only matmul-shaped work is counted (linear layers, attention scores and values, convs):
LayerNorm, softmax, GELU and index copies are not, as in ``greenmim simulate``.
"""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor, nn

_registered = False


def register_flop_formulas() -> None:
    """Teaches ``FlopCounterMode`` greenmim's ops (idempotent)."""
    global _registered
    if _registered:
        return
    from torch.utils.flop_counter import flop_registry, register_flop_formula
    from . import conv_ops, ops  # noqa: F401  (the ops must be registered first)
    g = torch.ops.greenmim

    def attention(q_shape, group_size, index):
        B, _, H, D = q_shape          # index: the shapes of gather, scatter, slot_window, slot_coord
        slots = index[0][0]           # num_groups * G
        return 2 * 2 * B * H * D * slots * group_size     # S = Q K^T, O = P V over each group

    def new(op) -> bool:
        return op.default not in flop_registry

    if new(g.attention_fwd):
        @register_flop_formula(g.attention_fwd)
        def _(q, k, v, bias, index, group_size, *args, out_shape=None, **kw):
            return attention(q, group_size, index)

        @register_flop_formula(g.attention_bwd)       # dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q
        def _(d_o, q, k, v, o, lse, bias, index, group_size, *args, out_shape=None, **kw):
            return 2 * attention(q, group_size, index)

        @register_flop_formula(g.attention_packed_fwd)
        def _(qkv, bias, index, group_size, *args, out_shape=None, **kw):
            B, N, _, H, D = qkv
            return attention((B, N, H, D), group_size, index)

        @register_flop_formula(g.attention_packed_bwd)
        def _(d_o, qkv, o, lse, bias, index, group_size, *args, out_shape=None, **kw):
            B, N, _, H, D = qkv
            return 2 * attention((B, N, H, D), group_size, index)

        @register_flop_formula(g.depthwise_conv3x3_fwd)
        def _(x, nbr, weight, *args, out_shape=None, **kw):        # k x k taps a token (PEG 3x3, ConvNeXt 7x7)
            return 2 * weight[-2] * weight[-1] * x[0] * x[1] * x[2]

        @register_flop_formula(g.depthwise_conv3x3_bwd)   # dx, and dweight when asked
        def _(dy, x, nbr, weight, residual, need_dw, *args, out_shape=None, **kw):
            return (2 if need_dw else 1) * 2 * weight[-2] * weight[-1] * x[0] * x[1] * x[2]

        @register_flop_formula(g.block_conv_fwd)
        def _(x, gather, weight, *args, out_shape=None, **kw):
            return 2 * x[0] * gather[0] * weight[0] * weight[1] * weight[2] * weight[3]

        @register_flop_formula(g.block_conv_bwd)          # dA = dY W', and dW' = dY^T A when asked
        def _(dy, x, gather, weight, need_dw, *args, out_shape=None, **kw):
            return (2 if need_dw else 1) * 2 * x[0] * gather[0] * weight[0] * weight[1] * weight[2] * weight[3]

    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None and new(cpu_sdpa):
        @register_flop_formula(cpu_sdpa)
        def _(q, k, v, *args, out_shape=None, **kw):
            b, h, s_q, d = q
            return 2 * b * h * s_q * k[2] * (d + v[3])
    _registered = True


class _Features(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, img: Tensor, plan=None) -> Tensor:
        return self.model.forward_features(img) if plan is None else self.model.forward_features(img, plan)


def stage_macs(model: nn.Module, img: Tensor, plan=None, backward: bool = False) -> List[float]:
    """Multiply-adds of ``model.forward_features`` per stage, summed over the batch: the stage's
    patch embedding (``patch_embeds.i``), blocks (``blocks.i``) and PEG (``pos_block.i``), the
    names of timm's Twins and of :class:`greenmim.VisibleTwins`. ``plan=None`` runs
    ``forward_features(img)`` (timm's all-token model). ``backward``: the backward's too."""
    from torch.utils.flop_counter import FlopCounterMode
    register_flop_formulas()
    counter = FlopCounterMode(display=False)
    with counter:
        out = _Features(model)(img, plan)          # a call through a root module names every submodule
        if backward:
            out.sum().backward()
    counts = counter.get_flop_counts()
    n = len(model.blocks)

    def total(name: str) -> float:
        return float(sum(counts.get(f"_Features.model.{name}", {}).values()))
    # a ModuleList is never called: the counter names each block, not the stage's list
    return [(total(f"patch_embeds.{i}") + sum(total(f"blocks.{i}.{j}") for j in range(len(model.blocks[i])))
             + total(f"pos_block.{i}")) / 2 for i in range(n)]


def twins_stage_formula(model: nn.Module, plan, batch: int, padded_lsa_linear: bool = True) -> List[float]:
    """``greenmim simulate``'s multiply-adds of each Twins stage for a shared-mask ``plan``
    (tools/simulate_twins.cpp, restated): LSA is the planner's cost of the stage's partition
    (``4 G C^2 + 2 G^2 C`` a group: the qkv and output projections counted over padded slots too,
    unless ``padded_lsa_linear=False``: over the tokens only, as the model computes them), GSA
    ``q + sr conv (M sr^2 C^2: a partly visible block's masked inputs are multiplied too) + kv +
    scores + proj``, MLP, PEG ``9 N C``, patch embedding ``N C_in k^2 C``.
    ``batch``: images per shared mask; a per-sample plan counts all its samples (pass 1), GSA's
    scores over the padded ``[samples, max_tokens, max_keys]`` layout the model attends in
    (the sum of the samples' ``N_b M_b`` when they are all the same size)."""
    out = []
    for i, st in enumerate(plan.stages):
        C, depth, sr = model.embed_dims[i], model.depths[i], model.sr_ratios[i]
        N = st.num_tokens
        M = st.num_keys
        mlp = model.blocks[i][0].mlp.fc1.out_features / C
        part = st.partition
        lsa = part.num_groups * (4.0 * part.group_size * C * C + 2.0 * part.group_size ** 2 * C)
        if not padded_lsa_linear:
            lsa -= 4.0 * C * C * (part.num_groups * part.group_size - N)
        scores = N * M if st.cu_seqlens is None else st.num_masks * st.max_tokens * st.max_keys
        # the sr conv reads whole blocks: M sr^2 = N when every block is whole (unit masks)
        gsa = N * C * C + (M * sr * sr * C * C if sr > 1 else 0) + 2 * M * C * C + 2 * scores * C + N * C * C
        c_in, k = (model.patch_embeds[0].proj.in_channels, model.patch_size) if i == 0 else (model.embed_dims[i - 1], 2)
        total = ((depth + 1) // 2) * lsa + (depth // 2) * gsa + depth * 2 * mlp * N * C * C + 9 * N * C \
            + N * c_in * k * k * C
        out.append(batch * total)
    return out
