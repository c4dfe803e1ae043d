"""The plan of a visible-token Twins-SVT encoder: one library call, one int32 arena.

:func:`plan_twins` hands a mask to ``gmh_twins_plan_prepare`` (C++ ``twins_plan.hpp``), which
builds per stage the visible tokens, the LSA partition (windows never shifted, grouped by the
planner), the PEG's 3x3 neighbour table, the GSA keys' block table (sub-sampling ``sr``) with the
padded layout a per-sample batch attends through, the patch embedding's block table to the next
stage, and the last stage's unit ranks; every array is a view of one tensor (``TwinsPlan``,
an :class:`~greenmim._arena.ArenaPlan` like :class:`greenmim.MaskPlan`: ``.to()``,
``.pin_memory()``, ``.mark_dynamic()``, one buffer when pickled).

Block convs keep every block with a visible input (spconv's rule, docs/sparse-conv.md): with
mask units that cover the largest stride every block is whole, and a finer mask is planned too
(each stage's tokens are then the blocks of the previous stage that hold a visible token).

Tokens are in **block-major order** (twins_plan.hpp): per sample, the last stage's cells
row-major and each in Z (Morton) order at every stage, so that every 2x2 and sr x sr block is a
run of consecutive tokens. Where blocks are whole (the 32 px units), the block tables say
``reshape=True`` and :func:`greenmim.block_conv` is one GEMM over a view of the tokens, no gather.
Read token positions from ``position``, never from the order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _lib, mask_plan
from ._arena import ArenaPlan, PartitionLayout, PlanLayout, StageLayout, StructReader, arena_views, plan_arena
from ._lib import GreenmimError
from .conv_tables import BlockTable, NeighborTable, mark_valid
from .mask_plan import StagePartition


@dataclass(eq=False)
class TwinsStagePlan:
    """One stage of a :class:`TwinsPlan` (int32 views of the plan's arena)."""
    grid: Tuple[int, int]
    partition: StagePartition            # LSA windows
    neighbors: NeighborTable             # PEG
    keys: Optional[BlockTable]           # GSA sub-sampling (None at sr 1: the keys are the tokens)
    embed: Optional[BlockTable]          # patch embedding into the next stage (None at the last)
    position: Tensor                     # [N] flat positions (b*H*W + h*W + w per sample)
    cu_seqlens: Optional[Tensor]         # [B+1] per-sample masks
    key_cu_seqlens: Optional[Tensor]     # [B+1] per-sample masks
    num_keys: int                        # the GSA key axis (per sample with a shared mask)
    max_tokens: int                      # the largest sample's tokens and keys (per-sample masks)
    max_keys: int
    uniform: bool                        # every sample has max_tokens tokens and max_keys keys
    query_slot: Optional[Tensor]         # [N] slot in [B, max_tokens] (per sample, not uniform)
    key_gather: Optional[Tensor]         # [B*max_keys] key or -1 (per sample, not uniform)
    sr: int = 1
    unit_rank: Optional[Tensor] = None   # last stage, [M, H*W]: rank among visible or -1 - rank among masked
    num_masks: int = 1

    @property
    def num_tokens(self) -> int:
        """Length of the token axis (per sample with a shared mask)."""
        return self.partition.num_tokens

    @property
    def partitions(self) -> Tuple[StagePartition]:
        return (self.partition,)

    def visible_units(self) -> Tensor:
        """``[M, H*W]`` bool on the plan's device (needs ``unit_rank``: the last stage)."""
        if self.unit_rank is None:
            raise GreenmimError("greenmim: unit ranks exist for the last stage only")
        return self.unit_rank >= 0


class TwinsStageLayout(StageLayout):
    """One stage of a :class:`TwinsPlan`'s layout (gmh_twins_stage, and the stage's GSA
    sub-sampling ``sr``): token grid and counts, the LSA partition, the ranges of its tables."""
    __slots__ = ()
    _range_fields = ("position", "cu_seqlens", "neighbors", "keys", "key_cu_seqlens", "query_slot", "key_gather",
                     "embed", "unit_rank")
    _fields = ("height", "width", "num_tokens", "num_keys", "max_tokens", "max_keys", "uniform", "key_holes",
               "embed_holes", "reshape", "lsa") + _range_fields + ("sr",)

    def partition_layouts(self) -> Tuple[PartitionLayout, ...]:
        return (self.lsa,)

    def with_partition_layouts(self, parts) -> "TwinsStageLayout":
        (lsa,) = parts
        return self._replace(lsa=lsa)


_READ = None   # (reader of gmh_twins_info, the parse of a plan of n stages for each n)


def _reader():
    global _READ
    if _READ is None:
        r = StructReader(_lib.TwinsInfo)
        flags = ("uniform", "key_holes", "embed_holes")

        def stage(k: int) -> str:
            at = ("stage", k)
            scalars = [f"bool({r.at(*at, f)})" if f in flags else r.at(*at, f) for f in TwinsStageLayout._fields[:10]]
            return (f"_new(TwinsStageLayout, ({', '.join(scalars)}, {r.partition(*at, 'lsa')}, "
                    f"*{r.ranges(*at, names=TwinsStageLayout._range_fields)}, extra[{k}]))")

        parse = [r.compile(f"_new(PlanLayout, (per_sample, {r.at('num_masks')}, patch_grid, {r.at('build_us')}, "
                           f"({''.join(stage(k) + ', ' for k in range(n))})))", TwinsStageLayout=TwinsStageLayout)
                 for n in range(_lib.GMH_MAX_STAGES + 1)]
        _READ = (r, parse, r.index[("num_stages",)], r.index[("num_masks",)], r.index[("build_us",)])
    return _READ


def _layout(per_sample: bool, patch_grid: Tuple[int, int], sr: Tuple[int, ...], v: tuple) -> PlanLayout:
    """The arena's layout as named records, from gmh_twins_info's values (read by field name)
    and the stages' sub-sampling ``sr``."""
    _, parse, n, _, _ = _reader()
    return parse[v[n]](per_sample, patch_grid, sr, v)


class TwinsPlan(ArenaPlan):
    """Everything a visible-token Twins needs for one mask (or a batch of per-sample masks).

    ``stages[i]`` is a :class:`TwinsStagePlan`; ``patch_index`` the visible patches (stage 1's
    positions); ``per_sample``, ``num_masks``, ``patch_grid`` as :class:`greenmim.MaskPlan`."""

    @staticmethod
    def _head(v: tuple) -> Tuple[int, float]:
        _, _, _, m, us = _reader()
        return v[m], v[us]

    _parse = staticmethod(lambda *wire: _layout(*wire))

    def _build_stages(self) -> List["TwinsStagePlan"]:
        layout = self.layout
        per_sample, num_masks = layout.per_sample, layout.num_masks
        view = arena_views(self.arena, self._ranges(layout))    # every array of the arena, in arena order
        out: List[TwinsStagePlan] = []
        for st in layout.stages:
            H, W, N, sr, p = st.height, st.width, st.num_tokens, st.sr, st.lsa
            part = StagePartition(*(view(r) for r in p.arrays), None, group_size=p.group_size,
                                  num_groups=p.num_groups, num_tokens=N, window=p.window, shift=p.shift, cost=p.cost,
                                  lower_bound=p.lower_bound, plan_us=p.plan_us,
                                  budget_exhausted=bool(p.budget_exhausted))
            pos = view(st.position)
            cu = view(st.cu_seqlens) if per_sample else None
            key_cu = view(st.key_cu_seqlens) if per_sample else None
            nt = NeighborTable(view(st.neighbors).view(N, 9), (H, W), pos, cu)
            kt = BlockTable(view(st.keys).view(-1, sr * sr), sr, N, st.key_holes, (H // sr, W // sr), None, key_cu,
                            reshape=bool(st.reshape & 1)) if sr > 1 else None
            et = BlockTable(view(st.embed).view(-1, 4), 2, N, st.embed_holes, (H // 2, W // 2),
                            reshape=bool(st.reshape & 2)) if st.embed[1] else None
            for t in (nt, kt, et):
                if t is not None:
                    mark_valid(t)
            out.append(TwinsStagePlan(
                grid=(H, W), partition=part, neighbors=nt, keys=kt, embed=et, position=pos, cu_seqlens=cu,
                key_cu_seqlens=key_cu, num_keys=st.num_keys, max_tokens=st.max_tokens, max_keys=st.max_keys,
                uniform=st.uniform, query_slot=view(st.query_slot) if st.query_slot[1] else None,
                key_gather=view(st.key_gather) if st.key_gather[1] else None, sr=sr,
                unit_rank=view(st.unit_rank).view(num_masks, H * W) if st.unit_rank[1] else None,
                num_masks=num_masks))
        for i in range(len(out) - 1):           # the next stage's tokens are the embedding's outputs
            nxt = out[i + 1]
            out[i].embed.position, out[i].embed.cu_seqlens = nxt.position, nxt.cu_seqlens
        return out

    def __repr__(self) -> str:
        kind = f"{self.num_masks} per-sample masks" if self.per_sample else "one shared mask"
        return (f"TwinsPlan({kind}, {len(self.stages)} stages, tokens {[s.num_tokens for s in self.stages]}, "
                f"keys {[s.num_keys for s in self.stages]}, {self.arena.numel() * 4 / 1024:.1f} KiB on {self.device})")


def plan_twins(visible: Tensor, *, img_size: int = 224, patch_size: int = 4, windows: Sequence[int] = (7, 7, 7, 7),
               sr_ratios: Sequence[int] = (8, 4, 2, 1), channels: Sequence[int] = (128, 256, 512, 1024),
               strategy: str = "fast", device=None, cache: bool = True, max_group_size: Optional[int] = None,
               group_size: int = 0) -> TwinsPlan:
    """Plans every stage of a Twins-SVT encoder for a mask: one library call, one arena.

    ``visible``: bool ``[h, w]`` (shared by the batch) or ``[B, h, w]`` (per sample), True =
    visible, at any resolution that tiles the ``img_size / patch_size`` grid (mask units or
    patches). Stage s has a ``grid >> s`` token grid, LSA windows ``windows[s]`` and GSA
    sub-sampling ``sr_ratios[s]`` (both must divide the stage's grid), ``channels[s]`` for the
    planner's cost model. ``strategy``, ``group_size`` (-1: each stage's window area, for
    torch.compile), ``max_group_size``, ``device`` and ``cache`` as :func:`greenmim.plan_masks`."""
    host, per_sample, device, cap = mask_plan.plan_inputs(visible, strategy, img_size, patch_size, max_group_size,
                                                        device)
    S = len(windows)
    if not (len(sr_ratios) == len(channels) == S) or not 1 <= S <= _lib.GMH_MAX_STAGES:
        raise GreenmimError(f"greenmim: windows, sr_ratios and channels need one entry per stage (1..8), got "
                            f"{len(windows)}, {len(sr_ratios)}, {len(channels)}")
    geo = (img_size, patch_size, tuple(windows), tuple(sr_ratios), tuple(channels), strategy, group_size, cap)
    if cache:
        key = ("twins", host.numpy().tobytes(), tuple(host.shape), per_sample, geo, str(device))
        hit = mask_plan.plan_cache.get(key)
        if hit is not None:
            return hit
    M, h, w = host.shape
    grid = img_size // patch_size
    a = _lib.TwinsArgs()
    a.visible, a.num_masks, a.mask_height, a.mask_width, a.per_sample = host.data_ptr(), M, h, w, int(per_sample)
    a.grid, a.num_stages = grid, S
    for i in range(S):
        a.window[i], a.sr_ratio[i], a.channels[i] = int(windows[i]), int(sr_ratios[i]), int(channels[i])
    a.strategy, a.group_size, a.max_group_size = _lib.STRATEGIES[strategy], int(group_size), cap
    info = _lib.TwinsInfo()
    arena = plan_arena("twins", a, info, "twins plan")
    plan = TwinsPlan(arena, wire=(per_sample, (grid, grid), tuple(int(r) for r in sr_ratios),
                                  _reader()[0].read(info, info.num_stages))).to(device)
    if cache:
        mask_plan.plan_cache.put(key, plan)
    return plan


@dataclass(frozen=True)
class TwinsPlanSpec:
    """What planning needs of a Twins encoder, picklable (a DataLoader worker plans with it)."""
    img_size: int
    patch_size: int
    windows: Tuple[int, ...]
    sr_ratios: Tuple[int, ...]
    channels: Tuple[int, ...]
    strategy: str = "fast"
    group_size: int = 0

    def plan(self, visible: Tensor, device=None, cache: bool = True) -> TwinsPlan:
        return plan_twins(visible, img_size=self.img_size, patch_size=self.patch_size, windows=self.windows,
                          sr_ratios=self.sr_ratios, channels=self.channels, strategy=self.strategy, device=device,
                          cache=cache, group_size=self.group_size)
