"""FCMAE (ConvNeXt V2's masked autoencoder) on visible tokens, with the released recipe: the
encoder (:class:`greenmim.VisibleConvNeXtV2`) sees only the visible 32-px units of each sample;
the decoder is dense at 1/32 resolution.

    model = greenmim.fcmae.FCMAE("convnextv2_atto")              # decoder 512 x 1
    visible = model.random_masks(batch)                         # per sample, 60% of the units masked
    loss, pred, mask = model(images, visible)
    sd = greenmim.fcmae.export_encoder(model)                   # timm's convnextv2_atto(num_classes=0)

Decoder (the released ``models/fcmae.py``): the last stage's map with zeros at the masked units
(:meth:`VisibleConvNeXtV2.to_dense`), a 1x1 conv to ``decoder_embed_dim`` (``proj``), the mask
token at every masked unit (``mask_token``), ``decoder_depth`` dense ConvNeXt V2 blocks (timm's
``ConvNeXtBlock`` with GRN, no layer scale), a 1x1 conv to each unit's 32 x 32 x 3 pixels
(``pred``). Loss: per unit the mean square error against its pixels, normalised per unit with
``norm_pix_loss`` (mean and unbiased variance + 1e-6), averaged over the masked units only.
``pred`` is ``[B, L, 3072]`` and ``mask`` ``[B, L]`` (1 = masked), as :class:`greenmim.GreenMIM`
returns them.

In the trainer (``python -m greenmim.pretrain --model fcmae_convnextv2_atto_dec512b1``, registered in
:mod:`greenmim.mim`) the model shows the surface of :class:`greenmim.GreenMIM`: ``grid``, ``unit``,
``encoder.img_size``, ``random_masks``, ``plan`` (a :class:`~greenmim.convnext_plan.ConvNeXtPlan`:
every table of the batch's masks in one arena, built in the loader's workers, so the step reads
nothing on the host and runs as a CUDA graph or under ``torch.compile``), ``reconstruct``,
``config``, ``mask_token``, ``decoder_blocks``.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ._lib import GreenmimError
from .convnext_plan import MASK_UNIT, ConvNeXtPlan, plan_convnext
from .convnextv2 import VisibleConvNeXtV2
from .mask_plan import random_masks
from .mim import GreenMIM

__all__ = ["FCMAE", "export_encoder"]


class FCMAE(nn.Module):
    """FCMAE on visible tokens: ``forward(images, visible) -> (loss, pred, mask)``; ``visible``
    bool ``[B, H/32, W/32]`` (True = visible), one mask per sample."""

    def __init__(self, encoder: str = "convnextv2_atto", img_size: int = 224, decoder_embed_dim: int = 512,
                 decoder_depth: int = 1, mask_ratio: float = 0.6, norm_pix_loss: bool = True, grn: str = "sample",
                 in_chans: int = 3, **encoder_kwargs):
        super().__init__()
        from timm.models.convnext import ConvNeXtBlock
        if img_size % MASK_UNIT:
            raise ValueError(f"greenmim: FCMAE's image size must be a multiple of {MASK_UNIT}, got {img_size}")
        self.encoder = VisibleConvNeXtV2(encoder, grn=grn, num_classes=0, in_chans=in_chans, **encoder_kwargs)
        # timm's head (its LayerNorm) is the classifier's, unused here: frozen at timm's initialisation
        # (so DDP finds no parameter without a gradient), and exported as it is for a strict load
        self.encoder.head.requires_grad_(False)
        self.img_size, self.unit, self.grid = img_size, MASK_UNIT, img_size // MASK_UNIT
        self.mask_ratio, self.norm_pix_loss, self.in_chans = mask_ratio, norm_pix_loss, in_chans
        self.proj = nn.Conv2d(self.encoder.num_features, decoder_embed_dim, kernel_size=1)
        self.mask_token = nn.Parameter(torch.zeros(1, decoder_embed_dim, 1, 1))
        self.decoder = nn.Sequential(*[ConvNeXtBlock(decoder_embed_dim, use_grn=True, ls_init_value=None)
                                       for _ in range(decoder_depth)])
        self.pred = nn.Conv2d(decoder_embed_dim, self.unit * self.unit * in_chans, kernel_size=1)
        self._init_decoder()
        # what the trainer's Geometry and header read of an encoder (no windows: 7x7 depthwise kernels)
        self.encoder.img_size, self.encoder.patch_size, self.encoder.window_size = img_size, 4, None
        self.decoder_order = "greenmim"          # each latent at its own unit (the dense decoder has no other)

    @property
    def decoder_blocks(self) -> nn.Sequential:
        """The decoder's ConvNeXt V2 blocks (GreenMIM's name for its decoder blocks)."""
        return self.decoder

    def fsdp_units(self) -> list:
        """FSDP2's inner units: the decoder blocks. The encoder's blocks are not called as modules
        (their weights feed the visible-token ops), so they stay in the root unit."""
        return list(self.decoder)

    def plan(self, visible: Tensor, device=None, cache: bool = True, batch: Optional[int] = None) -> ConvNeXtPlan:
        """The encoder's plan of unit masks ``visible`` (bool ``[B, g, g]``, or one ``[g, g]`` for
        ``batch`` samples; a ``[g, g]`` without ``batch`` plans one sample, which :meth:`forward`
        plans again for its batch), on ``device``."""
        if isinstance(visible, Tensor) and visible.dim() == 2 and batch is None:
            batch = 1
        return plan_convnext(visible, self.img_size, self.encoder.kernel, device=device, cache=cache, batch=batch)

    reconstruct = GreenMIM.reconstruct

    def _init_decoder(self) -> None:
        """The released initialisation of the decoder: truncated normal (std 0.02) weights, zero
        biases, a N(0, 0.02) mask token; LayerNorms and GRN as timm makes them."""
        nn.init.normal_(self.mask_token, std=0.02)
        for m in [self.proj, self.pred, *self.decoder.modules()]:
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def random_masks(self, batch: int, ratio: Optional[float] = None,
                     generator: Optional[torch.Generator] = None) -> Tensor:
        """Per-sample unit masks ``[batch, g, g]``, True = visible, ``ratio`` (default: the model's
        0.6) of the units masked."""
        return random_masks(batch, grid=self.grid, ratio=self.mask_ratio if ratio is None else ratio,
                            generator=generator)

    def forward_decoder(self, tokens: Tensor, plan, visible: Tensor) -> Tensor:
        """``[B, L, unit^2 * 3]`` predictions from the encoder's last-stage tokens."""
        x = self.proj(VisibleConvNeXtV2.to_dense(tokens, plan))
        m = (~visible).unsqueeze(1).to(x.dtype)
        x = x * (1 - m) + self.mask_token.to(x.dtype) * m
        x = self.pred(self.decoder(x))
        return x.flatten(2).transpose(1, 2)

    forward_loss = GreenMIM.forward_loss   # the same loss on the same unit layout (norm-pix MSE on masked units)

    def forward(self, imgs: Tensor, visible: Union[Tensor, ConvNeXtPlan],
                generator=None) -> Tuple[Tensor, Tensor, Tensor]:
        """``visible``: a plan (:meth:`plan`; the trainer's, made in its loader workers), or unit
        masks, per sample ``[B, g, g]`` or one ``[g, g]`` shared by the batch (planned here, on the
        host). ``generator`` is accepted for the trainer's call and unused (nothing random is drawn)."""
        B, _, H, W = imgs.shape
        if (H, W) != (self.img_size, self.img_size):
            raise ValueError(f"greenmim: FCMAE takes {self.img_size} px images, got {tuple(imgs.shape)}")
        plan = visible
        if not isinstance(plan, ConvNeXtPlan) or (plan.num_masks == 1 and B > 1):
            masks = plan.visible[0] if isinstance(plan, ConvNeXtPlan) else visible
            if not isinstance(masks, Tensor) or masks.dim() not in (2, 3) or \
                    tuple(masks.shape[-2:]) != (self.grid, self.grid) or (masks.dim() == 3 and masks.shape[0] != B):
                raise ValueError(f"greenmim: FCMAE takes [B, {self.grid}, {self.grid}] masks, one [{self.grid}, "
                                 f"{self.grid}] or their plan for {B} images, got {tuple(getattr(masks, 'shape', ()))}")
            plan = self.plan(masks, device=imgs.device, cache=False, batch=B)
        if plan.num_masks != B or plan.image_size != (H, W) or plan.kernel != self.encoder.kernel:
            raise GreenmimError(f"greenmim: FCMAE: {plan!r} does not fit {B} images of {H}x{W} px and "
                                f"{self.encoder.kernel}x{self.encoder.kernel} convs")
        if plan.device != imgs.device:
            raise GreenmimError(f"greenmim: the plan is on {plan.device}, the images on {imgs.device}: plans and "
                                f"tensors must share a device (plan.to({str(imgs.device)!r}))")
        if plan.num_visible == B * self.grid * self.grid:     # the layout's count: no read of the device
            raise ValueError("greenmim: every unit is visible: nothing to reconstruct (mask ratio 0?)")
        tokens, plan = self.encoder(imgs, plan)
        visible = plan.visible
        pred = self.forward_decoder(tokens, plan, visible)
        mask = (~visible).reshape(B, -1).float()
        return self.forward_loss(imgs, pred, mask), pred, mask


def export_encoder(model: FCMAE) -> Dict[str, Tensor]:
    """The encoder's state dict, which timm's ``convnextv2_*`` with ``num_classes=0`` loads strictly
    (then ``reset_classifier(n)`` to fine-tune): the encoder's modules are timm's."""
    return {k: v.detach().clone() for k, v in model.encoder.state_dict().items()}
