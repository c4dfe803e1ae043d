"""Training checkpoints: written to a temporary file and renamed (a crash never leaves a torn
one), found again by ``--resume auto``, and refused with the reason when they belong to another
model. One file holds the model, optimizer, GradScaler, epoch, step, RNG states, arguments and
the model's configuration; the model's state dict is greenmim's (``greenmim.export`` turns it
into timm's)."""
from __future__ import annotations

import datetime
import os
import random
from typing import Optional, Tuple

import torch
from torch import nn

from .. import checkpoint as ckpt_io
from .args import UsageError
from .dist import Context, unwrap


def _full_state(model: nn.Module, opt: torch.optim.Optimizer, ctx: Context):
    """Whole state dicts on rank 0 (FSDP2's shards gathered; every rank must call this)."""
    if ctx.fsdp:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        o = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=o), get_optimizer_state_dict(model, opt, options=o)
    return unwrap(model).state_dict(), opt.state_dict()


def rng_state() -> dict:
    s = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save(path: str, model, opt, scaler, epoch: int, step: int, args, config: dict, ctx: Context,
         extra: Optional[dict] = None) -> Optional[str]:
    """Writes the checkpoint atomically on rank 0 (all ranks call it); returns the path."""
    model_sd, opt_sd = _full_state(model, opt, ctx)
    if not ctx.main:
        return None
    for g in opt_sd.get("param_groups", ()):       # --cuda_graphs keeps lr on the device: save a number
        if isinstance(g.get("lr"), torch.Tensor):
            g["lr"] = float(g["lr"])
    obj = {"model": model_sd, "optimizer": opt_sd, "scaler": scaler.state_dict() if scaler is not None else None,
           "epoch": epoch, "step": step, "args": vars(args), "config": config, "rng": rng_state(),
           "meta": {"greenmim": _version(), "world_size": ctx.world, "written": datetime.datetime.now().isoformat(),
                    **(extra or {})}}
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def checkpoint_name(output_dir: str, epoch: int, step: int, milestone: bool) -> str:
    """``checkpoint-<epoch>.pth`` for a milestone at an epoch's end (--save_freq, the end of the
    schedule: the released name, never pruned), ``checkpoint-<epoch>-step<step>.pth`` for every other
    save (--save_every_*, a preemption, --max_steps inside an epoch; --keep_last prunes them)."""
    return os.path.join(output_dir, f"checkpoint-{epoch}.pth" if milestone else f"checkpoint-{epoch}-step{step}.pth")


def resume_hint(output_dir: str) -> str:
    """What an interrupted run leaves to resume from: the newest checkpoint, or that there is none yet."""
    if not output_dir:
        return "nothing was saved (--output_dir '')"
    newest = latest(output_dir)
    if newest is None:
        return f"no checkpoint in {output_dir} yet, so nothing to resume"
    return f"{newest} is the newest checkpoint; --resume auto continues from it"


def latest(output_dir: str) -> Optional[str]:
    """The checkpoint of ``output_dir`` with the most optimizer steps, among those whose header
    reads (temporary files ignored; checkpoints.newest_valid also checks the whole file)."""
    from . import checkpoints
    found = checkpoints.candidates(output_dir)
    return found[0][1] if found else None


def _describe(cfg: dict) -> str:
    keys = ("embed_dim", "depths", "num_heads", "img_size", "window_size", "decoder_embed_dim", "decoder_depth")
    return f"{cfg.get('name')} ({', '.join(f'{k} {cfg[k]}' for k in keys if k in cfg)})"


def check_config(saved: dict, config: dict, path: str) -> None:
    diff = [k for k in sorted(set(saved) | set(config)) if k not in ("decoder_order", "norm_pix_loss", "attn_impl",
                                                                     "strategy", "drop_path_rate")
            and saved.get(k) != config.get(k)]
    if diff:
        what = "; ".join(f"{k}: {saved.get(k)} in the checkpoint, {config.get(k)} here" for k in diff)
        raise UsageError(f"--resume {path} is a checkpoint of another model: {what}. It was trained as "
                         f"{_describe(saved)}; this run builds {_describe(config)}")


_STEP_FLAGS = ("fused", "foreach", "capturable", "differentiable")


def load(path: str, model, opt, scaler, config: dict, ctx: Context, obj: Optional[dict] = None) -> Tuple[int, int]:
    """Restores model, optimizer, scaler and RNG states from ``path`` (or from ``obj``, its
    contents already read by checkpoints.read); returns (epoch, step) to continue from."""
    if obj is None:
        from . import checkpoints
        try:
            obj = checkpoints.read(path)
        except checkpoints.CheckpointError as e:
            raise UsageError(f"--resume {path}: {e}") from None
    sd = obj["model"]
    if ckpt_io.is_released(sd):
        raise UsageError(f"--resume {path} is a released GreenMIM checkpoint: it holds no greenmim training state. "
                         f"Load its weights with greenmim.checkpoint.load_pretrained(model, path, layout=...)")
    if "config" not in obj:
        raise UsageError(f"--resume {path}: not a greenmim.pretrain checkpoint (no model configuration)")
    check_config(obj["config"], config, path)
    ckpt_io.check_shapes(sd, unwrap(model), f"--resume {path}")
    if ctx.fsdp:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        o = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, sd, options=o)
        set_optimizer_state_dict(model, opt, obj["optimizer"], options=o)
    else:
        unwrap(model).load_state_dict(sd)
        # how this run steps (fused, capturable for CUDA graphs, ...) is its own, not the checkpoint's
        flags = [{k: g[k] for k in _STEP_FLAGS if k in g} for g in opt.param_groups]
        opt.load_state_dict(obj["optimizer"])
        for g, f in zip(opt.param_groups, flags):
            g.update(f)
    if scaler is not None and obj.get("scaler"):
        scaler.load_state_dict(obj["scaler"])
    if "rng" in obj:
        set_rng_state(obj["rng"])
    return int(obj["epoch"]), int(obj["step"])


def _version() -> str:
    from .. import __version__
    return __version__
