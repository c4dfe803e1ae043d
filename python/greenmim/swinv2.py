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
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._lib import GreenmimError
from .indices import StagePartition, StagePlan
from .ops import group_window_attention
from .released import released_group_attention
from .swin import ATTN_IMPLS, Mlp, VisibleSwinTransformer, drop_path


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
        if attn_impl not in ATTN_IMPLS:
            raise GreenmimError(f"greenmim: attn_impl must be one of {ATTN_IMPLS}, got {attn_impl!r}")
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
        self.drop_path = drop_path
        self.attn = GroupWindowAttentionV2(dim, num_heads, window_size, qkv_bias, proj_drop, pretrained_window_size,
                                           attn_impl)
        self.norm1 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)
        self.norm2 = norm_layer(dim)

    def forward(self, x: Tensor, stage: StagePlan, sample_of_token: Optional[Tensor] = None) -> Tensor:
        part = stage.partitions[1 if self.shifted else 0]
        x = x + drop_path(self.norm1(self.attn(x, part)), self.drop_path, self.training, sample_of_token)
        return x + drop_path(self.norm2(self.mlp(x)), self.drop_path, self.training, sample_of_token)


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


class VisibleSwinTransformerV2(VisibleSwinTransformer):
    """Swin Transformer V2 (timm layout) on visible tokens; same interface as
    :class:`VisibleSwinTransformer` (``plan``, ``forward(images, plan)``)."""

    def __init__(self, img_size: int = 256, window_size: int = 8, pretrained_window_sizes=(0, 0, 0, 0), **kw):
        n = len(kw.get("depths", (2, 2, 6, 2)))
        super().__init__(img_size=img_size, window_size=window_size, block_cls=SwinTransformerV2Block,
                         merge_cls=PatchMergingV2,
                         block_kw_per_stage=[dict(pretrained_window_size=pretrained_window_sizes[i]) for i in range(n)],
                         **kw)
        for m in self.modules():
            if isinstance(m, GroupWindowAttentionV2):
                nn.init.constant_(m.logit_scale, math.log(10.0))
                if m.q_bias is not None:
                    nn.init.zeros_(m.q_bias)
                    nn.init.zeros_(m.v_bias)


def _v2(embed_dim, depths, num_heads, img_size, window_size, **kw) -> VisibleSwinTransformerV2:
    return VisibleSwinTransformerV2(img_size=img_size, window_size=window_size, embed_dim=embed_dim, depths=depths,
                                    num_heads=num_heads, **kw)


def swinv2_base_window8_256(**kw) -> VisibleSwinTransformerV2:
    """timm's ``swinv2_base_window8_256``."""
    return _v2(128, (2, 2, 18, 2), (4, 8, 16, 32), 256, 8, **kw)


def swinv2_base_window16_256(**kw) -> VisibleSwinTransformerV2:
    """timm's ``swinv2_base_window16_256``."""
    return _v2(128, (2, 2, 18, 2), (4, 8, 16, 32), 256, 16, **kw)


def swinv2_large_window12_192(**kw) -> VisibleSwinTransformerV2:
    """timm's ``swinv2_large_window12_192``."""
    return _v2(192, (2, 2, 18, 2), (6, 12, 24, 48), 192, 12, **kw)
