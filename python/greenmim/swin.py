"""A Swin Transformer that computes on the visible tokens of a masked image only.

The module tree and parameter names are timm's ``SwinTransformer`` (``patch_embed.proj``,
``layers.N.downsample.{norm,reduction}``, ``layers.N.blocks.M.attn.{qkv,proj,
relative_position_bias_table}``, ``norm``, ``head.fc``), so a timm ``state_dict`` loads with no
key mapping. Tokens are ``[B, N, C]`` (one shared mask: the visible tokens of each sample,
row-major) or ``[1, sum N_b, C]`` (per-sample masks, sample-major): see :mod:`greenmim.mask_plan`.

    model = swin_base_patch4_window7_224()
    plan = model.plan(greenmim.random_masks(), device="cuda")   # a shared 7x7 mask
    feats = model.forward_features(images, plan)                # [B, 12, 1024]: 12 of 49 units visible
    logits = model.forward_head(feats, plan)                    # = model(images, plan)
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ._lib import GreenmimError
from .mask_plan import MaskPlan, StagePartition, StagePlan, window_geometry
from .layers import (ATTN_IMPLS, ClassifierHead, DropPath, Mlp, PatchEmbed, check_attn_impl, drop_path, norm_linear,
                     drop_path_rates, forward_stages, init_linear, plan_for)
from .ops import group_window_attention_packed
from .released import released_group_attention

__all__ = ["GroupWindowAttention", "SwinTransformerBlock", "PatchMerging", "SwinTransformerStage",
           "VisibleSwinTransformer", "swin_base_patch4_window7_224", "swin_large_patch4_window7_224",
           "ATTN_IMPLS", "Mlp", "PatchEmbed", "drop_path"]


class GroupWindowAttention(nn.Module):
    """Drop-in for timm's ``WindowAttention`` on visible tokens: ``[B, N, C] -> [B, N, C]`` with
    the partition of the block's (plain or shifted) windows. ``attn_impl="released"`` runs the
    released PyTorch path instead of greenmim's ops (a baseline)."""

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, qkv_bias: bool = True,
                 proj_drop: float = 0.0, head_dim: Optional[int] = None, attn_impl: str = "greenmim"):
        super().__init__()
        check_attn_impl(attn_impl)
        self.dim, self.num_heads, self.window_size = dim, num_heads, window_size
        self.head_dim = head_dim or dim // num_heads
        attn_dim = self.head_dim * num_heads
        self.scale = self.head_dim ** -0.5
        self.attn_impl = attn_impl
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        self.qkv = nn.Linear(dim, attn_dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(attn_dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.recompute = True   # norm= applied through norm_linear (layers.set_activation_recompute)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: Tensor, part: StagePartition, norm: Optional[nn.Module] = None) -> Tensor:
        """``attn(x)``, or ``attn(norm(x))`` with the norm's output recomputed in the backward."""
        B, N, _ = x.shape
        if part.window != self.window_size:
            raise GreenmimError(f"greenmim: partition of window {part.window}, layer has window {self.window_size}")
        if norm is not None:
            qkv = norm_linear(x, norm, self.qkv) if self.recompute else self.qkv(norm(x))
        else:
            qkv = self.qkv(x)
        qkv = qkv.view(B, N, 3, self.num_heads, self.head_dim)
        if self.attn_impl == "greenmim":
            o = group_window_attention_packed(qkv, self.relative_position_bias_table, part, scale=self.scale)
        else:
            q, k, v = qkv.unbind(2)
            o = released_group_attention(q, k, v, self.relative_position_bias_table, part, scale=self.scale)
        return self.proj_drop(self.proj(o.reshape(B, N, -1)))


class SwinTransformerBlock(nn.Module):
    """Pre-norm residuals: ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``."""

    def __init__(self, dim: int, num_heads: int, window_size: int, shifted: bool, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, proj_drop: float = 0.0, drop_path: float = 0.0,
                 norm_layer=nn.LayerNorm, attn_impl: str = "greenmim"):
        super().__init__()
        self.shifted = shifted
        self.norm1 = norm_layer(dim)
        self.attn = GroupWindowAttention(dim, num_heads, window_size, qkv_bias, proj_drop, attn_impl=attn_impl)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: Tensor, stage: StagePlan, sample_of_token: Optional[Tensor] = None) -> Tensor:
        part = stage.partitions[1 if self.shifted else 0]
        x = x + self.drop_path1(self.attn(x, part, norm=self.norm1), sample_of_token, stage.num_masks)
        return x + self.drop_path2(self.mlp(x, norm=self.norm2), sample_of_token, stage.num_masks)


class PatchMerging(nn.Module):
    """timm's PatchMerging on visible tokens: gather each 2x2 block (Swin's order), LayerNorm(4C),
    Linear(4C -> 2C)."""

    def __init__(self, dim: int, out_dim: Optional[int] = None, norm_layer=nn.LayerNorm):
        super().__init__()
        self.out_dim = out_dim or 2 * dim
        self.norm = norm_layer(4 * dim)
        self.reduction = nn.Linear(4 * dim, self.out_dim, bias=False)

    def forward(self, x: Tensor, merge: Tensor) -> Tensor:
        B, _, C = x.shape
        x = x.index_select(1, merge.flatten()).view(B, merge.shape[0], 4 * C)
        return self.reduction(self.norm(x))


class SwinTransformerStage(nn.Module):
    """Patch merging (all stages but the first), then the stage's blocks, alternately plain and
    shifted windows."""

    def __init__(self, dim: int, out_dim: int, depth: int, downsample: bool, num_heads: int, window_size: int,
                 mlp_ratio: float, qkv_bias: bool, proj_drop: float, drop_path: Sequence[float], norm_layer,
                 attn_impl: str):
        super().__init__()
        self.downsample = PatchMerging(dim, out_dim, norm_layer) if downsample else nn.Identity()
        self.blocks = nn.ModuleList([
            SwinTransformerBlock(out_dim, num_heads, window_size, shifted=(i % 2 == 1), mlp_ratio=mlp_ratio,
                                 qkv_bias=qkv_bias, proj_drop=proj_drop, drop_path=drop_path[i],
                                 norm_layer=norm_layer, attn_impl=attn_impl)
            for i in range(depth)])

    def forward(self, x: Tensor, stage: StagePlan, merge_in: Optional[Tensor],
                sample_of_token: Optional[Tensor]) -> Tensor:
        if merge_in is not None:
            x = self.downsample(x, merge_in)
        for blk in self.blocks:
            x = blk(x, stage, sample_of_token)
        return x


class VisibleSwinTransformer(nn.Module):
    """Swin Transformer (timm layout) on the visible tokens of masked images.

    ``forward_features(images, plan)`` returns the last stage's visible tokens after the final
    norm: ``[B, N_last, C_last]`` with a shared mask, ``[1, sum N_b, C_last]`` with per-sample
    masks (``plan.stages[-1].cu_seqlens`` splits it). ``forward_head`` pools each sample's tokens
    and applies ``head.fc``; ``forward(images, plan)`` is both, as in timm (with
    ``num_classes=0`` the pooled features). ``plan`` comes from :meth:`plan`."""

    def __init__(self, img_size: int = 224, patch_size: int = 4, in_chans: int = 3, embed_dim: int = 96,
                 depths: Sequence[int] = (2, 2, 6, 2), num_heads: Sequence[int] = (3, 6, 12, 24),
                 window_size: int = 7, mlp_ratio: float = 4.0, qkv_bias: bool = True, proj_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, norm_layer=nn.LayerNorm, num_classes: int = 0,
                 global_pool: str = "avg", attn_impl: str = "greenmim", strategy: str = "fast"):
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
            layers.append(SwinTransformerStage(in_dim, out_dim, depths[i], i > 0, num_heads[i], win, mlp_ratio,
                                               qkv_bias, proj_drop_rate, dpr[i], norm_layer, attn_impl))
            in_dim = out_dim
        self.layers = nn.ModuleList(layers)
        self.norm = norm_layer(self.num_features)
        self.head = ClassifierHead(self.num_features, num_classes, pool_type=global_pool)
        self.apply(init_linear)

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


# ---- presets: each stated once (mim.py and swinv2.py build on them; tests/test_mim.py checks them
# against the C++ CLI's copy in include/greenmim/models.hpp) ----------------------------------------

SWIN_NANO = dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))   # a toy for CPUs and tests
SWIN_T = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
SWIN_B = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
SWIN_L = dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48))

# encoder name (timm's): (class, keyword arguments, what it is); greenmim.create_model builds them
ENCODERS = {
    "swin_base_patch4_window7_224": (VisibleSwinTransformer, dict(SWIN_B, img_size=224, window_size=7),
                                     "Swin-B, timm's swin_base_patch4_window7_224 layout"),
    "swin_large_patch4_window7_224": (VisibleSwinTransformer, dict(SWIN_L, img_size=224, window_size=7),
                                      "Swin-L, timm's swin_large_patch4_window7_224 layout"),
}


def swin_base_patch4_window7_224(**kw) -> VisibleSwinTransformer:
    """Swin-B, timm's ``swin_base_patch4_window7_224`` layout."""
    cls, preset, _ = ENCODERS["swin_base_patch4_window7_224"]
    return cls(**{**preset, **kw})


def swin_large_patch4_window7_224(**kw) -> VisibleSwinTransformer:
    """Swin-L, timm's ``swin_large_patch4_window7_224`` layout."""
    cls, preset, _ = ENCODERS["swin_large_patch4_window7_224"]
    return cls(**{**preset, **kw})
