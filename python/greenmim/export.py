"""``python -m greenmim.export CKPT OUT``: the encoder of a GreenMIM checkpoint in timm's names
and layout, for fine-tuning with timm:

    timm.create_model("swin_base_patch4_window7_224", pretrained=True,
                      pretrained_cfg_overlay=dict(file="OUT"))      # or "twins_svt_large", ...

For FCMAE (``fcmae_convnextv2_*``) the file is timm's ``convnextv2_*`` state dict (the encoder's
modules are timm's), with a fresh classifier head unless ``--num_classes 0``.

CKPT is a ``greenmim.pretrain`` checkpoint, a GreenMIM state dict, or a checkpoint of the
released code (then ``--layout 2022`` for every checkpoint its README links, ``2023`` for weights
trained after its merge fix: see :mod:`greenmim.checkpoint`). The file holds the encoder and a
fresh classifier head (timm reads a file without ``head.fc`` as an old-format Swin checkpoint and
shifts its patch-merging keys), and the command prints the ``timm.create_model`` call that loads
it, with the architecture arguments timm needs when the model is not one of its presets.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Optional, Sequence, Tuple

import torch

from . import checkpoint as ckpt_io
from ._lib import GreenmimError

_SIZES = {96: "tiny", 128: "base", 192: "large"}


def infer_architecture(sd: Dict[str, torch.Tensor]) -> Tuple[str, dict]:
    """(timm model name, extra create_model kwargs) for an encoder state dict in timm's names."""
    v2 = any(k.endswith("cpb_mlp.0.weight") for k in sd)
    embed = sd["patch_embed.proj.weight"].shape[0]
    patch = sd["patch_embed.proj.weight"].shape[-1]
    stages = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    depths = tuple(1 + max((int(k.split(".")[3]) for k in sd if k.startswith(f"layers.{i}.blocks.")), default=-1)
                   for i in range(stages))
    if v2:
        heads = tuple(sd[f"layers.{i}.blocks.0.attn.logit_scale"].shape[0] for i in range(stages))
        window = None
    else:
        heads = tuple(sd[f"layers.{i}.blocks.0.attn.relative_position_bias_table"].shape[1] for i in range(stages))
        window = (int(round(sd["layers.0.blocks.0.attn.relative_position_bias_table"].shape[0] ** 0.5)) + 1) // 2
    size = _SIZES.get(embed)
    if size == "tiny" and depths[2] == 18:
        size = "small"
    arch = dict(embed_dim=embed, depths=depths, num_heads=heads, patch_size=patch)
    known = size is not None and patch == 4 and depths[:2] == (2, 2) and stages == 4
    if v2:
        name = f"swinv2_{size}_window8_256" if known else "swinv2_tiny_window8_256"
        return name, ({} if known else arch)
    name = f"swin_{size}_patch4_window7_224" if known else "swin_tiny_patch4_window7_224"
    extra = {} if known else arch
    if window != 7:
        extra["window_size"] = window
    return name, extra


_TWINS = {((64, 128, 256, 512), (2, 2, 10, 4)): "twins_svt_small",
          ((96, 192, 384, 768), (2, 2, 18, 2)): "twins_svt_base",
          ((128, 256, 512, 1024), (2, 2, 18, 2)): "twins_svt_large"}


def infer_twins(sd: Dict[str, torch.Tensor], cfg: dict) -> Tuple[str, dict]:
    """(timm model name, extra create_model kwargs) for a Twins encoder in timm's names. Heads,
    windows and sr ratios leave no trace in the weights: a model that is not one of timm's
    presets takes them from the checkpoint's ``config`` (greenmim.pretrain writes it)."""
    n = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("patch_embeds."))
    dims = tuple(int(sd[f"patch_embeds.{i}.proj.weight"].shape[0]) for i in range(n))
    depths = tuple(1 + max(int(k.split(".")[2]) for k in sd if k.startswith(f"blocks.{i}.")) for i in range(n))
    patch = int(sd["patch_embeds.0.proj.weight"].shape[-1])
    name = _TWINS.get((dims, depths)) if patch == 4 else None
    if name is not None and all(tuple(cfg.get(k, d)) == d for k, d in (("sr_ratios", (8, 4, 2, 1)),
                                                                         ("wss", (7, 7, 7, 7)))):
        return name, {}
    if "num_heads" not in cfg:
        raise GreenmimError(f"greenmim: a Twins with dims {dims}, depths {depths} is not one of timm's presets "
                            f"and the checkpoint has no config to read its heads, windows and sr ratios from")
    extra = dict(embed_dims=dims, depths=depths, num_heads=tuple(cfg["num_heads"]), patch_size=patch)
    for k in ("sr_ratios", "wss", "mlp_ratios"):
        if k in cfg:
            extra[k] = tuple(cfg[k])
    return "twins_svt_small", extra


