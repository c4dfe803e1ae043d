"""From a mask to what every stage of a visible-token encoder needs.

:func:`plan_masks` turns one shared mask ``[h, w]`` or per-sample masks ``[B, h, w]`` (True =
visible, at mask-unit or patch resolution) into a :class:`MaskPlan`: per stage, the visible
tokens, the partition indices for the plain and the shifted windows (planned by the C++
planner), and the patch-merging indices to the next stage. Token order: row-major (h, w) within
a sample; with per-sample masks the token axis is all samples' tokens, sample-major (batch
extent 1, ``cu_seqlens`` style).

:func:`plan_masks` is one call into the host library: every stage, both shifts, the merges and the
per-sample offsets, written into one int32 arena that Python views as tensors and copies to the
target device once (the product path: ``encoder_plan.hpp``). Plans are cached per (mask,
geometry, planner settings, device). The per-stage builders over the reference headers
(``stage_partition``, ``merge_indices``) are in :mod:`greenmim.testing`.
"""
from __future__ import annotations

import collections
import ctypes
import math
import threading
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib
from ._arena import ArenaPlan, PartitionLayout, PlanLayout, StageLayout, StructReader, arena_views, plan_arena
from ._lib import GreenmimError


@dataclass(eq=False)
class StagePartition:
    """Partition indices of one stage and shift (int32 tensors on the target device).

    ``gather[slot]`` token or -1 (padding), ``scatter[token]`` slot, ``slot_window[slot]`` window
    or -1, ``slot_coord[slot]`` packed ``h << 16 | w``; group g owns slots ``[g*G, (g+1)*G)``.
    ``token_window[token]`` is each token's window (sample-major ids with per-sample masks)."""
    gather: Tensor
    scatter: Tensor
    slot_window: Tensor
    slot_coord: Tensor
    _token_window: Optional[Tensor]  # derived on first use when None: slot_window[scatter]
    group_size: int
    num_groups: int
    num_tokens: int
    window: int
    shift: int
    cost: float
    lower_bound: float
    plan_us: float
    budget_exhausted: bool = False

    @property
    def token_window(self) -> Tensor:
        if self._token_window is None:
            self._token_window = self.slot_window[self.scatter.long()]
        return self._token_window

    @property
    def gap(self) -> float:
        """Relative gap of the plan's cost to the planner's lower bound on any plan."""
        return (self.cost - self.lower_bound) / self.lower_bound if self.lower_bound > 0 else 0.0


@dataclass(eq=False)
class StagePlan:
    """One stage: its token grid, partitions, token positions and merge indices (int32 views of
    the plan's arena, on the plan's device)."""
    grid: Tuple[int, int]
    partitions: Tuple[StagePartition, StagePartition]  # (plain windows, shifted windows)
    merge: Optional[Tensor]              # [N_next, 4] into this stage's token axis, or None
    cu_seqlens: Optional[Tensor]         # [B+1] (per-sample masks), None when shared
    position: Tensor                     # [N] flat position: h*W + w, or b*H*W + h*W + w per sample
    unit_rank: Optional[Tensor] = None   # last stage, [M, H*W]: rank among visible (>= 0) or -1 - rank among masked
    num_masks: int = 1

    @property
    def num_tokens(self) -> int:
        """Length of the token axis (per sample with a shared mask)."""
        return self.partitions[0].num_tokens

    @property
    def visible(self) -> Tensor:
        """``[M, H, W]`` bool on the host: the stage's mask."""
        H, W = self.grid
        out = torch.zeros(self.num_masks * H * W, dtype=torch.bool)
        out[self.position.to("cpu", torch.int64)] = True
        return out.view(self.num_masks, H, W)

    def visible_units(self) -> Tensor:
        """``[M, H*W]`` bool on the plan's device (needs ``unit_rank``: the last stage)."""
        if self.unit_rank is None:
            raise GreenmimError("greenmim: unit ranks exist for the last stage only")
        return self.unit_rank >= 0


