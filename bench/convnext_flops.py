#!/usr/bin/env python3
"""ConvNeXt V2's encoder FLOPs per stage, as torch's FlopCounterMode counts them: greenmim's
visible-token encoder (greenmim.VisibleConvNeXtV2, per-sample masks of 32-px units) against the
dense model (timm's convnextv2_* forward_features on the whole image: the JAX/SparK masked-dense
way, which computes every site whatever the mask).

Stage s holds its downsampling layer (stage 1: the stem) and its blocks, as timm's module tree
does. Each stage's count is the difference of the cumulative counts of the model cut after stage
s-1 and after stage s (the same cut for both models). Counts are FLOPs (2 per multiply-add) of one
forward over ``--batch`` images with per-sample masks (FLOPs are linear in the batch), per image.
FlopCounterMode counts the matmuls and convolutions only (greenmim's ops by the formulas of
greenmim.flops); LayerNorm, GELU and GRN count zero in both models, so with every unit visible the
two counts are equal.

    OMP_NUM_THREADS=1 python bench/convnext_flops.py [--model convnextv2_base] [--img 224] [--ratio 0.6] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn


def _cut(model: nn.Module, n: int) -> nn.Module:
    """``model`` with its first ``n`` stages only (a shallow copy; the modules are shared)."""
    import copy
    m = copy.copy(model)
    m._modules = dict(model._modules)
    m._modules["stages"] = model.stages[:n]
    return m


def _count(fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn()
    return float(counter.get_total_flops())


def stage_flops(model: str = "convnextv2_base", img: int = 224, ratio: float = 0.6, batch: int = 2,
                seed: int = 0, visible=None) -> dict:
    """Per-stage FLOPs per image: ``dense`` (timm, whole image), ``visible`` (greenmim, the masks),
    and the masks' visible share of the units. ``visible``: bool ``[B, img/32, img/32]`` masks
    (default: ``batch`` random per-sample masks at ``ratio``)."""
    import timm
    import greenmim
    import greenmim.flops
    greenmim.flops.register_flop_formulas()
    torch.manual_seed(seed)
    enc = greenmim.VisibleConvNeXtV2(model, num_classes=0).eval()
    dense = timm.create_model(model, pretrained=False, num_classes=0).eval()
    dense.load_state_dict(enc.state_dict(), strict=False)      # same weights (FLOPs do not depend on them)
    if visible is None:
        visible = greenmim.random_masks(batch, grid=img // 32, ratio=ratio,
                                        generator=torch.Generator().manual_seed(seed))
    B = visible.shape[0]
    x = torch.randn(B, 3, img, img)
    plan = enc.plan(visible, (img, img))
    n = len(enc.stages)
    cum_d = [0.0] + [_count(lambda k=k: _cut(dense, k).forward_features(x)) for k in range(1, n + 1)]
    cum_v = [0.0] + [_count(lambda k=k: _cut(enc, k).forward_features(x, plan)) for k in range(1, n + 1)]
    d = [(cum_d[i + 1] - cum_d[i]) / B for i in range(n)]
    v = [(cum_v[i + 1] - cum_v[i]) / B for i in range(n)]
    return dict(model=model, img=img, ratio=ratio, batch=B, visible_share=int(visible.sum()) / visible.numel(),
                stages=[dict(stage=i + 1, dense_gflops=d[i] / 1e9, visible_gflops=v[i] / 1e9,
                             saved=1 - v[i] / d[i] if d[i] else 0.0) for i in range(n)],
                total=dict(dense_gflops=sum(d) / 1e9, visible_gflops=sum(v) / 1e9, saved=1 - sum(v) / sum(d)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="convnextv2_base", help="a timm convnextv2_* name")
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--ratio", type=float, default=0.6, help="mask ratio (FCMAE's 0.6)")
    ap.add_argument("--batch", type=int, default=2, help="images (one mask each); FLOPs are per image")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args(argv)
    if not a.model.startswith("convnextv2_"):
        ap.error(f"--model must be a timm convnextv2_* name, got {a.model!r}")
    if a.img < 32 or a.img % 32 or a.batch < 1 or not 0.0 <= a.ratio < 1.0:
        ap.error("--img must be a multiple of 32, --batch >= 1, 0 <= --ratio < 1")
    r = stage_flops(a.model, a.img, a.ratio, a.batch, a.seed)
    if a.json:
        print(json.dumps(r))
        return 0
    print(f"== {a.model} encoder GFLOPs per image, {a.img} px, mask ratio {a.ratio} (visible share "
          f"{r['visible_share']:.3f}), {r['batch']} per-sample masks; torch {torch.__version__} FlopCounterMode")
    print("| stage | dense GFLOPs (timm, whole image) | visible GFLOPs (greenmim) | saved |")
    print("|---|---|---|---|")
    for s in r["stages"]:
        print(f"| {s['stage']} | {s['dense_gflops']:.3f} | {s['visible_gflops']:.3f} | {100 * s['saved']:.1f}% |")
    t = r["total"]
    print(f"| total | {t['dense_gflops']:.3f} | {t['visible_gflops']:.3f} | {100 * t['saved']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
