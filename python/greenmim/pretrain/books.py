"""The trainer's bookkeeping between steps: reading back the losses and skip flags (every step on
the CPU, every few on CUDA, so nothing waits for the device each step), the ranks' agreement on
stopping and saving, the saves themselves, and the clearly named test hooks.

Agreement: at each read-back the ranks all-reduce one vector: the pending steps' losses and skip
flags, whether each preemption signal arrived, and whether rank 0's clock says a timed save is
due. Every rank thus stops or saves after the same step. Read-backs fall on the same steps on
every rank (every ``readback`` steps, at epoch ends, at scheduled saves and at the last step).
"""
from __future__ import annotations

import os
import signal
import time
from typing import List, Optional, Tuple

import torch

from . import checkpoints, dist, signals, state

_SIGNAL_ORDER = tuple(signals.SIGNALS)


def preempted_line(signum: int, step: int, path: Optional[str], out: str) -> str:
    where = (f"saved {path}; the same command with --resume auto continues from it" if path else
             "nothing was saved (--output_dir '')")
    return f"greenmim.pretrain: {signals.name(signum)}: stopped after step {step}; {where}"


class Books:
    """Pending steps (step, epoch, lr, loss on the device, skip flag on the device) until the next
    read-back; then the log rows, the skip count and the stop on too many consecutive skips."""

    def __init__(self, args, ctx, rep, summary: dict, epoch_losses: List[float], step: int):
        self.args, self.ctx, self.rep, self.summary = args, ctx, rep, summary
        self.pending: list = []
        self.epoch_losses = list(epoch_losses)
        self.done = step
        self.skips = 0
        self.run_of_skips: List[int] = []

    def read_back(self, signum: int, time_due: bool, overflows: Optional[int]) -> Tuple[int, bool]:
        """Reads the pending steps; returns the signal every rank stops for (0: none) and whether a
        timed save is due, both agreed across ranks."""
        ctx, n = self.ctx, len(self.pending)
        flags = [float(signum == s) for s in _SIGNAL_ORDER] + [float(time_due and ctx.main)]
        vec = torch.cat([torch.stack([p[3] for p in self.pending]).double().reshape(-1),
                         torch.stack([p[4] for p in self.pending]).double().reshape(-1),
                         torch.tensor(flags, dtype=torch.float64, device=self.pending[0][3].device)])
        if ctx.distributed:
            import torch.distributed as torch_dist
            vec = vec.to(ctx.device)
            torch_dist.all_reduce(vec)
        vals = vec.tolist()
        rows, self.pending = self.pending, []
        for k, (step, epoch, lr, _, _) in enumerate(rows):
            loss, skipped = vals[k] / ctx.world, vals[n + k] > 0
            self.done = step
            self.summary["losses"].append(loss)
            self.summary["loss"] = loss
            if skipped:
                self.skips += 1
                self.run_of_skips.append(step)
            else:
                self.run_of_skips = []
                self.epoch_losses.append(loss)
            self.summary["skipped"] = self.skips
            self.rep.step(step, epoch, loss, lr, skipped, self.skips, overflows)
            if len(self.run_of_skips) >= self.args.max_skipped_steps:
                raise _too_many_skips(self.run_of_skips, loss, self.summary.get("checkpoint"), self.args)
        stop = [s for s, v in zip(_SIGNAL_ORDER, vals[2 * n:2 * n + len(_SIGNAL_ORDER)]) if v > 0]
        return (stop[0] if stop else 0), vals[-1] > 0


def _too_many_skips(steps: List[int], loss: float, saved: Optional[str], args):
    from .engine import Stopped
    last_good = saved or (checkpoints.candidates(args.output_dir)[0][1] if checkpoints.candidates(args.output_dir)
                          else None)
    keep = (f"the last good checkpoint is {last_good} (--resume auto continues from it)" if last_good else
            "no checkpoint was written")
    return Stopped(f"greenmim.pretrain: stopped at step {steps[-1]}: {len(steps)} consecutive steps "
                   f"({steps[0]}-{steps[-1]}) had a non-finite loss or gradient (last loss {loss}) and were skipped "
                   f"(--max_skipped_steps {args.max_skipped_steps}); {keep}. Lower --lr or --blr, or try --amp bf16 "
                   f"or off", 1)


class Saver:
    """Writes checkpoints: only with finite weights, read back after the rename, then the step
    checkpoints beyond --keep_last pruned. Times --save_every_minutes on rank 0."""

    def __init__(self, args, ctx, rep, summary, model, opt, scaler, config, meta: dict):
        self.args, self.ctx, self.rep, self.summary = args, ctx, rep, summary
        self.model, self.opt, self.scaler, self.config, self.meta = model, opt, scaler, config, meta
        self.last = time.monotonic()

    def due(self) -> bool:
        m = self.args.save_every_minutes
        return bool(m) and bool(self.args.output_dir) and time.monotonic() - self.last >= 60 * m

    def save(self, epoch: int, step: int, milestone: bool) -> Optional[str]:
        out = self.args.output_dir
        if not out:
            return None
        from .engine import Stopped
        if not dist.all_finite(self.model, self.ctx):
            prev = self.summary.get("checkpoint")
            raise Stopped(f"greenmim.pretrain: stopped at step {step}: the weights hold a NaN or an infinity, so no "
                          f"checkpoint was written; "
                          + (f"the last good one is {prev}" if prev else "none was written before") +
                          ". Lower --lr or --blr", 1)
        path = state.checkpoint_name(out, epoch, step, milestone)
        state.save(path, self.model, self.opt, self.scaler, epoch, step, self.args, self.config, self.ctx, self.meta)
        if self.ctx.main:
            checkpoints.probe(path)                 # it reads back before an older one goes
            gone = checkpoints.prune(out, self.args.keep_last, path)
            self.rep.print(f"greenmim.pretrain: saved {path} (step {step})"
                           + (f"; removed {', '.join(os.path.basename(g) for g in gone)} (--keep_last "
                              f"{self.args.keep_last})" if gone else ""))
        dist.barrier(self.ctx)                      # no rank runs ahead of a save (or a prune) in progress
        self.summary["checkpoint"] = path
        self.last = time.monotonic()
        return path


class TestHooks:
    """Hooks for the tests of python/tests/test_long_runs.py, read from the environment and off
    unless set. They exist to inject faults that cannot be produced on demand otherwise:

    - ``GREENMIM_TEST_NONFINITE_STEPS="3,5-9"``: multiplies the loss of those optimizer steps
      (1-based) by NaN before the backward, in the eager step (the gradients follow).
    - ``GREENMIM_TEST_KILL_AT="RANK:STEP"``: that rank kills itself with SIGKILL after that step
      (once it is read back and saved), on the first attempt only (TORCHELASTIC_RESTART_COUNT 0):
      a worker dying under torchrun --max_restarts."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.nan_steps = set()
        spec = os.environ.get("GREENMIM_TEST_NONFINITE_STEPS", "")
        for part in filter(None, (s.strip() for s in spec.split(","))):
            lo, _, hi = part.partition("-")
            self.nan_steps.update(range(int(lo), int(hi or lo) + 1))
        self.kill = None
        kill = os.environ.get("GREENMIM_TEST_KILL_AT", "")
        if kill and checkpoints.restart_count() == 0:
            r, s = kill.split(":")
            if int(r) == ctx.rank:
                self.kill = int(s)

    def poison(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        return loss * float("nan") if step in self.nan_steps else loss

    def maybe_die(self, step: int) -> None:
        if self.kill is not None and step >= self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
