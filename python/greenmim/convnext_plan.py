"""The plan of a visible-token ConvNeXt V2 (FCMAE's encoder): every table of a batch of
per-sample masks of 32-px units, in one int32 arena.

:func:`plan_convnext` builds, per stage (token grid ``H/4 >> s``), with the library's table
builders (``sparse_conv.hpp``):

- the visible tokens' flat positions, per-sample offsets ``cu_seqlens`` and the sample of each
  token (GRN's per-sample norm, drop path);
- the k x k submanifold neighbour table (the 7x7 depthwise conv);
- stages 2-4: the 2x2 block table from the stage before (the downsampling conv). With 32-px
  units every 2x2 block is wholly visible or wholly masked, so its outputs are exactly the
  stage's visible tokens (checked when built);
- the last stage (the unit grid): the unit masks themselves, which the decoder and the loss read.

Tokens are sample-major, row-major within a sample. All of it is one tensor described by a
picklable layout (:class:`ConvNeXtPlan`, an :class:`~greenmim._arena.ArenaPlan` like
:class:`greenmim.MaskPlan` and :class:`greenmim.TwinsPlan`): a DataLoader worker builds it, the
main process moves one buffer (``.to()``, ``.pin_memory()``), and a CUDA graph captured on one
plan replays on another of the same shapes (``copy_``). Per-sample masks at a fixed ratio keep
every sample's unit count, so every plan of a run has the same shapes: one graph, and one
``torch.compile`` graph, serve every mask (there are no groups to pad: ``group_counts`` is
empty, ``padded`` returns the plan).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib, mask_plan
from ._arena import ArenaPlan, PlanLayout, StageLayout, arena_views
from ._lib import GreenmimError
from .conv_tables import BlockTable, BuiltTable, NeighborTable, mark_valid

__all__ = ["ConvNeXtStagePlan", "ConvNeXtPlan", "ConvNeXtPlanSpec", "plan_convnext", "MASK_UNIT"]

MASK_UNIT = 32   # pixels a side of FCMAE's mask unit
STEM = 4         # the stem's patch (4x4, stride 4)
STAGES = 4


@dataclass(eq=False)
class ConvNeXtStagePlan:
    """One stage's tables (int32 views of the plan's arena): the k x k neighbour table of its
    visible tokens, and (stages 2-4) the 2x2 block table from the stage before."""
    grid: Tuple[int, int]
    nbr: NeighborTable
    down: Optional[BlockTable]   # into this stage; None at stage 1
    sample_of_token: Tensor      # [N] the sample of each token
    cu_seqlens: Tensor           # [B+1]
    position: Tensor             # [N] b * h * w + row * w + col
    partitions: tuple = ()       # no attention partitions (ArenaPlan.copy_ walks them)

    @property
    def num_tokens(self) -> int:
        return self.nbr.num_tokens


class ConvNeXtStageLayout(StageLayout):
    """One stage of a :class:`ConvNeXtPlan`'s layout: token grid and count, the neighbour
    table's k, the downsampling table's inputs and holes, and the ranges of its arrays."""
    __slots__ = ()
    _range_fields = ("position", "cu_seqlens", "sample_of_token", "neighbors", "down", "units")
    _fields = ("height", "width", "num_tokens", "kernel", "down_inputs", "down_holes") + _range_fields

    def partition_layouts(self) -> tuple:
        return ()

    def with_partition_layouts(self, parts) -> "ConvNeXtStageLayout":
        return self


class ConvNeXtPlan(ArenaPlan):
    """Everything a visible-token ConvNeXt V2 needs for a batch of per-sample unit masks.

    ``stages[s]`` is a :class:`ConvNeXtStagePlan`; ``num_masks`` the batch; ``image_size`` (H, W);
    ``patch_position`` the visible 4x4 patches (stage 1's positions); ``visible`` the unit masks
    ``[B, H/32, W/32]`` (bool, on the plan's device); ``num_visible`` the visible units of the
    batch (from the layout: no read of the device)."""

    @property
    def image_size(self) -> Tuple[int, int]:
        return self.patch_grid[0] * STEM, self.patch_grid[1] * STEM

    @property
    def patch_position(self) -> Tensor:
        return self.stages[0].position

    @property
    def kernel(self) -> int:
        return self.layout.stages[0].kernel

    @property
    def visible(self) -> Tensor:
        last = self.layout.stages[-1]
        units = arena_views(self.arena, self._ranges(self.layout))(last.units)
        return units.view(self.num_masks, last.height, last.width) != 0

    @property
    def num_visible(self) -> int:
        return self.layout.stages[-1].num_tokens

    def _build_stages(self) -> List[ConvNeXtStagePlan]:
        view = arena_views(self.arena, self._ranges(self.layout))
        out = []
        for st in self.layout.stages:
            H, W, N, k = st.height, st.width, st.num_tokens, st.kernel
            pos, cu = view(st.position), view(st.cu_seqlens)
            nbr = NeighborTable(view(st.neighbors).view(N, k * k), (H, W), pos, cu)
            down = BlockTable(view(st.down).view(N, 4), 2, st.down_inputs, st.down_holes, (H, W), pos, cu) \
                if st.down[1] else None
            for t in (nbr, down):
                if t is not None:
                    mark_valid(t)
            out.append(ConvNeXtStagePlan((H, W), nbr, down, view(st.sample_of_token), cu, pos))
        return out

    def mark_dynamic(self) -> "ConvNeXtPlan":
        """Nothing to mark: at a fixed mask ratio every plan of a run has the same shapes."""
        return self

    def __repr__(self) -> str:
        return (f"ConvNeXtPlan({self.num_masks} per-sample masks, {self.image_size[0]}x{self.image_size[1]} px, "
                f"{self.kernel}x{self.kernel}, tokens {[s.num_tokens for s in self.layout.stages]}, "
                f"{self.arena.numel() * 4 / 1024:.1f} KiB on {self.device})")


def _unit_masks(visible: Tensor, image_size: Tuple[int, int], batch: Optional[int]) -> Tensor:
    H, W = image_size
    g = (H // MASK_UNIT, W // MASK_UNIT)
    ok = isinstance(visible, Tensor) and visible.dtype == torch.bool and H % MASK_UNIT == 0 and \
        W % MASK_UNIT == 0 and H > 0 and W > 0 and visible.dim() in (2, 3) and tuple(visible.shape[-2:]) == g
    if ok and visible.dim() == 2:
        if batch is None:
            raise GreenmimError("greenmim: a ConvNeXt V2 plan is per sample: a shared [h, w] mask needs batch=")
        visible = visible.expand(int(batch), -1, -1)
    if not ok or visible.shape[0] < 1:
        raise GreenmimError(f"greenmim: ConvNeXt V2 masks are bool [B, H/32, W/32] (or a shared [H/32, W/32] with "
                            f"batch=) for {H}x{W} images (multiples of {MASK_UNIT}), got "
                            f"{getattr(visible, 'dtype', type(visible).__name__)} "
                            f"{tuple(getattr(visible, 'shape', ()))}")
    return visible.detach().to("cpu", torch.uint8).contiguous()


def plan_convnext(visible: Tensor, image_size, kernel: int = 7, device=None, cache: bool = True,
                  batch: Optional[int] = None) -> ConvNeXtPlan:
    """The plan of per-sample unit masks ``visible`` (bool ``[B, H/32, W/32]``, True = visible; or
    one ``[H/32, W/32]`` mask for each of ``batch`` samples) for images of ``image_size`` (an int
    or (H, W)), with k x k depthwise convs (``kernel`` odd, 1..15). Built on the host, then moved
    to ``device`` (default: the mask's) in one copy; cached with the mask plans unless ``cache``
    is False (the trainer's workers plan fresh masks)."""
    H, W = (image_size, image_size) if isinstance(image_size, int) else tuple(int(v) for v in image_size)
    k = int(kernel) if isinstance(kernel, int) else -1
    if k < 1 or k > 15 or k % 2 == 0:
        raise GreenmimError(f"greenmim: ConvNeXt V2 plan: the kernel must be odd, 1..15, got {kernel!r}")
    host = _unit_masks(visible, (H, W), batch)
    device = torch.device(device) if device is not None else visible.device
    if cache:
        key = ("convnext", host.numpy().tobytes(), tuple(host.shape), (H, W), k, str(device))
        hit = mask_plan.plan_cache.get(key)
        if hit is not None:
            return hit
    t0 = time.perf_counter()
    B = host.shape[0]
    with contextlib.ExitStack() as held:
        # the library builds every table first; their sizes lay out the arena, which is allocated
        # once and filled by copies straight into its views (no torch buffer, no concatenation)
        grids, nbrs, downs = [], [], []
        for s in range(STAGES):
            r = (MASK_UNIT // STEM) >> s
            vs = host.repeat_interleave(r, 1).repeat_interleave(r, 2)          # [B, H/4 >> s, W/4 >> s]
            nbrs.append(held.enter_context(BuiltTable(vs, True, _lib.GMH_NEIGHBOR_TABLE, k)))
            downs.append(held.enter_context(BuiltTable(grids[-1], True, _lib.GMH_BLOCK_TABLE, 2)) if s else None)
            grids.append(vs)
        at, stages = 0, []

        def take(n: int) -> Tuple[int, int]:
            nonlocal at
            at += n
            return at - n, n

        for s, (vs, nbr, down) in enumerate(zip(grids, nbrs, downs)):
            N = nbr.rows[0]
            ranges = dict(position=take(N), cu_seqlens=take(B + 1), sample_of_token=take(N), neighbors=take(N * k * k),
                          down=take(N * 4 if down is not None else 0),
                          units=take(host.numel() if s == STAGES - 1 else 0))
            stages.append(ConvNeXtStageLayout.of(height=vs.shape[1], width=vs.shape[2], num_tokens=N, kernel=k,
                                                 down_inputs=down.num_inputs if down is not None else 0,
                                                 down_holes=down.holes if down is not None else False, **ranges))
        arena = torch.empty(at, dtype=torch.int32)
        view = arena_views(arena, [r for st in stages for r in st.ranges()])
        for s, (st, nbr, down) in enumerate(zip(stages, nbrs, downs)):
            pos, cu = view(st.position), view(st.cu_seqlens)
            nbr.copy_into(view(st.neighbors), cu, pos)
            view(st.sample_of_token).copy_(torch.repeat_interleave(torch.arange(B, dtype=torch.int32), cu.diff().long()))
            if down is not None:
                dcu, dpos = torch.empty_like(cu), torch.empty_like(pos)
                down.copy_into(view(st.down), dcu, dpos)
                if down.num_inputs != stages[s - 1].num_tokens or not (torch.equal(dpos, pos) and torch.equal(dcu, cu)):
                    raise GreenmimError("greenmim: ConvNeXt V2 plan: the downsampling's outputs are not the next "
                                        "stage's visible tokens (masks must be of whole 32-px units)")
            if st.units[1]:
                view(st.units).copy_(host.reshape(-1))
    layout = PlanLayout.of(per_sample=True, num_masks=B, patch_grid=(H // STEM, W // STEM),
                           build_us=(time.perf_counter() - t0) * 1e6, stages=tuple(stages))
    plan = ConvNeXtPlan(arena, layout).to(device)
    if cache:
        mask_plan.plan_cache.put(key, plan)
    return plan


@dataclass(frozen=True)
class ConvNeXtPlanSpec:
    """What planning needs of a ConvNeXt V2 encoder, picklable (the trainer's DataLoader workers
    plan with it). ``fixed_shapes``: every plan of a run has the same shapes (nothing to pad)."""
    img_size: int
    kernel: int = 7
    fixed_shapes = True

    def plan(self, visible: Tensor, device=None, cache: bool = True, batch: Optional[int] = None) -> ConvNeXtPlan:
        return plan_convnext(visible, self.img_size, self.kernel, device=device, cache=cache, batch=batch)
