"""Swin Transformer V2 on visible tokens (SimMIM pretrained SwinV2-H and -G this way).

V2's window attention differs from V1 in two places, both handled outside the fused kernel:
- scaled cosine attention: q and k are L2-normalised per head and the logits multiplied by a
  learnable per-head ``exp(min(logit_scale, log 100))``; that factor is folded into q, so the
  kernel runs with scale 1;
- log-spaced continuous position bias: ``cpb_mlp`` maps the log-spaced relative coordinates to a
  ``[(2w-1)^2, heads]`` table, then ``16 * sigmoid``: exactly the bias table the kernels take,
  and its gradient reaches the MLP through the table.
Blocks are post-norm (``x + norm1(attn(x))``), patch merging reduces then normalises. Module
tree and parameter names are timm's ``SwinTransformerV2`` (``logit_scale``, ``cpb_mlp``,
``q_bias``/``v_bias``), so its state_dicts load.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._lib import GreenmimError
from .mask_plan import MaskPlan, StagePartition, StagePlan, window_geometry
from .layers import (ClassifierHead, DropPath, Mlp, PatchEmbed, check_attn_impl, drop_path_rates, forward_stages,
                     init_linear, plan_for)
from .ops import group_window_attention
from .released import released_group_attention
from .swin import SWIN_B, SWIN_L


def log_spaced_coords(window: int, pretrained_window: int = 0) -> Tensor:
    """timm's ``relative_coords_table``: ``[1, 2w-1, 2w-1, 2]``, normalised to [-8, 8] by the
    (pretrained) window, then ``sign(x) * log2(|x| + 1) / log2(8)``. Row (dh, dw) of its flat
    view is bucket ``(dh + w - 1) * (2w - 1) + dw + w - 1``: greenmim's rel_pos_index order."""
    r = torch.arange(-(window - 1), window, dtype=torch.float32)
    t = torch.stack(torch.meshgrid(r, r, indexing="ij")).permute(1, 2, 0).contiguous().unsqueeze(0)
    t = t / ((pretrained_window if pretrained_window > 0 else window) - 1)
    t = t * 8
    return torch.sign(t) * torch.log2(t.abs() + 1.0) / math.log2(8)


class GroupWindowAttentionV2(nn.Module):
    """timm's V2 ``WindowAttention`` on visible tokens: ``[B, N, C] -> [B, N, C]``."""

    def __init__(self, dim: int, num_heads: int, window_size: int, qkv_bias: bool = True, proj_drop: float = 0.0,
                 pretrained_window_size: int = 0, attn_impl: str = "greenmim"):
        super().__init__()
        check_attn_impl(attn_impl)
        if window_size < 2:
            raise GreenmimError("greenmim: Swin V2's log-spaced position bias needs a window of at least 2")
        self.dim, self.num_heads, self.window_size = dim, num_heads, window_size
        self.head_dim = dim // num_heads
        self.attn_impl = attn_impl
        self.logit_scale = nn.Parameter(torch.full((num_heads, 1, 1), math.log(10.0)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 512, bias=True), nn.ReLU(inplace=True),
                                     nn.Linear(512, num_heads, bias=False))
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        if qkv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.register_buffer("k_bias", torch.zeros(dim), persistent=False)
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.k_bias = self.v_bias = None
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.register_buffer("relative_coords_table", log_spaced_coords(window_size, pretrained_window_size),
                             persistent=False)

    def bias_table(self) -> Tensor:
        """``16 * sigmoid(cpb_mlp(coords))``: ``[(2w-1)^2, heads]``, differentiable into the MLP."""
        t = self.cpb_mlp(self.relative_coords_table.to(self.cpb_mlp[0].weight.dtype)).view(-1, self.num_heads)
        return 16 * torch.sigmoid(t)

    def forward(self, x: Tensor, part: StagePartition) -> Tensor:
        B, N, C = x.shape
        if part.window != self.window_size:
            raise GreenmimError(f"greenmim: partition of window {part.window}, layer has window {self.window_size}")
        bias = None if self.q_bias is None else torch.cat((self.q_bias, self.k_bias, self.v_bias))
        qkv = F.linear(x, self.qkv.weight, bias).view(B, N, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(2)
        logit = torch.clamp(self.logit_scale, max=math.log(100.0)).exp().view(1, 1, self.num_heads, 1)
        q = F.normalize(q, dim=-1) * logit                     # the per-head scale, folded into q
        k = F.normalize(k, dim=-1)
        table = self.bias_table()
        if self.attn_impl == "greenmim":
            o = group_window_attention(q, k.to(q.dtype), v.to(q.dtype), table, part, scale=1.0)
        else:
            o = released_group_attention(q, k.to(q.dtype), v.to(q.dtype), table, part, scale=1.0)
        return self.proj_drop(self.proj(o.reshape(B, N, C).to(x.dtype)))


class SwinTransformerV2Block(nn.Module):
    """Post-norm residuals: ``x + norm1(attn(x))``, ``x + norm2(mlp(x))``."""

    def __init__(self, dim: int, num_heads: int, window_size: int, shifted: bool, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, proj_drop: float = 0.0, drop_path: float = 0.0, norm_layer=nn.LayerNorm,
                 attn_impl: str = "greenmim", pretrained_window_size: int = 0):
        super().__init__()
        self.shifted = shifted
        self.attn = GroupWindowAttentionV2(dim, num_heads, window_size, qkv_bias, proj_drop, pretrained_window_size,
                                           attn_impl)
        self.norm1 = norm_layer(dim)
        self.drop_path1 = DropPath(drop_path)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)
        self.norm2 = norm_layer(dim)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: Tensor, stage: StagePlan, sample_of_token: Optional[Tensor] = None) -> Tensor:
        part = stage.partitions[1 if self.shifted else 0]
        x = x + self.drop_path1(self.norm1(self.attn(x, part)), sample_of_token, stage.num_masks)
        return x + self.drop_path2(self.norm2(self.mlp(x)), sample_of_token, stage.num_masks)