class MaskPlan(ArenaPlan):
    """Everything a visible-token encoder needs for one mask (or one batch of per-sample masks).

    All index arrays are int32 views of one tensor, ``arena``: moving a plan to a device
    (:meth:`to`), pinning it (:meth:`pin_memory`, which a DataLoader calls) or sending it to
    another process (pickling, as DataLoader workers do) moves that one tensor (_arena.py)."""

    @staticmethod
    def _head(v: tuple) -> Tuple[int, float]:
        _, _, _, m, us = _reader()
        return v[m], v[us]

    _parse = staticmethod(lambda *wire: _layout(*wire))

    def _build_stages(self) -> List["StagePlan"]:
        layout = self.layout
        view = arena_views(self.arena, self._ranges(layout))    # every array of the arena, in arena order
        out: List[StagePlan] = []
        for st in layout.stages:
            made = []
            for p in st.partitions:
                made.append(StagePartition(*(view(r) for r in p.arrays), None, group_size=p.group_size,
                                           num_groups=p.num_groups, num_tokens=st.num_tokens, window=p.window,
                                           shift=p.shift, cost=p.cost, lower_bound=p.lower_bound, plan_us=p.plan_us,
                                           budget_exhausted=bool(p.budget_exhausted)))
            if st.partitions[1] == st.partitions[0]:
                made[1] = made[0]
            H, W = st.height, st.width
            out.append(StagePlan(grid=(H, W), partitions=(made[0], made[1]),
                                 merge=view(st.merge).view(-1, 4) if st.merge[1] else None,
                                 cu_seqlens=view(st.cu_seqlens) if layout.per_sample else None,
                                 position=view(st.position),
                                 unit_rank=view(st.unit_rank).view(layout.num_masks, H * W) if st.unit_rank[1] else None,
                                 num_masks=layout.num_masks))
        return out

    def __repr__(self) -> str:
        kind = f"{self.num_masks} per-sample masks" if self.per_sample else "one shared mask"
        return (f"MaskPlan({kind}, {len(self.stages)} stages, tokens {[s.num_tokens for s in self.stages]}, "
                f"{self.arena.numel() * 4 / 1024:.1f} KiB on {self.device})")


def group_capacity(plans: Iterable["MaskPlan"], margin: float = 0.02) -> Tuple[Tuple[int, ...], ...]:
    """A capacity for :meth:`MaskPlan.padded` (and :class:`greenmim.TwinsPlan`'s): per stage, the
    most groups each of its partitions (Swin: plain, shifted; Twins: LSA) takes in any of
    ``plans``, raised by ``ceil(margin * most)`` where the count varied among them (one that
    never varied, e.g. a stage whose tokens fit one group, stays as it is). Plan a few dozen masks
    of the training distribution with fixed group sizes (``group_size=-1``): their counts sit
    within a few groups of tokens / G, so a capacity from 64 of them is rarely exceeded and pads
    by a few percent (docs/pretraining-speed.md, "CUDA graphs")."""
    if not margin >= 0:
        raise GreenmimError(f"greenmim: group_capacity: margin must be >= 0, got {margin}")
    counts = [p.group_counts() for p in plans]
    if not counts:
        raise GreenmimError("greenmim: group_capacity: no plans")
    if any(len(c) != len(counts[0]) for c in counts):
        raise GreenmimError("greenmim: group_capacity: plans of different stage counts")
    out = []
    for s in range(len(counts[0])):
        pair = []
        for j in range(len(counts[0][s])):
            seen = [c[s][j] for c in counts]
            hi = max(seen)
            pair.append(hi + (math.ceil(hi * margin) if min(seen) < hi else 0))
        out.append(tuple(pair))
    return tuple(out)


def window_geometry(height: int, width: int, window: int, shift: int) -> Tuple[int, int, int]:
    """(window, shift, number of windows) a stage really uses: Swin's small-stage rule (as timm:
    a grid no larger than the window is one window, no shift), from the C++ geometry.hpp."""
    w, sh, n = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
    _lib.host_check(_lib.host().gmh_window_geometry(height, width, window, shift, ctypes.byref(w), ctypes.byref(sh),
                                                    ctypes.byref(n)), "window geometry")
    return w.value, sh.value, n.value


CACHE_SIZE = 256


