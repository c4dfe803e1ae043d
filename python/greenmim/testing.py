"""Tools for tests and benchmarks, not a product path: the per-stage index builders.

The product builds every stage of a plan in one library call (:func:`greenmim.plan_masks`, C++
``encoder_plan.hpp``). The builders here plan and index one stage at a time over the reference
headers (``windows.hpp``, ``partition.hpp``, ``merging.hpp``) that the encoder planner is tested
against, and on CUDA (or the emulator) through the kernels' device-side index building
(``kernels.h``: select visible, count window sizes, build partition), with one host round trip per
stage and shift. Tests use them to check plans and ops stage by stage; ``bench/`` times them.

    from greenmim.testing import stage_partition, merge_indices, window_geometry
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import _device, _lib
from ._lib import GreenmimError
from .mask_plan import StagePartition, partition_cache, window_geometry

__all__ = ["stage_partition", "merge_indices", "window_geometry"]


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
           str(device), _device.emulating())
    if cache:
        hit = partition_cache.get(key)
        if hit is not None:
            return hit
    if max_group_size is None:  # (resolved on a miss only: a hit costs no library call)
        auto = strategy in ("fast", "paper") and group_size == 0
        eff = window_geometry(visible.shape[-2], visible.shape[-1], window, shift)[0]
        max_group_size = _lib.host().gmh_fast_path_max_group(eff) if auto else 0
    if device.type == "cuda" or (device.type == "cpu" and _device.emulating()):
        part = _device_partition(visible.to(device, torch.uint8).contiguous(), window, shift, channels, strategy,
                                 group_size, max_group_size)
    else:
        part = _host_partition(host, window, shift, channels, strategy, group_size, max_group_size, device)
    if cache:
        partition_cache.put(key, part)
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
    stream = _device.stream(mask)
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
    temp, temp_ptr = _device.device_buffer(tmp.value, mask)
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
    temp, temp_ptr = _device.device_buffer(tmp.value, mask)
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


