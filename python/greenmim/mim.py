"""GreenMIM, the whole pretraining model: a visible-token encoder, then MAE's light decoder at the
last stage's resolution, and the loss on the masked units.

    model = greenmim.create_model("green_mim_swin_base_patch4_dec512b1")
    plan = model.plan(greenmim.random_masks(batch), device="cuda")   # per-sample masks, or one [7, 7]
    loss, pred, mask = model(images, plan)

Parameter names are the released ``MaskedAutoencoder``'s (``encoder.*``, ``decoder_embed``,
``mask_token``, ``decoder_pos_embed``, ``decoder_blocks.N``, ``decoder_norm``, ``decoder_pred``),
with the encoder in timm's layout (``encoder.layers.N.downsample`` opens stage N). Two choices
differ from the released code, on purpose (docs/pretraining.md):

- each visible latent reaches the decoder at its own unit (``decoder_order="greenmim"``); the
  released decoder receives them in a random order (``decoder_order="released"`` reproduces it);
- the encoder keeps timm's initialisation and LayerNorm eps (1e-5), which is what fine-tuning in
  timm runs; the decoder keeps MAE's (xavier_uniform, eps 1e-6).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._lib import GreenmimError
from .mask_plan import MaskPlan
from . import swin, swinv2, twins
from .layers import Mlp
from .swin import SWIN_B, SWIN_L, SWIN_NANO, SWIN_T, VisibleSwinTransformer
from .swinv2 import VisibleSwinTransformerV2
from .twins import TWINS_NANO as _TWINS_NANO_DIMS, TWINS_SVT_L, VisibleTwins

DECODER_ORDERS = ("greenmim", "released")


def sincos_pos_embed(dim: int, grid: int) -> Tensor:
    """MAE's fixed 2-D sin-cos embedding ``[grid * grid, dim]`` (``get_2d_sincos_pos_embed``,
    computed in float64 as its numpy original, returned as float32). As in MAE, the first half
    of the channels encodes the column and the second half the row."""
    if dim % 4:
        raise GreenmimError(f"greenmim: the decoder width must be a multiple of 4 for sin-cos positions, got {dim}")
    g = torch.arange(grid, dtype=torch.float64)
    ww, hh = torch.meshgrid(g, g, indexing="xy")          # np.meshgrid(grid_w, grid_h): ww varies along w

    def one(pos: Tensor) -> Tensor:
        omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
        out = pos.reshape(-1, 1) * omega.reshape(1, -1)
        return torch.cat([out.sin(), out.cos()], dim=1)

    return torch.cat([one(ww), one(hh)], dim=1).float()


class DecoderAttention(nn.Module):
    """timm's ViT ``Attention`` (``qkv``, ``proj``) with ``scaled_dot_product_attention``."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise GreenmimError(f"greenmim: decoder width {dim} is not a multiple of its {num_heads} heads")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        B, L, C = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, C))


class DecoderBlock(nn.Module):
    """timm's ViT ``Block`` (pre-norm; ``norm1``, ``attn``, ``norm2``, ``mlp.fc1/fc2``)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, norm_layer=nn.LayerNorm):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = DecoderAttention(dim, num_heads)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(x, norm=self.norm2)


def patchify(imgs: Tensor, p: int) -> Tensor:
    """``[B, C, H, W] -> [B, (H/p)(W/p), p*p*C]``, MAE's order (row, column, channel last)."""
    B, C, H, W = imgs.shape
    h, w = H // p, W // p
    return imgs.reshape(B, C, h, p, w, p).permute(0, 2, 4, 3, 5, 1).reshape(B, h * w, p * p * C)


def _unit_stats(target: Tensor) -> Tuple[Tensor, Tensor]:
    """Each unit's mean and MAE's std (unbiased variance + 1e-6) over its pixels: norm_pix_loss."""
    return target.mean(dim=-1, keepdim=True), (target.var(dim=-1, keepdim=True) + 1.0e-6) ** 0.5


def unpatchify(x: Tensor, p: int, chans: int = 3) -> Tensor:
    """Inverse of :func:`patchify` for a square grid."""
    B, L, _ = x.shape
    h = int(round(math.sqrt(L)))
    return x.reshape(B, h, h, p, p, chans).permute(0, 5, 1, 3, 2, 4).reshape(B, chans, h * p, h * p)


