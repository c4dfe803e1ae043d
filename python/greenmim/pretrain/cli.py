"""Entry point: parse, validate, run; bad input is one line on stderr and exit code 2."""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from .._lib import GreenmimError
from . import checkpoints, dist, state
from .args import UsageError, parser, validate
from .data import DataError


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:               # --help (0) or a usage error, already printed in one line (2)
        return int(e.code or 0)
    main_rank = int(os.environ.get("RANK", "0") or 0) == 0
    try:
        validate(args)
        resume = checkpoints.preflight(args, main_rank)    # before the model is built
        ctx = dist.setup(args.device, args.fsdp)
    except (UsageError, RuntimeError) as e:
        if main_rank:
            print(f"greenmim.pretrain: error: {e}", file=sys.stderr)
        return 2
    from . import engine
    try:
        summary = engine.run(args, ctx, resume)
    except (UsageError, DataError, GreenmimError) as e:
        if ctx.main:
            print(f"greenmim.pretrain: error: {e}", file=sys.stderr)
        return 2
    except engine.Stopped as e:           # a preemption (after its save), or too many non-finite steps
        if ctx.main:
            print(e.line, file=sys.stderr, flush=True)
        return e.code
    except KeyboardInterrupt:   # Ctrl-C: one line, not a traceback; checkpoints are whole (atomic renames)
        if ctx.main:
            print(f"\ngreenmim.pretrain: interrupted; {state.resume_hint(args.output_dir)}", file=sys.stderr)
        return 130
    finally:
        dist.teardown(ctx)
    if ctx.main:
        print(f"greenmim.pretrain: done: {summary['steps']} steps, last loss {summary['loss']:.4f}"
              + (f", {summary['skipped']} skipped (non-finite)" if summary.get("skipped") else "")
              + (f", {summary['graph_overflows']} of them eager beside the CUDA graph"
                 if summary.get("graph_overflows") else "")
              + (f", held-out loss {summary['held_out_loss']:.4f}" if "held_out_loss" in summary else "")
              + (f"; checkpoint {summary['checkpoint']}" if summary["checkpoint"] else ""), flush=True)
    return 0
