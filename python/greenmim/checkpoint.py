"""State dicts in and out of a GreenMIM model: the released code's checkpoints, window-size
changes, and the encoder in timm's format for fine-tuning.

- :func:`from_released` converts a checkpoint of the released ``MaskedAutoencoder`` (its Swin
  closes each stage with ``layers.i.downsample``; timm and greenmim open stage i+1 with it). The
  released repository changed its patch-merging order on 2023-01-16 (commit b981012): weights
  trained before (every checkpoint its README links, 2022-05) hold the four C-wide blocks of
  ``downsample.norm`` and of the input side of ``downsample.reduction`` in row-first order
  (0,0), (0,1), (1,0), (1,1); after, in Swin's (0,0), (1,0), (0,1), (1,1). Shapes cannot tell
  them apart, so the layout is an explicit argument.
- :func:`resize_rel_pos_tables` interpolates Swin's relative-position tables to another window
  (bicubic, as Swin's and timm's loaders); Swin V2's log-spaced position MLP needs none.
- :func:`encoder_to_timm` writes the encoder in timm's names, with a classifier head so that
  timm's loader reads it as a native checkpoint (``greenmim.export`` is the command line).
"""
from __future__ import annotations

import re
from typing import Dict, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._lib import GreenmimError

RELEASED_LAYOUTS = ("2022", "2023")
_ROW_FIRST_TO_SWIN = (0, 2, 1, 3)  # block k of Swin's order is block _ROW_FIRST_TO_SWIN[k] of the row-first order


def unwrap(obj) -> Dict[str, Tensor]:
    """The state dict inside a checkpoint (``{"model": ...}``, ``{"state_dict": ...}`` or itself)."""
    if isinstance(obj, Mapping):
        for k in ("model", "state_dict"):
            if k in obj and isinstance(obj[k], Mapping):
                return dict(obj[k])
        return dict(obj)
    raise GreenmimError(f"greenmim: a checkpoint is a dict of tensors, got {type(obj).__name__}")


def is_released(sd: Mapping[str, Tensor]) -> bool:
    """True for the released tree: ``encoder.layers.0.downsample`` exists (stage 1 closes with it)."""
    return any(k.startswith("encoder.layers.0.downsample.") for k in sd)


def _row_first_to_swin(t: Tensor, dim: int) -> Tensor:
    c = t.shape[dim] // 4
    return torch.cat([t.narrow(dim, j * c, c) for j in _ROW_FIRST_TO_SWIN], dim=dim)


def from_released(sd: Mapping[str, Tensor], layout: Optional[str]) -> Dict[str, Tensor]:
    """A released GreenMIM pretraining state dict in greenmim's names (and Swin's merge order).

    ``layout``: ``"2022"`` for weights trained before the released merge fix (every checkpoint
    the README links), ``"2023"`` for weights trained after it. There is no default: shapes
    cannot tell the two apart, and the wrong one silently scrambles every patch merging."""
    if layout not in RELEASED_LAYOUTS:
        raise GreenmimError(
            "greenmim: a released GreenMIM checkpoint needs its patch-merging layout: layout='2022' (trained "
            "before the released code's merge fix of 2023-01-16, row-first (0,0),(0,1),(1,0),(1,1): every "
            "checkpoint linked in its README, dated 2022-05) or layout='2023' (Swin's order "
            f"(0,0),(1,0),(0,1),(1,1)); got {layout!r}")
    out: Dict[str, Tensor] = {}
    for k, v in sd.items():
        if "relative_position_index" in k or "attn_mask" in k:
            continue  # derived buffers: greenmim computes its own
        m = re.match(r"encoder\.layers\.(\d+)\.downsample\.(.*)$", k)
        if m:
            rest = m.group(2)
            if layout == "2022" and rest in ("norm.weight", "norm.bias"):
                v = _row_first_to_swin(v, 0)
            elif layout == "2022" and rest == "reduction.weight":
                v = _row_first_to_swin(v, 1)
            k = f"encoder.layers.{int(m.group(1)) + 1}.downsample.{rest}"
        out[k] = v
    return out


