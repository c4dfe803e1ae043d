"""From a mask to what every stage of a visible-token encoder needs.

:func:`plan_masks` turns one shared mask ``[h, w]`` or per-sample masks ``[B, h, w]`` (True =
visible, at mask-unit or patch resolution) into a :class:`MaskPlan`: per stage, the visible
tokens, the partition indices for the plain and the shifted windows (planned by the C++
planner), and the patch-merging indices to the next stage. Token order: row-major (h, w) within
a sample; with per-sample masks the token axis is all samples' tokens, sample-major (batch
extent 1, ``cu_seqlens`` style).

On CUDA the partition indices are built on the device (kernels.h: select visible, count window
sizes, build partition); only the window sizes travel to the host for the planner. Results are
cached per (mask, stage geometry, shift, planner settings, device).
"""
from __future__ import annotations

import collections
import ctypes
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _backend, _lib
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
    token_window: Tensor
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
    def gap(self) -> float:
        """Relative gap of the plan's cost to the planner's lower bound on any plan."""
        return (self.cost - self.lower_bound) / self.lower_bound if self.lower_bound > 0 else 0.0


@dataclass(eq=False)
class StagePlan:
    """One stage: its token grid, visible tokens, partitions and merge indices."""
    grid: Tuple[int, int]
    partitions: Tuple[StagePartition, StagePartition]  # (plain windows, shifted windows)
    merge: Optional[Tensor]              # [N_next, 4] int64 into this stage's token axis, or None
    cu_seqlens: Optional[Tensor]         # [B+1] int64 (per-sample masks), None when shared
    visible: Tensor = field(repr=False)  # [M, H, W] bool on the host

    @property
    def num_tokens(self) -> int:
        """Length of the token axis (per sample with a shared mask)."""
        return self.partitions[0].num_tokens


@dataclass(eq=False)
class MaskPlan:
    """Everything a visible-token encoder needs for one mask (or one batch of per-sample masks)."""
    per_sample: bool
    num_masks: int
    patch_grid: Tuple[int, int]
    patch_index: Tensor                  # [N_0] int64: flat patch position (b*H*W + h*W + w per-sample)
    stages: List[StagePlan]


def window_geometry(height: int, width: int, window: int, shift: int) -> Tuple[int, int, int]:
    """(window, shift, number of windows) a stage really uses: Swin's small-stage rule (as timm:
    a grid no larger than the window is one window, no shift), from the C++ geometry.hpp."""
    w, sh, n = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
    _lib.host_check(_lib.host().gmh_window_geometry(height, width, window, shift, ctypes.byref(w), ctypes.byref(sh),
                                                    ctypes.byref(n)), "window geometry")
    return w.value, sh.value, n.value


_cache_lock = threading.Lock()
_cache: "collections.OrderedDict[tuple, StagePartition]" = collections.OrderedDict()
CACHE_SIZE = 256


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


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
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
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
        with _cache_lock:
            _cache[key] = part
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
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


def _stage1_mask(visible: Tensor, grid: Tuple[int, int]) -> Tensor:
    h, w = visible.shape[-2:]
    if grid[0] % h or grid[1] % w:
        raise GreenmimError(f"greenmim: a {h}x{w} mask does not tile the {grid[0]}x{grid[1]} patch grid "
                            f"(give it at mask-unit or patch resolution)")
    fh, fw = grid[0] // h, grid[1] // w
    return visible.repeat_interleave(fh, dim=-2).repeat_interleave(fw, dim=-1)


def plan_masks(visible: Tensor, *, img_size: int = 224, patch_size: int = 4, window_size: int = 7,
               num_stages: int = 4, embed_dim: int = 128, strategy: str = "fast", device=None,
               cache: bool = True, max_group_size: Optional[int] = None) -> MaskPlan:
    """Plans every stage of a Swin-like encoder for a mask.

    ``visible``: bool ``[h, w]`` (one mask shared by the batch, the paper's setting) or
    ``[B, h, w]`` (per-sample masks), True = visible, at mask-unit (e.g. 7x7 for 32 px units at
    224 px) or patch resolution. Stage s has a ``(img/patch) / 2^s`` token grid, C = embed_dim
    * 2^s (the planner's cost model), windows of ``window_size`` shifted by half on odd blocks.
    The result lives on ``device`` (default: the mask's). ``max_group_size``: see
    :func:`stage_partition` (default: G kept on the tensor-core kernels where windows allow)."""
    if not isinstance(visible, Tensor) or visible.dtype != torch.bool:
        raise GreenmimError("greenmim: the mask must be a bool tensor (True = visible)")
    if visible.dim() not in (2, 3):
        raise GreenmimError(f"greenmim: the mask is [h, w] (shared) or [B, h, w] (per sample), "
                            f"got {tuple(visible.shape)}")
    if img_size % patch_size:
        raise GreenmimError(f"greenmim: image {img_size} is not a multiple of the patch {patch_size}")
    g0 = img_size // patch_size
    if g0 % (1 << (num_stages - 1)):
        raise GreenmimError(f"greenmim: the {g0}x{g0} patch grid does not halve {num_stages - 1} times")
    per_sample = visible.dim() == 3
    device = torch.device(device) if device is not None else visible.device
    m0 = _stage1_mask(visible.detach().to("cpu"), (g0, g0))
    m0 = m0 if per_sample else m0.unsqueeze(0)
    M = m0.shape[0]
    if not bool(m0.any()):
        raise GreenmimError("greenmim: the mask has no visible patch")
    stages: List[StagePlan] = []
    for s in range(num_stages):
        ms = m0[:, :: 1 << s, :: 1 << s].contiguous()
        H = W = g0 >> s
        C = embed_dim << s
        arg = ms if per_sample else ms[0]
        plain = stage_partition(arg, window_size, 0, C, strategy, device=device, cache=cache,
                                max_group_size=max_group_size)
        shifted = stage_partition(arg, window_size, window_size // 2, C, strategy, device=device, cache=cache,
                                  max_group_size=max_group_size)
        merge = merge_indices(arg, device) if s + 1 < num_stages else None
        counts = ms.flatten(1).sum(1)
        cu = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(device) if per_sample else None
        stages.append(StagePlan(grid=(H, W), partitions=(plain, shifted), merge=merge,
                                cu_seqlens=cu, visible=ms))
    flat = m0.flatten() if per_sample else m0[0].flatten()
    patch_index = torch.nonzero(flat).flatten().to(device)
    return MaskPlan(per_sample=per_sample, num_masks=M, patch_grid=(g0, g0), patch_index=patch_index, stages=stages)


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
