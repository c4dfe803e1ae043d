"""The training loop of ``python -m greenmim.pretrain``."""
from __future__ import annotations

import math
import os
from typing import Optional

import torch

from .. import mim
from . import data, dist, graphs, optim, report, state
from .args import UsageError

SMALL_MODELS = ("green_mim_swin_nano_patch4_dec128b1", "green_mim_swin_tiny_patch4_dec512b1",
                "green_mim_twins_nano_patch4_dec128b1")


class LossNotFinite(RuntimeError):
    pass


def build_model(args) -> mim.GreenMIM:
    return mim.create_model(args.model, img_size=args.input_size, window_size=args.window_size,
                            norm_pix_loss=args.norm_pix_loss, decoder_order=args.decoder_order,
                            decoder_depth=args.decoder_depth, drop_path_rate=args.drop_path or None)


def amp_dtype(args, device: torch.device) -> Optional[torch.dtype]:
    amp = args.amp or ("bf16" if device.type == "cuda" else "off")
    if amp != "off" and device.type != "cuda":
        raise UsageError(f"--amp {amp} needs CUDA: greenmim's CPU attention runs float32 (use --amp off)")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[amp]


def images_of(args):
    return data.ImageFiles(args.data_path) if args.data_path else data.SamplePhotographs()


def run(args, ctx: dist.Context) -> dict:
    """Trains; returns a summary: steps, the loss of each step run here and the last, the last
    checkpoint written, the (unwrapped; with FSDP2 sharded) model, held-out losses."""
    torch.manual_seed(args.seed)                       # the same initial weights on every rank
    model = build_model(args)
    amp = amp_dtype(args, ctx.device)
    images = images_of(args)
    if args.cuda_graphs and ctx.device.type != "cuda":
        raise UsageError(f"--cuda_graphs needs a CUDA device (here: {ctx.device.type}); drop it to train eagerly")
    geometry = data.Geometry(model, fixed_groups=args.compile or args.cuda_graphs)
    sampler = data.StepSampler(len(images), args.batch_size, args.accum_iter, ctx.world, ctx.rank, args.seed)
    spe = sampler.steps_per_epoch
    if spe == 0:
        raise UsageError(f"the data ({images.describe()}) hold fewer images than one optimizer step needs: batch_size "
                         f"{args.batch_size} x accum_iter {args.accum_iter} x {ctx.world} process(es) = "
                         f"{sampler.global_batch}; lower --batch_size or --accum_iter")
    total = args.epochs * spe if args.max_steps is None else min(args.max_steps, args.epochs * spe)
    lr = args.lr if args.lr is not None else args.blr * sampler.global_batch / 256
    model.to(ctx.device)
    config = model.config
    # --cuda_graphs averages the gradients itself (one all-reduce after each replay): no DDP wrapper
    wrapped = model if args.cuda_graphs else dist.wrap(model, ctx)
    opt = optim.adamw(wrapped if ctx.fsdp else model, lr, args.weight_decay,
                      fused=ctx.device.type == "cuda" and not ctx.fsdp, capturable=args.cuda_graphs)
    scaler = torch.amp.GradScaler(ctx.device.type) if amp == torch.float16 else None
    step = 0
    out = args.output_dir
    if out and ctx.main:
        os.makedirs(out, exist_ok=True)
    resume = state.latest(out) if args.resume == "auto" else args.resume
    if args.resume == "auto" and resume is None and ctx.main:
        print(f"greenmim.pretrain: --resume auto: no checkpoint in {out}, starting afresh", flush=True)
    if resume:
        _, step = state.load(resume, wrapped, opt, scaler, config, ctx)
    net = torch.compile(wrapped, backend=args.compile_backend) if args.compile else wrapped
    graphed = None
    if args.cuda_graphs:
        graphs.tensor_lr(opt, ctx.device)
        geometry.capacity = geometry.capacity_for(args.batch_size, args.per_sample_masks, args.mask_ratio, args.seed)
        dist.broadcast_state(model, ctx)
        graphed = graphs.GraphedStep(net, lambda x, p: net(data.normalize(x), p)[0], opt, amp, ctx.device,
                                     geometry.capacity, grad_sync=dist.average_gradients(ctx))
    workers = data.worker_count(args.num_workers)
    ds = data.MicroBatches(images, geometry.img_size, geometry, args.mask_ratio, args.per_sample_masks, args.seed)
    rep = report.Reporter(ctx.main, out, args.log_dir, args.print_freq, total, spe,
                          args.batch_size * args.accum_iter * ctx.world)
    _header(rep, args, model, images, sampler, geometry, lr, amp, ctx, workers, total, resume, step)
    vis_imgs = data.fixed_images(images, geometry.img_size)
    vis_masks = model.random_masks(len(vis_imgs), args.mask_ratio, torch.Generator().manual_seed(args.seed + 1))
    summary = {"steps": step, "checkpoint": None, "loss": float("nan"), "losses": [], "model": model}
    model.train()
    try:
        epoch, t0 = divmod(step, spe)
        sampler.epoch, sampler.start_step, sampler.end = epoch, t0, total
        loader = data.make_loader(ds, sampler, workers, args.pin_mem and ctx.device.type == "cuda")
        losses, epoch_losses = [], []
        for i, (imgs, masks, plan) in enumerate(loader):   # one loader for the run (StepSampler's end)
            a = i % args.accum_iter
            if a == 0:
                epoch, t = divmod(step, spe)
                value = optim.lr_at(epoch + t / spe, lr, args.min_lr, args.warmup_epochs, args.epochs)
                optim.set_lr(opt, value)
                torch.manual_seed(data.derive_seed(args.seed, ctx.rank, step, 1))  # drop path, dropout
                losses = []
            if graphed is not None:                   # --cuda_graphs (accum_iter 1): the whole step
                loss = graphed.step(imgs, plan)
                losses.append(loss.float())
            else:
                imgs = data.normalize(imgs.to(ctx.device, non_blocking=True))   # uint8 from the workers
                plan = plan.to(ctx.device, non_blocking=True)
                if args.compile:
                    plan.mark_dynamic()                   # one graph for every mask (docs/pretraining.md)
                gen = None
                if args.decoder_order == "released":
                    gen = torch.Generator().manual_seed(data.derive_seed(args.seed, epoch, t, a * ctx.world + ctx.rank,
                                                                         2))
                with dist.no_sync(wrapped, ctx, sync=a == args.accum_iter - 1):
                    with torch.autocast(ctx.device.type, dtype=amp, enabled=amp is not None):
                        loss = net(imgs, plan, gen)[0]
                    scaled = loss / args.accum_iter
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                losses.append(loss.detach().float())
                if a < args.accum_iter - 1:
                    continue
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad(set_to_none=True)
            step = _after_step(step, losses, ctx, summary, epoch_losses, rep, epoch, value)
            epoch_end, last = step % spe == 0, step >= total
            if epoch_end or last:
                rep.epoch_end(epoch, sum(epoch_losses) / max(len(epoch_losses), 1), len(epoch_losses))
                epoch_losses = []
                if out and (last or (epoch + 1) % args.save_freq == 0):
                    path = state.checkpoint_name(out, epoch, step, epoch_end)
                    state.save(path, wrapped, opt, scaler, epoch, step, args, config, ctx,
                               {"global_batch": sampler.global_batch, "steps_per_epoch": spe})
                    summary["checkpoint"] = path
                    rep.print(f"greenmim.pretrain: saved {path} (step {step})")
                if last or (epoch + 1) % args.vis_freq == 0:
                    summary.update(_visualise(model, vis_imgs, vis_masks, args, ctx, epoch, rep))
            if last:
                break
        summary["steps"] = step
        if graphed is not None:
            summary["graph_replays"], summary["graph_overflows"] = graphed.replays, graphed.overflows
            why = (f"the capture failed: {graphed.failure}" if graphed.failure else
                   f"their plans exceeded the capacity {geometry.capacity}")
            rep.print(f"greenmim.pretrain: CUDA graph: {graphed.replays} step(s) replayed, {graphed.overflows} ran "
                      f"eagerly ({why})")
            summary["graph_failure"] = graphed.failure
        if args.compile:
            from torch._dynamo.utils import counters
            summary["graphs"] = counters["stats"]["unique_graphs"]
            rep.print(f"greenmim.pretrain: torch.compile: {summary['graphs']} graph(s) compiled over "
                      f"{len(summary['losses'])} steps")
    finally:
        rep.close()
    return summary


