"""The peer models that bench/gpu/train_step.py times next to greenmim, built from timm's modules.

- ``SimMIMSwin`` / ``SimMIMTwins`` / ``SimMIM``: SimMIM (Xie et al., 2022): timm's Swin (Twins)
  over all tokens, masked patch embeddings replaced by a learned mask token; the whole model adds
  SimMIM's linear decoder (1x1 conv + pixel shuffle) and L1 on the masked pixels.
- ``MAE``: MAE ViT-B/16 (He et al., 2022; facebookresearch/mae models_mae.py): the encoder on the
  visible 25% of the patches (plus the class token), fixed 2-D sin-cos position embeddings, the
  decoder (512 wide, 8 blocks, 16 heads) over every patch with mask tokens, and the mean square
  error of the normalised pixels of the masked patches. timm's ``vision_transformer.Block``.
- ``HieraMAE``: Hiera-B's MAE (Ryali et al., 2023; facebookresearch/hiera hiera_mae.py) on timm's
  ``Hiera`` (``hiera_base_224``'s sizes; MAE pools q twice, ``q_pool=2``): masking of whole 8x8
  mask units (60%), the multi-scale fusion heads, the decoder (512, 8 blocks, 16 heads) at the
  last stage's 14x14 tokens, and the normalised-pixel loss at stride 16 on the masked units.
- ``MaskedDenseFCMAE``: FCMAE (ConvNeXt V2) the JAX / SparK way, the practical peer of greenmim's
  sparse FCMAE: timm's ConvNeXt V2 modules on the whole image, the masked 32-px units zeroed
  before the stem, after the stem and each downsampling layer, and after each block; every site
  is computed whatever the mask. The same decoder and loss as ``greenmim.fcmae.FCMAE`` (its own
  modules). The block's inner ops are timm's, unmasked (its GRN norms over masked sites too): a
  peer for time, memory and FLOPs, not an oracle (python/tests/test_convnextv2.py holds that).

Each model's ``forward(img, item)`` returns the loss (``full=True``) or the encoder's output on the
visible tokens (``full=False``: train_step.py's encoder-only rows take its mean square). The item
is drawn outside the step (train_step.py's ``--plans loader`` draws it ahead, like greenmim's
plans) and has a fixed shape, so that a CUDA graph captures the step: MAE takes each sample's
patch permutation (``MAE.draw``), Hiera a boolean mask over its mask units with the same number
kept in every sample (``HieraMAE.draw``). Where the reference code selects tokens with a boolean
index (a host synchronisation, which a graph cannot capture), these gather or scatter by indices
sorted from the mask: the same tokens in the same order.

``fused_attention_on(model)``: timm's fused attention (``F.scaled_dot_product_attention``) in
every attention module. timm turns it on by default for ViT, Hiera and Twins but leaves Swin's
off unless ``TIMM_FUSED_ATTN=2`` (its ``use_fused_attn(experimental=True)``).

``make_row(row, cfg, args, device)`` builds a train_step.py row's model (greenmim's rows too).
"""
from __future__ import annotations

import math

import torch
from torch import nn

import greenmim

DENSE = ("simmim", "mae", "hiera", "masked-dense")          # rows whose item is a tensor (a mask), not a greenmim plan


def fused_attention_on(model: nn.Module) -> int:
    """Sets ``fused_attn`` on every timm attention module of ``model``; returns how many."""
    n = 0
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = True
            n += 1
    return n


# ---- SimMIM ---------------------------------------------------------------------------------------

