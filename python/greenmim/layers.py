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
from .mask_plan import MaskPlan, StagePlan, plan_masks

ATTN_IMPLS = ("greenmim", "released")


def check_attn_impl(attn_impl: str) -> None:
    if attn_impl not in ATTN_IMPLS:
        raise GreenmimError(f"greenmim: attn_impl must be one of {ATTN_IMPLS}, got {attn_impl!r}")


def token_samples(stage: StagePlan, num_tokens: int, device) -> Tensor:
    """The sample of each token of a per-sample (flat) stage: ``[num_tokens]`` int64, from
    ``cu_seqlens`` with a static output shape (no host sync, traceable)."""
    cu = stage.cu_seqlens.to(device)
    return torch.searchsorted(cu[1:], torch.arange(num_tokens, device=device), right=True)


def drop_path(x: Tensor, p: float, training: bool, sample_of_token: Optional[Tensor],
              num_samples: Optional[int] = None) -> Tensor:
    """Stochastic depth per sample; with the flat per-sample layout ``sample_of_token`` says
    which sample each token belongs to, of ``num_samples`` (the plan's masks: given, nothing
    waits for the device, so a CUDA graph can hold the step; None reads it off the ids)."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    if sample_of_token is None:
        m = x.new_empty((x.shape[0], 1, 1)).bernoulli_(keep)
    else:
        n = num_samples if num_samples is not None else \
            (int(sample_of_token.max()) + 1 if sample_of_token.numel() else 0)
        m = x.new_empty((n,)).bernoulli_(keep)[sample_of_token].view(1, -1, 1)
    return x * m / keep


class DropPath(nn.Module):
    """timm's ``DropPath`` on visible tokens (no parameters): ``drop_path`` with ``drop_prob``."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor, sample_of_token: Optional[Tensor] = None, num_samples: Optional[int] = None) -> Tensor:
        return drop_path(x, self.drop_prob, self.training, sample_of_token, num_samples)

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


def _linear_param_grads(dy: Tensor, inp: Tensor, types, need_w: bool, need_b: bool):
    """The weight and bias gradients of ``linear(inp)`` as autograd computes them (in the
    forward's compute type), cast to the parameters' types ``types = (weight, bias or None)``."""
    dy2, in2 = dy.reshape(-1, dy.shape[-1]), inp.reshape(-1, inp.shape[-1])
    dw = (dy2.t() @ in2).to(types[0]) if need_w else None
    db = dy2.sum(0).to(types[1]) if types[1] is not None and need_b else None
    return dw, db


