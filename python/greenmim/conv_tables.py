"""Index tables of the convolutions on visible tokens, from masks (sparse_conv.hpp's builders).

- :func:`neighbor_table` ``(visible, kernel=3)``: the k x k submanifold table ``[N, k*k]`` of a
  stage mask (``-1``: the neighbour is masked or outside the grid), for
  :func:`greenmim.ops.submanifold_depthwise_conv`.
- :func:`block_table` ``(visible, stride)``: the kernel = stride block table ``[N_next, s*s]``
  for :func:`greenmim.ops.block_conv`. **Output rule:** a block is an output when any of its inputs
  is visible (spconv's rule for a strided sparse conv); its masked inputs are ``-1`` and read as
  zero, so the output equals the dense conv over the zero-filled grid at that cell. With mask
  units that cover whole blocks (GreenMIM's 32 px units and Twins' strides) every block is
  wholly visible or wholly masked and any rule gives the same table.

``visible`` is a bool stage mask at token resolution, ``[H, W]`` (shared by the batch: tables
index the visible tokens of one sample, row-major) or ``[B, H, W]`` (per-sample masks: the flat
``[1, sum N_b, C]`` layout, sample-major). Tables are int32 tensors on ``device`` (default: the
mask's), built on the host and cached with the mask plans (:func:`greenmim.clear_cache`).
"""
from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib, mask_plan
from ._lib import GreenmimError


@dataclass(eq=False)
class NeighborTable:
    """k x k submanifold neighbour table (k odd): ``nbr[t, o]`` is the token at offset ``o``
    (row-major over the stencil, ``o = (dh + k/2) * k + dw + k/2``) of token ``t``, or -1."""
    nbr: Tensor                         # [N, 9] int32
    grid: Tuple[int, int]
    position: Optional[Tensor] = None   # [N] flat positions (b*H*W + h*W + w with per-sample masks)
    cu_seqlens: Optional[Tensor] = None  # [B+1] with per-sample masks

    @property
    def num_tokens(self) -> int:
        return self.nbr.shape[0]

    @property
    def kernel(self) -> int:
        """k (the table has k*k entries per token)."""
        return round(self.nbr.shape[1] ** 0.5)


@dataclass(eq=False)
class BlockTable:
    """kernel = stride = ``stride`` block table: ``gather[n, i*s + j]`` is the input token at
    ``(s*bh + i, s*bw + j)`` of output ``n``, or -1 (masked: reads zero).

    ``reshape``: every input is in one block and output ``n``'s tap ``(i, j)`` is token
    ``n*s*s + morton_rank(i, j)`` (Twins plans' block-major order with whole blocks), so the conv
    is ``x.view(B, N_next, s*s*C_in) @ W'`` with ``W'``'s taps in Morton order. Set by the plan
    builder, which checks it (twins_plan.hpp); a table whose claim changes after its check (or
    that no builder made) is checked again on its next use."""
    gather: Tensor                       # [N_next, s*s] int32
    stride: int
    num_inputs: int
    holes: bool                          # some block is partly visible (-1 entries)
    grid: Tuple[int, int] = (0, 0)       # the output grid (H/s, W/s)
    position: Optional[Tensor] = None    # [N_next] the outputs' flat positions on the output grid
    cu_seqlens: Optional[Tensor] = None  # [B+1] the outputs' per-sample offsets (per-sample masks)
    reshape: bool = False                # gather[n, i*s + j] == n*s*s + morton_rank(i, j): a view of x

    @property
    def num_outputs(self) -> int:
        return self.gather.shape[0]


# tables whose entries were checked (or built by us) -> the `reshape` claim that was checked with them
_valid: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def morton_rank(i: int, j: int) -> int:
    """The Z-order rank of ``(i, j)`` in a power-of-two cell: i's bits at the odd positions, j's at
    the even ones (twins_plan.hpp's ``morton_rank``; ``2 i + j`` in a 2x2 cell)."""
    r, b = 0, 0
    while (i >> b) or (j >> b):
        r |= (((j >> b) & 1) << (2 * b)) | (((i >> b) & 1) << (2 * b + 1))
        b += 1
    return r