class SimMIMSwin(nn.Module):
    """SimMIM's encoder: timm's Swin over all tokens, masked patch embeddings replaced by a
    learned mask token."""

    def __init__(self, timm_model: nn.Module, dim: int):
        super().__init__()
        self.swin = timm_model
        self.mask_token = nn.Parameter(torch.zeros(1, 1, 1, dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def forward(self, img: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        x = self.swin.patch_embed(img)                                  # [B, H, W, C]
        w = masked.unsqueeze(-1).to(x.dtype)
        x = x * (1 - w) + self.mask_token.to(x.dtype) * w
        return self.swin.norm(self.swin.layers(x))


class SimMIMTwins(nn.Module):
    """The same for timm's Twins: masked patch embeddings of stage 1 replaced by a mask token,
    then timm's stages on all tokens (``Twins.forward_features`` from its first PEG on).
    Returns ``[B, h, w, C]`` like :class:`SimMIMSwin`."""

    def __init__(self, timm_model: nn.Module, dim: int):
        super().__init__()
        self.twins = timm_model
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def forward(self, img: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        t, B = self.twins, img.shape[0]
        x = img
        for i, (embed, drop, blocks, peg) in enumerate(zip(t.patch_embeds, t.pos_drops, t.blocks, t.pos_block)):
            x, size = embed(x)
            if i == 0:
                w = masked.reshape(B, -1, 1).to(x.dtype)
                x = x * (1 - w) + self.mask_token.to(x.dtype) * w
            x = drop(x)
            for j, blk in enumerate(blocks):
                x = blk(x, size)
                if j == 0:
                    x = peg(x, size)
            x = x.reshape(B, *size, -1)
            if i < len(t.blocks) - 1:
                x = x.permute(0, 3, 1, 2).contiguous()
        return t.norm(x)


class SimMIM(nn.Module):
    """SimMIM's whole model: the encoder above, a 1x1 conv to stride^2 * 3 channels, a pixel
    shuffle back to the image, and L1 on the masked pixels (SimMIM's simmim.py)."""

    def __init__(self, encoder: nn.Module, num_features: int, stride: int = 32):
        super().__init__()
        self.encoder, self.stride = encoder, stride
        self.decoder = nn.Sequential(nn.Conv2d(num_features, stride ** 2 * 3, kernel_size=1), nn.PixelShuffle(stride))

    def forward(self, img: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        z = self.encoder(img, masked)                                   # [B, h, w, C]
        rec = self.decoder(z.permute(0, 3, 1, 2).contiguous())
        p = img.shape[-1] // masked.shape[-1]                           # patch size
        m = masked.repeat_interleave(p, 1).repeat_interleave(p, 2).unsqueeze(1).to(rec.dtype)
        return (torch.abs(img - rec) * m).sum() / (m.sum() + 1e-5) / 3


# ---- MAE and Hiera's MAE: shared pieces --------------------------------------------------------------

def patch_labels(img: torch.Tensor, p: int) -> torch.Tensor:
    """``[B, 3, H, W] -> [B, (H/p)(W/p), p*p*3]`` in raster order, each patch normalised by its own
    mean and variance (MAE's and Hiera's ``norm_pix_loss``)."""
    B, C, H, W = img.shape
    x = img.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
    return (x - mean) / (var + 1e-6) ** 0.5


def masked_mse(pred: torch.Tensor, target: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean square error over the masked patches (``masked`` [B, L], 1 = masked), as
    ``((pred - target) ** 2).mean(-1)[masked].mean()`` without the boolean index."""
    m = masked.to(pred.dtype)
    return (((pred.float() - target.float()) ** 2).mean(-1) * m).sum() / m.sum()


def sincos_2d(h: int, w: int, dim: int, cls_token: bool) -> torch.Tensor:
    """MAE's fixed 2-D sin-cos position embedding ``[1, (1 +) h*w, dim]`` (a zero row for the class token)."""
    def one(pos: torch.Tensor, d: int) -> torch.Tensor:
        omega = 1.0 / 10000 ** (torch.arange(d // 2, dtype=torch.float64) / (d / 2.0))
        out = pos.reshape(-1, 1).double() * omega
        return torch.cat([out.sin(), out.cos()], 1)
    gy, gx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    emb = torch.cat([one(gx, dim // 2), one(gy, dim // 2)], 1).float()      # MAE: w's half first
    if cls_token:
        emb = torch.cat([torch.zeros(1, dim), emb], 0)
    return emb.unsqueeze(0)


class MAE(nn.Module):
    """MAE: a ViT encoder on the visible patches, a lighter decoder over all of them."""

    def __init__(self, img_size: int = 224, patch: int = 16, dim: int = 768, depth: int = 12, heads: int = 12,
                 dec_dim: int = 512, dec_depth: int = 8, dec_heads: int = 16, mask_ratio: float = 0.75,
                 full: bool = True):
        super().__init__()
        from timm.layers import PatchEmbed
        from timm.models.vision_transformer import Block
        from functools import partial
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.patch, self.full = patch, full
        self.grid = img_size // patch
        self.num_patches = self.grid ** 2
        self.keep = int(self.num_patches * (1 - mask_ratio))
        self.patch_embed = PatchEmbed(img_size, patch, 3, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.register_buffer("pos_embed", sincos_2d(self.grid, self.grid, dim, True), persistent=False)
        self.blocks = nn.ModuleList(Block(dim, heads, 4.0, qkv_bias=True, norm_layer=norm) for _ in range(depth))
        self.norm = norm(dim)
        if full:
            self.decoder_embed = nn.Linear(dim, dec_dim)
            self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_dim))
            self.register_buffer("decoder_pos_embed", sincos_2d(self.grid, self.grid, dec_dim, True), persistent=False)
            self.decoder_blocks = nn.ModuleList(Block(dec_dim, dec_heads, 4.0, qkv_bias=True, norm_layer=norm)
                                                for _ in range(dec_depth))
            self.decoder_norm = norm(dec_dim)
            self.decoder_pred = nn.Linear(dec_dim, patch * patch * 3)
        nn.init.normal_(self.cls_token, std=0.02)

    def draw(self, batch: int, gen: torch.Generator) -> torch.Tensor:
        """Each sample's patch permutation (int64 [B, L]): its first ``keep`` patches stay visible
        (MAE's ``random_masking``: the argsort of uniform noise)."""
        return torch.argsort(torch.rand(batch, self.num_patches, generator=gen), dim=1)

    def forward(self, img: torch.Tensor, ids_shuffle: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(img) + self.pos_embed[:, 1:].to(img.dtype)
        B, L, D = x.shape
        ids_keep = ids_shuffle[:, :self.keep]
        x = torch.gather(x, 1, ids_keep.unsqueeze(-1).expand(-1, -1, D))
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(B, -1, -1)
        x = torch.cat([cls.to(x.dtype), x], 1)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        if not self.full:
            return x
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        x = self.decoder_embed(x)
        masks = self.mask_token.to(x.dtype).expand(B, L - self.keep, -1)
        y = torch.cat([x[:, 1:], masks], 1)
        y = torch.gather(y, 1, ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[2]))
        x = torch.cat([x[:, :1], y], 1) + self.decoder_pos_embed.to(x.dtype)
        for blk in self.decoder_blocks:
            x = blk(x)
        pred = self.decoder_pred(self.decoder_norm(x))[:, 1:]
        masked = (ids_restore >= self.keep)                               # MAE's mask: 1 = removed
        return masked_mse(pred, patch_labels(img, self.patch), masked)


class HieraMAE(nn.Module):
    """Hiera's MAE on timm's ``Hiera`` (``hiera_base_224``: embed 96, 1 head, stages 2-3-16-3)."""

    def __init__(self, img_size: int = 224, embed_dim: int = 96, num_heads: int = 1, stages=(2, 3, 16, 3),
                 q_pool: int = 2, dec_dim: int = 512, dec_depth: int = 8, dec_heads: int = 16,
                 mask_ratio: float = 0.6, full: bool = True):
        super().__init__()
        from functools import partial
        from timm.models.hiera import Hiera, HieraBlock
        self.hiera = h = Hiera(img_size=(img_size, img_size), embed_dim=embed_dim, num_heads=num_heads,
                               stages=tuple(stages), q_pool=q_pool, num_classes=0, drop_path_rate=0.0)
        self.full = full
        self.units = math.prod(h.mask_spatial_shape)
        self.keep = int(self.units * (1 - mask_ratio))
        dim_out = h.blocks[-1].dim_out
        self.encoder_norm = nn.LayerNorm(dim_out, eps=1e-6)
        self.mu_final = [s // st ** q_pool for s, st in zip(h.mask_unit_size, h.q_stride)]
        self.tokens_final = [s // st ** q_pool for s, st in zip(h.tokens_spatial_shape, h.q_stride)]
        if not full:
            return
        heads, mu = [], list(h.mask_unit_size)
        for i in h.stage_ends[:q_pool]:           # the stages before the resolution stops changing
            k = [m // f for m, f in zip(mu, self.mu_final)]
            mu = [m // s for m, s in zip(mu, h.q_stride)]
            heads.append(nn.Conv2d(h.blocks[i].dim_out, dim_out, kernel_size=k, stride=k))
        self.fusion_heads = nn.ModuleList(heads)
        self.decoder_embed = nn.Linear(dim_out, dec_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_dim))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, math.prod(self.tokens_final), dec_dim))
        self.decoder_blocks = nn.ModuleList(HieraBlock(dec_dim, dec_dim, dec_heads, norm_layer=partial(nn.LayerNorm, eps=1e-6))
                                            for _ in range(dec_depth))
        self.decoder_norm = nn.LayerNorm(dec_dim, eps=1e-6)
        self.pred_stride = h.patch_stride[-1] * h.q_stride[-1] ** q_pool
        self.decoder_pred = nn.Linear(dec_dim, self.pred_stride ** 2 * 3)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        nn.init.trunc_normal_(self.decoder_pos_embed, std=0.02)

    def draw(self, batch: int, gen: torch.Generator) -> torch.Tensor:
        """bool [B, units]: ``keep`` mask units visible per sample, at random (Hiera's get_random_mask)."""
        ids = torch.argsort(torch.rand(batch, self.units, generator=gen), dim=1)
        return torch.zeros(batch, self.units, dtype=torch.bool).scatter_(1, ids[:, :self.keep], True)

    def _kept_units(self, mask: torch.Tensor) -> torch.Tensor:
        """int64 [B, keep]: each sample's visible units in ascending order (static shapes, no sync)."""
        ar = torch.arange(self.units, device=mask.device)
        return torch.sort(torch.where(mask, ar, ar + self.units), dim=1)[0][:, :self.keep]

    def encode(self, img: torch.Tensor, mask: torch.Tensor):
        """timm's ``Hiera.forward_features(img, mask, return_intermediates=True)`` with the visible
        tokens gathered by index: (the last block's output, each stage's rerolled output, the kept units)."""
        h = self.hiera
        B = img.shape[0]
        x = h.patch_embed(img, mask=mask.view(B, 1, *h.mask_spatial_shape))
        x = h.unroll(h._pos_embed(x))                                   # [B, tokens, C], unit = token % units
        kept = self._kept_units(mask)
        # Hiera: x[mask.tile(1, mu_size)]: the tokens t with mask[t % units], ascending in t
        idx = (torch.arange(h.mu_size, device=img.device).view(1, -1, 1) * self.units + kept.unsqueeze(1)).flatten(1)
        x = torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        stages = []
        for i, blk in enumerate(h.blocks):
            x = blk(x)
            if i in h.stage_ends:
                stages.append(h.reroll(x, i, mask=mask))                 # [B, keep, *mu, C]
        return x, stages, kept

    def forward(self, img: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.hiera
        B = img.shape[0]
        x, stages, kept = self.encode(img, mask)
        if not self.full:
            return self.encoder_norm(x)
        z = stages[-1]
        for head, s in zip(self.fusion_heads, stages[:h.q_pool]):
            Bk = s.shape[0] * s.shape[1]
            y = head(s.reshape(Bk, *s.shape[2:]).permute(0, 3, 1, 2))       # [B*keep, C', *mu_final]
            z = z + y.permute(0, 2, 3, 1).reshape(z.shape)
        z = self.decoder_embed(self.encoder_norm(z))                     # [B, keep, *mu_final, D]
        full_units = self.mask_token.to(z.dtype).view(1, 1, 1, 1, -1).expand(B, self.units, *z.shape[2:]).clone()
        full_units.scatter_(1, kept.view(B, -1, 1, 1, 1).expand_as(z), z)   # Hiera: x_dec[mask] = x
        from timm.models.hiera import undo_windowing
        z = undo_windowing(full_units, self.tokens_final, self.mu_final).reshape(B, -1, z.shape[-1])
        z = z + self.decoder_pos_embed.to(z.dtype)
        for blk in self.decoder_blocks:
            z = blk(z)
        pred = self.decoder_pred(self.decoder_norm(z))                   # [B, 14*14, 16*16*3]
        unit_mask = mask.view(B, *h.mask_spatial_shape, 1, 1).expand(-1, -1, -1, *self.mu_final)
        unit_mask = unit_mask.permute(0, 1, 3, 2, 4).reshape(B, -1)      # each prediction token's unit
        return masked_mse(pred, patch_labels(img, self.pred_stride), ~unit_mask)


# ---- train_step.py's rows ----------------------------------------------------------------------------

# the peers' sizes: (MAE ViT-B/16, Hiera-B's MAE) and toys of them (--cpu, --toy)
PEERS = {
    "base": (dict(dim=768, depth=12, heads=12, dec_dim=512, dec_depth=8, dec_heads=16),
             dict(embed_dim=96, num_heads=1, stages=(2, 3, 16, 3), dec_dim=512, dec_depth=8, dec_heads=16)),
    "toy": (dict(dim=32, depth=2, heads=2, dec_dim=32, dec_depth=1, dec_heads=2),
            dict(embed_dim=16, num_heads=1, stages=(1, 1, 1, 1), dec_dim=32, dec_depth=1, dec_heads=2)),
}

class MaskedDenseFCMAE(nn.Module):
    """The dense masked FCMAE step (see the module docstring) around an FCMAE ``fcmae``:
    ``forward(img, visible)`` -> the loss; ``visible`` bool ``[B, H/32, W/32]`` per sample."""

    def __init__(self, fcmae: nn.Module):
        super().__init__()
        self.fcmae = fcmae

    def forward(self, imgs: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        m, enc = self.fcmae, self.fcmae.encoder
        B = imgs.shape[0]

        def keep(r):                     # [B, 1, g*r, g*r]: 1 at the visible units' sites
            return visible.repeat_interleave(r, 1).repeat_interleave(r, 2).unsqueeze(1).to(imgs.dtype)
        x = enc.stem(imgs * keep(32)) * keep(8)
        for s, stage in enumerate(enc.stages):
            k = keep(8 >> s)
            if s:
                x = stage.downsample(x) * k
            for blk in stage.blocks:
                x = blk(x) * k
        x = m.proj(enc.norm_pre(x))
        masked = (~visible).unsqueeze(1).to(x.dtype)
        x = x * (1 - masked) + m.mask_token.to(x.dtype) * masked
        pred = m.pred(m.decoder(x)).flatten(2).transpose(1, 2)
        return m.forward_loss(imgs, pred, (~visible).reshape(B, -1).float())


def make_convnext_row(row: str, cfg: dict, args, device):
    """ConvNeXt V2's rows: ``greenmim`` (greenmim's FCMAE, registry ``cfg["registry"]``) or
    ``masked-dense`` (the same FCMAE run densely, ``MaskedDenseFCMAE``)."""
    model = greenmim.create_model(cfg["registry"], img_size=args.img, **cfg.get("kwargs", {}))
    return (MaskedDenseFCMAE(model) if row == "masked-dense" else model).to(device)


def make_twins_row(row: str, cfg: dict, args, device):
    width = cfg["embed_dims"][-1]
    if row == "simmim":
        import timm
        m = timm.models.twins.Twins(img_size=args.img, num_classes=0, wss=(7, 7, 7, 7), drop_path_rate=0.0, **cfg)
        enc = SimMIMTwins(m, cfg["embed_dims"][0])
        return (SimMIM(enc, width) if args.full else enc).to(device)
    enc = greenmim.VisibleTwins(img_size=args.img, attn_impl="released" if row == "released" else "greenmim", **cfg)
    if not args.full:
        return enc.to(device)
    dec = dict(decoder_embed_dim=128, decoder_num_heads=4) if cfg["embed_dims"][0] <= 32 else {}
    return greenmim.GreenMIM(enc, **dec).to(device)


def make_peer(row: str, cfg: dict, args, device):
    """The mae or hiera row's model: ViT-B/16's or Hiera-B's MAE, toys of them beside a toy model."""
    toy = (cfg.get("embed_dim") or cfg["embed_dims"][0]) <= 32
    mae_cfg, hiera_cfg = PEERS["toy" if toy else "base"]
    if row == "mae":
        return MAE(img_size=args.img, mask_ratio=0.75, full=args.full, **mae_cfg).to(device)
    return HieraMAE(img_size=args.img, q_pool=2, mask_ratio=0.6, full=args.full, **hiera_cfg).to(device)


def make_row(row: str, cfg: dict, args, device):
    """The row's model; SimMIM and the peers with timm's fused attention on (at their strongest)."""
    if getattr(args, "convnext", False):
        return make_convnext_row(row, cfg, args, device)
    if row in ("mae", "hiera"):
        model = make_peer(row, cfg, args, device)
    elif args.twins:
        model = make_twins_row(row, cfg, args, device)
    else:
        model = make_swin_row(row, cfg, args, device)
    if row in DENSE:
        fused_attention_on(model)
    return model


def make_swin_row(row: str, cfg: dict, args, device):
    width = cfg["embed_dim"] << (len(cfg["depths"]) - 1)
    if row == "simmim":
        import timm
        cls = timm.models.swin_transformer_v2.SwinTransformerV2 if args.v2 else \
            timm.models.swin_transformer.SwinTransformer
        m = cls(img_size=args.img, num_classes=0, window_size=args.window, drop_path_rate=0.0, **cfg)
        enc = SimMIMSwin(m, cfg["embed_dim"])
        return (SimMIM(enc, width) if args.full else enc).to(device)
    impl = "released" if row == "released" else "greenmim"
    cls = greenmim.VisibleSwinTransformerV2 if args.v2 else greenmim.VisibleSwinTransformer
    enc = cls(img_size=args.img, window_size=args.window, attn_impl=impl, **cfg)
    if not args.full:
        return enc.to(device)
    dec = dict(decoder_embed_dim=128, decoder_num_heads=4) if cfg["embed_dim"] <= 32 else {}
    return greenmim.GreenMIM(enc, **dec).to(device)