class _GeluLinear(torch.autograd.Function):
    """``linear(gelu(h1), weight, bias)`` that saves ``h1`` only and recomputes the GELU in the
    backward: the MLP's widest activation (4C per token) is not kept twice (GELU keeps its input,
    the linear its input). Under autocast it casts as autocast does (GELU in h1's type, the linear
    in the autocast type, the weight's cast kept for the backward as autocast's linear keeps it),
    and the backward does what autograd does for the plain expression: the GEMMs in the forward's
    compute type, gradients cast back to the parameters' type."""

    @staticmethod
    def forward(ctx, h1: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        dev = h1.device.type
        ct = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        ctx.types = (weight.dtype, None if bias is None else bias.dtype)
        with torch.autocast(dev, enabled=False):
            h = F.gelu(h1)
            w = weight if ct is None else weight.to(ct)
            b = bias if ct is None or bias is None else bias.to(ct)
            y = F.linear(h if ct is None else h.to(ct), w, b)
        ctx.cast = ct
        ctx.save_for_backward(h1, w)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        h1, w = ctx.saved_tensors
        need_h1, need_w, need_b = ctx.needs_input_grad
        h = F.gelu(h1)
        hc = h if ctx.cast is None else h.to(ctx.cast)                   # the linear's input
        dw, db = _linear_param_grads(dy, hc, ctx.types, need_w, need_b)
        # GELU's own backward (autograd's kernel; no autograd calls here, so torch.compile traces it)
        dh1 = torch.ops.aten.gelu_backward((dy @ w).to(h.dtype), h1, approximate="none") if need_h1 else None
        return dh1, dw, db


class _NormLinear(torch.autograd.Function):
    """``linear(layer_norm(x), weight, bias)`` that saves ``x`` (which the residual stream keeps
    anyway) and recomputes the norm in the backward: the norm's output is not kept for the
    linear. The recompute runs under the forward's autocast state, so it is the forward's norm;
    the rest is autograd's arithmetic for the plain expression, as in ``_GeluLinear``."""

    @staticmethod
    def forward(ctx, x: Tensor, ln_w: Optional[Tensor], ln_b: Optional[Tensor], weight: Tensor,
                bias: Optional[Tensor], eps: float) -> Tensor:
        dev = x.device.type
        ct = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        y = F.layer_norm(x, x.shape[-1:], ln_w, ln_b, eps)            # under the ambient autocast
        with torch.autocast(dev, enabled=False):
            w = weight if ct is None else weight.to(ct)
            b = bias if ct is None or bias is None else bias.to(ct)
            out = F.linear(y if ct is None else y.to(ct), w, b)
        ctx.cast, ctx.eps, ctx.norm_type = ct, eps, y.dtype   # the norm ran in y's type (autocast's choice)
        ctx.types = (weight.dtype, None if bias is None else bias.dtype)
        ctx.save_for_backward(x, ln_w, ln_b, w)
        return out

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, ln_w, ln_b, w = ctx.saved_tensors
        need_x, need_lw, need_lb, need_w, need_b, _ = ctx.needs_input_grad
        nt, shape = ctx.norm_type, x.shape[-1:]
        # the forward's norm again, in the type it ran in (as autocast cast its inputs), with the
        # statistics its backward needs: aten's kernels, as autograd runs them (traceable)
        xn = x.to(nt)
        lw = ln_w.to(nt) if ln_w is not None else None
        lb = ln_b.to(nt) if ln_b is not None else None
        y, mean, rstd = torch.ops.aten.native_layer_norm(xn, shape, lw, lb, ctx.eps)
        yc = y if ctx.cast is None else y.to(ctx.cast)                  # the linear's input
        dw, db = _linear_param_grads(dy, yc, ctx.types, need_w, need_b)
        dx = dlw = dlb = None
        if need_x or need_lw or need_lb:
            mask = [need_x, need_lw and lw is not None, need_lb and lb is not None]
            gx, gw, gb = torch.ops.aten.native_layer_norm_backward((dy @ w).to(nt), xn, shape, mean, rstd, lw, lb, mask)
            dx = gx.to(x.dtype) if mask[0] else None
            dlw = gw.to(ln_w.dtype) if mask[1] else None
            dlb = gb.to(ln_b.dtype) if mask[2] else None
        return dx, dlw, dlb, dw, db, None


def norm_linear(x: Tensor, norm: nn.Module, linear: nn.Linear) -> Tensor:
    """``linear(norm(x))``; in training with a plain LayerNorm, without keeping the norm's output
    for the backward (``_NormLinear``)."""
    if (torch.is_grad_enabled() and type(norm) is nn.LayerNorm and len(norm.normalized_shape) == 1
            and x.requires_grad):
        return _NormLinear.apply(x, norm.weight, norm.bias, linear.weight, linear.bias, norm.eps)
    return linear(norm(x))


def set_activation_recompute(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Turns the recomputes of ``_GeluLinear`` and ``norm_linear`` on (the default) or off in
    every MLP and window attention of ``model``: off keeps every activation, as timm does, for a
    step with a few kernels fewer and more memory (docs/models.md). Returns ``model``."""
    for m in model.modules():
        if hasattr(m, "recompute"):
            m.recompute = bool(enabled)
    return model


class Mlp(nn.Module):
    """timm's Mlp (fc1, GELU, fc2, dropouts). In training with no dropout between the GELU and fc2,
    fc2 runs through ``_GeluLinear``: the GELU's output is recomputed in the backward instead of
    being kept (bench/activation_memory.py: about a quarter of a Swin block's saved activations)."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)
        self.recompute = True   # set_activation_recompute(model, False): keep everything, as timm does

    def forward(self, x: Tensor, norm: Optional[nn.Module] = None) -> Tensor:
        """``mlp(x)``, or ``mlp(norm(x))`` with the norm's output recomputed in the backward."""
        if norm is None:
            h1 = self.fc1(x)
        else:
            h1 = norm_linear(x, norm, self.fc1) if self.recompute else self.fc1(norm(x))
        if (self.recompute and torch.is_grad_enabled() and (not self.training or self.drop1.p == 0)
                and type(self.act) is nn.GELU and self.act.approximate == "none"):
            return self.drop2(_GeluLinear.apply(h1, self.fc2.weight, self.fc2.bias))
        return self.drop2(self.fc2(self.drop1(self.act(h1))))


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