def reshape_gather(num_outputs: int, stride: int, device=None) -> Tensor:
    """The gather table of a block table that is a reshape: ``[n, i*s + j] = n*s*s + morton_rank(i, j)``."""
    s = stride
    rank = torch.tensor([morton_rank(i, j) for i in range(s) for j in range(s)], dtype=torch.int32, device=device)
    return torch.arange(num_outputs, dtype=torch.int32, device=device).mul_(s * s).unsqueeze(1) + rank


def mark_valid(table) -> None:
    """Records a builder's table as checked. Not under torch.compile (where the check is skipped
    too): dynamo would trace the store into the weak cache and guard on its keys, which the
    collector changes between calls."""
    if torch.compiler.is_compiling():
        return
    _valid[table] = getattr(table, "reshape", None)


def check_table_values(table) -> None:
    """Refuses a table with an entry outside [-1, N) or (block tables) an input in two blocks,
    once per table object: the builders' tables are valid by construction, and the kernels would
    read a bad entry as zero rather than fail. Not under torch.compile: dynamo would guard on this
    cache's weak keys and recompile whenever a step's tables are freed (every step); the eager
    call checks, and a compiled step's tables come from the builders or a plan."""
    if torch.compiler.is_compiling():
        return
    if table in _valid and _valid[table] == getattr(table, "reshape", None):
        return                          # checked, and its reshape claim has not changed since
    t = table.nbr if isinstance(table, NeighborTable) else table.gather
    n = table.num_tokens if isinstance(table, NeighborTable) else table.num_inputs
    flat = t.reshape(-1).long()
    bad = flat.numel() > 0 and (int(flat.min()) < -1 or int(flat.max()) >= n)
    if not bad and isinstance(table, BlockTable):
        real = flat[flat >= 0]
        bad = real.unique().numel() != real.numel()
        if not bad and bool((flat < 0).any()) and not table.holes:
            raise GreenmimError("greenmim: block conv: the table has -1 entries but says holes=False")
        if not bad and table.reshape and (table.num_outputs * table.stride ** 2 != n or not torch.equal(
                t, reshape_gather(table.num_outputs, table.stride, t.device))):
            raise GreenmimError("greenmim: block conv: the table says reshape=True but output n's taps are not the "
                                "tokens n*s*s + Morton rank (only a Twins plan's tables with whole blocks are)")
    if bad:
        kind = "neighbour" if isinstance(table, NeighborTable) else "block"
        raise GreenmimError(f"greenmim: the {kind} table has entries outside [-1, {n}) or an input in two blocks "
                            f"(a table of another mask, or modified?)")
    mark_valid(table)


def _host_mask(visible: Tensor) -> Tuple[Tensor, bool]:
    if not isinstance(visible, Tensor) or visible.dtype != torch.bool or visible.dim() not in (2, 3):
        raise GreenmimError("greenmim: a stage mask is a bool tensor [H, W] (shared) or [B, H, W] (per sample), "
                            f"got {getattr(visible, 'dtype', type(visible).__name__)} "
                            f"{tuple(getattr(visible, 'shape', ()))}")
    per_sample = visible.dim() == 3
    host = visible.detach().to("cpu", torch.uint8)
    return (host if per_sample else host.unsqueeze(0)).contiguous(), per_sample


