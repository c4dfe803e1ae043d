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

from . import _lib, indices
from ._arena import ArenaPlan, arena_views, plan_arena
from ._lib import GreenmimError
from .conv_tables import BlockTable, NeighborTable, mark_valid
from .indices import StagePartition


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


def _ranges(part: _lib.PlanPartition) -> tuple:
    return tuple((r.offset, r.size) for r in (part.gather, part.scatter, part.slot_window, part.slot_coord))


_STAGE_RANGES = ("position", "cu_seqlens", "neighbors", "keys", "key_cu_seqlens", "query_slot", "key_gather", "embed",
                 "unit_rank")


def _layout(info: _lib.TwinsInfo, per_sample: bool, patch_grid: Tuple[int, int], sr: Sequence[int]) -> tuple:
    """The arena's layout as plain Python data (picklable)."""
    stages = []
    for k in range(info.num_stages):
        st = info.stage[k]
        p = st.lsa
        lsa = (p.group_size, p.num_groups, p.num_windows, p.window, p.shift, p.budget_exhausted, p.cost,
               p.lower_bound, p.plan_us, _ranges(p))
        ranges = tuple((getattr(st, n).offset, getattr(st, n).size) for n in _STAGE_RANGES)
        stages.append((st.height, st.width, st.num_tokens, st.num_keys, st.max_tokens, st.max_keys, bool(st.uniform),
                       bool(st.key_holes), bool(st.embed_holes), lsa, ranges, int(sr[k]), int(st.reshape)))
    return (per_sample, int(info.num_masks), patch_grid, float(info.build_us), tuple(stages))


class TwinsPlan(ArenaPlan):
    """Everything a visible-token Twins needs for one mask (or a batch of per-sample masks).

    ``stages[i]`` is a :class:`TwinsStagePlan`; ``patch_index`` the visible patches (stage 1's
    positions); ``per_sample``, ``num_masks``, ``patch_grid`` as :class:`greenmim.MaskPlan`."""

    def __init__(self, arena: Tensor, layout: tuple):
        super().__init__(arena, layout)
        self.per_sample, self.num_masks, self.patch_grid, self.build_us = layout[:4]

    def _build_stages(self) -> List["TwinsStagePlan"]:
        arena, layout = self.arena, self.layout
        per_sample, num_masks, patch_grid, build_us, stages = layout
        view = arena_views(arena, self._ranges(layout))    # every array of the arena, in arena order
        out: List[TwinsStagePlan] = []
        for (H, W, N, K, max_n, max_k, uniform, key_holes, embed_holes, lsa, ranges, sr, reshape) in stages:
            G, ng, nw, win, sh, exhausted, cost, lb, us, arrays = lsa
            g, sc, sw, co = (view(r) for r in arrays)
            part = StagePartition(g, sc, sw, co, None, group_size=G, num_groups=ng, num_tokens=N, window=win, shift=sh,
                                  cost=cost, lower_bound=lb, plan_us=us, budget_exhausted=bool(exhausted))
            pos, cu, nbr, keys, key_cu, q_slot, k_gather, embed, rank = (view(r) for r in ranges)
            cu = cu if per_sample else None
            nt = NeighborTable(nbr.view(N, 9), (H, W), pos, cu)
            kt = BlockTable(keys.view(-1, sr * sr), sr, N, key_holes, (H // sr, W // sr), None,
                            key_cu if per_sample else None, reshape=bool(reshape & 1)) if sr > 1 else None
            et = BlockTable(embed.view(-1, 4), 2, N, embed_holes, (H // 2, W // 2),
                            reshape=bool(reshape & 2)) if ranges[7][1] else None
            for t in (nt, kt, et):
                if t is not None:
                    mark_valid(t)
            out.append(TwinsStagePlan(
                grid=(H, W), partition=part, neighbors=nt, keys=kt, embed=et, position=pos, cu_seqlens=cu,
                key_cu_seqlens=key_cu if per_sample else None, num_keys=K, max_tokens=max_n, max_keys=max_k,
                uniform=uniform, query_slot=q_slot if ranges[5][1] else None,
                key_gather=k_gather if ranges[6][1] else None, sr=sr,
                unit_rank=rank.view(num_masks, H * W) if ranges[8][1] else None, num_masks=num_masks))
        for i in range(len(out) - 1):           # the next stage's tokens are the embedding's outputs
            nxt = out[i + 1]
            out[i].embed.position, out[i].embed.cu_seqlens = nxt.position, nxt.cu_seqlens
        return out

    # ---- the arena layout, for ArenaPlan's padded() / shape_key() ---------------------------------

    @staticmethod
    def _ranges(layout: tuple):
        return (r for st in layout[4] for r in (*st[9][9], *st[10]))

    @staticmethod
    def _partitions(layout: tuple):
        return tuple((st[9],) for st in layout[4])

    @staticmethod
    def _relayout(layout: tuple, counts, new, exhausted=None) -> tuple:
        per_sample, num_masks, patch_grid, build_us, stages = layout
        out = []
        for st, (n,) in zip(stages, counts):
            lsa = st[9]
            lsa = (lsa[0], n, *lsa[2:5], lsa[5] if exhausted is None else exhausted, *lsa[6:9],
                   tuple(new(r) for r in lsa[9]))
            out.append((*st[:9], lsa, tuple(new(r) for r in st[10]), *st[11:]))
        return (per_sample, num_masks, patch_grid, build_us, tuple(out))

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
    host, per_sample, device, cap = indices.plan_inputs(visible, strategy, img_size, patch_size, max_group_size,
                                                        device)
    S = len(windows)
    if not (len(sr_ratios) == len(channels) == S) or not 1 <= S <= _lib.GMH_MAX_STAGES:
        raise GreenmimError(f"greenmim: windows, sr_ratios and channels need one entry per stage (1..8), got "
                            f"{len(windows)}, {len(sr_ratios)}, {len(channels)}")
    geo = (img_size, patch_size, tuple(windows), tuple(sr_ratios), tuple(channels), strategy, group_size, cap)
    if cache:
        key = ("twins", host.numpy().tobytes(), tuple(host.shape), per_sample, geo, str(device))
        hit = indices._plan_cache.get(key)
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
    plan = TwinsPlan(arena, _layout(info, per_sample, (grid, grid), sr_ratios)).to(device)
    if cache:
        indices._plan_cache.put(key, plan)
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
