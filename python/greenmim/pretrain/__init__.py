"""GreenMIM pretraining from one command: ``python -m greenmim.pretrain`` (or ``greenmim-pretrain``).

The paper's model (:class:`greenmim.GreenMIM`) and the released recipe (AdamW, per-iteration
warm-up and cosine, norm_pix_loss, 32 px mask units at ratio 0.75), under torchrun with DDP or
FSDP2, with per-sample masks, bf16 or fp16 autocast, torch.compile, the step captured as a CUDA
graph by default on CUDA, exact resume and atomic checkpoints, and runs that survive preemption
signals, requeues, elastic restarts, torn checkpoints and non-finite steps (checkpoints.py,
signals.py, books.py). docs/pretraining.md describes every flag.
"""
from .cli import main

__all__ = ["main"]
