"""Twins-SVT (alt_gvt) that computes on the visible tokens of a masked image only.

The module tree and parameter names are timm's ``Twins`` (``patch_embeds.N.{proj,norm}``,
``blocks.N.M.{norm1,attn,norm2,mlp}``, LSA ``attn.{qkv,proj}``, GSA ``attn.{q,kv,proj,sr,norm}``,
``pos_block.N.proj.0``, ``norm``, ``head``), so timm's ``twins_svt_*`` state dicts load with no
key mapping. Per stage, on the visible tokens of a :class:`greenmim.TwinsPlan`:

- patch embedding: stage 1 the visible 4x4 patches (a per-token linear map), later stages the
  2x2 block conv (:func:`greenmim.block_conv`);
- LSA (even blocks): attention within 7x7 windows, no position bias, on the grouped attention
  op (the windows' uneven visible counts packed by the planner, never shifted);
- GSA (odd blocks): every visible query attends the keys and values of its own sample, taken
  from the sr x sr block conv of the visible tokens (a block with no visible token gives no key);
- PEG after each stage's first block: the 3x3 submanifold depthwise conv, ``+ x``.

Tokens are ``[B, N, C]`` with a shared mask, ``[1, sum N_b, C]`` with per-sample masks.

    model = greenmim.twins_svt_large()
    plan = model.plan(greenmim.random_masks(), device="cuda")
    feats = model.forward_features(images, plan)        # [B, 12, 1024]
"""
from __future__ import annotations

import math
from functools import partial
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._lib import GreenmimError
from .conv_ops import block_conv, submanifold_depthwise_conv3x3
from .layers import DropPath, Mlp, PatchEmbed, check_attn_impl, drop_path_rates, token_samples, visible_mean
from .ops import group_window_attention_packed
from .released import released_group_attention
from .twins_plan import TwinsPlan, TwinsPlanSpec, TwinsStagePlan

__all__ = ["LocallyGroupedAttn", "GlobalSubSampleAttn", "Block", "PosConv", "SparsePatchEmbed", "VisibleTwins",
           "subsampled_attention", "twins_svt_small", "twins_svt_base", "twins_svt_large"]


def subsampled_attention(q: Tensor, k: Tensor, v: Tensor, stage: TwinsStagePlan, dropout_p: float = 0.0) -> Tensor:
    """GSA's attention: each query attends every key of its own sample. ``q`` ``[B, N, H, D]``,
    ``k``, ``v`` ``[B, K, H, D]`` (per-sample masks: B = 1, sample-major axes). Shared masks and
    per-sample batches whose samples are all the same size are one SDPA over ``[samples, ...]``
    views; otherwise queries and keys are scattered into a ``[samples, max, ...]`` padding, the
    padded keys masked out (docs/sparse-conv.md has the measurement behind this choice)."""
    if stage.cu_seqlens is None:                                        # shared mask
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           dropout_p=dropout_p)
        return o.transpose(1, 2)
    M, H, D = stage.num_masks, q.shape[2], q.shape[3]
    if stage.uniform:
        qs, ks, vs = (t.reshape(M, -1, H, D).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(qs, ks, vs, dropout_p=dropout_p).transpose(1, 2).reshape(q.shape)
    slot, kg = stage.query_slot.long(), stage.key_gather.long()
    qp = q.new_zeros((M * stage.max_tokens, H, D)).index_copy(0, slot, q[0]).view(M, stage.max_tokens, H, D)
    idx = kg.clamp(min=0)
    kp, vp = (t[0].index_select(0, idx).view(M, stage.max_keys, H, D) for t in (k, v))
    allowed = (kg >= 0).view(M, 1, 1, stage.max_keys)
    allowed = allowed | ~allowed.any(-1, keepdim=True)   # a sample without keys has no query either: no NaN rows
    o = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                       attn_mask=allowed, dropout_p=dropout_p)
    return o.transpose(1, 2).reshape(M * stage.max_tokens, H, D).index_select(0, slot).unsqueeze(0)


