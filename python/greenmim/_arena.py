"""Plans whose index arrays are int32 views of one tensor (the arena) described by a picklable
layout: :class:`greenmim.MaskPlan` (Swin) and :class:`greenmim.TwinsPlan` (Twins).

Moving such a plan to a device, pinning it (a DataLoader does) or sending it to another process
(pickling, as DataLoader workers do) moves that one tensor; the subclass rebuilds its views from
``(arena, layout)``.

The layout is a tree of named records (:class:`Record`): a :class:`PlanLayout` whose stages are
the plan's stage records, each with its :class:`PartitionLayout` s and the ranges of its other
arrays. They are read from the library's info struct by field name (:class:`StructReader`), so
the load-time check of that struct's layout (``_lib.check_layouts``) covers every number read.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _lib

Range = Tuple[int, int]   # (offset, size) in int32 entries: a plain pair, the layout's leaves


class Record(tuple):
    """A named, immutable record that is a tuple: fields by name (``part.num_groups``), and a
    tuple's equality, hashing and pickling. Unlike a NamedTuple it has no Python ``__new__`` or
    ``__getnewargs__``, so it pickles and unpickles in C, nearly as cheaply as a plain tuple: a
    plan's layout crosses from every DataLoader worker. Subclasses declare ``_fields`` and
    ``__slots__ = ()``; make one with :meth:`of` (by name) or :meth:`_replace`."""
    __slots__ = ()
    _fields: Tuple[str, ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "__slots__" not in cls.__dict__:
            raise TypeError(f"{cls.__name__}: a Record declares __slots__ = () (no per-instance dict)")
        for i, f in enumerate(cls.__dict__.get("_fields", ())):    # plain functions: dynamo traces them
            setattr(cls, f, property(eval(f"lambda self: self[{i}]"), doc=f"field {i} of {cls.__name__}"))

    @classmethod
    def of(cls, **fields):
        if fields.keys() != set(cls._fields):
            raise TypeError(f"{cls.__name__}: fields {sorted(set(cls._fields) ^ fields.keys())} missing or unknown")
        return tuple.__new__(cls, [fields[f] for f in cls._fields])

    def _replace(self, **fields):
        out = tuple.__new__(type(self), [fields.pop(f, v) for f, v in zip(self._fields, self)])
        if fields:
            raise TypeError(f"{type(self).__name__}: unknown fields {sorted(fields)}")
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f}={v!r}' for f, v in zip(self._fields, self))})"


PARTITION_ARRAYS = ("gather", "scatter", "slot_window", "slot_coord")   # as gmh_plan_partition's ranges


class PartitionLayout(Record):
    """One attention partition of a plan (gmh_plan_partition): its planner results and the
    ranges of its arrays (``arrays``: one per :data:`PARTITION_ARRAYS`, in that order)."""
    __slots__ = ()
    _fields = ("group_size", "num_groups", "num_windows", "window", "shift", "budget_exhausted", "cost",
               "lower_bound", "plan_us", "arrays")


class StageLayout(Record):
    """Base of a plan's stage records: its partitions (:meth:`partition_layouts`) and the
    ranges of its other arrays (the fields named in ``_range_fields``)."""
    __slots__ = ()
    _range_fields: Tuple[str, ...] = ()
    _range_index: Tuple[int, ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls._range_fields:
            cls._range_index = tuple(cls._fields.index(f) for f in cls._range_fields)

    def partition_layouts(self) -> Tuple[PartitionLayout, ...]:
        raise NotImplementedError

    def with_partition_layouts(self, parts: Tuple[PartitionLayout, ...]) -> "StageLayout":
        raise NotImplementedError

    def ranges(self) -> List[Range]:
        """Every array's (offset, size): the partitions', then the stage's own."""
        out = [r for p in self.partition_layouts() for r in p.arrays]
        out += [self[i] for i in self._range_index]
        return out


