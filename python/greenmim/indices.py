"""From a mask to what every stage of a visible-token encoder needs.

:func:`plan_masks` turns one shared mask ``[h, w]`` or per-sample masks ``[B, h, w]`` (True =
visible, at mask-unit or patch resolution) into a :class:`MaskPlan`: per stage, the visible
tokens, the partition indices for the plain and the shifted windows (planned by the C++
planner), and the patch-merging indices to the next stage. Token order: row-major (h, w) within
a sample; with per-sample masks the token axis is all samples' tokens, sample-major (batch
extent 1, ``cu_seqlens`` style).

:func:`plan_masks` is one call into the host library: every stage, both shifts, the merges and the
per-sample offsets, written into one int32 arena that Python views as tensors and copies to the
target device once. :func:`stage_partition` plans one stage; on CUDA it builds the indices on
the device (kernels.h: select visible, count window sizes, build partition) with one host round
trip for the planner's window sizes. Both cache their results per (mask, geometry, planner
settings, device).
"""
from __future__ import annotations

import collections
import ctypes
import math
import struct
import threading
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Tuple

import torch
from torch import Tensor

from . import _backend, _lib
from ._arena import ArenaPlan, arena_views, plan_arena
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

    def __init__(self, arena: Tensor, layout: tuple):
        super().__init__(arena, layout)
        self.per_sample, self.num_masks, self.patch_grid, self.build_us = layout[:4]

    def _build_stages(self) -> List["StagePlan"]:
        arena, layout = self.arena, self.layout
        per_sample, num_masks, patch_grid, build_us, stages = layout
        view = arena_views(arena, self._ranges(layout))    # every array of the arena, in arena order
        out: List[StagePlan] = []
        for (H, W, N, parts, position, merge, cu, rank) in stages:
            made = []
            for (G, ng, nw, win, sh, exhausted, cost, lb, us, arrays) in parts:
                g, sc, sw, co = (view(r) for r in arrays)
                made.append(StagePartition(g, sc, sw, co, None, group_size=G, num_groups=ng, num_tokens=N, window=win,
                                           shift=sh, cost=cost, lower_bound=lb, plan_us=us,
                                           budget_exhausted=bool(exhausted)))
            if parts[1] == parts[0]:
                made[1] = made[0]
            out.append(StagePlan(grid=(H, W), partitions=(made[0], made[1]),
                                         merge=view(merge).view(-1, 4) if merge[1] else None,
                                         cu_seqlens=view(cu) if per_sample else None, position=view(position),
                                         unit_rank=view(rank).view(num_masks, H * W) if rank[1] else None,
                                         num_masks=num_masks))
        return out

    # ---- the arena layout, for ArenaPlan's padded() / shape_key() ---------------------------------

    @staticmethod
    def _ranges(layout: tuple):
        return (r for st in layout[4] for r in (*(x for p in st[3] for x in p[9]), *st[4:8]))

    @staticmethod
    def _partitions(layout: tuple):
        return tuple(st[3] for st in layout[4])

    @staticmethod
    def _relayout(layout: tuple, counts, new, exhausted=None) -> tuple:
        per_sample, num_masks, patch_grid, build_us, stages = layout
        out = []
        for (H, W, N, parts, position, merge, cu, rank), w in zip(stages, counts):
            parts = tuple((p[0], n, *p[2:5], p[5] if exhausted is None else exhausted, *p[6:9],
                           tuple(new(r) for r in p[9])) for p, n in zip(parts, w))
            out.append((H, W, N, parts, new(position), new(merge), new(cu), new(rank)))
        return (per_sample, num_masks, patch_grid, build_us, tuple(out))

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
    by a few percent (docs/pretraining.md, "CUDA graphs")."""
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


_cache, _plan_cache = _LRU(), _LRU()   # stage partitions, mask plans


def clear_cache() -> None:
    """Forgets every cached plan and partition."""
    _cache.clear()
    _plan_cache.clear()


def _host_bytes(t: Tensor) -> Tensor:
    return t.detach().to("cpu", torch.uint8).contiguous()


def stage_partition(visible: Tensor, window: int, shift: int, channels: int, strategy: str = "fast",
                    group_size: int = 0, device=None, cache: bool = True,
                    max_group_size: Optional[int] = None) -> StagePartition:
    """Partition indices of one stage: ``visible`` is ``[H, W]`` (shared) or ``[M, H, W]``
    (per-sample) bool. Planned with the FLOPs cost model at ``channels``.

    ``max_group_size``: the planner keeps G at or below it (0: no cap). None (the default) caps G
    at the tensor-core attention's limit (256) when the stage's windows fit under it (window <=
    16), so every group runs on the fast kernels; a fixed ``group_size`` is then left alone."""
    if visible.dim() == 2:
        visible = visible.unsqueeze(0)
    if visible.dim() != 3:
        raise GreenmimError(f"greenmim: a stage mask is [H, W] or [B, H, W], got {tuple(visible.shape)}")
    if strategy not in _lib.STRATEGIES:
        raise GreenmimError(f"greenmim: unknown strategy {strategy!r}; one of {sorted(_lib.STRATEGIES)}")
    device = torch.device(device) if device is not None else visible.device
    host = _host_bytes(visible)
    key = (host.numpy().tobytes(), tuple(host.shape), window, shift, channels, strategy, group_size, max_group_size,
           str(device), _backend.emulating())
    if cache:
        hit = _cache.get(key)
        if hit is not None:
            return hit
    if max_group_size is None:  # (resolved on a miss only: a hit costs no library call)
        auto = strategy in ("fast", "paper") and group_size == 0
        eff = window_geometry(visible.shape[-2], visible.shape[-1], window, shift)[0]
        max_group_size = _lib.host().gmh_fast_path_max_group(eff) if auto else 0
    if device.type == "cuda" or (device.type == "cpu" and _backend.emulating()):
        part = _device_partition(visible.to(device, torch.uint8).contiguous(), window, shift, channels, strategy,
                                 group_size, max_group_size)
    else:
        part = _host_partition(host, window, shift, channels, strategy, group_size, max_group_size, device)
    if cache:
        _cache.put(key, part)
    return part


def _host_partition(host: Tensor, window, shift, channels, strategy, group_size, max_group_size,
                    device) -> StagePartition:
    lib = _lib.host()
    M, H, W = host.shape
    a = _lib.StageArgs(host.data_ptr(), M, H, W, window, shift, _lib.STRATEGIES[strategy], group_size, channels,
                       max_group_size)
    handle = ctypes.c_void_p()
    _lib.host_check(lib.gmh_stage_build(ctypes.byref(a), ctypes.byref(handle)), "stage partition")
    try:
        info = _lib.StageInfo()
        _lib.host_check(lib.gmh_stage_info_get(handle, ctypes.byref(info)), "stage partition")
        S = info.group_size * info.num_groups
        out = [torch.empty(n, dtype=torch.int32) for n in (S, info.num_tokens, S, S, info.num_tokens)]
        _lib.host_check(lib.gmh_stage_copy(handle, *(t.data_ptr() for t in out), None), "stage partition")
    finally:
        lib.gmh_stage_free(handle)
    out = [t.to(device) for t in out]
    return StagePartition(*out, group_size=info.group_size, num_groups=info.num_groups, num_tokens=info.num_tokens,
                          window=info.window, shift=info.shift, cost=info.cost, lower_bound=info.lower_bound,
                          plan_us=info.plan_us, budget_exhausted=bool(info.budget_exhausted))


def _device_partition(mask: Tensor, window, shift, channels, strategy, group_size, max_group_size) -> StagePartition:
    """kernels.h's flow: select visible -> token windows and window sizes -> (host) plan -> build."""
    lib = _lib.kernels(emulated=mask.device.type != "cuda")
    stream = _backend._stream(mask)
    M, H, W = mask.shape
    win, sh, nw_per = window_geometry(H, W, window, shift)
    cap = M * H * W
    dev = mask.device
    i32 = dict(dtype=torch.int32, device=dev)

    def check(rc, where):
        _lib.kernel_check(lib, rc, where)

    tmp = ctypes.c_size_t(0)
    positions, count = torch.empty(cap, **i32), torch.empty(1, **i32)
    check(lib.gm_select_visible(None, ctypes.byref(tmp), mask.data_ptr(), M, H, W, positions.data_ptr(),
                                count.data_ptr(), stream), "select visible")
    temp, temp_ptr = _backend.device_buffer(tmp.value, mask)
    check(lib.gm_select_visible(temp_ptr, ctypes.byref(tmp), mask.data_ptr(), M, H, W, positions.data_ptr(),
                                count.data_ptr(), stream), "select visible")
    geom = _lib.WindowGeometry(H, W, win, sh)
    coords, token_window = torch.empty(cap, **i32), torch.empty(cap, **i32)
    sizes = torch.empty(M * nw_per, **i32)
    check(lib.gm_token_windows(positions.data_ptr(), count.data_ptr(), cap, M, geom, coords.data_ptr(),
                               token_window.data_ptr(), sizes.data_ptr(), stream), "token windows")
    host_sizes = sizes.to("cpu")  # the one host round trip: the planner's input
    N = int(host_sizes.sum())
    if N == 0:
        raise GreenmimError("greenmim: stage partition: mask: no visible token")
    group, offset = torch.empty(M * nw_per, dtype=torch.int32), torch.empty(M * nw_per, dtype=torch.int32)
    info = _lib.StageInfo()
    _lib.host_check(_lib.host().gmh_plan_table(host_sizes.data_ptr(), M * nw_per, _lib.STRATEGIES[strategy],
                                               group_size, max_group_size, channels, group.data_ptr(),
                                               offset.data_ptr(),
                                               ctypes.byref(info)), "stage partition")
    G, ng = info.group_size, info.num_groups
    d_group, d_offset = group.to(dev), offset.to(dev)
    gather, slot_window, slot_coord = (torch.empty(G * ng, **i32) for _ in range(3))
    scatter = torch.empty(N, **i32)
    args = lambda t: (t, ctypes.byref(tmp), coords.data_ptr(), token_window.data_ptr(), N, sizes.data_ptr(),
                      M * nw_per, d_group.data_ptr(), d_offset.data_ptr(), G, ng, gather.data_ptr(),
                      scatter.data_ptr(), slot_window.data_ptr(), slot_coord.data_ptr(), stream)
    check(lib.gm_build_partition(*args(None)), "build partition")
    temp, temp_ptr = _backend.device_buffer(tmp.value, mask)
    check(lib.gm_build_partition(*args(temp_ptr)), "build partition")
    return StagePartition(gather, scatter, slot_window, slot_coord, token_window[:N].clone(), group_size=G,
                          num_groups=ng, num_tokens=N, window=win, shift=sh, cost=info.cost,
                          lower_bound=info.lower_bound, plan_us=info.plan_us,
                          budget_exhausted=bool(info.budget_exhausted))