class LocallyGroupedAttn(nn.Module):
    """timm's LSA on visible tokens: attention within each window of ``ws`` (no position bias)
    through the grouped attention op. ``attn_impl="released"``: the released PyTorch path."""

    def __init__(self, dim: int, num_heads: int = 8, attn_drop: float = 0.0, proj_drop: float = 0.0, ws: int = 7,
                 attn_impl: str = "greenmim"):
        super().__init__()
        check_attn_impl(attn_impl)
        if dim % num_heads:
            raise GreenmimError(f"greenmim: dim {dim} is not a multiple of {num_heads} heads")
        if attn_drop:
            raise GreenmimError("greenmim: LSA attention dropout is not supported (the grouped attention op has none)")
        self.dim, self.num_heads, self.ws, self.attn_impl = dim, num_heads, ws, attn_impl
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, stage: TwinsStagePlan) -> Tensor:
        B, N, C = x.shape
        part = stage.partition
        if part.window != self.ws:
            raise GreenmimError(f"greenmim: a plan of window {part.window}, the layer has window {self.ws}")
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, C // self.num_heads)
        if self.attn_impl == "greenmim":
            o = group_window_attention_packed(qkv, None, part, scale=self.scale)
        else:
            q, k, v = qkv.unbind(2)
            o = released_group_attention(q, k, v, None, part, scale=self.scale)
        return self.proj_drop(self.proj(o.reshape(B, N, C)))


