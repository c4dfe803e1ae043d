"""ConvNeXt V2 that computes on the visible tokens of a masked image only (FCMAE's encoder,
without MinkowskiEngine).

The module tree is timm's ``ConvNeXt`` as ``timm.create_model("convnextv2_*")`` builds it
(``stem.{0,1}``, ``stages.N.downsample.{0,1}``, ``stages.N.blocks.M.{conv_dw,norm,mlp.{fc1,grn,fc2}}``,
``head``): the modules ARE timm's, so timm's ``convnextv2_atto`` ... ``convnextv2_huge`` state dicts
load strictly and an exported encoder is a timm model. Only the forward differs: per stage, on the
visible tokens of per-sample masks of 32-px units, packed on one axis ``[1, sum N_b, C]``
(sample-major, row-major within a sample):

- stem (4x4, stride 4): the visible 4x4 patches (whole inside a 32-px unit), one GEMM, LayerNorm;
- downsampling (LayerNorm, then 2x2 stride 2): the block conv (:func:`greenmim.ops.block_conv`) over
  the stage's block table (:func:`greenmim.conv_tables.block_table`); with 32-px units every 2x2
  block is wholly visible or wholly masked,
  so the outputs are exactly the next stage's visible tokens;
- each block: the 7x7 submanifold depthwise conv (:func:`greenmim.ops.submanifold_depthwise_conv`;
  masked sites and sites outside the image read as zero), LayerNorm (eps 1e-6), fc1, exact GELU,
  GRN, fc2, drop path, the residual.

GRN (``grn=``): ``"sample"`` (the default) takes the L2 norm of each channel over each sample's
visible tokens, which is the dense ConvNeXt V2's GRN over the zero-filled map (masked sites
contribute zero), so a sample's output does not depend on the other samples of its batch;
``"batch"`` takes it over every visible token of the batch, as the released ``MinkowskiGRN``
(``models/convnextv2_sparse.py``) does (for loading and comparing with runs of that code).

    enc = greenmim.VisibleConvNeXtV2("convnextv2_atto")
    visible = torch.rand(B, 7, 7) > 0.6                 # per-sample masks of 32-px units
    tokens, plan = enc(images, visible)                 # [1, sum N_b, 320], the stage-4 plan
    dense = enc.to_dense(tokens, plan)                  # [B, 320, 7, 7], zeros at masked units
"""
from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .conv_ops import block_conv, submanifold_depthwise_conv
from .convnext_plan import MASK_UNIT, ConvNeXtPlan, ConvNeXtPlanSpec, ConvNeXtStagePlan, plan_convnext

__all__ = ["ConvNeXtStagePlan", "ConvNeXtPlan", "VisibleConvNeXtV2", "grn_visible", "MASK_UNIT"]


def grn_visible(x: Tensor, weight: Tensor, bias: Tensor, sample_of_token: Tensor, num_masks: int,
                eps: float = 1e-6, scope: str = "sample") -> Tensor:
    """GRN on packed visible tokens ``x`` ``[1, N, C]``: ``x + bias + weight * x * n``, where
    ``n = g / (mean_c g + eps)`` and ``g`` is the L2 norm of each channel over each sample's tokens
    (``scope="sample"``) or over every token (``"batch"``, the released MinkowskiGRN)."""
    t = x[0]
    if scope == "batch":
        g = t.norm(p=2, dim=0, keepdim=True)                                       # [1, C]
        n = g / (g.mean(dim=-1, keepdim=True) + eps)
        nt = n.expand_as(t)
    else:
        sq = t.new_zeros((num_masks, t.shape[1])).index_add_(0, sample_of_token, t * t)
        g = sq.clamp_min(0).sqrt()                                                 # [B, C]
        n = g / (g.mean(dim=-1, keepdim=True) + eps)
        nt = n.index_select(0, sample_of_token)
    return (t + torch.addcmul(bias.to(t.dtype), weight.to(t.dtype), t * nt)).unsqueeze(0)


def _linear(x: Tensor, layer: nn.Module) -> Tensor:
    """A timm ``nn.Linear`` or 1x1 ``nn.Conv2d`` (conv_mlp models) as a per-token linear map."""
    w = layer.weight
    return F.linear(x, w.reshape(w.shape[0], -1), layer.bias)


def _norm(x: Tensor, norm: nn.Module) -> Tensor:
    """timm's LayerNorm / LayerNorm2d per token (over the channels)."""
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)