def merge_indices(visible: Tensor, device=None) -> Tensor:
    """Patch-merging indices ``[N_next, 4]`` (int64) of a stage mask ``[H, W]`` / ``[M, H, W]``:
    output token j concatenates input tokens ``merge[j]`` in Swin's order (0,0), (1,0), (0,1), (1,1)."""
    host = _host_bytes(visible if visible.dim() == 3 else visible.unsqueeze(0))
    M, H, W = host.shape
    out = torch.empty(max(int(host.sum()), 1), dtype=torch.int32)
    n = ctypes.c_int64(0)
    _lib.host_check(_lib.host().gmh_merge_indices(host.data_ptr(), M, H, W, out.data_ptr(), out.numel(),
                                                  ctypes.byref(n)), "merge indices")
    return out[: n.value].view(-1, 4).to(device if device is not None else visible.device, torch.int64)


def _struct_format(cls, base: int = 0, at: int = 0) -> Tuple[str, int]:
    """A ``struct`` format reading every scalar of the ctypes structure ``cls`` in field order,
    padding taken from ctypes' own offsets (so it follows the C layout the library checks)."""
    codes = {ctypes.c_int32: "i", ctypes.c_int64: "q", ctypes.c_double: "d"}
    fmt = ""
    for name, typ in cls._fields_:
        off = base + getattr(cls, name).offset
        elem, count = (typ._type_, typ._length_) if issubclass(typ, ctypes.Array) else (typ, 1)
        for i in range(count):
            o = off + i * ctypes.sizeof(elem)
            if issubclass(elem, ctypes.Structure):
                f, at = _struct_format(elem, o, at)
                fmt += f
            else:
                fmt += "x" * (o - at) + codes[elem]
                at = o + ctypes.sizeof(elem)
    return fmt, at