class BuiltTable:
    """A table the library built from a uint8 ``[M, H, W]`` host mask and holds until it is
    copied: its sizes first (``rows``: ``(N, entries per row)``, ``num_masks``, ``num_inputs``,
    ``holes``), then :meth:`copy_into` the caller's int32 buffers (views of one arena, say), with
    no buffer of torch's in between. ``with BuiltTable(...) as t:`` frees it."""

    def __init__(self, host: Tensor, per_sample: bool, kind: int, size: int):
        self.lib = _lib.host()
        M, H, W = host.shape
        a = _lib.ConvTableArgs(host.data_ptr(), M, H, W, int(per_sample), kind, size)
        self.handle, info = ctypes.c_void_p(), _lib.ConvTableInfo()
        self.what = "neighbour table" if kind == _lib.GMH_NEIGHBOR_TABLE else "block table"
        _lib.host_check(self.lib.gmh_conv_table_build(ctypes.byref(a), ctypes.byref(self.handle), ctypes.byref(info)),
                        self.what)
        self.rows, self.num_masks = (info.num_outputs, info.row), M
        self.num_inputs, self.holes = int(info.num_inputs), bool(info.holes)

    def copy_into(self, entries: Optional[Tensor], cu_seqlens: Optional[Tensor], position: Optional[Tensor]) -> None:
        """The entries ``[N, row]``, the outputs' ``cu_seqlens`` ``[M+1]`` and positions ``[N]``,
        each into a contiguous int32 CPU tensor of that size (None: not copied)."""
        want = ((entries, self.rows[0] * self.rows[1]), (cu_seqlens, self.num_masks + 1), (position, self.rows[0]))
        for t, n in want:
            if t is not None and (t.dtype != torch.int32 or t.device.type != "cpu" or not t.is_contiguous()
                                  or t.numel() != n):
                raise GreenmimError(f"greenmim: {self.what}: copy_into takes contiguous int32 CPU tensors of "
                                    f"{[n for _, n in want]} entries")
        ptr = [t.data_ptr() if t is not None else None for t, _ in want]
        _lib.host_check(self.lib.gmh_conv_table_copy(self.handle, *ptr), self.what)

    def __enter__(self) -> "BuiltTable":
        return self

    def __exit__(self, *exc) -> None:
        if self.handle:
            self.lib.gmh_conv_table_free(self.handle)
            self.handle = ctypes.c_void_p()


def host_table(host: Tensor, per_sample: bool, kind: int, size: int) -> Tuple[Tensor, Tensor, Tensor, int, bool]:
    """One table of a uint8 ``[M, H, W]`` host mask, by the library's builder: ``(entries [N, row],
    cu_seqlens [M+1], position [N], num_inputs, holes)``, int32 CPU tensors (what
    :func:`neighbor_table` and :func:`block_table` are made of)."""
    with BuiltTable(host, per_sample, kind, size) as t:
        entries = torch.empty(t.rows, dtype=torch.int32)
        cu = torch.empty(t.num_masks + 1, dtype=torch.int32)
        pos = torch.empty(t.rows[0], dtype=torch.int32)
        t.copy_into(entries, cu, pos)
        return entries, cu, pos, t.num_inputs, t.holes


def _build(visible: Tensor, kind: int, size: int, device, cache: bool):
    host, per_sample = _host_mask(visible)
    device = torch.device(device) if device is not None else visible.device
    key = ("conv_table", host.numpy().tobytes(), tuple(host.shape), per_sample, kind, size, str(device))
    if cache:
        hit = mask_plan.plan_cache.get(key)
        if hit is not None:
            return hit
    M, H, W = host.shape
    entries, cu, pos, num_inputs, holes = host_table(host, per_sample, kind, size)
    rows = entries.shape
    arena = torch.cat([entries.view(-1), cu, pos]).to(device)   # one copy to the device
    entries, cu, pos = arena.split([entries.numel(), cu.numel(), pos.numel()])
    entries = entries.view(rows)
    cu = cu if per_sample else None
    if kind == _lib.GMH_NEIGHBOR_TABLE:
        table = NeighborTable(entries, (H, W), pos, cu)
    else:
        table = BlockTable(entries, size, num_inputs, holes, (H // size, W // size), pos, cu)
    mark_valid(table)
    if cache:
        mask_plan.plan_cache.put(key, table)
    return table


def neighbor_table(visible: Tensor, device=None, cache: bool = True, kernel: int = 3) -> NeighborTable:
    """The k x k submanifold neighbour table (``kernel`` = k, odd, 1..15; 3: Twins' PEG, 7:
    ConvNeXt) of a stage mask (bool ``[H, W]`` or ``[B, H, W]``, True = visible, token
    resolution)."""
    k = int(kernel)
    if k != kernel or k < 1 or k > 15 or k % 2 == 0:
        raise GreenmimError(f"greenmim: neighbour table: the kernel must be odd, 1..15, got {kernel!r}")
    return _build(visible, _lib.GMH_NEIGHBOR_TABLE, k, device, cache)


def block_table(visible: Tensor, stride: int, device=None, cache: bool = True) -> BlockTable:
    """The kernel = stride block table of a stage mask (bool ``[H, W]`` or ``[B, H, W]``, token
    resolution; ``stride`` divides H and W): an output for every block with a visible input."""
    return _build(visible, _lib.GMH_BLOCK_TABLE, int(stride), device, cache)