class _LRU:
    """A thread-safe least-recently-used cache of CACHE_SIZE entries."""

    def __init__(self):
        self.lock, self.entries = threading.Lock(), collections.OrderedDict()

    def get(self, key):
        with self.lock:
            hit = self.entries.get(key)
            if hit is not None:
                self.entries.move_to_end(key)
            return hit

    def put(self, key, value) -> None:
        with self.lock:
            self.entries[key] = value
            while len(self.entries) > CACHE_SIZE:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


plan_cache = _LRU()        # mask and Twins plans, conv tables (twins_plan.py, conv_tables.py)
partition_cache = _LRU()   # the per-stage partitions of greenmim.testing.stage_partition


def clear_cache() -> None:
    """Forgets every cached plan, table and partition."""
    plan_cache.clear()
    partition_cache.clear()


class MaskStageLayout(StageLayout):
    """One stage of a :class:`MaskPlan`'s layout (gmh_plan_stage): its token grid and count, its
    plain and shifted partitions, and the ranges of its other arrays."""
    __slots__ = ()
    _fields = ("height", "width", "num_tokens", "partitions", "position", "merge", "cu_seqlens", "unit_rank")
    _range_fields = ("position", "merge", "cu_seqlens", "unit_rank")

    def partition_layouts(self) -> Tuple[PartitionLayout, ...]:
        return self.partitions

    def with_partition_layouts(self, parts) -> "MaskStageLayout":
        return self._replace(partitions=tuple(parts))


_READ = None   # (reader of gmh_encoder_info, the parse of a plan of n stages for each n)


def _reader():
    global _READ
    if _READ is None:
        r = StructReader(_lib.EncoderInfo)

        def stage(k: int) -> str:
            at = ("stage", k)
            return (f"_new(MaskStageLayout, ({r.at(*at, 'height')}, {r.at(*at, 'width')}, {r.at(*at, 'num_tokens')}, "
                    f"({r.partition(*at, 'part', 0)}, {r.partition(*at, 'part', 1)}), "
                    f"*{r.ranges(*at, names=MaskStageLayout._range_fields)}))")

        parse = [r.compile(f"_new(PlanLayout, (per_sample, {r.at('num_masks')}, patch_grid, {r.at('build_us')}, "
                           f"({''.join(stage(k) + ', ' for k in range(n))})))", MaskStageLayout=MaskStageLayout)
                 for n in range(_lib.GMH_MAX_STAGES + 1)]
        _READ = (r, parse, r.index[("num_stages",)], r.index[("num_masks",)], r.index[("build_us",)])
    return _READ


def _layout(per_sample: bool, patch_grid: Tuple[int, int], extra, v: tuple) -> PlanLayout:
    """The arena's layout as named records, from gmh_encoder_info's values (read by field
    name: :func:`_reader`)."""
    _, parse, n, _, _ = _reader()
    return parse[v[n]](per_sample, patch_grid, extra, v)


def _build_plan(host: Tensor, per_sample: bool, grid: int, window: int, num_stages: int, embed_dim: int,
                strategy: str, group_size: int, max_group_size: int) -> MaskPlan:
    M, h, w = host.shape
    a = _lib.EncoderArgs(host.data_ptr(), M, h, w, int(per_sample), grid, window, num_stages, embed_dim,
                         _lib.STRATEGIES[strategy], group_size, max_group_size)
    info = _lib.EncoderInfo()
    arena = plan_arena("encoder", a, info, "plan")
    return MaskPlan(arena, wire=(per_sample, (grid, grid), None, _reader()[0].read(info, info.num_stages)))