_INFO_FORMAT = None
_PART_FIELDS, _STAGE_FIELDS = 9 + 4 * 2, 4 + 2 * (9 + 4 * 2) + 4 * 2


def _layout(info, per_sample: bool, patch_grid: Tuple[int, int]) -> tuple:
    """The arena's layout as plain Python data (picklable), read from the info struct in one
    ``struct.unpack_from``."""
    global _INFO_FORMAT
    if _INFO_FORMAT is None:
        _INFO_FORMAT = struct.Struct("=" + _struct_format(_lib.EncoderInfo)[0])
    v = _INFO_FORMAT.unpack_from(info)
    num_stages, num_masks, build_us = v[0], v[1], v[3]
    pair = lambda i: (v[i], v[i + 1])
    stages = []
    for k in range(num_stages):
        b = 4 + k * _STAGE_FIELDS
        parts = []
        for j in range(2):
            p = b + 4 + j * _PART_FIELDS
            parts.append((*v[p:p + 9], tuple(pair(p + 9 + 2 * r) for r in range(4))))
        q = b + 4 + 2 * _PART_FIELDS
        stages.append((v[b], v[b + 1], v[b + 2], tuple(parts), pair(q), pair(q + 2), pair(q + 4), pair(q + 6)))
    return (per_sample, int(num_masks), patch_grid, float(build_us), tuple(stages))


