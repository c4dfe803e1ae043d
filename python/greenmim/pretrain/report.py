"""What a person sees: a progress line on rank 0 (redrawn on a terminal, printed every
--print_freq steps otherwise), metrics as JSON lines in output_dir/log.jsonl, TensorBoard when it
is installed, and a PNG of reconstructions every --vis_freq epochs. Without a terminal a line is
printed every --print_freq steps, and at least once a minute."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Optional

import torch

from .data import IMAGENET_MEAN, IMAGENET_STD


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def truncate_log(path: str, step: int, steps_per_epoch: int) -> list:
    """Keeps the rows of ``log.jsonl`` up to optimizer step ``step`` (a resumed run writes the steps
    after it once more; a fresh run, step 0, starts an empty log), atomically. Returns the finite
    losses of that step's epoch so far, so the resumed epoch's ``epoch_end`` row covers all of it."""
    if not os.path.exists(path):
        return []
    kept, losses = [], []
    first_of_epoch = step - step % steps_per_epoch if steps_per_epoch else 0
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue                  # a torn last line (the process was killed mid-write)
            if not isinstance(row, dict):
                continue
            if "step" in row:
                if row["step"] > step:
                    continue
                if row["step"] > first_of_epoch and row.get("loss") is not None and not row.get("skipped"):
                    losses.append(row["loss"])
            elif "epoch_end" in row and (row["epoch_end"] + 1) * steps_per_epoch > step:
                continue
            elif "event" in row and row.get("at_step", 0) > step:
                continue
            kept.append(json.dumps(row) + "\n")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)
    return losses


def event(rep, **row) -> None:
    """A row of its own in log.jsonl (resumed, preempted, stopped)."""
    if rep.jsonl:
        rep.jsonl.write(json.dumps({"event": row.pop("event"), **row}) + "\n")
        rep.jsonl.flush()


class Reporter:
    def __init__(self, main: bool, output_dir: str, log_dir: Optional[str], print_freq: int, total_steps: int,
                 steps_per_epoch: int, images_per_step: int, stream=None, resume_step: int = 0):
        self.main, self.print_freq, self.total = main, print_freq, total_steps
        self.steps_per_epoch, self.images_per_step = steps_per_epoch, images_per_step
        self.stream = stream or sys.stdout
        self.tty = self.main and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.resumed_losses = []
        if main and output_dir:
            self.resumed_losses = truncate_log(os.path.join(output_dir, "log.jsonl"), resume_step, steps_per_epoch)
        self.jsonl = open(os.path.join(output_dir, "log.jsonl"), "a") if main and output_dir else None
        self.tb = None
        if main and (log_dir or output_dir):
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(log_dir=log_dir or output_dir)
            except Exception:  # noqa: BLE001 - tensorboard not installed: JSON lines only
                self.tb = None
        self.t0 = self.t_last = self.t_printed = time.perf_counter()
        self.first_step = None
        self.recent = []

    def print(self, *a) -> None:
        if self.main:
            if self.tty:
                self.stream.write("\r\033[K")
            print(*a, file=self.stream, flush=True)

    def step(self, step: int, epoch: int, loss: float, lr: float, skipped: bool = False, skips: int = 0,
             overflows: Optional[int] = None) -> None:
        """After optimizer step ``step`` (1-based count of steps done) of the run. ``skipped``: this
        step's update was skipped (a non-finite loss or gradient); ``skips``: how many so far;
        ``overflows``: steps run eagerly beside the CUDA graph so far."""
        now = time.perf_counter()
        if self.first_step is None:
            self.first_step, self.t_first = step - 1, self.t_last
        self.recent = (self.recent + [now - self.t_last])[-20:]
        self.t_last = now
        if not self.main:
            return
        per_step = sum(self.recent) / len(self.recent)
        img_s = self.images_per_step / per_step if per_step > 0 else float("nan")
        eta = per_step * (self.total - step)
        in_epoch = (step - 1) % self.steps_per_epoch + 1
        rec = {"step": step, "epoch": epoch, "loss": loss if math.isfinite(loss) else None, "lr": lr,
               "images_per_s": img_s, "time_s": now - self.t0, "skipped": skipped, "skipped_total": skips}
        if overflows is not None:
            rec["graph_overflows"] = overflows
        if self.jsonl:
            self.jsonl.write(json.dumps(rec) + "\n")
            self.jsonl.flush()
        if self.tb:
            x = int(1000 * (step / self.steps_per_epoch))      # epoch_1000x, as the released code
            self.tb.add_scalar("train_loss", loss, x)
            self.tb.add_scalar("lr", lr, x)
        width = 24
        done = int(width * step / max(self.total, 1))
        line = (f"epoch {epoch} [{'#' * done}{'.' * (width - done)}] step {step}/{self.total} "
                f"({in_epoch}/{self.steps_per_epoch} of the epoch)  loss {loss:.4f}  lr {lr:.2e}  "
                f"{img_s:.1f} img/s  ETA {_clock(eta)}"
                + (f"  skipped {skips} (non-finite)" if skips else "")
                + (f"  eager {overflows} (over capacity)" if overflows else ""))
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
        elif step % self.print_freq == 0 or step == self.total or step == self.first_step + 1 or \
                now - self.t_printed > 60:
            print(line, file=self.stream, flush=True)
            self.t_printed = now

    def epoch_end(self, epoch: int, mean_loss: float, steps: int) -> None:
        if not self.main:
            return
        rec = {"epoch_end": epoch, "mean_loss": mean_loss, "steps": steps, "time_s": time.perf_counter() - self.t0}
        if self.jsonl:
            self.jsonl.write(json.dumps(rec) + "\n")
            self.jsonl.flush()
        if self.tb:
            self.tb.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
        if self.jsonl:
            self.jsonl.close()
        if self.tb:
            self.tb.close()


def denormalize(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, dtype=x.dtype).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * std + mean).clamp(0, 1)


@torch.no_grad()
def reconstruction_grid(model, images: torch.Tensor, masks: torch.Tensor, device, path: str) -> float:
    """Rows: original, masked input (masked units grey), reconstruction, reconstruction with the
    visible units pasted back; one column per image, written to ``path`` (None: no file).
    Returns the masked-unit loss."""
    from torchvision.utils import save_image
    was = model.training
    model.eval()
    imgs = images.to(device)
    plan = model.plan(masks, device=device, cache=False)
    with torch.autocast(device.type, enabled=False):
        loss, pred, mask = model(imgs, plan)
    model.train(was)
    if path is None:
        return float(loss)
    recon, pasted = model.reconstruct(imgs, pred, mask)
    unit = model.unit
    m = mask.view(-1, 1, model.grid, model.grid).repeat_interleave(unit, 2).repeat_interleave(unit, 3)
    masked = denormalize(imgs.float().cpu()) * (1 - m.cpu()) + 0.5 * m.cpu()
    rows = [denormalize(imgs.float().cpu()), masked, denormalize(recon.cpu()), denormalize(pasted.cpu())]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp.png"
    save_image(torch.cat(rows), tmp, nrow=images.shape[0], padding=2, pad_value=1.0)
    os.replace(tmp, path)
    return float(loss)


def header(rep, args, model, images, sampler, geometry, lr, amp, ctx, workers, total, resume, step, graphed: bool,
           threads: str, small_models: tuple, decode: str = "cpu") -> None:
    """The lines a run starts with: model, data and masks, batch and schedule, device and modes,
    checkpoints, threads; then what was resumed."""
    n = sum(p.numel() for p in model.parameters())
    L = model.grid * model.grid
    keep = int(L * (1 - args.mask_ratio))
    masks = "one per image" if args.per_sample_masks else f"one per micro-batch of {args.batch_size}"
    where = f"{workers} loader worker{'s' if workers > 1 else ''}" if workers else "the main process (--num_workers 0)"
    window = f", window {geometry.window}" if geometry.window else ""     # FCMAE's ConvNeXt has none
    rep.print(f"greenmim.pretrain: {args.model} ({n / 1e6:.1f} M parameters): {geometry.img_size} px{window}, "
              f"decoder {model.mask_token.numel()} x {len(model.decoder_blocks)}, decoder order "
              f"{model.decoder_order}, norm_pix_loss {model.norm_pix_loss}")
    rep.print(f"  data: {images.describe()}; masks: {masks}, ratio {args.mask_ratio} ({keep} of {L} units "
              f"visible), drawn and planned in {where}; images decoded "
              f"{'on ' + str(ctx.device) + ' (--decode gpu)' if decode == 'gpu' else 'in the workers'}")
    procs = f"{ctx.world} process{'es' if ctx.world > 1 else ''}"
    rep.print(f"  {args.batch_size} images x accum {args.accum_iter} x {procs} = {sampler.global_batch} "
              f"per step; {sampler.steps_per_epoch} steps per epoch; {total} steps "
              f"({args.epochs} epochs{f', --max_steps {args.max_steps}' if args.max_steps else ''}); lr {lr:.3g} "
              f"(blr {args.blr:g}), warm-up {args.warmup_epochs:g} epochs, cosine to {args.min_lr:g}; AdamW (0.9, 0.95), "
              f"weight decay {args.weight_decay:g}")
    mode = "FSDP2" if ctx.fsdp else ("DDP" if ctx.distributed and not graphed else
                                     (f"{ctx.world} processes, gradients averaged after each graph" if ctx.distributed
                                      else "one process"))
    rep.print(f"  {ctx.device}, {str(amp).replace('torch.', '') if amp else 'float32'}, {mode}"
              f"{', torch.compile' if args.compile else ''}"
              f"{', the step captured as a CUDA graph (--eager: without)' if graphed else ''}"
              f"{', ' + threads if threads else ''}")
    every = [f"every {args.save_freq} epochs (kept)"]
    if args.save_every_steps:
        every.append(f"every {args.save_every_steps} step{'s' if args.save_every_steps > 1 else ''}")
    if args.save_every_minutes:
        every.append(f"every {args.save_every_minutes:g} minutes")
    rep.print(f"  output {args.output_dir or '(none)'}: checkpoints {', '.join(every)}, at the end and on SIGTERM, "
              f"SIGUSR1 or Ctrl-C (the newest {args.keep_last or 'all'} step checkpoints kept); reconstructions every "
              f"{args.vis_freq} epochs; log.jsonl" if args.output_dir else f"  output (none): nothing is saved")
    if resume:
        rep.print(f"  resumed from {resume} at step {step}")
    for note in getattr(args, "notes", ()):
        rep.print(f"  {note}")
    if ctx.device.type == "cpu" and args.model not in small_models:
        rep.print(f"  note: {args.model} on a CPU is slow (the ETA below tells how slow); for a first look try "
                  f"--model green_mim_swin_nano_patch4_dec128b1 --batch_size 16")
