"""Entry point: parse, validate, run; bad input is one line on stderr and exit code 2."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from .._lib import GreenmimError
from . import dist
from .args import UsageError, parser, validate
from .data import DataError


def _resume_hint(args) -> str:
    """What an interrupted run leaves to resume from: the newest checkpoint, or that there is none yet."""
    if not args.output_dir:
        return "nothing was saved (--output_dir '')"
    from .state import latest
    newest = latest(args.output_dir)
    if newest is None:
        return (f"no checkpoint in {args.output_dir} yet (one is written every --save_freq {args.save_freq} "
                f"epochs and at the end), so nothing to resume")
    return f"{newest} is the newest checkpoint; --resume auto continues from it"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        validate(args)
        ctx = dist.setup(args.device, args.fsdp)
    except (UsageError, RuntimeError) as e:
        print(f"greenmim.pretrain: error: {e}", file=sys.stderr)
        return 2
    from . import engine
    try:
        summary = engine.run(args, ctx)
    except (UsageError, DataError, GreenmimError) as e:
        if ctx.main:
            print(f"greenmim.pretrain: error: {e}", file=sys.stderr)
        return 2
    except engine.LossNotFinite as e:
        if ctx.main:
            print(f"greenmim.pretrain: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # Ctrl-C: one line, not a traceback; checkpoints are whole (atomic renames)
        if ctx.main:
            print(f"\ngreenmim.pretrain: interrupted; {_resume_hint(args)}", file=sys.stderr)
        return 130
    finally:
        dist.teardown(ctx)
    if ctx.main:
        print(f"greenmim.pretrain: done: {summary['steps']} steps, last loss {summary['loss']:.4f}"
              + (f", held-out loss {summary['held_out_loss']:.4f}" if "held_out_loss" in summary else "")
              + (f"; checkpoint {summary['checkpoint']}" if summary["checkpoint"] else ""), flush=True)
    return 0