class PatchMergingV2(nn.Module):
    """V2's patch merging on visible tokens: gather the 2x2 block, Linear(4C -> 2C), LayerNorm(2C)."""

    def __init__(self, dim: int, out_dim: Optional[int] = None, norm_layer=nn.LayerNorm):
        super().__init__()
        self.out_dim = out_dim or 2 * dim
        self.reduction = nn.Linear(4 * dim, self.out_dim, bias=False)
        self.norm = norm_layer(self.out_dim)

    def forward(self, x: Tensor, merge: Tensor) -> Tensor:
        B, _, C = x.shape
        x = x.index_select(1, merge.flatten()).view(B, merge.shape[0], 4 * C)
        return self.norm(self.reduction(x))


class SwinTransformerV2Stage(nn.Module):
    """Patch merging (all stages but the first), then the stage's blocks, alternately plain and
    shifted windows."""

    def __init__(self, dim: int, out_dim: int, depth: int, downsample: bool, num_heads: int, window_size: int,
                 mlp_ratio: float, qkv_bias: bool, proj_drop: float, drop_path: Sequence[float], norm_layer,
                 attn_impl: str, pretrained_window_size: int = 0):
        super().__init__()
        self.downsample = PatchMergingV2(dim, out_dim, norm_layer) if downsample else nn.Identity()
        self.blocks = nn.ModuleList([
            SwinTransformerV2Block(out_dim, num_heads, window_size, shifted=(i % 2 == 1), mlp_ratio=mlp_ratio,
                                   qkv_bias=qkv_bias, proj_drop=proj_drop, drop_path=drop_path[i],
                                   norm_layer=norm_layer, attn_impl=attn_impl,
                                   pretrained_window_size=pretrained_window_size)
            for i in range(depth)])

    def forward(self, x: Tensor, stage: StagePlan, merge_in: Optional[Tensor],
                sample_of_token: Optional[Tensor]) -> Tensor:
        if merge_in is not None:
            x = self.downsample(x, merge_in)
        for blk in self.blocks:
            x = blk(x, stage, sample_of_token)
        return x


