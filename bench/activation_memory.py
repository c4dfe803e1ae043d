#!/usr/bin/env python3
"""What a pretraining step keeps for its backward, counted on any CPU: the bytes of the tensors
autograd saves in the forward (unique storages, through ``torch.autograd.graph.saved_tensors_hooks``),
under bf16 autocast as on a GPU, for the whole models of ``bench/gpu/train_step.py`` (SimMIM's timm
Swin on all tokens, GreenMIM on the visible ones), and the step's fixed memory (fp32 parameters,
their gradients, AdamW's two states, the bf16 weight copies autocast caches).

greenmim's ops take the CUDA path's Python under ``greenmim.emulate_cuda()`` with the kernel
library's calls replaced by no-ops: what they save is what the CUDA path saves, and no kernel
runs (the numbers are garbage; the shapes and dtypes are the CUDA path's).

Saved bytes are counted at batch 1 and 2: the difference is what one more sample costs, the rest
(autocast's bf16 weight copies, saved by the linear layers) is fixed. The predicted peak at batch
128, fixed + 128 x per sample, leaves out the allocator's slack and the transient
buffers of the backward, so it sits below a device's ``max_memory_allocated``; the
ratio to SimMIM is what the issue's targets are about.

    python bench/activation_memory.py [--model swin_large_patch4_window7_224] [--rows simmim,greenmim]
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

import torch

import greenmim

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from op_overhead import null_kernels  # noqa: E402


def _train_step_module():
    path = pathlib.Path(__file__).resolve().parent / "gpu" / "train_step.py"
    spec = importlib.util.spec_from_file_location("train_step", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def saved_bytes(fn) -> int:
    """Bytes of the unique storages autograd saves while ``fn()`` runs (parameters excluded)."""
    seen = {}

    def pack(t):
        if isinstance(t, torch.nn.Parameter):
            return t
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="swin_large_patch4_window7_224")
    ap.add_argument("--ratio", type=float, default=0.75)
    ap.add_argument("--rows", default="simmim,greenmim,per-sample")
    ap.add_argument("--no-recompute", action="store_true",
                    help="greenmim rows keep every activation (greenmim.set_activation_recompute(model, False))")
    a = ap.parse_args(argv)
    ts = _train_step_module()
    if a.model not in ts.MODELS:
        ap.error(f"--model: one of {sorted(ts.MODELS)}")
    cfg, img_size, window, v2 = ts.MODELS[a.model]
    args = argparse.Namespace(twins=False, v2=v2, img=img_size, window=window, full=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    grid = img_size // 32
    g0 = img_size // 4
    print(f"== saved for backward: {a.model}, whole models, ratio {a.ratio}, bf16 autocast "
          f"(counted on the CPU at batch 1 and 2), torch {torch.__version__}")
    print("| row | parameters M | fixed MiB (fp32 param + grad + 2 AdamW states, bf16 copies) | saved per sample MiB |"
          " predicted peak at batch 128 GiB | vs SimMIM |")
    print("|---|---|---|---|---|---|")
    base = None

    def saved_at(model, row, batch):
        img = torch.randn(batch, 3, img_size, img_size)
        units = ts.unit_masks(batch, row == "per-sample", a.ratio, gen, grid)
        with greenmim.emulate_cuda(), torch.autocast("cpu", dtype=torch.bfloat16):
            if row == "simmim":
                masked = ~units.repeat_interleave(g0 // grid, -2).repeat_interleave(g0 // grid, -1)
                return saved_bytes(lambda: model(img, masked.expand(batch, g0, g0)))
            plan = model.plan(units, cache=False)
            return saved_bytes(lambda: model(img, plan)[0])

    with null_kernels():
        for row in [r for r in a.rows.split(",") if r]:
            model = ts.make_row(row, cfg, args, torch.device("cpu"))
            if row != "simmim":
                greenmim.set_activation_recompute(model, not a.no_recompute)
            params = sum(p.numel() for p in model.parameters())
            one, two = saved_at(model, row, 1), saved_at(model, row, 2)
            per = two - one                        # what grows with the batch
            fixed = params * 4 * 4 + (one - per)   # fp32 param, grad, exp_avg, exp_avg_sq + autocast's copies
            peak = (fixed + 128 * per) / 2 ** 30
            base = peak if row == "simmim" else base
            rel = f"{100 * peak / base:.1f}%" if base else "-"
            print(f"| {row} | {params / 1e6:.1f} | {fixed / 2 ** 20:.0f} | {per / 2 ** 20:.1f} | {peak:.2f} | {rel} |",
                  flush=True)
            del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
