"""The command line of ``python -m greenmim.pretrain``: the released ``main_pretrain.py`` flags
(their scripts keep working) and greenmim's own, each with its default in ``--help``."""
from __future__ import annotations

import argparse
import difflib
import os

from .. import mim

WARMUP_EPOCHS = 40              # the released warm-up; a tenth of --epochs when that is shorter


class UsageError(ValueError):
    """A bad argument: one line on stderr and exit code 2, before anything is written."""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already says what the default is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def _fmt(prog):
    return _Formatter(prog, max_help_position=32, width=100)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``greenmim.pretrain: error: ...`` and exit code 2, and the
    closest flag for a typo ("did you mean --batch_size?"), as the C++ command line does."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            flags = [a for a in message.split(":", 1)[1].split() if a.startswith("-")]
            known = [o for a in self._actions for o in a.option_strings]
            hints = []
            for f in flags:
                close = difflib.get_close_matches(f.split("=")[0], known, n=1, cutoff=0.6)
                hints.append(f"{f} (did you mean {close[0]}?)" if close else f)
            message = f"unknown flag{'s' if len(hints) > 1 else ''} " + ", ".join(hints or [message.split(':', 1)[1]])
        self.exit(2, f"greenmim.pretrain: error: {message} (all flags: python -m greenmim.pretrain --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m greenmim.pretrain", formatter_class=_fmt,
        description="GreenMIM pretraining (the paper's model and recipe) on the visible tokens of masked images. "
                    "One process, or many under torchrun (DDP; FSDP2 with --fsdp). Without --data_path it trains "
                    "on photographs that ship with scikit-image, so it runs on a fresh machine as is.",
        epilog="docs/pretraining.md: the recipe, multi-GPU and multi-node (torchrun, Slurm), export to timm; "
               "docs/long-runs.md: resume, preemption; docs/pretraining-speed.md: compile, CUDA graphs, the loader.")
    g = p.add_argument_group("model")
    g.add_argument("--model", default="green_mim_swin_base_patch4_dec512b1",
                   help="one of: " + ", ".join(mim.model_names()))
    g.add_argument("--input_size", default=None, type=int, help="image side in pixels (default: the model's)")
    g.add_argument("--window_size", default=None, type=int, help="window side in tokens (default: the model's)")
    g.add_argument("--mask_ratio", default=None, type=float,
                   help="share of mask units hidden, 0 < r < 1; fcmae_* models take their recipe's 0.6 "
                        "(default: 0.75)")
    g.add_argument("--norm_pix_loss", dest="norm_pix_loss", action="store_true", default=True,
                   help="targets are each unit's normalised pixels (on by default; the released flag is accepted)")
    g.add_argument("--no_norm_pix_loss", dest="norm_pix_loss", action="store_false", help="raw pixel targets")
    g.add_argument("--per_sample_masks", action="store_true", default=None,
                   help="a different mask for every image (default: the model's recipe: one mask per micro-batch "
                        "for GreenMIM, as released; one per image for FCMAE)")
    g.add_argument("--shared_masks", dest="per_sample_masks", action="store_false",
                   help="one mask per micro-batch, whatever the model's recipe (default: off)")
    g.add_argument("--decoder_order", default="greenmim", choices=mim.DECODER_ORDERS,
                   help="'greenmim': each visible latent at its own unit; 'released': a random permutation of "
                        "them among the visible units, as the released code does (docs/pretraining.md)")
    g.add_argument("--decoder_depth", default=None, type=int, help="decoder blocks (default: the model's, 1)")
    g.add_argument("--drop_path", default=0.0, type=float, help="stochastic depth of the encoder")
    g = p.add_argument_group("optimization")
    g.add_argument("--batch_size", default=64, type=int,
                   help="images per GPU (process) and micro-batch; effective batch = batch_size x accum_iter x "
                        "processes")
    g.add_argument("--epochs", default=400, type=int, help="length of the schedule")
    g.add_argument("--max_steps", default=None, type=int,
                   help="stop after this many optimizer steps in all; the schedule still spans --epochs "
                        "(default: none, the whole schedule)")
    g.add_argument("--accum_iter", default=1, type=int, help="micro-batches accumulated per optimizer step")
    g.add_argument("--weight_decay", default=0.05, type=float, help="AdamW's, off for norms, biases, position tables")
    g.add_argument("--lr", default=None, type=float, help="absolute learning rate (default: blr x batch / 256)")
    g.add_argument("--blr", default=1.5e-4, type=float,
                   help="base learning rate: lr = blr x effective batch / 256 (the paper's 1.5e-4)")
    g.add_argument("--min_lr", default=0.0, type=float, help="end of the cosine schedule")
    g.add_argument("--warmup_epochs", default=None, type=float,
                   help=f"linear warm-up, per iteration (default: {WARMUP_EPOCHS}; a tenth of --epochs when --epochs "
                        f"is under {WARMUP_EPOCHS})")
    g.add_argument("--amp", default=None, choices=("bf16", "fp16", "off"),
                   help="autocast dtype (default: bf16 on CUDA, off on CPU); fp16 uses a GradScaler")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile the model: G fixed at each stage's window area and the group axis "
                        "dynamic, so fresh masks do not recompile (docs/pretraining-speed.md)")
    g.add_argument("--compile_backend", default="inductor", help="torch.compile's backend")
    g.add_argument("--cuda_graphs", action="store_true",
                   help="the default on CUDA: capture the step (forward, backward; AdamW too in one process) once "
                        "as a CUDA graph and replay it, plans padded to one capacity. fp16, --accum_iter > 1, "
                        "--fsdp and --decoder_order released run eagerly, with a line saying so "
                        "(docs/pretraining-speed.md) (default: on with CUDA, off on the CPU)")
    g.add_argument("--eager", action="store_true",
                   help="run every step eagerly on CUDA too (no CUDA graph)")
    g.add_argument("--max_skipped_steps", default=20, type=int,
                   help="stop after this many consecutive optimizer steps skipped for a non-finite loss or "
                        "gradient (each skip is counted in the progress line and log.jsonl)")
    g.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (fully_shard) instead of DDP")
    g = p.add_argument_group("data")
    g.add_argument("--data_path", default=None,
                   help="an image folder (class subfolders or images; DATA_PATH/train is used when it exists); "
                        "default: scikit-image's sample photographs")
    g.add_argument("--decode", default="auto", choices=("auto", "cpu", "gpu"),
                   help="where JPEGs are decoded and cropped: 'gpu' on the step's CUDA device (batched nvJPEG; the "
                        "workers only read bytes and draw the crops), 'cpu' in the loader workers (libjpeg-turbo); "
                        "'auto': gpu when the step runs on CUDA and torchvision decodes there, else cpu")
    g.add_argument("--num_workers", default=None, type=int, help="loader processes per rank (default: this rank's share of the CPUs less one, 1 to 32)")
    g.add_argument("--pin_mem", dest="pin_mem", action="store_true", default=True, help="pin host memory (CUDA)")
    g.add_argument("--no_pin_mem", dest="pin_mem", action="store_false")
    g.add_argument("--seed", default=0, type=int, help="weights, data order, crops and masks")
    g = p.add_argument_group("output")
    g.add_argument("--output_dir", default="./output_dir", help="checkpoints, log.jsonl, vis/ ('' saves nothing)")
    g.add_argument("--log_dir", default=None, help="TensorBoard logs, when tensorboard is installed "
                                                    "(default: output_dir)")
    g.add_argument("--save_freq", default=20, type=int,
                   help="save a milestone checkpoint every N epochs (and at the end); milestones are never pruned")
    g.add_argument("--save_every_steps", default=0, type=int,
                   help="also save a checkpoint every N optimizer steps (0: off)")
    g.add_argument("--save_every_minutes", default=10.0, type=float,
                   help="also save a checkpoint when this many minutes of training passed since the last one "
                        "(0: off); with SIGTERM/SIGUSR1 saving on preemption, a hard kill loses at most this")
    g.add_argument("--keep_last", default=2, type=int,
                   help="keep the newest K step checkpoints (--save_every_*, preemption) and delete older ones; "
                        "milestones (--save_freq) and the newest valid checkpoint are always kept (0: keep all)")
    g.add_argument("--overwrite", action="store_true",
                   help="start afresh in an --output_dir that holds checkpoints: its checkpoints and log.jsonl are "
                        "deleted first (without it such a run is refused)")
    g.add_argument("--vis_freq", default=20, type=int, help="draw reconstructions every N epochs (and at the end)")
    g.add_argument("--print_freq", default=20, type=int, help="log a line every N steps when not on a terminal")
    g.add_argument("--resume", default="",
                   help="a checkpoint to continue, or 'auto': the newest readable one in output_dir (torchrun's "
                        "elastic restarts use auto by themselves) (default: none, a fresh run)")
    g.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    g = p.add_argument_group("accepted for the released scripts (torchrun sets these through the environment)")
    g.add_argument("--start_epoch", default=0, type=int, help="ignored: resume restores the epoch")
    g.add_argument("--world_size", default=1, type=int, help="ignored: WORLD_SIZE from torchrun")
    g.add_argument("--local_rank", "--local-rank", default=-1, type=int, help="ignored: LOCAL_RANK from torchrun")
    g.add_argument("--dist_on_itp", action="store_true", help="ignored")
    g.add_argument("--dist_url", default="env://", help="ignored: torchrun's rendezvous")
    return p


