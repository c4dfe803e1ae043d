"""A Swin Transformer that computes on the visible tokens of a masked image only.

The module tree and parameter names are timm's ``SwinTransformer`` (``patch_embed.proj``,
``layers.N.downsample.{norm,reduction}``, ``layers.N.blocks.M.attn.{qkv,proj,
relative_position_bias_table}``, ``norm``, ``head.fc``), so a timm ``state_dict`` loads with no
key mapping. Tokens are ``[B, N, C]`` (one shared mask: the visible tokens of each sample,
row-major) or ``[1, sum N_b, C]`` (per-sample masks, sample-major): see :mod:`greenmim.indices`.

    model = swin_base_patch4_window7_224()
    plan = model.plan(greenmim.random_masks(), device="cuda")   # a shared 7x7 mask
    feats = model(images, plan)                                  # [B, 49 * 12 / 49..., 1024]
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .indices import MaskPlan, StagePartition, StagePlan, plan_masks, window_geometry
from .ops import group_window_attention_packed
from .released import released_group_attention
from ._lib import GreenmimError

ATTN_IMPLS = ("greenmim", "released")


def drop_path(x: Tensor, p: float, training: bool, sample_of_token: Optional[Tensor]) -> Tensor:
    """Stochastic depth per sample; with the flat per-sample layout ``sample_of_token`` says
    which sample each token belongs to."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    if sample_of_token is None:
        m = x.new_empty((x.shape[0], 1, 1)).bernoulli_(keep)
    else:
        n = int(sample_of_token.max()) + 1 if sample_of_token.numel() else 0
        m = x.new_empty((n,)).bernoulli_(keep)[sample_of_token].view(1, -1, 1)
    return x * m / keep


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class GroupWindowAttention(nn.Module):
    """Drop-in for timm's ``WindowAttention`` on visible tokens: ``[B, N, C] -> [B, N, C]`` with
    the partition of the block's (plain or shifted) windows. ``attn_impl="released"`` runs the
    released PyTorch path instead of greenmim's ops (a baseline)."""

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, qkv_bias: bool = True,
                 proj_drop: float = 0.0, head_dim: Optional[int] = None, attn_impl: str = "greenmim"):
        super().__init__()
        if attn_impl not in ATTN_IMPLS:
            raise GreenmimError(f"greenmim: attn_impl must be one of {ATTN_IMPLS}, got {attn_impl!r}")
        self.dim, self.num_heads, self.window_size = dim, num_heads, window_size
        self.head_dim = head_dim or dim // num_heads
        attn_dim = self.head_dim * num_heads
        self.scale = self.head_dim ** -0.5
        self.attn_impl = attn_impl
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        self.qkv = nn.Linear(dim, attn_dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(attn_dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: Tensor, part: StagePartition) -> Tensor:
        B, N, _ = x.shape
        if part.window != self.window_size:
            raise GreenmimError(f"greenmim: partition of window {part.window}, layer has window {self.window_size}")
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim)
        if self.attn_impl == "greenmim":
            o = group_window_attention_packed(qkv, self.relative_position_bias_table, part, scale=self.scale)
        else:
            q, k, v = qkv.unbind(2)
            o = released_group_attention(q, k, v, self.relative_position_bias_table, part, scale=self.scale)
        return self.proj_drop(self.proj(o.reshape(B, N, -1)))


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, window_size: int, shifted: bool, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, proj_drop: float = 0.0, drop_path: float = 0.0,
                 norm_layer=nn.LayerNorm, attn_impl: str = "greenmim"):
        super().__init__()
        self.shifted = shifted
        self.drop_path = drop_path
        self.norm1 = norm_layer(dim)
        self.attn = GroupWindowAttention(dim, num_heads, window_size, qkv_bias, proj_drop, attn_impl=attn_impl)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)

    def forward(self, x: Tensor, stage: StagePlan, sample_of_token: Optional[Tensor] = None) -> Tensor:
        part = stage.partitions[1 if self.shifted else 0]
        x = x + drop_path(self.attn(self.norm1(x), part), self.drop_path, self.training, sample_of_token)
        return x + drop_path(self.mlp(self.norm2(x)), self.drop_path, self.training, sample_of_token)


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
    def __init__(self, dim: int, out_dim: int, depth: int, downsample: bool, num_heads: int, window_size: int,
                 mlp_ratio: float, qkv_bias: bool, proj_drop: float, drop_path: Sequence[float], norm_layer,
                 attn_impl: str, block_cls=None, merge_cls=None, **block_kw):
        super().__init__()
        block_cls = block_cls or SwinTransformerBlock
        merge_cls = merge_cls or PatchMerging
        self.downsample = merge_cls(dim, out_dim, norm_layer) if downsample else nn.Identity()
        self.blocks = nn.ModuleList([
            block_cls(out_dim, num_heads, window_size, shifted=(i % 2 == 1), mlp_ratio=mlp_ratio,
                      qkv_bias=qkv_bias, proj_drop=proj_drop, drop_path=drop_path[i],
                      norm_layer=norm_layer, attn_impl=attn_impl, **block_kw)
            for i in range(depth)])

    def forward(self, x: Tensor, stage: StagePlan, merge_in: Optional[Tensor],
                sample_of_token: Optional[Tensor]) -> Tensor:
        if merge_in is not None:
            x = self.downsample(x, merge_in)
        for blk in self.blocks:
            x = blk(x, stage, sample_of_token)
        return x


