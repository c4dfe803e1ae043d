"""Plans whose index arrays are int32 views of one tensor (the arena) described by a picklable
layout: :class:`greenmim.MaskPlan` (Swin) and :class:`greenmim.TwinsPlan` (Twins).

Moving such a plan to a device, pinning it (a DataLoader does) or sending it to another process
(pickling, as DataLoader workers do) moves that one tensor; the subclass rebuilds its views from
``(arena, layout)``.
"""
from __future__ import annotations

from typing import Dict, Iterable, Tuple

import torch
from torch import Tensor

Range = Tuple[int, int]   # (offset, size) in int32 entries


def arena_views(arena: Tensor, ranges: Iterable[Range]) -> Dict[Range, Tensor]:
    """Every non-empty range of the arena as a view, from one ``split`` (ranges tile the arena
    in order; empty ones map to nothing: look them up with ``.get(r, arena[:0])``)."""
    rs = sorted({r for r in ranges if r[1] > 0})
    return dict(zip(rs, arena.split([r[1] for r in rs]))) if rs else {}


class ArenaPlan:
    """Base of the arena plans: ``arena`` and ``layout`` (plain Python data), and ``stages``,
    each with ``partitions`` (the attention partitions whose slot axis a new mask changes)."""

    def __init__(self, arena: Tensor, layout: tuple):
        self.arena = arena
        self.layout = layout

    @property
    def device(self) -> torch.device:
        return self.arena.device

    def to(self, device, non_blocking: bool = False):
        """This plan on ``device`` (one copy of the arena; ``self`` when it is already there)."""
        device = torch.device(device)
        if device == self.arena.device:
            return self
        return type(self)(self.arena.to(device, non_blocking=non_blocking), self.layout)

    def mark_dynamic(self):
        """Marks the slot axis of every partition dynamic for torch.compile (call it on each step's
        plan, after :meth:`to`). With fixed group sizes (``group_size=-1``: each stage's window
        area) that axis is the only thing masks change: one graph serves every mask."""
        for st in self.stages:
            for p in st.partitions:
                for t in (p.gather, p.slot_window, p.slot_coord):
                    torch._dynamo.mark_dynamic(t, 0)
        return self

    def pin_memory(self, device=None):
        return type(self)(self.arena.pin_memory() if device is None else self.arena.pin_memory(device), self.layout)

    def __reduce__(self):
        return (type(self), (self.arena, self.layout))