def validate(args) -> None:
    """Refuses arguments that cannot work, with the reason (UsageError)."""
    if args.model not in mim.model_names():
        names = mim.closest_model_names(args.model)
        raise UsageError(f"unknown --model {args.model!r}; closest: {', '.join(names)} "
                         f"(all: python -m greenmim.pretrain --help)")
    args.notes = []
    _recipe_defaults(args)
    if not 0.0 < args.mask_ratio < 1.0:
        raise UsageError(f"--mask_ratio must be strictly between 0 and 1, got {args.mask_ratio} (0 leaves nothing "
                         f"to reconstruct, 1 nothing to see)")
    for name in ("batch_size", "epochs", "accum_iter", "save_freq", "vis_freq", "print_freq", "max_skipped_steps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError(f"--max_steps must be >= 1, got {args.max_steps}")
    if args.num_workers is not None and args.num_workers < 0:
        raise UsageError(f"--num_workers must be >= 0, got {args.num_workers}")
    for name in ("save_every_steps", "save_every_minutes", "keep_last"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name} must be >= 0 (0: off), got {getattr(args, name)}")
    if args.warmup_epochs is None:                 # a default adapts; only a value the user set is refused
        args.warmup_epochs = float(WARMUP_EPOCHS)
        if args.warmup_epochs > args.epochs:
            args.warmup_epochs = args.epochs / 10
            args.notes.append(f"note: the default warm-up ({WARMUP_EPOCHS} epochs) is longer than --epochs "
                              f"{args.epochs}: warming up over {args.warmup_epochs:g} epochs instead (a tenth, as "
                              f"the released 40 of 400); --warmup_epochs sets it")
    if args.warmup_epochs < 0 or args.warmup_epochs > args.epochs:
        raise UsageError(f"--warmup_epochs must be in [0, --epochs={args.epochs}], got {args.warmup_epochs:g}")
    if args.lr is not None and args.lr <= 0 or args.blr <= 0:
        raise UsageError("--lr and --blr must be > 0")
    if args.data_path is not None and os.path.isfile(args.data_path):
        raise UsageError(f"--data_path {args.data_path} is a file: give the folder that holds the images (class "
                         f"subfolders, or the images themselves)")
    if args.data_path is not None and not os.path.isdir(args.data_path):
        raise UsageError(f"--data_path {args.data_path}: no such folder")
    if args.output_dir:
        _check_creatable(args.output_dir)
    if args.resume not in ("", "auto") and not os.path.isfile(args.resume):
        raise UsageError(f"--resume {args.resume}: no such file")
    if args.cuda_graphs and args.eager:
        raise UsageError("--cuda_graphs and --eager contradict each other: give one")
    if args.resume == "auto" and not args.output_dir:
        raise UsageError("--resume auto looks in --output_dir, which is empty")


def _recipe_defaults(args) -> None:
    """The model's recipe (mim.recipe) fills --mask_ratio and --per_sample_masks where the user
    gave none; a header line says so where it departs from the trainer's GreenMIM defaults."""
    r = mim.recipe(args.model)
    took = []
    if args.mask_ratio is None:
        args.mask_ratio = r["mask_ratio"]
        took.append(f"mask ratio {args.mask_ratio:g}")
    if args.per_sample_masks is None:
        args.per_sample_masks = r["per_sample_masks"]
        took.append("one mask per image" if args.per_sample_masks else "one mask per micro-batch")
    if took and r != mim.RECIPES["green_mim"]:
        args.notes.append(f"note: {args.model}'s recipe: {', '.join(took)} (--mask_ratio, --per_sample_masks / "
                          f"--shared_masks set them)")
    if args.model in mim.FCMAE_ARCHS:
        for flag, bad, why in (("--window_size", args.window_size is not None,
                                "ConvNeXt V2 has no windows (7x7 depthwise convolutions)"),
                               ("--decoder_order released", args.decoder_order == "released",
                                "its dense decoder keeps each latent at its own unit")):
            if bad:
                raise UsageError(f"{flag} does not apply to {args.model}: {why}")


def _check_creatable(path: str) -> None:
    """That ``path`` is a folder or can be made one, without making it: its nearest existing
    ancestor must be a writable folder."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError(f"--output_dir {path} is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"--output_dir {path}: no permission to write there")
        return
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--output_dir {path} cannot be created: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--output_dir {path} cannot be created: no permission to write in {parent}")
