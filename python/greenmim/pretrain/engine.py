"""The training loop of ``python -m greenmim.pretrain``."""
from __future__ import annotations

import os
from typing import Optional

import torch

from .. import mim
from . import decode as _decode
from . import checkpoints, data, dist, graphs, inductor_cache, optim, report, signals, state
from .books import Books as _Books, Saver as _Saver, TestHooks as _TestHooks, preempted_line as _preempted_line
from .args import UsageError

SMALL_MODELS = ("green_mim_swin_nano_patch4_dec128b1", "green_mim_swin_tiny_patch4_dec512b1",
                "green_mim_twins_nano_patch4_dec128b1", "fcmae_convnextv2_atto_dec512b1")


READBACK_STEPS = 10    # on CUDA: the losses and skip flags are read every this many steps, not every step


class Stopped(RuntimeError):
    """The run stopped early: ``line`` says why and how to go on; ``code`` is the exit status."""

    def __init__(self, line: str, code: int):
        super().__init__(line)
        self.line, self.code = line, code


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


def run(args, ctx: dist.Context, resume: Optional[checkpoints.Resume] = None) -> dict:
    """Trains; returns a summary: steps, the loss of each step run here and the last, the last
    checkpoint written, the (unwrapped; with FSDP2 sharded) model, held-out losses, skipped steps.
    ``resume``: what ``checkpoints.preflight`` found (None: a fresh run). Raises Stopped when the
    run stops early: a preemption signal (after saving) or too many non-finite steps."""
    resume = resume or checkpoints.Resume()
    torch.manual_seed(args.seed)                       # the same initial weights on every rank
    if args.cuda_graphs and ctx.device.type != "cuda":
        raise UsageError(f"--cuda_graphs needs a CUDA device (here: {ctx.device.type}); drop it to train eagerly")
    threads = ""
    workers = data.worker_count(args.num_workers)
    if ctx.device.type == "cpu":
        workers, n, why = dist.cpu_split(args.num_workers)
        threads = f"{n} intra-op thread{'s' if n > 1 else ''} ({why})"
    decode_mode = _decode.resolve_decode(args.decode, ctx.device)   # --decode gpu without CUDA: one line, exit 2
    model = build_model(args)
    amp = amp_dtype(args, ctx.device)
    images = images_of(args)
    use_graphs, graph_note = graphs.choose(args, ctx.device)
    geometry = data.Geometry(model, fixed_groups=args.compile or use_graphs)
    sampler = data.StepSampler(len(images), args.batch_size, args.accum_iter, ctx.world, ctx.rank, args.seed)
    spe = sampler.steps_per_epoch
    if spe == 0:
        raise UsageError(f"the data ({images.describe()}) hold fewer images than one optimizer step needs: batch_size "
                         f"{args.batch_size} x accum_iter {args.accum_iter} x {ctx.world} process(es) = "
                         f"{sampler.global_batch}; lower --batch_size or --accum_iter")
    total = args.epochs * spe if args.max_steps is None else min(args.max_steps, args.epochs * spe)
    if resume.step >= total:
        raise UsageError(f"nothing to do: the checkpoint {resume.path} is at step {resume.step}, and this run ends at "
                         f"step {total} (--epochs {args.epochs} x {spe} steps"
                         f"{f', --max_steps {args.max_steps}' if args.max_steps else ''})")
    lr = args.lr if args.lr is not None else args.blr * sampler.global_batch / 256
    model.to(ctx.device)
    config = model.config
    # under CUDA graphs the step averages the gradients itself (one all-reduce after each replay): no DDP
    wrapped = model if use_graphs else dist.wrap(model, ctx)
    opt = optim.adamw(wrapped if ctx.fsdp else model, lr, args.weight_decay,
                      fused=ctx.device.type == "cuda" and not ctx.fsdp, capturable=use_graphs)
    scaler = torch.amp.GradScaler(ctx.device.type) if amp == torch.float16 else None
    step = 0
    out = args.output_dir
    if out and ctx.main:
        os.makedirs(out, exist_ok=True)
    if resume.path:
        _, step = state.load(resume.path, wrapped, opt, scaler, config, ctx, resume.obj)
        resume.obj = None                              # its tensors now live in the model and optimizer
    mended = inductor_cache.mend() if args.compile else []
    net = torch.compile(wrapped, backend=args.compile_backend) if args.compile else wrapped
    graphed = None
    if use_graphs:
        graphs.tensor_lr(opt, ctx.device)
        geometry.capacity = geometry.capacity_for(args.batch_size, args.per_sample_masks, args.mask_ratio, args.seed)
        dist.broadcast_state(model, ctx)
        graphed = graphs.GraphedStep(net, lambda x, p: net(data.normalize(x), p)[0], opt, amp, ctx.device,
                                     geometry.capacity, grad_sync=dist.average_gradients(ctx))
    ds = data.MicroBatches(images, geometry.img_size, geometry, args.mask_ratio, args.per_sample_masks, args.seed,
                           decode=decode_mode)
    decoder = _decode.GpuDecoder(ctx.device, geometry.img_size) if decode_mode == "gpu" else None
    rep = report.Reporter(ctx.main, out, args.log_dir, args.print_freq, total, spe,
                          args.batch_size * args.accum_iter * ctx.world, resume_step=step)
    report.header(rep, args, model, images, sampler, geometry, lr, amp, ctx, workers, total, resume.path, step,
                  use_graphs, threads, SMALL_MODELS, decode_mode)
    if mended:
        rep.print(f"greenmim.pretrain: removed {len(mended)} kernel librar{'ies' if len(mended) > 1 else 'y'} cut short "
                  f"from inductor's cache (a run killed while compiling; pytorch/pytorch#102539), e.g. {mended[0]}")
    for line in (resume.why, graph_note):
        if line:
            rep.print(line if line.startswith("greenmim.pretrain") else f"greenmim.pretrain: {line}")
    if resume.path:
        report.event(rep, event="resumed", path=resume.path, at_step=step)
    vis_imgs = data.fixed_images(images, geometry.img_size)
    vis_masks = model.random_masks(len(vis_imgs), args.mask_ratio, torch.Generator().manual_seed(args.seed + 1))
    summary = {"steps": step, "checkpoint": None, "loss": float("nan"), "losses": [], "model": model, "skipped": 0}
    hooks = _TestHooks(ctx)
    books = _Books(args, ctx, rep, summary, rep.resumed_losses, step)
    saver = _Saver(args, ctx, rep, summary, wrapped, opt, scaler, config,
                   {"global_batch": sampler.global_batch, "steps_per_epoch": spe})
    readback = 1 if ctx.device.type == "cpu" else READBACK_STEPS
    params = [p for g in opt.param_groups for p in g["params"]]
    model.train()
    preemption = None
    try:
        with signals.Preemption() as preemption:
            epoch, t0 = divmod(step, spe)
            sampler.epoch, sampler.start_step, sampler.end = epoch, t0, total
            loader = data.make_loader(ds, sampler, workers, args.pin_mem and ctx.device.type == "cuda")
            signals.shield_workers(loader)
            losses = []
            for i, (imgs, masks, plan) in enumerate(loader):   # one loader for the run (StepSampler's end)
                a = i % args.accum_iter
                if a == 0:
                    epoch, t = divmod(step, spe)
                    value = optim.lr_at(epoch + t / spe, lr, args.min_lr, args.warmup_epochs, args.epochs)
                    optim.set_lr(opt, value)
                    torch.manual_seed(data.derive_seed(args.seed, ctx.rank, step, 1))  # drop path, dropout
                    losses = []
                if decoder is not None:                   # --decode gpu: bytes -> uint8 crops on the device
                    imgs = decoder(imgs)
                if graphed is not None:                   # a CUDA graph (accum_iter 1): the whole step
                    losses.append(graphed.step(imgs, plan).float())
                    found = graphed.found.clone()
                else:
                    imgs = data.normalize(imgs.to(ctx.device, non_blocking=True))   # uint8 from the workers
                    plan = plan.to(ctx.device, non_blocking=True)
                    if args.compile:
                        plan.mark_dynamic()                   # one graph for every mask (docs/pretraining-speed.md)
                    gen = None
                    if args.decoder_order == "released":
                        gen = torch.Generator().manual_seed(data.derive_seed(args.seed, epoch, t,
                                                                             a * ctx.world + ctx.rank, 2))
                    with dist.no_sync(wrapped, ctx, sync=a == args.accum_iter - 1):
                        with torch.autocast(ctx.device.type, dtype=amp, enabled=amp is not None):
                            loss = net(imgs, plan, gen)[0]
                        loss = hooks.poison(loss, step + 1)
                        scaled = loss / args.accum_iter
                        (scaler.scale(scaled) if scaler is not None else scaled).backward()
                    losses.append(loss.detach().float())
                    if a < args.accum_iter - 1:
                        continue
                    found = _optimizer_step(opt, scaler, torch.stack(losses).mean(), params, ctx)
                    opt.zero_grad(set_to_none=True)
                step += 1
                books.pending.append((step, epoch, value, torch.stack(losses).mean(), found))
                epoch_end, last = step % spe == 0, step >= total
                milestone = epoch_end and (last or (epoch + 1) % args.save_freq == 0)
                scheduled = bool(args.save_every_steps) and step % args.save_every_steps == 0
                if not (len(books.pending) >= readback or epoch_end or last or scheduled):
                    continue
                signum, time_due = books.read_back(preemption.signum, saver.due(),
                                                   graphed.overflows if graphed is not None else None)
                if signum:
                    path = saver.save(epoch, step, milestone)
                    raise Stopped(_preempted_line(signum, step, path, out), signals.exit_code(signum))
                if epoch_end:
                    rep.epoch_end(epoch, sum(books.epoch_losses) / max(len(books.epoch_losses), 1),
                                  len(books.epoch_losses))
                    books.epoch_losses = []
                if milestone or last or scheduled or time_due:
                    saver.save(epoch, step, milestone)
                if (epoch_end or last) and (last or (epoch + 1) % args.vis_freq == 0):
                    summary.update(_visualise(model, vis_imgs, vis_masks, args, ctx, epoch, rep))
                hooks.maybe_die(step)
                if last:
                    break
        summary["steps"] = step
        if decoder is not None:
            summary.update(decode_fallbacks=decoder.fallbacks, decode_failures=decoder.failures)
            if decoder.fallbacks or decoder.failures:
                rep.print(f"greenmim.pretrain: --decode gpu: {decoder.fallbacks} image(s) decoded on the CPU instead, "
                          f"{decoder.failures} unreadable (a grey image stood in)")
        if graphed is not None:
            summary.update(graph_replays=graphed.replays, graph_overflows=graphed.overflows,
                           graph_recaptures=graphed.recaptures, graph_failure=graphed.failure)
            why = (f"the capture failed: {graphed.failure}" if graphed.failure else
                   f"their plans exceeded the capacity; it grew {graphed.recaptures} time(s)")
            rep.print(f"greenmim.pretrain: CUDA graph: {graphed.replays} step(s) replayed, {graphed.overflows} ran "
                      f"eagerly ({why})")
        if args.compile:
            from torch._dynamo.utils import counters
            summary["graphs"] = counters["stats"]["unique_graphs"]
            rep.print(f"greenmim.pretrain: torch.compile: {summary['graphs']} graph(s) compiled over "
                      f"{len(summary['losses'])} steps")
    except Stopped as e:
        report.event(rep, event="stopped", at_step=books.done, code=e.code, why=e.line)
        raise
    except Exception as e:
        if preemption is None or not preemption.signum:
            raise
        # the signal reached a helper too (Slurm and timeout signal the whole process group: the
        # compiler under --compile, a collective's peer) and broke the step in progress
        line = _broken_line(preemption.signum, step, e, args)
        report.event(rep, event="stopped", at_step=books.done, code=signals.exit_code(preemption.signum), why=line)
        raise Stopped(line, signals.exit_code(preemption.signum)) from e
    finally:
        rep.close()
    return summary


def _broken_line(signum: int, step: int, e: BaseException, args) -> str:
    what = (str(e).strip().splitlines() or [""])[0][:200]
    return (f"greenmim.pretrain: {signals.name(signum)}: stopped in step {step + 1}, which the signal broke "
            f"({type(e).__name__}: {what}); {state.resume_hint(args.output_dir)}")


def _optimizer_step(opt, scaler, loss: torch.Tensor, params, ctx) -> torch.Tensor:
    """AdamW after the last micro-batch, skipped when the loss or a gradient is not finite; returns
    the flag (a device tensor, 1.0: skipped). With fp16 the GradScaler decides (it skips steps whose
    scaled gradients overflow, and lowers the scale: a skip is a scale that went down)."""
    if scaler is not None:
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        return torch.tensor(float(scaler.get_scale() < before), device=loss.device)
    found = optim.nonfinite(loss, params)
    if ctx.fsdp and ctx.distributed:                   # each rank checked its own shards
        import torch.distributed as torch_dist
        torch_dist.all_reduce(found)
        found = found.clamp_(max=1.0)
    optim.step_unless(opt, found)
    return found


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