class PatchEmbed(nn.Module):
    """timm's PatchEmbed (Conv2d k = s = patch, LayerNorm), applied to the visible patches only."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, norm_layer=nn.LayerNorm):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = norm_layer(embed_dim)

    def forward(self, img: Tensor, plan: MaskPlan) -> Tensor:
        B, Cin, Hi, Wi = img.shape
        p = self.patch_size
        gh, gw = Hi // p, Wi // p
        if (gh, gw) != plan.patch_grid:
            raise GreenmimError(f"greenmim: image {Hi}x{Wi} gives a {gh}x{gw} patch grid, the plan is for "
                                f"{plan.patch_grid[0]}x{plan.patch_grid[1]}")
        if plan.per_sample and B != plan.num_masks:
            raise GreenmimError(f"greenmim: {B} images, {plan.num_masks} per-sample masks")
        patches = img.view(B, Cin, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, Cin * p * p)
        if plan.per_sample:
            patches = patches.reshape(1, B * gh * gw, -1)
        x = patches.index_select(1, plan.patch_index)
        return self.norm(F.linear(x, self.proj.weight.flatten(1), self.proj.bias))


class VisibleSwinTransformer(nn.Module):
    """Swin Transformer (timm layout) on the visible tokens of masked images.

    ``forward(images, plan)`` returns the last stage's visible tokens after the final norm:
    ``[B, N_last, C_last]`` with a shared mask, ``[1, sum N_b, C_last]`` with per-sample masks
    (``plan.stages[-1].cu_seqlens`` splits it). ``plan`` comes from :meth:`plan`."""

    def __init__(self, img_size: int = 224, patch_size: int = 4, in_chans: int = 3, embed_dim: int = 96,
                 depths: Sequence[int] = (2, 2, 6, 2), num_heads: Sequence[int] = (3, 6, 12, 24),
                 window_size: int = 7, mlp_ratio: float = 4.0, qkv_bias: bool = True, proj_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, norm_layer=nn.LayerNorm, num_classes: int = 0,
                 attn_impl: str = "greenmim", strategy: str = "fast", block_cls=None, merge_cls=None,
                 block_kw_per_stage: Optional[Sequence[dict]] = None):
        super().__init__()
        self.img_size, self.patch_size, self.window_size = img_size, patch_size, window_size
        self.embed_dim, self.depths, self.strategy = embed_dim, tuple(depths), strategy
        n = len(depths)
        self.num_features = embed_dim * 2 ** (n - 1)
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, norm_layer)
        total = sum(depths)  # stochastic depth rising linearly (plain floats: meta-device construction works)
        dpr = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        grid = img_size // patch_size
        layers, in_dim, start = [], embed_dim, 0
        for i in range(n):
            out_dim = embed_dim * 2 ** i
            win = window_geometry(grid >> i, grid >> i, window_size, 0)[0]  # timm's small-stage window
            extra = block_kw_per_stage[i] if block_kw_per_stage else {}
            layers.append(SwinTransformerStage(in_dim, out_dim, depths[i], i > 0, num_heads[i], win, mlp_ratio,
                                               qkv_bias, proj_drop_rate, dpr[start:start + depths[i]], norm_layer,
                                               attn_impl, block_cls, merge_cls, **extra))
            in_dim, start = out_dim, start + depths[i]
        self.layers = nn.ModuleList(layers)
        self.norm = norm_layer(self.num_features)
        self.head = nn.Module()
        self.head.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def plan(self, visible: Tensor, device=None, cache: bool = True) -> MaskPlan:
        """Plans a mask (bool ``[h, w]`` shared or ``[B, h, w]`` per sample, True = visible) for
        this model's geometry; see :func:`greenmim.plan_masks`."""
        return plan_masks(visible, img_size=self.img_size, patch_size=self.patch_size, window_size=self.window_size,
                          num_stages=len(self.layers), embed_dim=self.embed_dim, strategy=self.strategy,
                          device=device, cache=cache)

    def forward_features(self, img: Tensor, plan: MaskPlan) -> Tensor:
        if len(plan.stages) != len(self.layers):
            raise GreenmimError(f"greenmim: plan has {len(plan.stages)} stages, the model {len(self.layers)}")
        x = self.patch_embed(img, plan)
        for i, layer in enumerate(self.layers):
            stage = plan.stages[i]
            sample_of_token = None
            if plan.per_sample and self.training and layer.blocks[0].drop_path > 0:
                counts = stage.cu_seqlens[1:] - stage.cu_seqlens[:-1]
                sample_of_token = torch.repeat_interleave(torch.arange(counts.numel(), device=x.device), counts)
            x = layer(x, stage, plan.stages[i - 1].merge if i > 0 else None, sample_of_token)
        return self.norm(x)

    def forward_head(self, x: Tensor, plan: MaskPlan) -> Tensor:
        """Average over each sample's visible tokens, then ``head.fc``."""
        if plan.per_sample:  # a segment mean on the device: no host sync per sample
            cu = plan.stages[-1].cu_seqlens
            counts = cu[1:] - cu[:-1]
            sample = torch.repeat_interleave(torch.arange(plan.num_masks, device=x.device), counts)
            sums = x.new_zeros((plan.num_masks, x.shape[-1])).index_add_(0, sample, x[0])
            x = sums / counts.clamp(min=1).unsqueeze(1).to(x.dtype)
        else:
            x = x.mean(1)
        return self.head.fc(x)

    def forward(self, img: Tensor, plan: MaskPlan) -> Tensor:
        return self.forward_features(img, plan)


def _swin(embed_dim, depths, num_heads, **kw) -> VisibleSwinTransformer:
    return VisibleSwinTransformer(embed_dim=embed_dim, depths=depths, num_heads=num_heads, **kw)


def swin_base_patch4_window7_224(**kw) -> VisibleSwinTransformer:
    """Swin-B, timm's ``swin_base_patch4_window7_224`` layout."""
    return _swin(128, (2, 2, 18, 2), (4, 8, 16, 32), **kw)


def swin_large_patch4_window7_224(**kw) -> VisibleSwinTransformer:
    """Swin-L, timm's ``swin_large_patch4_window7_224`` layout."""
    return _swin(192, (2, 2, 18, 2), (6, 12, 24, 48), **kw)