def resize_rel_pos_tables(sd: Dict[str, Tensor], model: nn.Module) -> Dict[str, Tensor]:
    """Interpolates every ``relative_position_bias_table`` of ``sd`` whose size differs from the
    model's (another window): the ``[(2w-1)^2, heads]`` table as a ``heads x (2w-1) x (2w-1)``
    image, bicubic (Swin's and timm's loaders do the same)."""
    own = model.state_dict()
    out = dict(sd)
    for k, v in sd.items():
        if not k.endswith("relative_position_bias_table") or k not in own or own[k].shape == v.shape:
            continue
        (n_src, heads), (n_dst, heads_dst) = v.shape, own[k].shape
        s, d = int(round(n_src ** 0.5)), int(round(n_dst ** 0.5))
        if heads != heads_dst or s * s != n_src or d * d != n_dst:
            continue  # not a window change: check_shapes names it
        img = v.float().permute(1, 0).reshape(1, heads, s, s)
        out[k] = F.interpolate(img, size=(d, d), mode="bicubic", align_corners=False).reshape(heads, n_dst).permute(
            1, 0).to(v.dtype).contiguous()
    return out


def check_shapes(sd: Mapping[str, Tensor], model: nn.Module, what: str) -> None:
    """Refuses a state dict that does not fit ``model``, naming the keys and shapes that differ."""
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    extra = [k for k in sd if k not in own]
    shapes = [f"{k}: {tuple(sd[k].shape)} vs {tuple(own[k].shape)}" for k in own
              if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or extra or shapes:
        parts = []
        if shapes:
            parts.append(f"{len(shapes)} shapes differ (checkpoint vs model), e.g. {'; '.join(shapes[:3])}")
        if missing:
            parts.append(f"{len(missing)} keys missing, e.g. {missing[:3]}")
        if extra:
            parts.append(f"{len(extra)} unexpected keys, e.g. {extra[:3]}")
        raise GreenmimError(f"greenmim: {what} does not fit this model: " + "; ".join(parts))


def load_pretrained(model: nn.Module, source, layout: Optional[str] = None) -> nn.Module:
    """Loads a GreenMIM checkpoint into a GreenMIM ``model``, strictly: one of greenmim's own
    (``greenmim.pretrain``'s, or a state dict) or a released one (``layout`` required, see
    :func:`from_released`). Relative-position tables of another window size are resized."""
    obj = torch.load(source, map_location="cpu", weights_only=False) if isinstance(source, str) else source
    sd = unwrap(obj)
    if is_released(sd):
        sd = from_released(sd, layout)
    elif layout is not None:
        raise GreenmimError(f"greenmim: layout={layout!r} applies to released checkpoints only; this one is "
                            f"greenmim's (patch merging opens each stage)")
    sd = resize_rel_pos_tables(sd, model)
    check_shapes(sd, model, "the checkpoint")
    model.load_state_dict(sd, strict=True)
    return model


def encoder_to_timm(sd: Mapping[str, Tensor], num_classes: int = 1000,
                    generator: Optional[torch.Generator] = None) -> Dict[str, Tensor]:
    """The encoder of a GreenMIM state dict (greenmim's names) in timm's ``SwinTransformer`` /
    ``SwinTransformerV2`` format: the ``encoder.`` prefix dropped, the decoder left out, derived
    buffers left out, and a fresh classifier ``head.fc`` (MAE's fine-tuning init: N(0, 2e-5)
    weights, zero bias) so that timm reads it as a native checkpoint and loads it strictly with
    its default head. ``num_classes=0`` writes no head (load it with ``num_classes=0``)."""
    out: Dict[str, Tensor] = {}
    for k, v in sd.items():
        if not k.startswith("encoder.") or "relative_position_index" in k or "relative_coords_table" in k:
            continue
        out[k[len("encoder."):]] = v.detach().clone()
    if not out:
        raise GreenmimError("greenmim: no encoder.* tensor in this checkpoint")
    if num_classes > 0:
        width = out["norm.weight"].shape[0]
        w = torch.empty(num_classes, width)
        nn.init.trunc_normal_(w, std=2e-5, generator=generator)
        out["head.fc.weight"] = w
        out["head.fc.bias"] = torch.zeros(num_classes)
    return out