class PlanLayout(Record):
    """A whole plan's layout: whether masks are per sample, how many, the patch grid, the
    library's time, and one stage record per stage."""
    __slots__ = ()
    _fields = ("per_sample", "num_masks", "patch_grid", "build_us", "stages")


class StructReader:
    """Reads a ctypes structure's scalars by field path, all in one ``struct.unpack_from``: the
    format and every offset come from the ctypes class (so from the C layout the library's load
    checks), not from counting. ``getter(prefix, names)`` is a C ``itemgetter`` over the unpacked
    values, yielding ``prefix + (name,)`` for each name (a name may be a path tuple)."""

    _CODES = {ctypes.c_int32: "i", ctypes.c_int64: "q", ctypes.c_double: "d"}

    def __init__(self, cls):
        paths: list = []
        fmt, _ = self._walk(cls, 0, 0, (), paths)
        self.struct = struct.Struct("=" + fmt)
        self.index = {p: i for i, p in enumerate(paths)}
        self._ends: Dict[int, int] = {}

    @classmethod
    def _walk(cls, typ, base: int, at: int, prefix: tuple, paths: list) -> Tuple[str, int]:
        fmt = ""
        for name, ftyp in typ._fields_:
            off = base + getattr(typ, name).offset
            array = issubclass(ftyp, ctypes.Array)
            elem, count = (ftyp._type_, ftyp._length_) if array else (ftyp, 1)
            for i in range(count):
                o, path = off + i * ctypes.sizeof(elem), prefix + ((name, i) if array else (name,))
                if issubclass(elem, ctypes.Structure):
                    f, at = cls._walk(elem, o, at, path, paths)
                    fmt += f
                elif elem in cls._CODES:
                    fmt += "x" * (o - at) + cls._CODES[elem]
                    at = o + ctypes.sizeof(elem)
                    paths.append(path)
                else:   # pointers and the like: not layout data
                    fmt += "x" * (o - at + ctypes.sizeof(elem))
                    at = o + ctypes.sizeof(elem)
        return fmt, at

    def read(self, info, stages: Optional[int] = None) -> tuple:
        """The values, up to the last of the first ``stages`` entries of a ``stage`` array
        (all when None; its head comes first)."""
        v = self.struct.unpack_from(info)
        if stages is None:
            return v
        end = self._ends.get(stages)
        if end is None:
            head = max(i for p, i in self.index.items() if p[0] != "stage") + 1
            end = self._ends[stages] = max([head] + [i + 1 for p, i in self.index.items()
                                                     if p[0] == "stage" and p[1] < stages])
        return v[:end]

    def at(self, *path) -> str:
        """The source of the value at a field path, for :meth:`compile` (``v[i]``)."""
        return f"v[{self.index[path]}]"

    def partition(self, *prefix) -> str:
        """The source of the :class:`PartitionLayout` of the gmh_plan_partition at ``prefix``."""
        scalars = [self.at(*prefix, f) for f in PartitionLayout._fields[:-1]]
        return f"_new(PartitionLayout, ({', '.join(scalars)}, {self.ranges(*prefix, names=PARTITION_ARRAYS)}))"

    def ranges(self, *prefix, names: Sequence[str]) -> str:
        """The source of the (offset, size) pairs of the gmh_range fields ``names`` at ``prefix``."""
        pairs = [f"({self.at(*prefix, n, 'offset')}, {self.at(*prefix, n, 'size')})" for n in names]
        return f"({', '.join(pairs)},)"

    @staticmethod
    def compile(source: str, **names) -> Callable:
        """``lambda per_sample, patch_grid, extra, v: <source>``, compiled once: a parse is then
        one expression of constant subscripts (about 5 us for a 4-stage plan, as cheap as the
        tuple unpacking it replaces), while every index came from a field name."""
        scope = dict(_new=tuple.__new__, PartitionLayout=PartitionLayout, PlanLayout=PlanLayout, **names)
        return eval(f"lambda per_sample, patch_grid, extra, v: {source}", scope)


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

    def __init__(self, arena: Tensor, layout: Optional[PlanLayout] = None, wire: Optional[tuple] = None):
        """``layout``, or ``wire``: ``(per_sample, patch_grid, extra, values)``, the info struct's
        unpacked values up to the last stage (what a plan pickles, parsed into ``layout`` on first
        use: a plan made in a DataLoader worker sends its numbers without naming them)."""
        self.arena = arena
        self._layout, self._wire = layout, wire
        if layout is not None:
            self.per_sample, self.num_masks = layout.per_sample, layout.num_masks
            self.patch_grid, self.build_us = layout.patch_grid, layout.build_us
        else:
            self.per_sample, self.patch_grid = wire[0], wire[1]
            self.num_masks, self.build_us = self._head(wire[3])
        self._stages = None

    @property
    def layout(self) -> PlanLayout:
        """The arena's layout: a :class:`PlanLayout` of named records."""
        if self._layout is None:
            self._layout = self._parse(*self._wire)
        return self._layout

    # A subclass reads its info struct: _head(values) -> (num_masks, build_us);
    # _parse(per_sample, patch_grid, extra, values) -> PlanLayout.
    _head: Callable[[tuple], Tuple[int, float]]
    _parse: Callable[..., PlanLayout]

    def _again(self, arena: Tensor):
        """This plan's layout over another arena (no parse where it has none yet)."""
        return type(self)(arena, self._layout, self._wire)

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
        return self._again(self.arena.to(device, non_blocking=non_blocking))

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

    # ---- the arena layout ---------------------------------------------------------------------------

    @staticmethod
    def _ranges(layout: PlanLayout) -> Iterable[Range]:
        """Every array's (offset, size), stage by stage."""
        return [r for st in layout.stages for r in st.ranges()]

    @staticmethod
    def _partitions(layout: PlanLayout) -> Tuple[Tuple[PartitionLayout, ...], ...]:
        return tuple(st.partition_layouts() for st in layout.stages)

    @staticmethod
    def _relayout(layout: PlanLayout, counts, new: Callable[[Range], Range], exhausted=None) -> PlanLayout:
        """The layout with ``counts[s]`` groups in stage s's partitions, each range r moved to
        new(r) and, unless None, every budget flag set to ``exhausted``."""
        stages = []
        for st, w in zip(layout.stages, counts):
            parts = tuple(p._replace(num_groups=n, budget_exhausted=p.budget_exhausted if exhausted is None
                                     else exhausted, arrays=tuple(new(r) for r in p.arrays))
                          for p, n in zip(st.partition_layouts(), w))
            stages.append(st.with_partition_layouts(parts)._replace(**{f: new(getattr(st, f))
                                                                       for f in st._range_fields}))
        return layout._replace(stages=tuple(stages))

    # ---- one set of shapes for every mask: what a CUDA graph replays ------------------------------

    def group_counts(self) -> Tuple[Tuple[int, ...], ...]:
        """The number of groups of each stage's partitions (Swin: plain, shifted; Twins: its
        LSA windows). With fixed group sizes (``group_size=-1``) it is what a new mask changes
        in the plan's shapes."""
        return tuple(tuple(p.num_groups for p in parts) for parts in self._partitions(self.layout))

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
                arrays = dict(zip(PARTITION_ARRAYS, p.arrays))
                for a, fill in (("gather", -1), ("slot_window", -1), ("slot_coord", 0)):
                    grow[arrays[a]] = (n * p.group_size, fill)
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
        return self._again(self.arena.pin_memory() if device is None else self.arena.pin_memory(device))

    def __reduce__(self):
        # the info struct's plain numbers where the plan has them: smaller and quicker to pickle
        # and unpickle than named records (about half the time of the plain tuples before them)
        if self._wire is not None:
            return (type(self), (self.arena, None, self._wire))
        return (type(self), (self.arena, self._layout))


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
