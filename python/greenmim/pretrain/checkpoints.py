"""The checkpoints of an ``--output_dir``: which exist, which can be read, which a run resumes
from, which are pruned, and what is refused before the model is built.

- ``checkpoint-<epoch>.pth`` is a milestone (``--save_freq``, the end of the schedule), kept for
  good. ``checkpoint-<epoch>-step<step>.pth`` is a step checkpoint (``--save_every_steps``,
  ``--save_every_minutes``, a preemption, ``--max_steps`` inside an epoch); ``--keep_last K``
  keeps the newest K of them.
- A checkpoint is written to ``<name>.tmp-<pid>`` and renamed (state.save). A kill -9 during a
  save leaves the temporary file; the next start removes it, and says so.
- ``--resume auto`` takes the checkpoint with the most steps that reads whole and holds finite
  weights. Each one it skips gets a warning that names the file and the reason.
- A fresh run in a folder that holds checkpoints is refused: a requeued job that lacks
  ``--resume auto`` would otherwise write over a finished run.
"""
from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from .args import UsageError

_NAME = re.compile(r"checkpoint-(\d+)(?:-step(\d+))?\.pth")
_TMP = re.compile(r"checkpoint-\d+(?:-step\d+)?\.pth\.tmp-(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is the reason."""


def paths(output_dir: str) -> List[str]:
    """The checkpoint files of ``output_dir`` (by name: temporary files and others left out)."""
    if not output_dir or not os.path.isdir(output_dir):
        return []
    return sorted(p for p in glob.glob(os.path.join(glob.escape(output_dir), "checkpoint-*.pth"))
                  if _NAME.fullmatch(os.path.basename(p)))


def is_milestone(path: str) -> bool:
    m = _NAME.fullmatch(os.path.basename(path))
    return m is not None and m.group(2) is None


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _check(obj, path: str) -> dict:
    if not isinstance(obj, dict) or "model" not in obj or "step" not in obj:
        raise CheckpointError("not a greenmim.pretrain training checkpoint (no 'model' and 'step' entries)")
    return obj


def probe(path: str) -> dict:
    """The checkpoint's entries, memory-mapped (cheap: tensors are not read). Catches a truncated
    file (its zip directory is at the end) and a foreign one; ``read`` checks the weights."""
    try:
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any failure to read is the reason given
        raise CheckpointError(f"unreadable ({_reason(e)})") from None
    return _check(obj, path)


def read(path: str) -> dict:
    """The whole checkpoint, read and checked: a training checkpoint whose weights are all finite."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"unreadable ({_reason(e)})") from None
    _check(obj, path)
    bad = [k for k, v in obj["model"].items()
           if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"non-finite weights in {len(bad)} tensor(s), e.g. {bad[0]}")
    return obj


def candidates(output_dir: str, warn: Optional[Callable[[str], None]] = None) -> List[Tuple[int, str]]:
    """(step, path) of the checkpoints whose header reads, most steps first; ``warn`` hears of
    the others."""
    found = []
    for p in paths(output_dir):
        try:
            found.append((int(probe(p)["step"]), p))
        except (CheckpointError, ValueError, TypeError) as e:
            if warn:
                warn(f"--resume auto: skipping {p}: {e}")
    return sorted(found, key=lambda sp: (-sp[0], is_milestone(sp[1])))


def newest_valid(output_dir: str, warn: Callable[[str], None]) -> Tuple[Optional[str], Optional[dict]]:
    """The checkpoint with the most steps that reads whole with finite weights, and its contents."""
    for _, p in candidates(output_dir, warn):
        try:
            return p, read(p)
        except CheckpointError as e:
            warn(f"--resume auto: skipping {p}: {e}")
    return None, None


def remove_stale_temporaries(output_dir: str) -> List[str]:
    """Removes ``checkpoint-*.pth.tmp-<pid>`` files whose writer is gone (a save cut short by
    kill -9); returns their paths. A file whose process still runs on this machine is left."""
    removed = []
    if not output_dir or not os.path.isdir(output_dir):
        return removed
    for p in glob.glob(os.path.join(glob.escape(output_dir), "checkpoint-*.pth.tmp-*")):
        m = _TMP.fullmatch(os.path.basename(p))
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            os.remove(p)
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prune(output_dir: str, keep_last: int, newest: str) -> List[str]:
    """Deletes step checkpoints beyond the newest ``keep_last`` (``newest``, just written and read
    back, counts as one when it is a step checkpoint); milestones and ``newest`` are never
    deleted. Returns what went."""
    if keep_last <= 0:
        return []
    steps = []
    for p in paths(output_dir):
        m = _NAME.fullmatch(os.path.basename(p))
        if m.group(2) is not None and os.path.abspath(p) != os.path.abspath(newest):
            steps.append((int(m.group(2)), p))
    steps.sort(reverse=True)
    gone = []
    for _, p in steps[keep_last - (0 if is_milestone(newest) else 1):]:
        try:
            os.remove(p)
            gone.append(p)
        except FileNotFoundError:
            pass
    return gone


@dataclass
class Resume:
    """What preflight found: the checkpoint to continue (None: a fresh run) and its contents."""
    path: Optional[str] = None
    obj: Optional[dict] = None
    why: str = ""

    @property
    def step(self) -> int:
        return int(self.obj["step"]) if self.obj is not None else 0


def _step_of(path: str) -> int:
    try:
        return int(probe(path)["step"])
    except (CheckpointError, ValueError, TypeError):
        return -1


def restart_count() -> int:
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def preflight(args, main: bool, say: Callable[[str], None] = None) -> Resume:
    """Before the model is built, on every rank: removes stale temporary files (rank 0), refuses
    a fresh run over checkpoints, finds and reads the checkpoint to resume (UsageError for one
    that cannot be used), and refuses a run with nothing left to do."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    warn = say if main else (lambda line: None)
    out = args.output_dir
    if main:
        for p in remove_stale_temporaries(out):
            say(f"greenmim.pretrain: removed {p}, a checkpoint whose save was cut short (its process is gone)")
    existing = paths(out)
    restarts = restart_count()
    resume = Resume()
    if restarts > 0 and out:                         # torchrun --max_restarts: continue where the workers died
        path, obj = newest_valid(out, warn)
        given = args.resume not in ("", "auto")
        if path is not None and (not given or int(obj["step"]) >= _step_of(args.resume)):
            return _nothing_left(args, Resume(path, obj, f"elastic restart {restarts}: resuming from the newest "
                                                          f"checkpoint"))
        if not given:
            return Resume(why=f"elastic restart {restarts}: no checkpoint yet, starting afresh")
    if args.resume == "" and existing:
        if not args.overwrite:
            raise UsageError(f"--output_dir {out} holds {len(existing)} checkpoint(s) (e.g. "
                             f"{os.path.basename(existing[-1])}) of an earlier run: continue it with --resume auto, "
                             f"or start afresh over it with --overwrite (which deletes them)")
        if main:
            for p in existing:
                os.remove(p)
            log = os.path.join(out, "log.jsonl")
            if os.path.exists(log):
                os.remove(log)
            say(f"greenmim.pretrain: --overwrite: deleted {len(existing)} checkpoint(s) and log.jsonl of {out}")
        return resume
    if args.resume == "auto":
        path, obj = newest_valid(out, warn)
        if path is None:
            return Resume(why=f"--resume auto: no checkpoint in {out}, starting afresh")
        return _nothing_left(args, Resume(path, obj))
    if args.resume:
        try:
            obj = read(args.resume)
        except CheckpointError as e:
            raise UsageError(f"--resume {args.resume}: {e}") from None
        return _nothing_left(args, Resume(args.resume, obj))
    return resume


def _nothing_left(args, r: Resume) -> Resume:
    meta = r.obj.get("meta", {}) if isinstance(r.obj.get("meta"), dict) else {}
    spe = meta.get("steps_per_epoch")
    end = args.max_steps
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if spe and meta.get("global_batch") == args.batch_size * args.accum_iter * world:
        end = min(end, args.epochs * spe) if end else args.epochs * spe
    if end is not None and r.step >= end:
        what = f"--max_steps {args.max_steps}" if args.max_steps == end else f"--epochs {args.epochs}"
        raise UsageError(f"nothing to do: the checkpoint {r.path} is at step {r.step}, and {what} ends at step {end} "
                         f"(raise {what.split()[0]} to train further)")
    return r
