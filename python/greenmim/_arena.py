"""Plans whose index arrays are int32 views of one tensor (the arena) described by a picklable
layout: :class:`greenmim.MaskPlan` (Swin) and :class:`greenmim.TwinsPlan` (Twins).

Moving such a plan to a device, pinning it (a DataLoader does) or sending it to another process
(pickling, as DataLoader workers do) moves that one tensor; the subclass rebuilds its views from
``(arena, layout)``.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Dict, Iterable, Tuple

import torch
from torch import Tensor

from . import _lib

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


class _Planner:
    """A library planner (``gmh_<kind>_planner_*``), kept per thread: it reuses its scratch."""

    def __init__(self, kind: str):
        self.lib, self.kind = _lib.host(), kind
        self.handle = ctypes.c_void_p()
        _lib.host_check(getattr(self.lib, f"gmh_{kind}_planner_create")(ctypes.byref(self.handle)), f"{kind} plan")

    def __del__(self):
        if getattr(self, "handle", None):
            getattr(self.lib, f"gmh_{self.kind}_planner_destroy")(self.handle)


_planners = threading.local()


def plan_arena(kind: str, args, info, what: str) -> Tensor:
    """One plan in two library calls on this thread's ``kind`` planner ("encoder", "twins"):
    ``gmh_<kind>_plan_prepare(args) -> info`` lays it out, ``gmh_<kind>_plan_write`` fills a
    fresh int32 arena of ``info.arena_size`` entries, which is returned."""
    planner = getattr(_planners, kind, None)
    if planner is None:
        planner = _Planner(kind)
        setattr(_planners, kind, planner)
    lib = planner.lib
    _lib.host_check(getattr(lib, f"gmh_{kind}_plan_prepare")(planner.handle, ctypes.byref(args), ctypes.byref(info)),
                    what)
    arena = torch.empty(info.arena_size, dtype=torch.int32)
    _lib.host_check(getattr(lib, f"gmh_{kind}_plan_write")(planner.handle, arena.data_ptr()), what)
    return arena