class VisibleConvNeXtV2(nn.Module):
    """ConvNeXt V2 on the visible tokens (see the module docstring). ``name``: a timm
    ``convnextv2_*`` model; ``grn``: "sample" or "batch"; other keywords go to
    ``timm.create_model`` (``num_classes``, ``drop_path_rate``, ...)."""

    def __init__(self, name: str = "convnextv2_atto", grn: str = "sample", **kwargs):
        super().__init__()
        import timm
        if not name.startswith("convnextv2_"):
            raise ValueError(f"greenmim: VisibleConvNeXtV2 takes timm's convnextv2_* models, got {name!r}")
        if grn not in ("sample", "batch"):
            raise ValueError(f"greenmim: grn must be 'sample' or 'batch', got {grn!r}")
        m = timm.create_model(name, pretrained=False, **kwargs)
        self.name, self.grn = name, grn
        self.stem, self.stages, self.norm_pre, self.head = m.stem, m.stages, m.norm_pre, m.head
        self.num_features = m.num_features
        self.dims = [s.blocks[0].conv_dw.weight.shape[0] for s in self.stages]
        self.kernel = self.stages[0].blocks[0].conv_dw.weight.shape[-1]
        self.img_size = 224          # what plan_spec plans for (FCMAE sets its own)

    # ---- plans -------------------------------------------------------------------------------

    def plan(self, visible: Tensor, image_size, device=None, cache: bool = True) -> ConvNeXtPlan:
        """The plan (:func:`greenmim.convnext_plan.plan_convnext`: every table, one arena) of per-sample
        unit masks ``visible`` (bool ``[B, H/32, W/32]``) for images of ``image_size`` (H, W)."""
        return plan_convnext(visible, image_size, self.kernel, device=device, cache=cache)

    def plan_spec(self, group_size: int = 0) -> ConvNeXtPlanSpec:
        """What the trainer's loader workers plan with (``pretrain.data.Geometry``): the plans are
        built there, so the step reads no mask on the host (CUDA graphs, torch.compile)."""
        return ConvNeXtPlanSpec(self.img_size, self.kernel)

    # ---- forward -----------------------------------------------------------------------------

    def _block(self, blk: nn.Module, x: Tensor, st: ConvNeXtStagePlan, B: int) -> Tensor:
        y = submanifold_depthwise_conv(x, st.nbr, blk.conv_dw.weight, blk.conv_dw.bias)
        y = _norm(y, blk.norm)
        y = F.gelu(_linear(y, blk.mlp.fc1))
        y = blk.mlp.drop1(y)
        g = blk.mlp.grn
        y = grn_visible(y, g.weight, g.bias, st.sample_of_token, B, g.eps, self.grn)
        y = blk.mlp.drop2(_linear(y, blk.mlp.fc2))
        if blk.gamma is not None:
            y = y * blk.gamma
        return x + _drop_path(y, blk.drop_path, st.sample_of_token, B, self.training)

    def stem_tokens(self, images: Tensor, plan: ConvNeXtPlan) -> Tensor:
        """The visible 4x4 patches through the stem: ``[1, N_1, C_1]``."""
        B, Cin, H, W = images.shape
        conv, norm = self.stem[0], self.stem[1]
        p = conv.weight.shape[-1]
        patches = images.reshape(B, Cin, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, Cin * p * p)
        x = F.linear(patches.index_select(0, plan.patch_position), conv.weight.reshape(conv.weight.shape[0], -1),
                     conv.bias)
        return _norm(x, norm).unsqueeze(0)

    def forward_features(self, images: Tensor, plan: ConvNeXtPlan) -> Tensor:
        """Stage-4 visible tokens ``[1, N_4, C_4]`` (sample-major, row-major within a sample)."""
        if tuple(images.shape[-2:]) != tuple(plan.image_size) or images.shape[0] != plan.num_masks:
            raise ValueError(f"greenmim: images {tuple(images.shape)} and a plan of {plan.num_masks} masks for "
                             f"{plan.image_size} images")
        x = self.stem_tokens(images, plan)
        for s, (stage, st) in enumerate(zip(self.stages, plan.stages)):
            if st.down is not None:
                ds = stage.downsample
                x = block_conv(_norm(x, ds[0]), st.down, ds[1].weight, ds[1].bias)
            for blk in stage.blocks:
                x = self._block(blk, x, st, plan.num_masks)
        return x

    def forward(self, images: Tensor, visible: Union[Tensor, ConvNeXtPlan]):
        """``(stage-4 tokens, plan)`` of unit masks ``visible`` (planned here, on the host) or of a
        plan made ahead (:meth:`plan`)."""
        plan = visible if isinstance(visible, ConvNeXtPlan) else \
            self.plan(visible, tuple(images.shape[-2:]), device=images.device, cache=False)
        return self.forward_features(images, plan), plan

    @staticmethod
    def to_dense(tokens: Tensor, plan: ConvNeXtPlan, stage: int = 3) -> Tensor:
        """Stage ``stage``'s tokens ``[1, N, C]`` as a dense ``[B, C, h, w]`` map, zeros at the masked
        sites (the layout of timm's ``forward_features``); differentiable."""
        st = plan.stages[stage]
        h, w = st.grid
        C = tokens.shape[-1]
        out = tokens.new_zeros((plan.num_masks * h * w, C)).index_copy(0, st.nbr.position.long(), tokens[0])
        return out.view(plan.num_masks, h, w, C).permute(0, 3, 1, 2)


def _drop_path(y: Tensor, dp: nn.Module, sample_of_token: Tensor, B: int, training: bool) -> Tensor:
    """timm's DropPath per sample on packed tokens: a sample's rows all kept (scaled) or all zero."""
    p = float(getattr(dp, "drop_prob", 0.0) or 0.0)
    if not training or p == 0.0:
        return y
    keep = y.new_empty((B,)).bernoulli_(1 - p).div_(1 - p)
    return y * keep.index_select(0, sample_of_token).unsqueeze(-1)