class VisibleSwinTransformerV2(nn.Module):
    """Swin Transformer V2 (timm layout) on the visible tokens of masked images; the interface of
    :class:`greenmim.VisibleSwinTransformer`: ``plan``, ``forward_features(images, plan)`` (the
    last stage's visible tokens after the final norm), ``forward_head``, and ``forward`` = both."""

    def __init__(self, img_size: int = 256, patch_size: int = 4, in_chans: int = 3, embed_dim: int = 96,
                 depths: Sequence[int] = (2, 2, 6, 2), num_heads: Sequence[int] = (3, 6, 12, 24),
                 window_size: int = 8, mlp_ratio: float = 4.0, qkv_bias: bool = True, proj_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, norm_layer=nn.LayerNorm, num_classes: int = 0,
                 global_pool: str = "avg", attn_impl: str = "greenmim", strategy: str = "fast",
                 pretrained_window_sizes: Sequence[int] = (0, 0, 0, 0)):
        super().__init__()
        self.img_size, self.patch_size, self.window_size = img_size, patch_size, window_size
        self.embed_dim, self.depths, self.strategy = embed_dim, tuple(depths), strategy
        n = len(depths)
        self.num_features = embed_dim * 2 ** (n - 1)
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, norm_layer)
        dpr = drop_path_rates(drop_path_rate, depths)
        grid = img_size // patch_size
        layers, in_dim = [], embed_dim
        for i in range(n):
            out_dim = embed_dim * 2 ** i
            win = window_geometry(grid >> i, grid >> i, window_size, 0)[0]  # timm's small-stage window
            layers.append(SwinTransformerV2Stage(in_dim, out_dim, depths[i], i > 0, num_heads[i], win, mlp_ratio,
                                                 qkv_bias, proj_drop_rate, dpr[i], norm_layer, attn_impl,
                                                 pretrained_window_sizes[i]))
            in_dim = out_dim
        self.layers = nn.ModuleList(layers)
        self.norm = norm_layer(self.num_features)
        self.head = ClassifierHead(self.num_features, num_classes, pool_type=global_pool)
        self.apply(init_linear)  # Linear layers only: logit_scale, q_bias, v_bias keep the attention's values

    def plan(self, visible: Tensor, device=None, cache: bool = True) -> MaskPlan:
        """Plans a mask (bool ``[h, w]`` shared or ``[B, h, w]`` per sample, True = visible) for
        this model's geometry; see :func:`greenmim.plan_masks`."""
        return plan_for(self, visible, device, cache)

    def forward_features(self, img: Tensor, plan: MaskPlan) -> Tensor:
        return forward_stages(self, img, plan)

    def forward_head(self, x: Tensor, plan: MaskPlan, pre_logits: bool = False) -> Tensor:
        """Average over each sample's visible tokens, then ``head.fc`` (unless ``pre_logits``)."""
        return self.head(x, plan, pre_logits=pre_logits)

    def forward(self, img: Tensor, plan: MaskPlan) -> Tensor:
        return self.forward_head(self.forward_features(img, plan), plan)


ENCODERS = {   # timm's names; presets from swin.py
    "swinv2_base_window8_256": (VisibleSwinTransformerV2, dict(SWIN_B, img_size=256, window_size=8),
                                "Swin V2-B, timm's swinv2_base_window8_256"),
    "swinv2_base_window16_256": (VisibleSwinTransformerV2, dict(SWIN_B, img_size=256, window_size=16),
                                 "Swin V2-B, timm's swinv2_base_window16_256"),
    "swinv2_large_window12_192": (VisibleSwinTransformerV2, dict(SWIN_L, img_size=192, window_size=12),
                                  "Swin V2-L, timm's swinv2_large_window12_192"),
}


def _v2(name: str, kw: dict) -> VisibleSwinTransformerV2:
    cls, preset, _ = ENCODERS[name]
    return cls(**{**preset, **kw})


def swinv2_base_window8_256(**kw) -> VisibleSwinTransformerV2:
    """timm's ``swinv2_base_window8_256``."""
    return _v2("swinv2_base_window8_256", kw)


def swinv2_base_window16_256(**kw) -> VisibleSwinTransformerV2:
    """timm's ``swinv2_base_window16_256``."""
    return _v2("swinv2_base_window16_256", kw)


def swinv2_large_window12_192(**kw) -> VisibleSwinTransformerV2:
    """timm's ``swinv2_large_window12_192``."""
    return _v2("swinv2_large_window12_192", kw)