def plan_inputs(visible: Tensor, strategy: str, img_size: int, patch_size: int, max_group_size: Optional[int],
                device) -> Tuple[Tensor, bool, torch.device, int]:
    """The checks and conversions every arena planner shares (``plan_masks``, ``plan_twins``): the
    mask as contiguous uint8 ``[M, h, w]`` on the host, whether it is per sample, the target
    device (default: the mask's) and the library's G cap (-1: the fast kernels' cap)."""
    if not isinstance(visible, Tensor) or visible.dtype != torch.bool or visible.dim() not in (2, 3):
        raise GreenmimError("greenmim: the mask must be a bool tensor [h, w] (shared) or [B, h, w] (per sample), "
                            f"True = visible; got {getattr(visible, 'dtype', type(visible).__name__)} "
                            f"{tuple(getattr(visible, 'shape', ()))}")
    if strategy not in _lib.STRATEGIES:
        raise GreenmimError(f"greenmim: unknown strategy {strategy!r}; one of {sorted(_lib.STRATEGIES)}")
    if patch_size < 1 or img_size % patch_size:
        raise GreenmimError(f"greenmim: image {img_size} is not a multiple of the patch {patch_size}")
    if max_group_size is not None and max_group_size < 0:
        raise GreenmimError(f"greenmim: max_group_size must be >= 0 (0 = no cap, None = the fast kernels' cap), "
                            f"got {max_group_size}")
    per_sample = visible.dim() == 3
    host = visible.detach().to("cpu", torch.uint8)
    host = (host if per_sample else host.unsqueeze(0)).contiguous()
    device = torch.device(device) if device is not None else visible.device
    return host, per_sample, device, -1 if max_group_size is None else int(max_group_size)


def plan_masks(visible: Tensor, *, img_size: int = 224, patch_size: int = 4, window_size: int = 7,
               num_stages: int = 4, embed_dim: int = 128, strategy: str = "fast", device=None,
               cache: bool = True, max_group_size: Optional[int] = None, group_size: int = 0) -> MaskPlan:
    """Plans every stage of a Swin-like encoder for a mask: one library call, one arena.

    ``visible``: bool ``[h, w]`` (one mask shared by the batch, the paper's setting) or
    ``[B, h, w]`` (per-sample masks), True = visible, at mask-unit (e.g. 7x7 for 32 px units at
    224 px) or patch resolution. Stage s has a ``(img/patch) / 2^s`` token grid, C = embed_dim
    * 2^s (the planner's cost model), windows of ``window_size`` shifted by half on odd blocks.
    The indices are built on the host and the arena is copied to ``device`` (default: the
    mask's) once. ``max_group_size``: the planner keeps G at or below it; None (the default)
    caps G at the tensor-core attention's limit (256) where a stage's windows fit under it
    (window <= 16), so every group runs on the fast kernels; 0: no cap. ``group_size``: 0 lets the planner sweep
    G, > 0 fixes it, -1 fixes each stage's G at its window's area (p*p): plans of different masks
    then differ only in their number of groups (torch.compile, :meth:`MaskPlan.mark_dynamic`).
    Plans are cached per (mask, geometry, planner settings, device): a hit costs a hash of the mask."""
    host, per_sample, device, cap = plan_inputs(visible, strategy, img_size, patch_size, max_group_size, device)
    if cache:
        key = (host.numpy().tobytes(), tuple(host.shape), per_sample, img_size, patch_size, window_size, num_stages,
               embed_dim, strategy, group_size, cap, str(device))
        hit = plan_cache.get(key)
        if hit is not None:
            return hit
    plan = _build_plan(host, per_sample, img_size // patch_size, window_size, num_stages, embed_dim, strategy,
                       group_size, cap).to(device)
    if cache:
        plan_cache.put(key, plan)
    return plan


def random_masks(batch: Optional[int] = None, *, grid: int = 7, ratio: float = 0.75,
                 generator: Optional[torch.Generator] = None) -> Tensor:
    """Uniform random masks keeping ``int(grid*grid*(1-ratio))`` units, as the released code:
    ``[grid, grid]`` when ``batch`` is None (shared), else ``[batch, grid, grid]``."""
    n = grid * grid
    keep = int(n * (1 - ratio))
    if keep < 1:
        raise GreenmimError(f"greenmim: ratio {ratio} keeps no unit of a {grid}x{grid} grid")
    B = 1 if batch is None else batch
    order = torch.rand(B, n, generator=generator).argsort(dim=1)
    m = torch.zeros(B, n, dtype=torch.bool)
    m.scatter_(1, order[:, :keep], True)
    m = m.view(B, grid, grid)
    return m[0] if batch is None else m