class GreenMIM(nn.Module):
    """Masked image modeling on visible tokens: ``forward(images, plan) -> (loss, pred, mask)``.

    ``pred`` is ``[B, L, unit*unit*3]`` for the L units of the last stage's grid (7x7 at 224 px),
    ``mask`` is ``[B, L]`` (1 = masked, the released convention), and ``loss`` the mean square
    error against each unit's pixels (normalised per unit with ``norm_pix_loss``), averaged over
    the masked units only. ``plan`` comes from :meth:`plan`, one mask shared by the batch or one
    per sample. ``generator`` draws the released decoder order (``decoder_order="released"``)."""

    def __init__(self, encoder: VisibleSwinTransformer, decoder_embed_dim: int = 512, decoder_depth: int = 1,
                 decoder_num_heads: int = 16, mlp_ratio: float = 4.0, norm_pix_loss: bool = True,
                 decoder_order: str = "greenmim", in_chans: int = 3, decoder_norm_eps: float = 1e-6):
        super().__init__()
        if decoder_order not in DECODER_ORDERS:
            raise GreenmimError(f"greenmim: decoder_order must be one of {DECODER_ORDERS}, got {decoder_order!r}")
        self.encoder = encoder
        stages = len(encoder.depths)
        self.unit = encoder.patch_size << (stages - 1)        # the last stage's stride: one decoder token
        if encoder.img_size % self.unit:
            raise GreenmimError(f"greenmim: image {encoder.img_size} is not a multiple of the last stride {self.unit}")
        self.grid = encoder.img_size // self.unit
        self.in_chans = in_chans
        self.norm_pix_loss = norm_pix_loss
        self.decoder_order = decoder_order
        norm = lambda d: nn.LayerNorm(d, eps=decoder_norm_eps)
        self.decoder_embed = nn.Linear(encoder.num_features, decoder_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.register_buffer("decoder_pos_embed", sincos_pos_embed(decoder_embed_dim, self.grid).unsqueeze(0))
        self.decoder_blocks = nn.ModuleList([DecoderBlock(decoder_embed_dim, decoder_num_heads, mlp_ratio, norm)
                                             for _ in range(decoder_depth)])
        self.decoder_norm = norm(decoder_embed_dim)
        self.decoder_pred = nn.Linear(decoder_embed_dim, self.unit * self.unit * in_chans)
        self._init_decoder()

    def _init_decoder(self) -> None:
        """MAE's initialisation of the decoder: xavier_uniform linears, zero biases, N(0, 0.02) mask token."""
        nn.init.normal_(self.mask_token, std=0.02)
        for m in [self.decoder_embed, self.decoder_pred, *self.decoder_blocks.modules()]:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    # ---- planning ---------------------------------------------------------------------------------

    def plan(self, visible: Tensor, device=None, cache: bool = True) -> MaskPlan:
        """Plans a unit mask (bool ``[g, g]`` shared or ``[B, g, g]`` per sample, True = visible)."""
        return self.encoder.plan(visible, device=device, cache=cache)

    def random_masks(self, batch: Optional[int], ratio: float = 0.75,
                     generator: Optional[torch.Generator] = None) -> Tensor:
        """Random unit masks for this model's grid: ``[g, g]`` (batch None) or ``[batch, g, g]``."""
        from .mask_plan import random_masks
        return random_masks(batch, grid=self.grid, ratio=ratio, generator=generator)

    # ---- forward ------------------------------------------------------------------------------------

    def _last_stage(self, plan: MaskPlan, batch: int):
        last = plan.stages[-1]
        if last.grid != (self.grid, self.grid) or last.unit_rank is None:
            raise GreenmimError(f"greenmim: the plan's last stage is {last.grid[0]}x{last.grid[1]}, the decoder's "
                                f"grid {self.grid}x{self.grid}: a plan for another model?")
        if plan.per_sample and plan.num_masks != batch:
            raise GreenmimError(f"greenmim: {batch} images, {plan.num_masks} per-sample masks")
        L = self.grid * self.grid
        if last.num_tokens * (1 if plan.per_sample else batch) == L * batch:
            raise GreenmimError("greenmim: every unit is visible: nothing to reconstruct (mask ratio 0?)")
        return last

    def decoder_index(self, plan: MaskPlan, batch: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """Where each unit's decoder input comes from: ``[B * L]`` indices into ``cat([latents,
        mask tokens])``, the latents flattened sample-major as the encoder returns them.

        ``"greenmim"``: unit u of sample b takes the latent of that very unit. ``"released"``: the
        visible units of each sample take their sample's latents in a uniformly random order,
        drawn afresh per sample from ``generator``: what the released code does in distribution."""
        last = self._last_stage(plan, batch)
        L = self.grid * self.grid
        rank = last.unit_rank                                   # [M, L]: visible rank, or -1 - masked rank
        dev = rank.device
        vis = rank >= 0
        r = torch.where(vis, rank, -1 - rank).long()
        b = torch.arange(batch, device=dev)
        if plan.per_sample:
            cu = last.cu_seqlens.long()
            vis_before, n_vis = cu[:-1], last.num_tokens
            counts = cu[1:] - cu[:-1]
        else:
            N = last.num_tokens
            vis, r = vis.expand(batch, L), r.expand(batch, L)
            vis_before, n_vis = b * N, batch * N
            counts = torch.full((batch,), N, device=dev, dtype=torch.long)
        slot = vis_before.unsqueeze(1) + r                      # visible units: their index among all latents
        if self.decoder_order == "released":
            sample = torch.repeat_interleave(b, counts, output_size=n_vis)
            gen_dev = generator.device if generator is not None else torch.device("cpu")
            noise = torch.rand(n_vis, generator=generator, device=gen_dev, dtype=torch.float64).to(dev)
            perm = torch.argsort(sample.double() + noise)       # a random permutation within each sample
            slot = perm[slot.clamp(max=n_vis - 1)]
        masked_before = b * L - vis_before
        return torch.where(vis, slot, n_vis + masked_before.unsqueeze(1) + r).reshape(-1)

    def forward_decoder(self, latent: Tensor, plan: MaskPlan, batch: int,
                        generator: Optional[torch.Generator] = None) -> Tensor:
        """Decoder on the full unit grid: ``latent`` is the encoder's output (``[B, N, C]`` shared
        or ``[1, sum N_b, C]`` per sample). Returns ``[B, L, unit^2 * 3]``."""
        L = self.grid * self.grid
        x = self.decoder_embed(latent).reshape(-1, self.mask_token.shape[-1])
        tokens = self.mask_token.to(x.dtype).reshape(1, -1).expand(batch * L - x.shape[0], -1)
        index = self.decoder_index(plan, batch, generator)
        x = torch.cat([x, tokens]).index_select(0, index).view(batch, L, -1)
        x = x + self.decoder_pos_embed.to(x.dtype)
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))

    def masked_units(self, plan: MaskPlan, batch: int) -> Tensor:
        """``[B, L]`` float, 1 where a unit is masked (the released convention)."""
        rank = self._last_stage(plan, batch).unit_rank
        return (rank < 0).float().expand(batch, -1)

    def forward_loss(self, imgs: Tensor, pred: Tensor, mask: Tensor) -> Tensor:
        """Mean square error per unit (normalised pixels with ``norm_pix_loss``, MAE's unbiased
        variance + 1e-6), averaged over the masked units (``mask`` 1)."""
        dt = torch.promote_types(pred.dtype, torch.float32)    # float32 under autocast, float64 in float64
        target = patchify(imgs.to(dt), self.unit)
        if self.norm_pix_loss:
            mean, std = _unit_stats(target)
            target = (target - mean) / std
        per_unit = (pred.to(dt) - target).square().mean(dim=-1)
        mask = mask.to(dt)
        return (per_unit * mask).sum() / mask.sum()

    def forward(self, imgs: Tensor, plan: MaskPlan,
                generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor, Tensor]:
        if plan.device != imgs.device:
            raise GreenmimError(f"greenmim: the plan is on {plan.device}, the images on {imgs.device}: plans and "
                                f"tensors must share a device (plan.to({str(imgs.device)!r}))")
        B = imgs.shape[0]
        mask = self.masked_units(plan, B)
        latent = self.encoder.forward_features(imgs, plan)
        pred = self.forward_decoder(latent, plan, B, generator)
        return self.forward_loss(imgs, pred, mask), pred, mask

    @torch.no_grad()
    def reconstruct(self, imgs: Tensor, pred: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
        """Images from a prediction (un-normalised with each unit's own mean and variance when
        ``norm_pix_loss``): (reconstruction, reconstruction with the visible units pasted back)."""
        target = patchify(imgs.float(), self.unit)
        pred = pred.float()
        if self.norm_pix_loss:
            mean, std = _unit_stats(target)
            pred = pred * std + mean
        m = mask.float().unsqueeze(-1)
        return unpatchify(pred, self.unit, self.in_chans), unpatchify(pred * m + target * (1 - m), self.unit,
                                                                       self.in_chans)


# ---- constructors ----------------------------------------------------------------------------------

# the encoders' presets are stated once, in swin.py and twins.py; GreenMIM's Twins name their
# sub-sampling and windows (the released alt_gvt's), which the checkpoint's config records
TWINS_L = dict(TWINS_SVT_L, sr_ratios=(8, 4, 2, 1), wss=(7, 7, 7, 7))
TWINS_NANO = dict(_TWINS_NANO_DIMS, sr_ratios=(8, 4, 2, 1), wss=(7, 7, 7, 7))

# name: (encoder class, encoder kwargs, decoder kwargs, what it is)
_ARCHS: Dict[str, Tuple[type, dict, dict, str]] = {
    "green_mim_swin_base_patch4_dec512b1": (VisibleSwinTransformer, dict(SWIN_B, img_size=224, window_size=7), {},
                                            "released: Swin-B, 224 px, window 7"),
    "green_mim_swin_base_patch4_win14_dec512b1": (VisibleSwinTransformer, dict(SWIN_B, img_size=224, window_size=14),
                                                  {}, "released: Swin-B, 224 px, window 14"),
    "green_mim_swin_large_patch4_win14_dec512b1": (VisibleSwinTransformer,
                                                   dict(SWIN_L, img_size=224, window_size=14), {},
                                                   "released: Swin-L, 224 px, window 14"),
    "green_mim_swin_base_patch4_window6_192_dec512b1": (VisibleSwinTransformer,
                                                        dict(SWIN_B, img_size=192, window_size=6), {},
                                                        "SimMIM's shape: Swin-B, 192 px, window 6"),
    "green_mim_swin_large_patch4_window6_192_dec512b1": (VisibleSwinTransformer,
                                                         dict(SWIN_L, img_size=192, window_size=6), {},
                                                         "SimMIM's shape: Swin-L, 192 px, window 6"),
    "green_mim_swinv2_base_window8_256_dec512b1": (VisibleSwinTransformerV2, dict(SWIN_B, img_size=256, window_size=8),
                                                   {}, "Swin V2-B, 256 px, window 8"),
    "green_mim_swinv2_base_window16_256_dec512b1": (VisibleSwinTransformerV2,
                                                    dict(SWIN_B, img_size=256, window_size=16), {},
                                                    "Swin V2-B, 256 px, window 16"),
    "green_mim_swinv2_large_window12_192_dec512b1": (VisibleSwinTransformerV2,
                                                     dict(SWIN_L, img_size=192, window_size=12), {},
                                                     "Swin V2-L, 192 px, window 12"),
    "green_mim_swin_tiny_patch4_dec512b1": (VisibleSwinTransformer, dict(SWIN_T, img_size=224, window_size=7), {},
                                            "Swin-T, 224 px, window 7"),
    "green_mim_swin_nano_patch4_dec128b1": (VisibleSwinTransformer, dict(SWIN_NANO, img_size=224, window_size=7),
                                            dict(decoder_embed_dim=128, decoder_num_heads=4),
                                            "a toy for CPUs and tests: embed 32, depths 2-2-2-2, decoder 128"),
    # Twins: timm's PEG (conv + x) and LayerNorm eps; the released code drops the PEG's + x
    # (docs/models.md): pass nothing to keep timm's, which is what fine-tuning in timm runs
    "green_mim_twins_large_patch4_dec512b1": (VisibleTwins, dict(TWINS_L, img_size=224), {},
                                              "released: Twins-SVT-L, 224 px, windows 7, sr 8/4/2/1"),
    "green_mim_twins_nano_patch4_dec128b1": (VisibleTwins, dict(TWINS_NANO, img_size=224),
                                             dict(decoder_embed_dim=128, decoder_num_heads=4),
                                             "a toy for CPUs and tests: Twins, dims 32-256, depths 2-2-2-2, decoder 128"),
}
# FCMAE (ConvNeXt V2's masked autoencoder, greenmim.fcmae): the released decoder 512 x 1, one per
# size of timm's convnextv2_*; its recipe differs from GreenMIM's (RECIPES)
FCMAE_SIZES = ("atto", "femto", "pico", "nano", "tiny", "base", "large", "huge")
FCMAE_ARCHS: Dict[str, Tuple[str, str]] = {
    f"fcmae_convnextv2_{s}_dec512b1": (f"convnextv2_{s}", f"FCMAE: ConvNeXt V2-{s}, 224 px, decoder 512 x 1"
                                       + (" (a toy for CPUs and tests)" if s == "atto" else ""))
    for s in FCMAE_SIZES}
# the trainer's defaults of each family, used where the user gave no flag (greenmim.pretrain.args)
RECIPES = {"green_mim": dict(mask_ratio=0.75, per_sample_masks=False),
           "fcmae": dict(mask_ratio=0.6, per_sample_masks=True)}


def recipe(name: str) -> dict:
    """The recipe defaults of a registered model: mask ratio and per-sample masks."""
    return dict(RECIPES["fcmae" if name in FCMAE_ARCHS else "green_mim"])


ENCODER_KEYS = ("img_size", "window_size", "attn_impl", "strategy", "drop_path_rate", "norm_layer")
DECODER_KEYS = ("decoder_embed_dim", "decoder_depth", "decoder_num_heads", "norm_pix_loss", "decoder_order")


# the visible-token encoders, by timm's names: name -> (class, keyword arguments, what it is)
ENCODERS: Dict[str, Tuple[type, dict, str]] = {**swin.ENCODERS, **swinv2.ENCODERS, **twins.ENCODERS}


def model_names(encoders: bool = False) -> Dict[str, str]:
    """The registered GreenMIM models and what each is; with ``encoders=True`` also the
    visible-token encoders (timm's names), which :func:`create_model` builds too."""
    out = {k: v[3] for k, v in _ARCHS.items()}
    out.update({k: v[1] for k, v in FCMAE_ARCHS.items()})
    if encoders:
        out.update({k: v[2] for k, v in ENCODERS.items()})
    return out


def create_model(name: str, **kw):
    """A registered model: a GreenMIM model (``green_mim_*``), whose keyword arguments override its
    encoder geometry (``img_size``, ``window_size``, ``attn_impl``, ``strategy``,
    ``drop_path_rate``) or decoder (``decoder_depth`` …, ``norm_pix_loss``, ``decoder_order``); or
    a visible-token encoder by timm's name (``swin_base_patch4_window7_224``, ``twins_svt_large``
    ...: :func:`model_names` with ``encoders=True``), whose keyword arguments go to its class."""
    if name in ENCODERS:
        cls, preset, _ = ENCODERS[name]
        return cls(**{**preset, **kw})
    if name in FCMAE_ARCHS:
        return _create_fcmae(name, kw)
    if name not in _ARCHS:
        close = closest_model_names(name, encoders=True)
        raise GreenmimError(f"greenmim: unknown model {name!r}; did you mean one of {close}? "
                            f"(all: greenmim.model_names(encoders=True))")
    cls, enc, dec, _ = _ARCHS[name]
    bad = [k for k in kw if k not in ENCODER_KEYS + DECODER_KEYS]
    if bad:
        raise GreenmimError(f"greenmim: {name}: unknown arguments {bad}")
    enc = {**enc, **{k: v for k, v in kw.items() if k in ENCODER_KEYS and v is not None}}
    dec = {**dec, **{k: v for k, v in kw.items() if k in DECODER_KEYS and v is not None}}
    model = GreenMIM(cls(**enc), **dec)
    model.name = name
    model.config = {"name": name, "encoder": cls.__name__,
                    **{k: (list(v) if isinstance(v, tuple) else v) for k, v in enc.items() if k != "norm_layer"},
                    "decoder_embed_dim": model.mask_token.shape[-1], "decoder_depth": len(model.decoder_blocks),
                    "decoder_num_heads": model.decoder_blocks[0].attn.num_heads if len(model.decoder_blocks) else 0,
                    "norm_pix_loss": model.norm_pix_loss, "decoder_order": model.decoder_order}
    return model


def _create_fcmae(name: str, kw: dict):
    """An FCMAE model (greenmim.fcmae.FCMAE); the GreenMIM keywords that mean nothing for it are
    refused when set (a window; the released decoder order: its dense decoder keeps each latent
    at its unit)."""
    from .fcmae import FCMAE
    bad = [k for k in kw if k not in ENCODER_KEYS + DECODER_KEYS + ("grn",)]
    if bad:
        raise GreenmimError(f"greenmim: {name}: unknown arguments {bad}")
    if kw.get("window_size") is not None:
        raise GreenmimError(f"greenmim: {name} has no windows (7x7 depthwise convolutions): drop the window size")
    if kw.get("decoder_order") not in (None, "greenmim"):
        raise GreenmimError(f"greenmim: {name}: decoder order {kw['decoder_order']!r} is GreenMIM's; FCMAE's dense "
                            f"decoder keeps each latent at its own unit")
    for k in ("attn_impl", "strategy", "norm_layer", "decoder_num_heads"):
        if kw.get(k) is not None:
            raise GreenmimError(f"greenmim: {name}: {k} is a Swin / Twins argument")
    args = {k: kw[k] for k in ("img_size", "decoder_embed_dim", "decoder_depth", "norm_pix_loss", "grn",
                                "drop_path_rate") if kw.get(k) is not None}
    try:
        model = FCMAE(FCMAE_ARCHS[name][0], mask_ratio=RECIPES["fcmae"]["mask_ratio"], **args)
    except ValueError as e:
        raise GreenmimError(str(e)) from None
    model.name = name
    model.config = {"name": name, "encoder": "VisibleConvNeXtV2", "timm_name": model.encoder.name,
                    "img_size": model.img_size, "decoder_embed_dim": model.mask_token.shape[1],
                    "decoder_depth": len(model.decoder), "grn": model.encoder.grn,
                    "norm_pix_loss": model.norm_pix_loss, "decoder_order": model.decoder_order,
                    "drop_path_rate": args.get("drop_path_rate", 0.0)}
    return model


def closest_model_names(name: str, n: int = 3, encoders: bool = False) -> list:
    """The ``n`` registered names closest to ``name`` (longest common prefix first): for "did you
    mean" in error messages."""
    return sorted(model_names(encoders=encoders), key=lambda m: -_common_prefix(m, name))[:n]


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _factory(name: str) -> Callable[..., GreenMIM]:
    def make(**kw) -> GreenMIM:
        return create_model(name, **kw)
    make.__name__ = name
    make.__doc__ = f"GreenMIM model: {_ARCHS[name][3]}."
    return make


green_mim_swin_base_patch4_dec512b1 = _factory("green_mim_swin_base_patch4_dec512b1")
green_mim_swin_base_patch4_win14_dec512b1 = _factory("green_mim_swin_base_patch4_win14_dec512b1")
green_mim_swin_large_patch4_win14_dec512b1 = _factory("green_mim_swin_large_patch4_win14_dec512b1")
green_mim_swin_base_patch4_window6_192_dec512b1 = _factory("green_mim_swin_base_patch4_window6_192_dec512b1")
green_mim_swin_large_patch4_window6_192_dec512b1 = _factory("green_mim_swin_large_patch4_window6_192_dec512b1")
green_mim_swinv2_base_window8_256_dec512b1 = _factory("green_mim_swinv2_base_window8_256_dec512b1")
green_mim_swinv2_base_window16_256_dec512b1 = _factory("green_mim_swinv2_base_window16_256_dec512b1")
green_mim_swinv2_large_window12_192_dec512b1 = _factory("green_mim_swinv2_large_window12_192_dec512b1")
green_mim_swin_tiny_patch4_dec512b1 = _factory("green_mim_swin_tiny_patch4_dec512b1")
green_mim_swin_nano_patch4_dec128b1 = _factory("green_mim_swin_nano_patch4_dec128b1")
green_mim_twins_large_patch4_dec512b1 = _factory("green_mim_twins_large_patch4_dec512b1")
green_mim_twins_nano_patch4_dec128b1 = _factory("green_mim_twins_nano_patch4_dec128b1")


def _fcmae_factory(name: str) -> Callable[..., nn.Module]:
    def make(**kw) -> nn.Module:
        return create_model(name, **kw)
    make.__name__ = name
    make.__doc__ = f"{FCMAE_ARCHS[name][1]}."
    return make


for _name in FCMAE_ARCHS:
    globals()[_name] = _fcmae_factory(_name)
del _name