class GlobalSubSampleAttn(nn.Module):
    """timm's GSA on visible tokens: keys and values from the sr x sr block conv of the visible
    tokens (``sr``), LayerNorm (``norm``), ``kv``; sr 1: from the tokens themselves."""

    def __init__(self, dim: int, num_heads: int = 8, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 sr_ratio: int = 1):
        super().__init__()
        if dim % num_heads:
            raise GreenmimError(f"greenmim: dim {dim} is not a multiple of {num_heads} heads")
        self.dim, self.num_heads, self.sr_ratio = dim, num_heads, sr_ratio
        self.q = nn.Linear(dim, dim, bias=True)
        self.kv = nn.Linear(dim, dim * 2, bias=True)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        else:
            self.sr = None
            self.norm = None

    def forward(self, x: Tensor, stage: TwinsStagePlan) -> Tensor:
        B, N, C = x.shape
        H = self.num_heads
        if stage.sr != self.sr_ratio:
            raise GreenmimError(f"greenmim: a plan of sub-sampling {stage.sr}, the layer has sr_ratio {self.sr_ratio}")
        q = self.q(x).view(B, N, H, C // H)
        if self.sr is not None:
            x = self.norm(block_conv(x, stage.keys, self.sr.weight, self.sr.bias))
        k, v = self.kv(x).view(B, x.shape[1], 2, H, C // H).unbind(2)
        o = subsampled_attention(q, k, v, stage, self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(o.reshape(B, N, C)))


class Block(nn.Module):
    """timm's Twins ``Block``: ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``; LSA when ``ws`` > 1,
    GSA when ``ws`` == 1."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, proj_drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0, norm_layer=nn.LayerNorm, sr_ratio: int = 1,
                 ws: int = 1, attn_impl: str = "greenmim"):
        super().__init__()
        self.norm1 = norm_layer(dim)
        if ws == 1:
            self.attn = GlobalSubSampleAttn(dim, num_heads, attn_drop, proj_drop, sr_ratio)
        else:
            self.attn = LocallyGroupedAttn(dim, num_heads, attn_drop, proj_drop, ws, attn_impl)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: Tensor, stage: TwinsStagePlan, sample_of_token: Optional[Tensor] = None) -> Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), stage), sample_of_token, stage.num_masks)
        return x + self.drop_path2(self.mlp(x, norm=self.norm2), sample_of_token, stage.num_masks)


class PosConv(nn.Module):
    """timm's PEG (``proj.0``: a depthwise 3x3 ``Conv2d``) as a submanifold conv on the visible
    tokens, ``conv(x) + x``. ``residual=False`` drops the ``+ x`` as the released GreenMIM code
    did (its checkpoints were trained that way)."""

    def __init__(self, in_chans: int, embed_dim: int, stride: int = 1, residual: bool = True):
        super().__init__()
        if stride != 1 or in_chans != embed_dim:
            raise GreenmimError("greenmim: the PEG on visible tokens is the depthwise stride-1 conv only")
        self.proj = nn.Sequential(nn.Conv2d(in_chans, embed_dim, 3, stride, 1, bias=True, groups=embed_dim))
        self.stride, self.residual = stride, residual

    def forward(self, x: Tensor, stage: TwinsStagePlan) -> Tensor:
        conv = self.proj[0]
        return submanifold_depthwise_conv3x3(x, stage.neighbors, conv.weight, conv.bias, residual=self.residual)


class SparsePatchEmbed(nn.Module):
    """timm's ``PatchEmbed`` of stages 2-4 (``Conv2d`` k = s = 2, LayerNorm) on the visible tokens:
    the block conv of the previous stage's tokens; its outputs are this stage's tokens."""

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int = 2):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: Tensor, prev: TwinsStagePlan) -> Tensor:
        return self.norm(block_conv(x, prev.embed, self.proj.weight, self.proj.bias))


class VisibleTwins(nn.Module):
    """Twins-SVT (timm's ``Twins`` with ``wss``) on the visible tokens of masked images.

    ``forward_features(images, plan)`` returns the last stage's visible tokens after the final
    norm (``[B, N, C]`` shared, ``[1, sum N_b, C]`` per sample); ``forward_head`` averages each
    sample's tokens, dropout, ``head``; ``forward`` is both. ``plan`` comes from :meth:`plan`.
    ``window_size`` (if given) sets every stage's LSA window; ``peg_residual=False`` is the
    released GreenMIM code's PEG (no ``+ x``)."""

    def __init__(self, img_size: int = 224, patch_size: int = 4, in_chans: int = 3, num_classes: int = 0,
                 global_pool: str = "avg", embed_dims: Sequence[int] = (64, 128, 256, 512),
                 num_heads: Sequence[int] = (2, 4, 8, 16), mlp_ratios: Sequence[float] = (4, 4, 4, 4),
                 depths: Sequence[int] = (2, 2, 10, 4), sr_ratios: Sequence[int] = (8, 4, 2, 1),
                 wss: Sequence[int] = (7, 7, 7, 7), window_size: Optional[int] = None, drop_rate: float = 0.0,
                 pos_drop_rate: float = 0.0, proj_drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, norm_layer=partial(nn.LayerNorm, eps=1e-6), peg_residual: bool = True,
                 attn_impl: str = "greenmim", strategy: str = "fast"):
        super().__init__()
        if global_pool not in ("avg", ""):
            raise GreenmimError(f"greenmim: global_pool must be 'avg' or '', got {global_pool!r}")
        n = len(depths)
        if not (len(embed_dims) == len(num_heads) == len(mlp_ratios) == len(sr_ratios) == len(wss) == n):
            raise GreenmimError("greenmim: embed_dims, num_heads, mlp_ratios, depths, sr_ratios, wss: one entry per stage")
        wss = tuple(wss) if window_size is None else (int(window_size),) * n
        grid = img_size // patch_size
        for i in range(n):
            side = grid >> i
            if img_size % patch_size or grid % (1 << i) or side % wss[i] or side % sr_ratios[i]:
                raise GreenmimError(f"greenmim: stage {i + 1} has a {side}x{side} grid ({img_size} px, patch "
                                    f"{patch_size}): the window {wss[i]} and sr {sr_ratios[i]} must divide it (timm "
                                    f"pads other grids with zero tokens, which visible tokens have no counterpart for)")
        self.img_size, self.patch_size, self.strategy = img_size, patch_size, strategy
        self.embed_dims, self.depths = tuple(embed_dims), tuple(depths)
        self.sr_ratios, self.wss, self.window_size = tuple(sr_ratios), wss, wss[0]
        self.num_classes, self.global_pool = num_classes, global_pool
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.patch_embeds = nn.ModuleList([PatchEmbed(patch_size, in_chans, embed_dims[0], nn.LayerNorm)] +
                                          [SparsePatchEmbed(embed_dims[i - 1], embed_dims[i]) for i in range(1, n)])
        self.pos_drops = nn.ModuleList([nn.Dropout(p=pos_drop_rate) for _ in range(n)])
        dpr = drop_path_rates(drop_path_rate, depths)
        self.blocks = nn.ModuleList([nn.ModuleList([
            Block(embed_dims[k], num_heads[k], mlp_ratios[k], proj_drop_rate, attn_drop_rate, dpr[k][i], norm_layer,
                  sr_ratios[k], 1 if i % 2 == 1 else wss[k], attn_impl) for i in range(depths[k])]) for k in range(n)])
        self.pos_block = nn.ModuleList([PosConv(d, d, residual=peg_residual) for d in embed_dims])
        self.norm = norm_layer(self.num_features)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        """timm's Twins initialisation."""
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def no_weight_decay(self):
        return {"pos_block." + n for n, _ in self.pos_block.named_parameters()}

    def plan_spec(self, group_size: int = 0) -> TwinsPlanSpec:
        """What planning needs of this encoder, picklable (``group_size=-1``: G fixed at each
        stage's window area, for torch.compile)."""
        return TwinsPlanSpec(self.img_size, self.patch_size, self.wss, self.sr_ratios, self.embed_dims, self.strategy,
                             group_size)

    def plan(self, visible: Tensor, device=None, cache: bool = True) -> TwinsPlan:
        """Plans a mask (bool ``[h, w]`` shared or ``[B, h, w]`` per sample, True = visible) for
        this model's geometry; see :func:`greenmim.plan_twins`."""
        return self.plan_spec().plan(visible, device=device, cache=cache)

    def forward_features(self, img: Tensor, plan: TwinsPlan) -> Tensor:
        if not isinstance(plan, TwinsPlan):
            raise GreenmimError(f"greenmim: VisibleTwins needs a TwinsPlan (model.plan(mask)), got {type(plan).__name__}")
        if len(plan.stages) != len(self.blocks):
            raise GreenmimError(f"greenmim: plan has {len(plan.stages)} stages, the model {len(self.blocks)}")
        if plan.device != img.device:
            raise GreenmimError(f"greenmim: the plan is on {plan.device}, the images on {img.device}: plans and "
                                f"tensors must share a device (plan.to({str(img.device)!r}))")
        x = self.patch_embeds[0](img, plan)
        for i, (drop, blocks, peg) in enumerate(zip(self.pos_drops, self.blocks, self.pos_block)):
            stage = plan.stages[i]
            if i > 0:
                x = self.patch_embeds[i](x, plan.stages[i - 1])
            x = drop(x)
            samples = None
            if plan.per_sample and self.training and any(b.drop_path1.drop_prob > 0 for b in blocks):
                samples = token_samples(stage, stage.num_tokens, x.device)
            for j, blk in enumerate(blocks):
                x = blk(x, stage, samples)
                if j == 0:
                    x = peg(x, stage)
        return self.norm(x)

    def forward_head(self, x: Tensor, plan: TwinsPlan, pre_logits: bool = False) -> Tensor:
        """Average over each sample's visible tokens (``global_pool="avg"``), dropout, ``head``."""
        if self.global_pool == "avg":
            x = visible_mean(x, plan)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, img: Tensor, plan: TwinsPlan) -> Tensor:
        return self.forward_head(self.forward_features(img, plan), plan)


# ---- presets: each stated once (mim.py builds on them; tests/test_mim.py checks them against the
# C++ CLI's copy in include/greenmim/models.hpp) --------------------------------------------------

TWINS_SVT_S = dict(embed_dims=(64, 128, 256, 512), num_heads=(2, 4, 8, 16), depths=(2, 2, 10, 4))
TWINS_SVT_B = dict(embed_dims=(96, 192, 384, 768), num_heads=(3, 6, 12, 24), depths=(2, 2, 18, 2))
TWINS_SVT_L = dict(embed_dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32), depths=(2, 2, 18, 2))
TWINS_NANO = dict(embed_dims=(32, 64, 128, 256), num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))   # a toy

ENCODERS = {   # timm's names
    "twins_svt_small": (VisibleTwins, TWINS_SVT_S, "Twins-SVT-S, timm's twins_svt_small layout"),
    "twins_svt_base": (VisibleTwins, TWINS_SVT_B, "Twins-SVT-B, timm's twins_svt_base layout"),
    "twins_svt_large": (VisibleTwins, TWINS_SVT_L, "Twins-SVT-L, timm's twins_svt_large layout (GreenMIM's Twins-L)"),
}


def twins_svt_small(**kw) -> VisibleTwins:
    """Twins-SVT-S, timm's ``twins_svt_small`` layout."""
    return VisibleTwins(**{**TWINS_SVT_S, **kw})


def twins_svt_base(**kw) -> VisibleTwins:
    """Twins-SVT-B, timm's ``twins_svt_base`` layout."""
    return VisibleTwins(**{**TWINS_SVT_B, **kw})


def twins_svt_large(**kw) -> VisibleTwins:
    """Twins-SVT-L, timm's ``twins_svt_large`` layout (GreenMIM's Twins-L)."""
    return VisibleTwins(**{**TWINS_SVT_L, **kw})