# timm's convnextv2_* by stage-1 width
_CONVNEXTV2 = {40: "atto", 48: "femto", 64: "pico", 80: "nano", 96: "tiny", 128: "base", 192: "large", 352: "huge"}


def fcmae_to_timm(sd: Dict[str, torch.Tensor], cfg: dict, num_classes: int) -> Tuple[str, dict]:
    """(timm's convnextv2 state dict, its model name) from an FCMAE state dict: the ``encoder.``
    keys as they are, plus a fresh head (timm's initialisation: truncated normal, std 0.02, zero
    bias) of ``num_classes`` classes (0: none)."""
    out = {k[len("encoder."):]: v for k, v in sd.items() if k.startswith("encoder.")}
    width = int(out["stem.0.weight"].shape[0])
    name = cfg.get("timm_name") or (f"convnextv2_{_CONVNEXTV2[width]}" if width in _CONVNEXTV2 else None)
    if name is None:
        raise GreenmimError(f"greenmim: a ConvNeXt V2 of stage-1 width {width} is not one of timm's convnextv2_*")
    if num_classes:
        features = int(out["head.norm.weight"].shape[0])
        w = torch.empty(num_classes, features)
        torch.nn.init.trunc_normal_(w, std=0.02, generator=torch.Generator().manual_seed(0))
        out["head.fc.weight"], out["head.fc.bias"] = w, torch.zeros(num_classes)
    return out, name


def export(src, out: str, layout: Optional[str] = None, num_classes: int = 1000,
           img_size: Optional[int] = None) -> Tuple[str, dict]:
    """Writes the encoder of ``src`` (a path or a loaded checkpoint) to ``out`` in timm's format;
    returns the timm model name and create_model kwargs that load it."""
    obj = torch.load(src, map_location="cpu", weights_only=False) if isinstance(src, str) else src
    sd = ckpt_io.unwrap(obj)
    if ckpt_io.is_released(sd):
        sd = ckpt_io.from_released(sd, layout)
    elif layout is not None:
        raise GreenmimError(f"greenmim: --layout {layout} applies to released checkpoints; this one is greenmim's")
    cfg = obj.get("config", {}) if isinstance(obj, dict) else {}
    size = img_size or cfg.get("img_size")
    fcmae = "encoder.stem.0.weight" in sd
    timm_sd = None if fcmae else ckpt_io.encoder_to_timm(sd, num_classes)
    if fcmae:                                           # FCMAE's ConvNeXt V2: no image size, no windows
        timm_sd, name = fcmae_to_timm(sd, cfg, num_classes)
        kwargs = {}
    elif "patch_embeds.0.proj.weight" in timm_sd:          # Twins: its classifier is ``head``
        for p in ("weight", "bias"):
            if f"head.fc.{p}" in timm_sd:
                timm_sd[f"head.{p}"] = timm_sd.pop(f"head.fc.{p}")
        name, kwargs = infer_twins(timm_sd, cfg)
        if size and size != 224:
            kwargs["img_size"] = size
    else:
        name, kwargs = infer_architecture(timm_sd)
        if size and str(size) not in name.split("_")[-1]:
            kwargs["img_size"] = size
        if cfg.get("window_size") and "window_size" not in kwargs and f"window{cfg['window_size']}" not in name:
            kwargs["window_size"] = cfg["window_size"]
    if num_classes != 1000:
        kwargs["num_classes"] = num_classes
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        torch.save(timm_sd, tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return name, kwargs


def create_model_call(name: str, kwargs: dict, out: str) -> str:
    extra = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    return f"timm.create_model({name!r}, pretrained=True, pretrained_cfg_overlay=dict(file={out!r}){extra})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m greenmim.export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("checkpoint", help="greenmim.pretrain checkpoint, GreenMIM state dict, or released checkpoint")
    p.add_argument("out", help="the timm weights file to write")
    p.add_argument("--layout", choices=ckpt_io.RELEASED_LAYOUTS, default=None,
                   help="released checkpoints only: their patch-merging layout (2022: every README link)")
    p.add_argument("--num_classes", type=int, default=1000,
                   help="classes of the fresh head (0: none; load with num_classes=0)")
    p.add_argument("--img_size", type=int, default=None, help="image size to fine-tune at (default: pretraining's)")
    a = p.parse_args(argv)
    if not os.path.isfile(a.checkpoint):
        print(f"greenmim.export: error: {a.checkpoint}: no such file", file=sys.stderr)
        return 2
    try:
        name, kwargs = export(a.checkpoint, a.out, a.layout, a.num_classes, a.img_size)
    except (GreenmimError, KeyError, ValueError) as e:
        print(f"greenmim.export: error: {e}", file=sys.stderr)
        return 2
    head = f"a fresh {a.num_classes}-class head" if a.num_classes else "no head"
    print(f"greenmim.export: wrote {a.out} (timm's {name.split('_')[0]} layout, {head}); load it with\n"
          f"  {create_model_call(name, kwargs, a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
