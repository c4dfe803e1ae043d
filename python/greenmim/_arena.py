"""Plans whose index arrays are int32 views of one tensor (the arena) described by a picklable
layout: :class:`greenmim.MaskPlan` (Swin) and :class:`greenmim.TwinsPlan` (Twins).

Moving such a plan to a device, pinning it (a DataLoader does) or sending it to another process
(pickling, as DataLoader workers do) moves that one tensor; the subclass rebuilds its views from
``(arena, layout)``.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Callable, Dict, Iterable, Sequence, Tuple

import torch
from torch import Tensor

from . import _lib

Range = Tuple[int, int]   # (offset, size) in int32 entries


def arena_views(arena: Tensor, ranges: Iterable[Range]) -> Callable[[Range], Tensor]:
    """``view(r)``: range ``r`` of the arena as a view (an empty range: an empty one). Eagerly all
    non-empty ranges come from one ``split`` (ranges tile the arena in order). Under torch.compile
    each is a slice: a plan passed straight into a compiled model has its views made inside the
    graph, where dynamo makes the layout's sizes symbolic from the second plan on and cannot sort
    them ("sort with non-constant keys")."""
    if torch.compiler.is_compiling():
        return lambda r: arena.narrow(0, r[0], r[1])
    rs = sorted({r for r in ranges if r[1] > 0})
    chunks = dict(zip(rs, arena.split([r[1] for r in rs]))) if rs else {}
    empty = arena[:0]
    return lambda r: chunks.get(r, empty)


class ArenaPlan:
    """Base of the arena plans: ``arena`` and ``layout`` (plain Python data), and ``stages``,
    each with ``partitions`` (the attention partitions whose slot axis a new mask changes).

    ``stages`` (the views of the arena and the objects around them) is made on first use: a
    plan made in a DataLoader worker is pickled as ``(arena, layout)`` without ever using them,
    and the copies the main process makes (unpickled, pinned, moved to the device) use them at most
    once. Making them cost about 150 us per Swin plan of 128 masks, each time."""

    def __init__(self, arena: Tensor, layout: tuple):
        self.arena = arena
        self.layout = layout
        self._stages = None

    @property
    def stages(self) -> list:
        if self._stages is None:
            self._stages = self._build_stages()
        return self._stages

    @property
    def patch_index(self) -> Tensor:
        """The visible patches in the plan's token order (stage 1's positions): row-major per
        sample for Swin's plans, block-major for Twins' (twins_plan.hpp)."""
        return self.stages[0].position

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
        """Marks the slot axis of every partition, and the buffer they all view, dynamic for
        torch.compile (call it on each step's plan, after :meth:`to`). With fixed group sizes
        (``group_size=-1``: each stage's window area) those lengths are the only thing masks
        change: one graph serves every mask."""
        torch._dynamo.mark_dynamic(self.arena, 0)   # the buffer the views share: its length follows the groups
        for st in self.stages:
            for p in st.partitions:
                for t in (p.gather, p.slot_window, p.slot_coord):
                    torch._dynamo.mark_dynamic(t, 0)
        return self

    # ---- one set of shapes for every mask: what a CUDA graph replays ------------------------------
    # A subclass describes its layout: _ranges(layout) every array's (offset, size),
    # _partitions(layout) per stage its partitions' layout tuples (G, num_groups, ..., the budget
    # flag at [5], arrays at [9]: gather, scatter, slot_window, slot_coord), _relayout(layout, counts,
    # new, exhausted=None) the layout with those group counts, each range r moved to new(r) and,
    # unless None, every budget flag set to exhausted.

    def group_counts(self) -> Tuple[Tuple[int, ...], ...]:
        """The number of groups of each stage's partitions (Swin: plain, shifted; Twins: its
        LSA windows). With fixed group sizes (``group_size=-1``) it is what a new mask changes
        in the plan's shapes."""
        return tuple(tuple(p[1] for p in parts) for parts in self._partitions(self.layout))

    def padded(self, counts: Sequence[Sequence[int]]):
        """This plan with exactly ``counts[s]`` groups in stage s's partitions. Groups of
        padding slots only are appended (gather and slot_window -1, slot_coord 0), which is the
        layout every op already skips, so outputs and gradients are the plan's own. Plans
        padded to one capacity share every shape and view: what replaying a CUDA graph needs
        (:func:`greenmim.group_capacity`). Raises :class:`GreenmimError` where the plan already
        has more groups than asked: an overflow, which the caller handles (a larger capacity, or
        a step without the graph). One copy of the arena, on the plan's device."""
        have = self.group_counts()
        try:
            want = tuple(tuple(int(c) for c in w) for w in counts)
        except (TypeError, ValueError):
            raise _lib.GreenmimError(f"greenmim: padded: counts must be one tuple of group counts per stage, got "
                                     f"{counts!r}")
        if len(want) != len(have) or any(len(w) != len(h) for w, h in zip(want, have)):
            raise _lib.GreenmimError(f"greenmim: padded: counts {want} do not match the plan's partitions {have} "
                                     f"(pairs for a plan of {len(have)} stages)")
        names = ("plain", "shifted") if all(len(h) == 2 for h in have) else ("LSA",)
        for s, (w, h) in enumerate(zip(want, have)):
            for j in range(len(h)):
                if w[j] < h[j]:
                    raise _lib.GreenmimError(f"greenmim: padded: stage {s + 1}'s {names[j]} windows take {h[j]} "
                                             f"groups, more than the {w[j]} asked (an overflow: raise the capacity, "
                                             f"or run this mask unpadded)")
            parts = self._partitions(self.layout)[s]
            if len(parts) == 2 and parts[1] == parts[0] and w[0] != w[1]:
                raise _lib.GreenmimError(f"greenmim: padded: stage {s + 1} has one partition (no shift): its plain "
                                         f"and shifted counts must agree, got {w}")
        if want == have:
            return self
        grow: Dict[Range, Tuple[int, int]] = {}      # range -> (entries after padding, fill value)
        for parts, w in zip(self._partitions(self.layout), want):
            for p, n in zip(parts, w):
                g, _, sw, co = p[9]
                for r, fill in ((g, -1), (sw, -1), (co, 0)):
                    grow[r] = (n * p[0], fill)
        ranges = sorted({r for r in self._ranges(self.layout) if r[1] > 0})
        view = arena_views(self.arena, ranges)
        pieces, moved, at = [], {}, 0
        for r in ranges:
            size, fill = grow.get(r, (r[1], 0))
            pieces.append(view(r))
            if size > r[1]:
                pieces.append(torch.full((size - r[1],), fill, dtype=self.arena.dtype, device=self.arena.device))
            moved[r] = (at, size)
            at += size
        return type(self)(torch.cat(pieces), self._relayout(self.layout, want, lambda r: moved.get(r, r)))

    def shape_key(self) -> tuple:
        """What fixes every shape and view of the plan: its layout without the planner's timings,
        costs (the layout's floats) and budget flags. Plans with equal keys are interchangeable
        under a CUDA graph."""
        def strip(x):
            return tuple(strip(v) for v in x if not isinstance(v, float)) if isinstance(x, tuple) else x
        layout = self._relayout(self.layout, self.group_counts(), lambda r: r, exhausted=False)
        return (type(self).__name__, self.arena.numel(), strip(layout))

    def copy_(self, other, non_blocking: bool = False):
        """Copies ``other``'s indices into this plan's arena, in place (one copy, on the stream of
        this plan's device): a CUDA graph captured with this plan then runs on ``other``'s mask.
        ``other`` must have this plan's :meth:`shape_key` (plans padded to one capacity do)."""
        if other.shape_key() != self.shape_key():
            raise _lib.GreenmimError(f"greenmim: copy_: the plans differ in shape ({other.group_counts()} groups and "
                                     f"{other.arena.numel()} arena entries into {self.group_counts()} and "
                                     f"{self.arena.numel()}): pad both to one capacity (padded)")
        self.arena.copy_(other.arena, non_blocking=non_blocking)
        from . import _cpu_attention
        for st in self._stages or ():          # what was derived from the old indices
            for p in st.partitions:
                p._token_window = None
                _cpu_attention.forget(p)
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
