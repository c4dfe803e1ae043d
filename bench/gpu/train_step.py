#!/usr/bin/env python3
"""The paper's claim, measured: one pretraining step of a Swin or Twins encoder on masked images,
next to its peers, in one call.

Rows (encoder forward + backward + AdamW step; bf16 autocast on CUDA; the loss is the mean
square of the encoder's output; with --full, each row is the whole pretraining model):
  simmim      timm's SwinTransformer (Twins) on all tokens, masked patches replaced by a mask token,
              with timm's fused attention on (timm leaves Swin's off: baselines.fused_attention_on)
  greenmim    our visible-token encoder, greenmim's ops, one mask shared by the batch
  per-sample  the same with a different mask per sample, packed across the batch
  released    our visible-token encoder with the released attention path in plain PyTorch
  mae         MAE ViT-B/16 on its 25% visible patches (timm's ViT blocks; --full: MAE's decoder and loss)
  hiera       Hiera-B's MAE on timm's Hiera (hiera_base_224's sizes), 60% of its mask units masked
--model convnextv2_base (ConvNeXt V2's FCMAE, always whole models, ratio 0.6, per-sample masks):
  masked-dense  the dense masked FCMAE step, the JAX / SparK way (the practical peer): timm's
                convnextv2_base on the whole image, masked units zeroed before the stem and after
                the stem, each downsampling and each block; the same decoder and loss
                (baselines.MaskedDenseFCMAE)
  greenmim      greenmim's sparse FCMAE (fcmae_convnextv2_base_dec512b1): the encoder on the
                visible tokens only
--full: the paper's real comparison, whole models (encoder, decoder, loss):
  simmim      SimMIM: timm's Swin with a mask token, its linear decoder (1x1 conv + pixel
              shuffle to the 32 px stride) and L1 on the masked pixels
  greenmim    greenmim.GreenMIM (decoder 512 x 1 block; 128 for the toy), shared mask
  per-sample  the same, per-sample masks
  released    greenmim.GreenMIM with the released attention path
  mae, hiera  their MAE models (bench/gpu/baselines.py), each on its own masking
Each step draws a new mask and plans it (cache off), so planning and index building are in the
step time (--plans inline, the default). --plans loader does what greenmim.pretrain's DataLoader
does instead: masks are drawn and planned on the CPU before the timed steps, pinned (CUDA), and
each step copies its plan (the dense rows: their mask) to the device asynchronously; the step then
holds no planning and no host-device synchronisation. Prints a table (median step time after
warm-up, images/s, peak memory, FLOPs and MFU), the ratios the issue sets as targets, and a
per-stage breakdown like the paper's appendix table.

MFU: the FLOPs of one eager forward + backward of the row's model, counted by torch's
FlopCounterMode (greenmim's ops included: greenmim.flops.register_flop_formulas; the optimizer's
elementwise work is not counted), divided by the median step time and by the device's dense
bf16 peak (PEAK_BF16_TFLOPS, from NVIDIA's datasheets; an unknown device or the CPU: blank).

    python bench/gpu/train_step.py --model swin_base_patch4_window7_224 --batch 128 [--full]
    python bench/gpu/train_step.py --model twins_svt_large --batch 128 [--full]   # Twins (no breakdown)
    python bench/gpu/train_step.py --cpu          # the --full rows for a toy Swin on this CPU
    python bench/gpu/train_step.py --cpu --model toy-twins     # ... for a toy Twins
    python bench/gpu/train_step.py --toy          # CPU, tiny model, 1 step: the CI smoke run
    python bench/gpu/train_step.py --model convnextv2_base --batch 128   # FCMAE: masked-dense vs greenmim
    python bench/gpu/train_step.py --toy --model convnextv2_base         # ... convnextv2_atto, CPU smoke run
    python bench/gpu/train_step.py --full --rows greenmim --trace traces/   # + profiler trace, time by category
    python bench/gpu/train_step.py --full --compile [reduce-overhead]        # every row torch.compile'd
    python bench/gpu/train_step.py --full --graphs --compile --compile-rows simmim,greenmim   # compile where it helps
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

import torch

import greenmim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baselines import DENSE, SimMIMTwins, make_row  # noqa: E402,F401  (SimMIMTwins, make_row: tests, activation_memory.py)
import step_profile  # noqa: E402

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
# ConvNeXt V2 (FCMAE): name -> (the rows' model: greenmim's registry name and its keywords, image size)
CONVNEXT = {
    "convnextv2_base": (dict(registry="fcmae_convnextv2_base_dec512b1"), 224),
    "toy-convnext": (dict(registry="fcmae_convnextv2_atto_dec512b1", kwargs=dict(decoder_embed_dim=128)), 224),
}
ROWS = ("simmim", "greenmim", "per-sample", "released", "mae", "hiera")
CONVNEXT_ROWS = ("masked-dense", "greenmim")
# dense bf16 tensor-core peaks, TFLOP/s (NVIDIA datasheets, without sparsity), by device name; the
# first entry whose key is in torch.cuda.get_device_name() wins (more specific names first)
PEAK_BF16_TFLOPS = (("H200 NVL", 835.0), ("H200", 989.0), ("GH200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0),
                    ("H100", 989.0), ("H800", 989.0), ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0),
                    ("L40S", 362.0), ("L4", 121.0), ("A10G", 70.0))


def peak_tflops(name: str):
    """The dense bf16 peak of the device called ``name``, or None (unknown device, the CPU)."""
    return next((v for k, v in PEAK_BF16_TFLOPS if k in name), None)


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


def run_row(row: str, cfg: dict, args, device) -> dict:
    gen = torch.Generator().manual_seed(args.seed)
    model = make_row(row, cfg, args, device)
    if row not in DENSE:
        greenmim.set_activation_recompute(model, not args.no_recompute)
    # fused on CUDA for every row (the trainer's choice; foreach took 19% of a step's GPU time);
    # capturable (its step count on the device) when the step is a CUDA graph
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if device.type == "cuda" else None,
                            capturable=bool(args.graphs) and device.type == "cuda")
    img = torch.randn(args.batch, 3, args.img, args.img, device=device)
    grid = args.img // 32
    amp_dtype = torch.bfloat16 if device.type == "cuda" else None
    clock = Clock(device)
    per_sample = row == "per-sample" or args.convnext        # FCMAE's masks are per sample
    g0 = args.img // 4
    compiled = bool(args.compile) and (args.compile_rows is None or row in args.compile_rows)

    def simmim_mask(units):
        return ~units.repeat_interleave(g0 // grid, -2).repeat_interleave(g0 // grid, -1)

    net = model
    inline_plan = lambda units: model.plan(units, device=device, cache=False)  # noqa: E731
    loader_plan = lambda units: model.plan(units, cache=False)                 # noqa: E731
    if compiled:
        # greenmim's plans as greenmim.pretrain --compile makes them: G fixed at each stage's window
        # area and the group axis dynamic, so fresh masks do not recompile (with --graphs the plans
        # are padded to one capacity instead: static shapes)
        net = torch.compile(model, mode=args.compile)
    info = {}
    if (compiled or args.graphs) and row not in DENSE:
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

    def draw(plan_fn):
        """The step's item: the dense rows' mask (MAE: a permutation), else the mask's plan."""
        if row in ("mae", "hiera"):
            return model.draw(args.batch, gen)
        units = unit_masks(args.batch, per_sample, args.ratio, gen, grid)
        if row == "masked-dense":
            return units
        return simmim_mask(units) if row == "simmim" else plan_fn(units)

    ready = None
    if args.plans == "loader":   # made before the timed steps, pinned: the trainer's DataLoader
        ready = iter([item.pin_memory() if device.type == "cuda" else item
                      for item in (draw(loader_plan) for _ in range(args.warmup + args.steps))])

    def next_item():
        return next(ready) if ready is not None else draw(inline_plan)

    def loss_of(x, item, m=None):
        m = net if m is None else m
        if row == "simmim":
            out = m(x, item.expand(args.batch, g0, g0))
        elif row in DENSE:
            out = m(x, item)
        else:
            out = m(x, item) if args.full else model.forward_features(x, item)   # visible tokens
        if args.full:
            return out.float() if row in DENSE else out[0].float()
        return out.float().square().mean()

    amp = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    def step():
        item = next_item().to(device, non_blocking=True)
        if compiled and row not in DENSE:
            item.mark_dynamic()
        with amp:
            loss = loss_of(img, item)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    graphed = None
    if args.graphs:
        # greenmim.pretrain's own graphed step (pretrain/graphs.py): captured once, replayed;
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
    trace = trace_steps(step, row, args, device) if args.trace and ready is None else None
    ms = statistics.median(times)
    flops = step_flops(lambda: loss_of(img, draw(inline_plan).to(device), m=model), amp, model) if args.flops else None
    out = dict(row=row, ms=ms, ms_min=min(times), images_per_s=args.batch / ms * 1e3, peak_gib=peak,
               gflop=flops / 1e9 if flops is not None else float("nan"), mfu=float("nan"), steps=args.steps,
               compiled=compiled, graphs=bool(args.graphs))
    if flops is not None and args.peak_tflops:
        out["mfu"] = flops / (ms / 1e3) / (args.peak_tflops * 1e12)
    if trace is not None:
        out["trace"] = trace
    if graphed is not None:
        cap, counts = info.get("capacity"), info.get("counts", [])
        text = (f"{row}: CUDA graph, {graphed.overflows} of {graphed.overflows + graphed.replays} steps ran eagerly "
                f"(overflow)")
        if graphed.failure:
            text += f"; capture failed: {graphed.failure}"
        if cap and counts:
            pad = 100 * (1 - statistics.mean(c[0][0] for c in counts) / cap[0][0])
            text += f"; capacity {cap}, stage 1 padded by {pad:.1f}% of its groups on average"
        print(text, flush=True)
    del model, opt, graphed, step        # the graph holds its memory pool until it goes
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def step_flops(loss_fn, amp, model) -> float:
    """FLOPs of one eager forward + backward (``loss_fn()`` under ``amp``, then its backward), as
    torch's FlopCounterMode counts them, greenmim's ops by their registered formulas (under the
    counter, a dispatch mode, they run as custom ops: greenmim/_dispatch.py); the gradients are dropped."""
    from torch.utils.flop_counter import FlopCounterMode
    import greenmim.flops
    greenmim.flops.register_flop_formulas()
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})
    with counter:
        with amp:
            loss = loss_fn()
        loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape=None, **kw) -> int:
    """A convolution's backward: each of grad_input and grad_weight (when asked) costs the forward's
    multiply-adds. torch's own formula (torch 2.11, torch.utils.flop_counter.conv_backward_flop)
    counts grad_weight as if the conv had one group: a depthwise conv's backward (ConvNeXt's 7x7,
    Twins' PEG in timm's models) by C times too much (a 7x7 depthwise at 64 channels: 640 MFLOP
    against 20)."""
    from torch.utils.flop_counter import conv_flop_count
    fwd = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed=transposed)
    return fwd * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def trace_steps(step, row: str, args, device) -> dict:
    """args.trace_steps more steps (3; 1 with --toy) under torch.profiler: a Chrome trace in
    args.trace, the step's host and GPU time by category (step_profile.py), and the ops that cost
    the most host time and device time (where a step waits: the host or the GPU). On the CPU a toy
    step records about 10,000 events, and torch's key_averages() takes about 3 s of host time per
    step recorded: the profiling, not the steps, would be most of a toy run."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    clock = Clock(device)
    with profile(activities=acts) as prof:
        t0 = clock()
        for _ in range(args.trace_steps):
            step()
        wall = (clock() - t0) * 1e3
    os.makedirs(args.trace, exist_ok=True)
    path = os.path.join(args.trace, f"trace_{args.model}_{row}.json")
    prof.export_chrome_trace(path)
    n = args.trace_steps
    print(f"\n## {row}: {n} step{'s' if n > 1 else ''} under torch.profiler (Chrome trace {path})")
    cats = step_profile.categories(prof, n, wall)
    print(f"time by category, per step (host: self time of the profiler's events; {wall / n:.2f} ms wall a step "
          f"under the profiler)")
    print(step_profile.table(cats, wall / n))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
    if device.type == "cuda":
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))
    return cats


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
            t_build = _time(lambda: parts.append(greenmim.testing.stage_partition(ms, args.window, shift, C, device=device,
                                                                          cache=False)), clock, args.reps)
            part = parts[-1]
            x = torch.randn(args.batch, part.num_tokens, C, device=device, dtype=dtype)
            y = greenmim.ops.partition_tokens(x, part)
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
            row[f"{key}_group_ms"] = _time(lambda: greenmim.ops.partition_tokens(x, part), clock, args.reps)
            row[f"{key}_ungroup_ms"] = _time(lambda: greenmim.ops.unpartition_tokens(y, part), clock, args.reps)
            row[f"{key}_attn_fwd_ms"] = _time(lambda: torch.ops.greenmim.attention_packed_fwd(
                qkv, bias, index, part.group_size, part.window, D ** -0.5, "auto"), clock, args.reps)
            row[f"{key}_attn_bwd_ms"] = _time(lambda: torch.ops.greenmim.attention_packed_bwd(
                g, qkv, o, lse, bias, index, part.group_size, part.window, D ** -0.5, "auto", True), clock,
                args.reps)
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="swin_base_patch4_window7_224",
                    choices=sorted(MODELS) + sorted(TWINS) + sorted(CONVNEXT))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--img", type=int, default=None, help="image size (default: the model's)")
    ap.add_argument("--ratio", type=float, default=None, help="mask ratio (default 0.75; ConvNeXt V2: FCMAE's 0.6)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20, help="repetitions of each breakdown timing")
    ap.add_argument("--rows", default=None, help=f"comma-separated (default: all; ConvNeXt V2: {','.join(CONVNEXT_ROWS)})")
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
    ap.add_argument("--compile-rows", default=None, metavar="ROWS",
                    help="with --compile: compile these rows only (comma-separated), the others eager (or graphed)")
    ap.add_argument("--no-flops", dest="flops", action="store_false",
                    help="skip counting each row's FLOPs (one eager step under FlopCounterMode) and its MFU")
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON object on the last line")
    ap.add_argument("--cpu", action="store_true",
                    help="--full rows for a toy Swin (embed 32; a Twins model: toy-twins) at batch 16 on this CPU "
                         "(MAE's and Hiera's at toy sizes too), no breakdown")
    args = ap.parse_args(argv)
    args.twins = args.model in TWINS
    args.convnext = args.model in CONVNEXT
    if args.ratio is None:
        args.ratio = 0.6 if args.convnext else 0.75
    if args.rows is None:
        args.rows = ",".join(CONVNEXT_ROWS if args.convnext else ROWS)
    if args.convnext:
        args.full = True                          # the FCMAE step: encoder, decoder and loss
    if args.cpu:
        args.model = "toy-twins" if args.twins else ("toy-convnext" if args.convnext else "toy")
        args.full, args.device, args.no_breakdown = True, "cpu", True
        args.batch = args.batch if args.batch != 128 else 16
    if args.toy:
        args.model = "toy-twins" if args.twins else "toy-convnext" if args.convnext else \
            ("toy-v2" if MODELS[args.model][3] else "toy")
        args.batch, args.steps, args.warmup, args.reps, args.device = 2, 1, 1, 1, "cpu"
    args.trace_steps = 1 if args.toy else 3
    if args.compile and not args.full:
        ap.error("--compile needs --full (it compiles the whole pretraining models)")
    if args.graphs and (not args.full or args.device != "cuda" or args.trace):
        ap.error("--graphs needs --full and a CUDA device (and no --trace)")
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--batch and --steps must be >= 1, --warmup >= 0")
    rows = [r for r in args.rows.split(",") if r]
    allowed = CONVNEXT_ROWS if args.convnext else ROWS
    bad = [r for r in rows if r not in allowed]
    if bad:
        ap.error(f"unknown rows {bad} for {args.model}; choose from {allowed}")
    if args.compile_rows is not None:
        args.compile_rows = [r for r in args.compile_rows.split(",") if r]
        bad = [r for r in args.compile_rows if r not in allowed]
        if bad or not args.compile:
            ap.error(f"--compile-rows needs --compile and rows from {allowed}" + (f" (unknown {bad})" if bad else ""))
    device = torch.device(args.device)
    if args.convnext:
        (cfg, img), args.window, args.v2 = CONVNEXT[args.model], None, False
        args.no_breakdown = True                 # the breakdown times Swin's attention stages only
    elif args.twins:
        (cfg, img), args.window, args.v2 = TWINS[args.model], 7, False
        args.no_breakdown = True                 # the breakdown times Swin's attention stages only
    else:
        cfg, img, args.window, args.v2 = MODELS[args.model]
    args.img = args.img or img
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    args.peak_tflops = peak_tflops(name) if device.type == "cuda" else None
    compiled = "" if not args.compile else \
        f"torch.compile ({args.compile}{', rows ' + ','.join(args.compile_rows) if args.compile_rows else ''}), "
    print(f"== train step{' (whole models)' if args.full else ''}: {args.model}, batch {args.batch}, {args.img} px, ratio {args.ratio}, "
          f"plans {args.plans}, {compiled}"
          f"{'no recompute, ' if args.no_recompute else ''}{'CUDA graphs, ' if args.graphs else ''}"
          f"{'bf16 autocast' if device.type == 'cuda' else 'float32'}, AdamW, {name}, torch {torch.__version__}")
    print(("masked-dense: timm's ConvNeXt V2 on every site; " if args.convnext else
           "timm's fused attention on in the simmim, mae and hiera rows; ")
          + (f"MFU against {args.peak_tflops:g} TFLOP/s dense bf16 ({name})" if args.peak_tflops else
             f"MFU blank: no dense bf16 peak known for {name}"))
    results = []
    for r in rows:
        res = run_row(r, cfg, args, device)
        results.append(res)
        print(f"{r}: {res['ms']:.2f} ms/step (median of {args.steps}), peak {res['peak_gib']:.2f} GiB", flush=True)
    ref = "masked-dense" if args.convnext else "simmim"
    print(f"\n| row | median ms/step | min ms | images/s | peak GiB | GFLOP/step | MFU | speed-up vs {ref} "
          f"| memory vs {ref} |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = next((x for x in results if x["row"] == ref), None)
    for x in results:
        sp = f"{base['ms'] / x['ms']:.2f}x" if base else "-"
        mem = f"{100 * x['peak_gib'] / base['peak_gib']:.0f}%" if base and base["peak_gib"] == base["peak_gib"] else "-"
        gf = f"{x['gflop']:.1f}" if x["gflop"] == x["gflop"] else "-"
        mfu = f"{100 * x['mfu']:.1f}%" if x["mfu"] == x["mfu"] else ""
        print(f"| {x['row']} | {x['ms']:.2f} | {x['ms_min']:.2f} | {x['images_per_s']:.0f} | {x['peak_gib']:.2f} | {gf} "
              f"| {mfu} | {sp} | {mem} |")
    by = {x["row"]: x for x in results}
    if "greenmim" in by and "per-sample" in by:
        print(f"per-sample / shared step time: {by['per-sample']['ms'] / by['greenmim']['ms']:.3f}")
    if args.convnext and "greenmim" in by and "masked-dense" in by:
        print(f"masked-dense / greenmim step time: {by['masked-dense']['ms'] / by['greenmim']['ms']:.3f} "
              f"(goal >= 2 at ratio 0.6), GFLOP ratio {by['masked-dense']['gflop'] / by['greenmim']['gflop']:.3f}")
    if "greenmim" in by and "released" in by:
        print(f"released / greenmim step time: {by['released']['ms'] / by['greenmim']['ms']:.3f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[k for k in results[0] if k != "trace"], extrasaction="ignore")
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
    if args.json:
        import json
        print(json.dumps(dict(model=args.model, batch=args.batch, device=name, full=args.full, graphs=args.graphs,
                              compile=args.compile, peak_tflops=args.peak_tflops,
                              rows=[{k: (None if isinstance(v, float) and v != v else v) for k, v in x.items()}
                                    for x in results])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
