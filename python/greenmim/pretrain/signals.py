"""Preemption: SIGTERM (what Slurm and Kubernetes send before they kill a job), SIGUSR1
(``sbatch --signal=B:USR1@120``, or ``--signal=USR1@120`` for every task) and SIGINT (Ctrl-C).

The handler only records the signal. The training loop finishes the step it is in; at the
next point where the ranks exchange their losses, they also exchange the flag (one all-reduce
that they make anyway), so every rank stops after the same step. The loop then writes a step
checkpoint, prints one line naming it and ``--resume auto``, and the process exits with the
signal's conventional code, 128 + its number (143, 138, 130).

A second Ctrl-C stops at once (KeyboardInterrupt): checkpoints are renamed into place, so none
is ever torn. The loader's worker processes ignore these signals: Slurm signals the whole
process group, and a worker that died of it would fail the step the main process is finishing;
they end when the main process closes the loader.
"""
from __future__ import annotations

import signal
import threading
from typing import Callable, Optional

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None), signal.SIGINT)
                if s is not None)


def exit_code(signum: int) -> int:
    return 128 + int(signum)


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Preemption:
    """``with Preemption() as p:`` ... ``p.signum`` is the first signal received (0: none)."""

    def __init__(self):
        self.signum = 0
        self._old = {}

    def _handler(self, signum, frame) -> None:
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt      # a second Ctrl-C: stop now
        if not self.signum:
            self.signum = signum

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


def _ignore_and_init(prev: Optional[Callable[[int], None]], worker_id: int) -> None:
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if prev is not None:
        prev(worker_id)


def shield_workers(loader) -> None:
    """Makes ``loader``'s worker processes ignore the preemption signals (keeping its own
    ``worker_init_fn``)."""
    import functools
    loader.worker_init_fn = functools.partial(_ignore_and_init, loader.worker_init_fn)
