"""What a person sees: a progress line on rank 0 (redrawn on a terminal, printed every
--print_freq steps otherwise), metrics as JSON lines in output_dir/log.jsonl, TensorBoard when it
is installed, and a PNG of reconstructions every --vis_freq epochs. Without a terminal a line is
printed every --print_freq steps, and at least once a minute."""
from __future__ import annotations

import json
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


class Reporter:
    def __init__(self, main: bool, output_dir: str, log_dir: Optional[str], print_freq: int, total_steps: int,
                 steps_per_epoch: int, images_per_step: int, stream=None):
        self.main, self.print_freq, self.total = main, print_freq, total_steps
        self.steps_per_epoch, self.images_per_step = steps_per_epoch, images_per_step
        self.stream = stream or sys.stdout
        self.tty = self.main and hasattr(self.stream, "isatty") and self.stream.isatty()
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

    def step(self, step: int, epoch: int, loss: float, lr: float) -> None:
        """After optimizer step ``step`` (1-based count of steps done) of the run."""
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
        rec = {"step": step, "epoch": epoch, "loss": loss, "lr": lr, "images_per_s": img_s,
               "time_s": now - self.t0}
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
                f"{img_s:.1f} img/s  ETA {_clock(eta)}")
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
