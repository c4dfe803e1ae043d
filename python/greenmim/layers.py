"""Small pieces the visible-token Swin (swin.py) and Swin V2 (swinv2.py) share, as timm shares
``timm.layers``: the MLP, the patch embedding on visible patches, stochastic depth on the token
layouts of a plan, and the classifier head that pools each sample's visible tokens.

Tokens are ``[B, N, C]`` (one shared mask: each sample's visible tokens) or ``[1, sum N_b, C]``
(per-sample masks, sample-major; ``cu_seqlens`` of a stage splits the samples).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._lib import GreenmimError
from .indices import MaskPlan, StagePlan, plan_masks

ATTN_IMPLS = ("greenmim", "released")


def check_attn_impl(attn_impl: str) -> None:
    if attn_impl not in ATTN_IMPLS:
        raise GreenmimError(f"greenmim: attn_impl must be one of {ATTN_IMPLS}, got {attn_impl!r}")


def token_samples(stage: StagePlan, num_tokens: int, device) -> Tensor:
    """The sample of each token of a per-sample (flat) stage: ``[num_tokens]`` int64, from
    ``cu_seqlens`` with a static output shape (no host sync, traceable)."""
    cu = stage.cu_seqlens.to(device)
    return torch.searchsorted(cu[1:], torch.arange(num_tokens, device=device), right=True)


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


class DropPath(nn.Module):
    """timm's ``DropPath`` on visible tokens (no parameters): ``drop_path`` with ``drop_prob``."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor, sample_of_token: Optional[Tensor] = None) -> Tensor:
        return drop_path(x, self.drop_prob, self.training, sample_of_token)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


def drop_path_rates(drop_path_rate: float, depths) -> list:
    """Stochastic depth rising linearly over all blocks, as plain floats (meta-device
    construction works), one list per stage."""
    total = sum(depths)
    dpr = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
    out, start = [], 0
    for d in depths:
        out.append(dpr[start:start + d])
        start += d
    return out


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


class ClassifierHead(nn.Module):
    """timm's ``ClassifierHead`` on visible tokens: ``global_pool`` ("avg": the mean of each
    sample's visible tokens of the last stage; "": no pooling), dropout, then ``fc`` (identity
    without classes). Input: the last stage's tokens; output ``[B, num_classes]`` (pooled)."""

    def __init__(self, in_features: int, num_classes: int, pool_type: str = "avg", drop_rate: float = 0.0):
        super().__init__()
        if pool_type not in ("avg", ""):
            raise GreenmimError(f"greenmim: global_pool must be 'avg' or '', got {pool_type!r}")
        self.pool_type = pool_type
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(in_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: Tensor, plan: MaskPlan, pre_logits: bool = False) -> Tensor:
        if self.pool_type == "avg":
            x = visible_mean(x, plan)
        x = self.drop(x)
        return x if pre_logits else self.fc(x)


def visible_mean(x: Tensor, plan: MaskPlan) -> Tensor:
    """The mean of each sample's visible tokens of the last stage: ``[B, C]``. Per-sample masks:
    a segment mean on the device (no host sync per sample)."""
    if not plan.per_sample:
        return x.mean(1)
    cu = plan.stages[-1].cu_seqlens.to(x.device)
    counts = cu[1:] - cu[:-1]
    sample = token_samples(plan.stages[-1], x.shape[1], x.device)
    sums = x.new_zeros((plan.num_masks, x.shape[-1])).index_add_(0, sample, x[0])
    return sums / counts.clamp(min=1).unsqueeze(1).to(x.dtype)


def init_linear(m: nn.Module) -> None:
    """timm's Swin initialisation of Linear layers: truncated normal (std 0.02), zero bias."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def plan_for(model: nn.Module, visible: Tensor, device=None, cache: bool = True) -> MaskPlan:
    """``model.plan``: a mask (bool ``[h, w]`` shared or ``[B, h, w]`` per sample, True = visible)
    planned for a visible-token Swin's geometry; see :func:`greenmim.plan_masks`."""
    return plan_masks(visible, img_size=model.img_size, patch_size=model.patch_size, window_size=model.window_size,
                      num_stages=len(model.layers), embed_dim=model.embed_dim, strategy=model.strategy,
                      device=device, cache=cache)


def forward_stages(model: nn.Module, img: Tensor, plan: MaskPlan) -> Tensor:
    """``model.forward_features``: patch embedding, the stages (each with the plan of its stage
    and the previous stage's merge), the final norm. Per-sample stochastic depth gets each
    token's sample where a stage has a non-zero rate."""
    if len(plan.stages) != len(model.layers):
        raise GreenmimError(f"greenmim: plan has {len(plan.stages)} stages, the model {len(model.layers)}")
    if plan.device != img.device:
        raise GreenmimError(f"greenmim: the plan is on {plan.device}, the images on {img.device}: plans and "
                            f"tensors must share a device (plan.to({str(img.device)!r}))")
    x = model.patch_embed(img, plan)
    for i, layer in enumerate(model.layers):
        stage = plan.stages[i]
        samples = None
        if plan.per_sample and model.training and any(b.drop_path1.drop_prob > 0 for b in layer.blocks):
            samples = token_samples(stage, stage.num_tokens, x.device)
        x = layer(x, stage, plan.stages[i - 1].merge if i > 0 else None, samples)
    return model.norm(x)
