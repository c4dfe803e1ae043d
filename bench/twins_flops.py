#!/usr/bin/env python3
"""Twins-L's FLOPs as torch counts them in the PyTorch models, stage by stage, against
``greenmim simulate --model twins-l`` (multiply-adds per image, 224 px, ratio 0.75).

Columns: torch's FlopCounterMode on greenmim.twins_svt_large over the visible tokens (mean over
``--masks`` random 7x7 unit masks, shared), the simulation's formula on the same plans, the
CLI's figure (its own 100 masks), and torch's count of timm's all-token twins_svt_large next to
the CLI's all-token figure. The only systematic difference: simulate counts LSA's qkv and output
projections over the planner's padded slots (its cost model, ``4 G C^2`` a group), the model
projects the tokens only.

    OMP_NUM_THREADS=1 python bench/twins_flops.py [--cli build/bin/greenmim] [--masks 10]
"""
import argparse
import json
import subprocess
import sys

import torch

import greenmim
from greenmim import flops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default="build/bin/greenmim")
    ap.add_argument("--masks", type=int, default=10)
    a = ap.parse_args(argv)
    sim = json.loads(subprocess.run([a.cli, "simulate", "--model", "twins-l", "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    torch.manual_seed(0)
    model = greenmim.create_model("twins_svt_large").eval()
    x = torch.randn(1, 3, 224, 224)
    g = torch.Generator().manual_seed(0)
    counted, tokens_only, padded = [0.0] * 4, [0.0] * 4, [0.0] * 4
    with torch.no_grad():
        for _ in range(a.masks):
            plan = model.plan(greenmim.random_masks(generator=g))
            for acc, v in ((counted, flops.stage_macs(model, x, plan)),
                           (tokens_only, flops.twins_stage_formula(model, plan, 1, padded_lsa_linear=False)),
                           (padded, flops.twins_stage_formula(model, plan, 1))):
                for i in range(4):
                    acc[i] += v[i] / a.masks / 1e6
        import timm
        dense = [v / 1e6 for v in flops.stage_macs(timm.create_model("twins_svt_large", pretrained=False).eval(), x)]
    print(f"== Twins-L encoder MFLOPs (multiply-adds) per image, 224 px, ratio 0.75; torch {torch.__version__}; "
          f"greenmim.flops.stage_macs (FlopCounterMode) over {a.masks} masks vs `greenmim simulate --model twins-l`")
    print("| stage | torch count, visible | formula, LSA linear on tokens | formula, LSA on padded slots | "
          "simulate, visible | torch count, timm all tokens | simulate, all tokens |")
    print("|---|---|---|---|---|---|---|")
    for i in range(4):
        s = sim["stages"][i]
        print(f"| {i + 1} | {counted[i]:.2f} | {tokens_only[i]:.2f} | {padded[i]:.2f} | {s['visible']['total']:.2f} "
              f"| {dense[i]:.2f} | {s['all']['total']:.2f} |")
    tot = lambda v: sum(v)
    print(f"| total | {tot(counted):.2f} | {tot(tokens_only):.2f} | {tot(padded):.2f} | "
          f"{sim['total']['visible']['total']:.2f} | {tot(dense):.2f} | {sim['total']['all']['total']:.2f} |")
    print(f"ratio all/visible: torch {tot(dense) / tot(counted):.3f}x, simulate {sim['total']['flops_ratio']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