def _after_step(step: int, losses: list, ctx, summary: dict, epoch_losses: list, rep, epoch: int,
                lr: float) -> int:
    """The bookkeeping of an optimizer step: the mean loss over micro-batches and ranks, its check,
    the summary and the report. Returns the new step count."""
    step += 1
    mean_loss = dist.mean(torch.stack(losses).mean(), ctx)
    if not math.isfinite(mean_loss):
        raise LossNotFinite(f"the loss is {mean_loss} at step {step}: stopping (lower --lr or --blr, "
                            f"or try --amp bf16 / off)")
    epoch_losses.append(mean_loss)
    summary["loss"] = mean_loss
    summary["losses"].append(mean_loss)
    rep.step(step, epoch, mean_loss, lr)
    return step


def _visualise(model, vis_imgs, vis_masks, args, ctx, epoch: int, rep) -> dict:
    """Reconstructions of the fixed images (a PNG on rank 0) and, on the sample photographs, the
    masked-unit loss of the held-out ones. Every rank runs the model (FSDP needs them all)."""
    out = {}
    path = os.path.join(args.output_dir, "vis", f"epoch_{epoch:04d}.png") if args.output_dir else None
    loss = report.reconstruction_grid(model, vis_imgs, vis_masks, ctx.device, path if ctx.main else None)
    out["vis_loss"] = loss
    if args.data_path is None:                       # the held-out photographs, 8 masks each
        held = data.held_out_photographs(model.encoder.img_size).repeat(8, 1, 1, 1)
        masks = model.random_masks(len(held), args.mask_ratio, torch.Generator().manual_seed(args.seed + 2))
        out["held_out_loss"] = report.reconstruction_grid(model, held, masks, ctx.device, None)
    if path and ctx.main:
        extra = f", held-out photographs {out['held_out_loss']:.4f}" if "held_out_loss" in out else ""
        rep.print(f"greenmim.pretrain: reconstructions in {path} (masked-unit loss of those images {loss:.4f}{extra}; "
                  f"1.0 = predicting each unit's mean)")
    return out