def _build_plan(host: Tensor, per_sample: bool, grid: int, window: int, num_stages: int, embed_dim: int,
                strategy: str, group_size: int, max_group_size: int) -> MaskPlan:
    M, h, w = host.shape
    a = _lib.EncoderArgs(host.data_ptr(), M, h, w, int(per_sample), grid, window, num_stages, embed_dim,
                         _lib.STRATEGIES[strategy], group_size, max_group_size)
    info = _lib.EncoderInfo()
    arena = plan_arena("encoder", a, info, "plan")
    return MaskPlan(arena, _layout(info, per_sample, (grid, grid)))


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
    mask's) once. ``max_group_size``: see :func:`stage_partition` (default: G kept on the
    tensor-core kernels where windows allow; 0: no cap). ``group_size``: 0 lets the planner sweep
    G, > 0 fixes it, -1 fixes each stage's G at its window's area (p*p): plans of different masks
    then differ only in their number of groups (torch.compile, :meth:`MaskPlan.mark_dynamic`).
    Plans are cached per (mask, geometry, planner settings, device): a hit costs a hash of the mask."""
    host, per_sample, device, cap = plan_inputs(visible, strategy, img_size, patch_size, max_group_size, device)
    if cache:
        key = (host.numpy().tobytes(), tuple(host.shape), per_sample, img_size, patch_size, window_size, num_stages,
               embed_dim, strategy, group_size, cap, str(device))
        hit = _plan_cache.get(key)
        if hit is not None:
            return hit
    plan = _build_plan(host, per_sample, img_size // patch_size, window_size, num_stages, embed_dim, strategy,
                       group_size, cap).to(device)
    if cache:
        _plan_cache.put(key, plan)
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
