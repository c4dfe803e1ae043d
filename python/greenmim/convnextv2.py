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

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .conv_ops import block_conv, submanifold_depthwise_conv
from .conv_tables import block_table, neighbor_table

__all__ = ["ConvNeXtStagePlan", "ConvNeXtPlan", "VisibleConvNeXtV2", "grn_visible"]

MASK_UNIT = 32  # pixels a side of FCMAE's mask unit


@dataclass(eq=False)
class ConvNeXtStagePlan:
    """One stage's tables: the 7x7 neighbour table of its visible tokens, and (stages 2-4) the
    2x2 block table from the stage before."""
    grid: tuple
    nbr: object                  # greenmim.conv_tables.NeighborTable (k x k)
    down: Optional[object]       # greenmim.BlockTable into this stage, None at stage 1
    sample_of_token: Tensor      # [N] int64: the sample of each token
    cu_seqlens: Tensor           # [B+1]


@dataclass(eq=False)
class ConvNeXtPlan:
    num_masks: int
    image_size: tuple
    patch_position: Tensor       # [N_1] int64: b * (H/4 * W/4) + h * W/4 + w of the visible patches
    stages: List[ConvNeXtStagePlan]


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

    # ---- plans -------------------------------------------------------------------------------

    def plan(self, visible: Tensor, image_size, device=None) -> ConvNeXtPlan:
        """The tables of per-sample unit masks ``visible`` (bool ``[B, H/32, W/32]``) for images of
        ``image_size`` (H, W)."""
        H, W = image_size
        if visible.dim() != 3 or visible.dtype != torch.bool or H % MASK_UNIT or W % MASK_UNIT or \
                visible.shape[1:] != (H // MASK_UNIT, W // MASK_UNIT):
            raise ValueError(f"greenmim: ConvNeXt V2 masks are bool [B, H/32, W/32] for {H}x{W} images, got "
                             f"{visible.dtype} {tuple(visible.shape)}")
        device = torch.device(device) if device is not None else visible.device
        B = visible.shape[0]
        stages, prev = [], None
        for s in range(4):
            r = 8 >> s
            vs = visible.repeat_interleave(r, 1).repeat_interleave(r, 2)   # [B, H/4 >> s, W/4 >> s]
            nbr = neighbor_table(vs, device=device, kernel=self.kernel)
            down = block_table(prev, 2, device=device) if prev is not None else None
            cu = nbr.cu_seqlens.long()
            sot = torch.repeat_interleave(torch.arange(B, device=device), cu.diff())
            stages.append(ConvNeXtStagePlan(tuple(vs.shape[1:]), nbr, down, sot, cu))
            prev = vs
        return ConvNeXtPlan(B, (H, W), stages[0].nbr.position.long(), stages)

    def plan_spec(self, group_size: int = 0) -> "UnitMasks":
        """What the trainer's loader workers plan with (``pretrain.data.Geometry``): nothing to
        plan ahead, the tables are built from the masks inside the step."""
        return UnitMasks()

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

    def forward(self, images: Tensor, visible: Tensor):
        plan = self.plan(visible, tuple(images.shape[-2:]), device=images.device)
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


class UnitMasks:
    """The trainer's plan spec for ConvNeXt V2 (picklable, for the loader's workers): the plan of
    a micro-batch's unit masks is the masks."""

    def plan(self, masks: Tensor, device=None, cache: bool = False) -> Tensor:
        return masks if device is None else masks.to(device)


def _drop_path(y: Tensor, dp: nn.Module, sample_of_token: Tensor, B: int, training: bool) -> Tensor:
    """timm's DropPath per sample on packed tokens: a sample's rows all kept (scaled) or all zero."""
    p = float(getattr(dp, "drop_prob", 0.0) or 0.0)
    if not training or p == 0.0:
        return y
    keep = y.new_empty((B,)).bernoulli_(1 - p).div_(1 - p)
    return y * keep.index_select(0, sample_of_token).unsqueeze(-1)