def _header(rep, args, model, images, sampler, geometry, lr, amp, ctx, workers, total, resume, step) -> None:
    n = sum(p.numel() for p in model.parameters())
    L = model.grid * model.grid
    keep = int(L * (1 - args.mask_ratio))
    masks = "one per image" if args.per_sample_masks else f"one per micro-batch of {args.batch_size}"
    where = f"{workers} loader worker{'s' if workers > 1 else ''}" if workers else "the main process (--num_workers 0)"
    rep.print(f"greenmim.pretrain: {args.model} ({n / 1e6:.1f} M parameters): {geometry.img_size} px, window "
              f"{geometry.window}, decoder {model.mask_token.shape[-1]} x {len(model.decoder_blocks)}, decoder order "
              f"{model.decoder_order}, norm_pix_loss {model.norm_pix_loss}")
    rep.print(f"  data: {images.describe()}; masks: {masks}, ratio {args.mask_ratio} ({keep} of {L} units "
              f"visible), drawn and planned in {where}")
    procs = f"{ctx.world} process{'es' if ctx.world > 1 else ''}"
    rep.print(f"  {args.batch_size} images x accum {args.accum_iter} x {procs} = {sampler.global_batch} "
              f"per step; {sampler.steps_per_epoch} steps per epoch; {total} steps "
              f"({args.epochs} epochs{f', --max_steps {args.max_steps}' if args.max_steps else ''}); lr {lr:.3g} "
              f"(blr {args.blr:g}), warm-up {args.warmup_epochs:g} epochs, cosine to {args.min_lr:g}; AdamW (0.9, 0.95), "
              f"weight decay {args.weight_decay:g}")
    mode = "FSDP2" if ctx.fsdp else ("DDP" if ctx.distributed and not args.cuda_graphs else
                                     (f"{ctx.world} processes, gradients averaged after each graph" if ctx.distributed
                                      else "one process"))
    rep.print(f"  {ctx.device}, {str(amp).replace('torch.', '') if amp else 'float32'}, {mode}"
              f"{', torch.compile' if args.compile else ''}{', CUDA graphs' if args.cuda_graphs else ''}; output {args.output_dir or '(none)'} (checkpoints every "
              f"{args.save_freq} epochs, reconstructions every {args.vis_freq}, log.jsonl)")
    if resume:
        rep.print(f"  resumed from {resume} at step {step}")
    if (ctx.device.type == "cuda" and not args.cuda_graphs and not ctx.fsdp and args.accum_iter == 1
            and args.amp != "fp16" and args.decoder_order != "released"):
        rep.print("  tip: eager steps are bound by the host's Python; --cuda_graphs replays each step as one CUDA "
                  "graph (Swin-B's step: 45-80 ms eager, 25-30 ms replayed on H100/H200; docs/pretraining.md)")
    if ctx.device.type == "cpu" and args.model not in SMALL_MODELS:
        rep.print(f"  note: {args.model} on a CPU is slow (the ETA below tells how slow); for a first look try "
                  f"--model green_mim_swin_nano_patch4_dec128b1 --batch_size 16")
