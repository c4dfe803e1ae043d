#!/usr/bin/env python3
"""The paper's claim, measured: one pretraining step of a Swin or Twins encoder on masked images.

Rows (encoder forward + backward + AdamW step; bf16 autocast on CUDA; the loss is the mean
square of the encoder's output; with --full, each row is the whole pretraining model):
  simmim      timm's SwinTransformer (Twins) on all tokens, masked patches replaced by a mask token
  greenmim    our visible-token encoder, greenmim's ops, one mask shared by the batch
  per-sample  the same with a different mask per sample, packed across the batch
  released    our visible-token encoder with the released attention path in plain PyTorch
--full: the paper's real comparison, whole models (encoder, decoder, loss):
  simmim      SimMIM: timm's Swin with a mask token, its linear decoder (1x1 conv + pixel
              shuffle to the 32 px stride) and L1 on the masked pixels
  greenmim    greenmim.GreenMIM (decoder 512 x 1 block; 128 for the toy), shared mask
  per-sample  the same, per-sample masks
  released    greenmim.GreenMIM with the released attention path
Each step draws a new mask and plans it (cache off), so planning and index building are in the
step time (--plans inline, the default). --plans loader does what greenmim.pretrain's DataLoader
does instead: masks are drawn and planned on the CPU before the timed steps, pinned (CUDA), and
each step copies its plan (SimMIM: its mask) to the device asynchronously; the step then holds no
planning and no host-device synchronisation. Prints a table (median step time after warm-up, peak memory), the ratios the issue
sets as targets, and a per-stage breakdown like the paper's appendix table.

    python bench/gpu/train_step.py --model swin_base_patch4_window7_224 --batch 128 [--full]
    python bench/gpu/train_step.py --model twins_svt_large --batch 128 [--full]   # Twins (no breakdown)
    python bench/gpu/train_step.py --cpu          # the --full rows for a toy Swin on this CPU
    python bench/gpu/train_step.py --cpu --model toy-twins     # ... for a toy Twins
    python bench/gpu/train_step.py --toy          # CPU, tiny model, 1 step: the CI smoke run
    python bench/gpu/train_step.py --full --rows greenmim --trace traces/   # + torch.profiler trace
    python bench/gpu/train_step.py --full --compile [reduce-overhead]        # every row torch.compile'd
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

import torch
from torch import nn

import greenmim

MODELS = {  # name: (architecture kwargs, image size, window, Swin V2)
    "swin_base_patch4_window7_224": (dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)), 224, 7, False),
    "swin_large_patch4_window7_224": (dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)), 224, 7, False),
    "swinv2_base_window8_256": (dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)), 256, 8, True),
    "swinv2_large_window12_192": (dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)), 192, 12, True),
    "toy": (dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), 224, 7, False),
    "toy-v2": (dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), 256, 8, True),
}
# Twins: name -> (architecture kwargs, image size); windows 7, sr 8/4/2/1 (timm's defaults)
TWINS = {
    "twins_svt_large": (dict(embed_dims=(128, 256, 512, 1024), depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)), 224),
    "toy-twins": (dict(embed_dims=(32, 64, 128, 256), depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), 224),
}
ROWS = ("simmim", "greenmim", "per-sample", "released")


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

    def __init__(self, encoder: SimMIMSwin, num_features: int, stride: int = 32):
        super().__init__()
        self.encoder, self.stride = encoder, stride
        self.decoder = nn.Sequential(nn.Conv2d(num_features, stride ** 2 * 3, kernel_size=1), nn.PixelShuffle(stride))

    def forward(self, img: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        z = self.encoder(img, masked)                                   # [B, h, w, C]
        rec = self.decoder(z.permute(0, 3, 1, 2).contiguous())
        p = img.shape[-1] // masked.shape[-1]                           # patch size
        m = masked.repeat_interleave(p, 1).repeat_interleave(p, 2).unsqueeze(1).to(rec.dtype)
        return (torch.abs(img - rec) * m).sum() / (m.sum() + 1e-5) / 3


class Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def unit_masks(batch: int, per_sample: bool, ratio: float, gen: torch.Generator, grid: int = 7) -> torch.Tensor:
    """Masks over 32-px units (the encoder's largest stride), as the released code draws them."""
    return greenmim.random_masks(batch if per_sample else None, grid=grid, ratio=ratio, generator=gen)


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


def make_row(row: str, cfg: dict, args, device):
    if args.twins:
        return make_twins_row(row, cfg, args, device)
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


def run_row(row: str, cfg: dict, args, device) -> dict:
    gen = torch.Generator().manual_seed(args.seed)
    model = make_row(row, cfg, args, device)
    if row != "simmim":
        greenmim.set_activation_recompute(model, not args.no_recompute)
    # fused on CUDA for every row (the trainer's choice; foreach took 19% of a step's GPU time);
    # capturable (its step count on the device) when the step is a CUDA graph
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if device.type == "cuda" else None,
                            capturable=bool(args.graphs) and device.type == "cuda")
    img = torch.randn(args.batch, 3, args.img, args.img, device=device)
    grid = args.img // 32
    amp_dtype = torch.bfloat16 if device.type == "cuda" else None
    clock = Clock(device)
    per_sample = row == "per-sample"
    g0 = args.img // 4

    def simmim_mask(units):
        return ~units.repeat_interleave(g0 // grid, -2).repeat_interleave(g0 // grid, -1)

    net = model
    inline_plan = lambda units: model.plan(units, device=device, cache=False)  # noqa: E731
    loader_plan = lambda units: model.plan(units, cache=False)                 # noqa: E731
    if args.compile:
        # every row compiled alike; greenmim's plans as greenmim.pretrain --compile makes them: G fixed
        # at each stage's window area and the group axis dynamic, so fresh masks do not recompile
        # (with --graphs the plans are padded to one capacity instead: static shapes)
        net = torch.compile(model, mode=args.compile)
    info = {}
    if (args.compile or args.graphs) and row != "simmim":
        from greenmim.pretrain.data import Geometry, pad_to
        geometry = Geometry(model, fixed_groups=True)
        inline_plan = loader_plan = geometry.plan
        if args.graphs:
            # greenmim.pretrain --cuda_graphs' capacity: the most groups 64 masks take, + 2%
            info.update(capacity=geometry.capacity_for(args.batch, per_sample, args.ratio, args.seed), counts=[])

            def padded(units):                 # Geometry.plan with a capacity, counting the real groups
                plan = geometry.plan(units)
                info["counts"].append(plan.group_counts())
                return pad_to(plan, info["capacity"])
            inline_plan = loader_plan = padded
    ready = None
    if args.plans == "loader":   # made before the timed steps, pinned: the trainer's DataLoader
        ready = []
        for _ in range(args.warmup + args.steps):
            units = unit_masks(args.batch, per_sample, args.ratio, gen, grid)
            item = simmim_mask(units) if row == "simmim" else loader_plan(units)
            ready.append(item.pin_memory() if device.type == "cuda" else item)
        ready = iter(ready)

    def next_item():
        if ready is not None:
            return next(ready)
        units = unit_masks(args.batch, per_sample, args.ratio, gen, grid)
        return simmim_mask(units) if row == "simmim" else inline_plan(units)

    def loss_of(x, item):
        if row == "simmim":
            out = net(x, item.expand(args.batch, g0, g0))
        else:
            out = net(x, item) if args.full else model.forward_features(x, item)   # visible tokens
        return out.float() if args.full and row == "simmim" else \
            (out[0].float() if args.full else out.float().square().mean())

    amp = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    def step():
        item = next_item().to(device, non_blocking=True)
        if args.compile and row != "simmim":
            item.mark_dynamic()
        with amp:
            loss = loss_of(img, item)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    graphed = None
    if args.graphs:
        # greenmim.pretrain --cuda_graphs' own step (pretrain/graphs.py): captured once, replayed;
        # the graph allocates its memory while captured, so the peak counts from before that
        from greenmim.pretrain.graphs import GraphedStep
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        graphed = GraphedStep(model, loss_of, opt, amp_dtype, device, info.get("capacity"))
        step = lambda: graphed.step(img, next_item())   # noqa: E731
    for _ in range(args.warmup):
        step()
    if device.type == "cuda" and not args.graphs:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        t0 = clock()
        step()
        times.append((clock() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
    if args.trace and ready is None:
        trace_steps(step, row, args, device)
    out = dict(row=row, ms=statistics.median(times), ms_min=min(times), peak_gib=peak, steps=args.steps)
    if graphed is not None:
        cap, counts = info.get("capacity"), info.get("counts", [])
        text = (f"{row}: CUDA graph, {graphed.overflows} of {graphed.overflows + graphed.replays} steps ran eagerly "
                f"(overflow)")
        if cap and counts:
            pad = 100 * (1 - statistics.mean(c[0][0] for c in counts) / cap[0][0])
            text += f"; capacity {cap}, stage 1 padded by {pad:.1f}% of its groups on average"
        print(text, flush=True)
    del model, opt, graphed, step        # the graph holds its memory pool until it goes
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def trace_steps(step, row: str, args, device) -> None:
    """args.trace_steps more steps (3; 1 with --toy) under torch.profiler: a Chrome trace in
    args.trace, and the ops that cost the most host time and device time printed (where a step
    waits: the host or the GPU). On the CPU a toy step records about 10,000 events, and torch's
    key_averages() takes about 3 s of host time per step recorded: the profiling, not the steps,
    would be most of a toy run."""
    import os
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(args.trace_steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    os.makedirs(args.trace, exist_ok=True)
    path = os.path.join(args.trace, f"trace_{args.model}_{row}.json")
    prof.export_chrome_trace(path)
    print(f"\n## {row}: {args.trace_steps} step{'s' if args.trace_steps > 1 else ''} under torch.profiler "
          f"(Chrome trace {path})")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
    if device.type == "cuda":
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))


def _time(fn, clock, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = clock()
        fn()
        ts.append((clock() - t0) * 1e3)
    return statistics.median(ts)


def breakdown(cfg: dict, args, device) -> list:
    """Per stage, like the paper's appendix: planning, index building, grouping, ungrouping,
    attention forward and backward, at the model's shapes (one shared mask)."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    clock = Clock(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    units = unit_masks(args.batch, False, args.ratio, gen, args.img // 32)
    g0 = args.img // 4
    m0 = units.repeat_interleave(g0 // units.shape[0], 0).repeat_interleave(g0 // units.shape[1], 1)
    out = []
    for s in range(4):
        ms = m0[:: 1 << s, :: 1 << s].contiguous()
        C, H = cfg["embed_dim"] << s, cfg["num_heads"][s]
        D = C // H
        row = dict(stage=s + 1)
        for shift in (0, args.window // 2):
            parts = []
            t_build = _time(lambda: parts.append(greenmim.stage_partition(ms, args.window, shift, C, device=device,
                                                                          cache=False)), clock, args.reps)
            part = parts[-1]
            x = torch.randn(args.batch, part.num_tokens, C, device=device, dtype=dtype)
            y = greenmim.partition_tokens(x, part)
            qkv = torch.randn(args.batch, part.num_tokens, 3, H, D, device=device, dtype=dtype)
            bias = torch.randn((2 * part.window - 1) ** 2, H, device=device)
            index = [part.gather, part.scatter, part.slot_window, part.slot_coord]
            o, lse = torch.ops.greenmim.attention_packed_fwd(qkv, bias, index, part.group_size, part.window,
                                                             D ** -0.5, "auto")
            g = torch.randn_like(o)
            key = "shifted" if shift else "plain"
            row[f"{key}_G"] = f"{part.group_size}x{part.num_groups}"
            row[f"{key}_plan_ms"] = part.plan_us / 1e3
            row[f"{key}_index_ms"] = max(t_build - part.plan_us / 1e3, 0.0)
            row[f"{key}_group_ms"] = _time(lambda: greenmim.partition_tokens(x, part), clock, args.reps)
            row[f"{key}_ungroup_ms"] = _time(lambda: greenmim.unpartition_tokens(y, part), clock, args.reps)
            row[f"{key}_attn_fwd_ms"] = _time(lambda: torch.ops.greenmim.attention_packed_fwd(
                qkv, bias, index, part.group_size, part.window, D ** -0.5, "auto"), clock, args.reps)
            row[f"{key}_attn_bwd_ms"] = _time(lambda: torch.ops.greenmim.attention_packed_bwd(
                g, qkv, o, lse, bias, index, part.group_size, part.window, D ** -0.5, "auto", True), clock,
                args.reps)
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="swin_base_patch4_window7_224", choices=sorted(MODELS) + sorted(TWINS))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--img", type=int, default=None, help="image size (default: the model's)")
    ap.add_argument("--ratio", type=float, default=0.75)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20, help="repetitions of each breakdown timing")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", default=None, help="also write the rows here")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="also run 3 steps (1 with --toy) of each row under torch.profiler: a Chrome trace per row in DIR, and the "
                         "ops with the most host and device time (--plans inline)")
    ap.add_argument("--plans", choices=("inline", "loader"), default="inline",
                    help="inline: each step draws and plans its mask; loader: planned and pinned before the timed "
                         "steps, copied asynchronously in the step (greenmim.pretrain's pipeline)")
    ap.add_argument("--toy", action="store_true", help="tiny model, batch 2, 2 steps, CPU: a smoke run")
    ap.add_argument("--full", action="store_true", help="whole pretraining models (encoder, decoder, loss)")
    ap.add_argument("--no-recompute", action="store_true",
                    help="greenmim rows keep every activation (greenmim.set_activation_recompute(model, False)): "
                         "a few kernels fewer per step, more memory")
    ap.add_argument("--compile", nargs="?", const="default", default=None,
                    choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                    help="torch.compile every row's model (with --full) in this mode; greenmim's plans fix G "
                         "and mark their group axis dynamic, as greenmim.pretrain --compile does")
    ap.add_argument("--graphs", action="store_true",
                    help="capture each row's whole step (forward, backward, AdamW) as one CUDA graph and replay it "
                         "(CUDA, --full): greenmim's plans are padded to one capacity (MaskPlan.padded); with "
                         "--compile, the compiled model is captured")
    ap.add_argument("--cpu", action="store_true",
                    help="--full rows for a toy Swin (embed 32; a Twins model: toy-twins) at batch 16 on this CPU, "
                         "no breakdown")
    args = ap.parse_args(argv)
    args.twins = args.model in TWINS
    if args.cpu:
        args.model = "toy-twins" if args.twins else "toy"
        args.full, args.device, args.no_breakdown = True, "cpu", True
        args.batch = args.batch if args.batch != 128 else 16
    if args.toy:
        args.model = "toy-twins" if args.twins else ("toy-v2" if MODELS[args.model][3] else "toy")
        args.batch, args.steps, args.warmup, args.reps, args.device = 2, 1, 1, 1, "cpu"
    args.trace_steps = 1 if args.toy else 3
    if args.compile and not args.full:
        ap.error("--compile needs --full (it compiles the whole pretraining models)")
    if args.graphs and (not args.full or args.device != "cuda" or args.trace):
        ap.error("--graphs needs --full and a CUDA device (and no --trace)")
    rows = [r for r in args.rows.split(",") if r]
    bad = [r for r in rows if r not in ROWS]
    if bad:
        ap.error(f"unknown rows {bad}; choose from {ROWS}")
    device = torch.device(args.device)
    if args.twins:
        (cfg, img), args.window, args.v2 = TWINS[args.model], 7, False
        args.no_breakdown = True                 # the breakdown times Swin's attention stages only
    else:
        cfg, img, args.window, args.v2 = MODELS[args.model]
    args.img = args.img or img
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"== train step{' (whole models)' if args.full else ''}: {args.model}, batch {args.batch}, {args.img} px, ratio {args.ratio}, "
          f"plans {args.plans}, {'torch.compile (' + args.compile + '), ' if args.compile else ''}"
          f"{'no recompute, ' if args.no_recompute else ''}{'CUDA graphs, ' if args.graphs else ''}"
          f"{'bf16 autocast' if device.type == 'cuda' else 'float32'}, AdamW, {name}, torch {torch.__version__}")
    results = []
    for r in rows:
        res = run_row(r, cfg, args, device)
        results.append(res)
        print(f"{r}: {res['ms']:.2f} ms/step (median of {args.steps}), peak {res['peak_gib']:.2f} GiB", flush=True)
    print("\n| row | median ms/step | min ms | peak GiB | speed-up vs simmim | memory vs simmim |")
    print("|---|---|---|---|---|---|")
    base = next((x for x in results if x["row"] == "simmim"), None)
    for x in results:
        sp = f"{base['ms'] / x['ms']:.2f}x" if base else "-"
        mem = f"{100 * x['peak_gib'] / base['peak_gib']:.0f}%" if base and base["peak_gib"] == base["peak_gib"] else "-"
        print(f"| {x['row']} | {x['ms']:.2f} | {x['ms_min']:.2f} | {x['peak_gib']:.2f} | {sp} | {mem} |")
    by = {x["row"]: x for x in results}
    if "greenmim" in by and "per-sample" in by:
        print(f"per-sample / shared step time: {by['per-sample']['ms'] / by['greenmim']['ms']:.3f}")
    if "greenmim" in by and "released" in by:
        print(f"released / greenmim step time: {by['released']['ms'] / by['greenmim']['ms']:.3f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(results[0]))
            w.writeheader()
            w.writerows(results)
    if not args.no_breakdown:
        print("\n## per-stage breakdown (greenmim, one shared mask; ms)")
        bd = breakdown(cfg, args, device)
        cols = ["G x groups", "plan", "index build", "group", "ungroup", "attn fwd", "attn bwd"]
        print("| stage | windows | " + " | ".join(cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        for r in bd:
            for k in ("plain", "shifted"):
                sh = k
                vals = [r[f"{k}_G"]] + [f"{r[f'{k}_{c}_ms']:.4f}" for c in
                                        ("plan", "index", "group", "ungroup", "attn_fwd", "attn_bwd")]
                print(f"| {r['stage']} | {sh} | " + " | ".join(vals) + " |")
    print("train_step: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
