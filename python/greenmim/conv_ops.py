"""Convolutions on visible tokens (Twins' PEG, GSA sub-sampling and patch embedding) as torch
custom ops, with fakes and registered autograd like the attention (ops.py), so
``torch.compile(fullgraph=True)`` traces them as opaque nodes.

- ``submanifold_depthwise_conv(x, table, weight, bias=None, residual=False)``: the k x k
  depthwise conv (k odd, stride 1, padding k/2: Twins' PEG 3x3, ConvNeXt's 7x7) at the visible
  tokens, masked neighbours and sites outside the grid read as zero; ``residual`` adds ``x``
  (Twins' ``PosConv``). ``table`` is a :class:`greenmim.conv_tables.NeighborTable` of the same k.
  ``submanifold_depthwise_conv3x3`` is the same with a 3x3 weight. The ops keep their first
  names (``greenmim::depthwise_conv3x3_fwd`` / ``_bwd``) and take any odd k.
- ``block_conv(x, table, weight, bias=None)``: the kernel = stride = s conv, ``[B, N, C_in] ->
  [B, N_next, C_out]``; an output exists for every s x s block with a visible input (spconv's
  rule) and its masked inputs read as zero. ``table`` is a :class:`greenmim.conv_tables.BlockTable`.

Both equal a dense ``torch.nn.functional.conv2d`` over the zero-filled grid, read at the output
cells. Weights are the dense ``nn.Conv2d`` parameters (``[C, 1, k, k]``, ``[C_out, C_in, s, s]``).

Where they run: a block table that is a reshape (a Twins plan's, whole blocks in block-major
order) makes the block conv one ``F.linear`` over a view of x, on every device. Otherwise CUDA
tensors (fp32/fp16/bf16; weights float32) run on the kernels, except the block
conv, which by default gathers x's rows and runs cuBLAS's GEMMs inside its op (1.3-3.1x faster
forwards than its fused gather-GEMM kernels on an H200; ``algo="fused"`` takes the kernels); CPU tensors in
float32/float64, the depthwise conv on the Eigen reference, the block conv eagerly as torch's
gather + GEMM (faster than the reference's loops; ``algo="reference"`` or ``torch.compile``
take the reference); ``emulate_cuda()`` sends CPU tensors through the kernels on the emulator.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _conv_abi as cb, _device, _dispatch
from .conv_tables import BlockTable, NeighborTable, check_table_values
from ._device import check_devices
from ._lib import GreenmimError

ALGOS = ("auto", "reference", "fused")


def _need(ctx, i: int) -> bool:
    return bool(ctx.needs_input_grad[i])


def _fake_grads(x: Tensor, weight: Tensor, need_dw: bool, need_db: bool) -> Tuple[Tensor, Tensor]:
    dt = cb.grad_dtype(x)
    dw = weight.new_empty(weight.shape, dtype=dt) if need_dw else x.new_empty((0,))
    db = weight.new_empty((weight.shape[0],), dtype=dt) if need_db else x.new_empty((0,))
    return dw, db


def _grad_out(g: Tensor, like: Optional[Tensor], need: bool) -> Optional[Tensor]:
    return g.to(like.dtype) if need and like is not None else None


# ---- depthwise 3x3 (PEG) ------------------------------------------------------------------------

@_dispatch.op("depthwise_conv3x3_fwd")
def _dw_fwd(x: Tensor, nbr: Tensor, weight: Tensor, bias: Optional[Tensor], residual: bool) -> Tensor:
    cb.check_depthwise(x, nbr, weight, bias)
    return cb.depthwise_fwd(x, nbr, weight, bias, residual)


@_dw_fwd.register_fake
def _(x, nbr, weight, bias, residual):
    check_devices("depthwise conv 3x3", x, neighbor_table=nbr, weight=weight, bias=bias)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_dispatch.op("depthwise_conv3x3_bwd")
def _dw_bwd(dy: Tensor, x: Tensor, nbr: Tensor, weight: Tensor, residual: bool, need_dw: bool,
            need_db: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = cb.depthwise_bwd(dy, x, nbr, weight, residual, need_dw, need_db)
    return dx, dw if dw is not None else x.new_empty((0,)), db if db is not None else x.new_empty((0,))


@_dw_bwd.register_fake
def _(dy, x, nbr, weight, residual, need_dw, need_db):
    check_devices("depthwise conv 3x3 backward", x, dy=dy, neighbor_table=nbr, weight=weight)
    return (x.new_empty(x.shape), *_fake_grads(x, weight, need_dw, need_db))


def _dw_setup(ctx, inputs, output):
    x, nbr, weight, bias, residual = inputs
    ctx.save_for_backward(x, nbr, weight)
    ctx.residual, ctx.bias = residual, bias is not None


def _dw_backward(ctx, dy):
    x, nbr, weight = ctx.saved_tensors
    need_db = ctx.bias and _need(ctx, 3)
    dx, dw, db = _dispatch.call("depthwise_conv3x3_bwd", dy, x, nbr, weight, ctx.residual, _need(ctx, 2), need_db)
    return dx, None, _grad_out(dw, weight, _need(ctx, 2)), db.to(weight.dtype) if need_db else None, None


_dispatch.register_autograd("depthwise_conv3x3_fwd", _dw_backward, _dw_setup)


# ---- block conv, kernel = stride ----------------------------------------------------------------

@_dispatch.op("block_conv_fwd")
def _bc_fwd(x: Tensor, gather: Tensor, weight: Tensor, bias: Optional[Tensor], fused: bool) -> Tensor:
    cb.check_block(x, gather, weight, bias)
    return cb.block_fwd(x, gather, weight, bias, fused)


@_bc_fwd.register_fake
def _(x, gather, weight, bias, fused):
    check_devices("block conv", x, block_table=gather, weight=weight, bias=bias)
    return x.new_empty((x.shape[0], gather.shape[0], weight.shape[0]))


@_dispatch.op("block_conv_bwd")
def _bc_bwd(dy: Tensor, x: Tensor, gather: Tensor, weight: Tensor, need_dw: bool,
            need_db: bool, fused: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = cb.block_bwd(dy, x, gather, weight, need_dw, need_db, fused)
    return dx, dw if dw is not None else x.new_empty((0,)), db if db is not None else x.new_empty((0,))


@_bc_bwd.register_fake
def _(dy, x, gather, weight, need_dw, need_db, fused):
    check_devices("block conv backward", x, dy=dy, block_table=gather, weight=weight)
    return (x.new_empty(x.shape), *_fake_grads(x, weight, need_dw, need_db))


def _bc_setup(ctx, inputs, output):
    x, gather, weight, bias, fused = inputs
    ctx.save_for_backward(x, gather, weight)
    ctx.bias, ctx.fused = bias is not None, fused


def _bc_backward(ctx, dy):
    x, gather, weight = ctx.saved_tensors
    need_db = ctx.bias and _need(ctx, 3)
    dx, dw, db = _dispatch.call("block_conv_bwd", dy, x, gather, weight, _need(ctx, 2), need_db, ctx.fused)
    return dx, None, _grad_out(dw, weight, _need(ctx, 2)), db.to(weight.dtype) if need_db else None, None


_dispatch.register_autograd("block_conv_fwd", _bc_backward, _bc_setup)


# ---- public API ---------------------------------------------------------------------------------

def _check_algo(algo: str) -> None:
    if algo not in ALGOS:
        raise GreenmimError(f"greenmim: algo must be one of {ALGOS}, got {algo!r}")


def _torch_cpu(x: Tensor, algo: str) -> bool:
    """Eager CPU tensors with algo "auto" may run in torch's kernels; under torch.compile and
    emulation the custom op runs (opaque, its CPU kernel the reference)."""
    _check_algo(algo)
    return algo == "auto" and x.device.type == "cpu" and not _device.emulating() and \
        not torch.compiler.is_compiling()


def _autocast(x: Tensor) -> Tensor:
    """Under CUDA autocast a float32 input runs in the autocast dtype (as F.linear's outputs do)."""
    if x.device.type == "cuda" and x.dtype == torch.float32 and torch.is_autocast_enabled():
        return x.to(torch.get_autocast_gpu_dtype())
    return x


def submanifold_depthwise_conv(x: Tensor, table: NeighborTable, weight: Tensor, bias: Optional[Tensor] = None,
                               residual: bool = False, algo: str = "auto") -> Tensor:
    """Depthwise k x k conv on the visible tokens (k odd, from ``weight`` ``[C, 1, k, k]``: Twins'
    PEG 3x3, ConvNeXt's 7x7): ``[B, N, C] -> [B, N, C]`` (``[1, sum N_b, C]`` with per-sample
    masks). Output at exactly the input's tokens; masked neighbours and sites outside the grid
    count as zero (a submanifold conv). ``table``: the :func:`greenmim.conv_tables.neighbor_table` of x's stage
    mask built with the same ``kernel`` (a table of another k or another mask is refused with the
    reason), ``bias`` ``[C]`` or None, ``residual``: ``+ x``. CUDA runs k up to 7 (the kernels'
    stencils), the CPU reference any odd k up to 15. Differentiable in x, weight and bias."""
    if not isinstance(table, NeighborTable):
        raise GreenmimError(f"greenmim: depthwise conv: the table must be a greenmim.conv_tables.NeighborTable, got "
                            f"{type(table).__name__}")
    _check_algo(algo)    # every path is the op: on the CPU the reference beats torch here (docs/sparse-conv.md)
    check_devices("depthwise conv", x, neighbor_table=table.nbr, weight=weight, bias=bias)
    cb.check_depthwise(x, table.nbr, weight, bias)   # before the op: k and the table's tokens, with the reason
    check_table_values(table)
    return _dispatch.call("depthwise_conv3x3_fwd", _autocast(x), table.nbr, weight, bias, bool(residual))


def submanifold_depthwise_conv3x3(x: Tensor, table: NeighborTable, weight: Tensor, bias: Optional[Tensor] = None,
                                  residual: bool = False, algo: str = "auto") -> Tensor:
    """:func:`submanifold_depthwise_conv` with ``weight`` ``[C, 1, 3, 3]`` (Twins' PEG); another
    kernel size is refused."""
    if weight.dim() != 4 or tuple(weight.shape[1:]) != (1, 3, 3):
        raise GreenmimError(f"greenmim: depthwise conv 3x3: weight must be [C, 1, 3, 3], got {tuple(weight.shape)} "
                            f"(submanifold_depthwise_conv takes any odd k)")
    return submanifold_depthwise_conv(x, table, weight, bias, residual, algo)


def block_conv(x: Tensor, table: BlockTable, weight: Tensor, bias: Optional[Tensor] = None,
               algo: str = "auto") -> Tensor:
    """Kernel = stride = s conv on the visible tokens: ``[B, N, C_in] -> [B, N_next, C_out]``
    (per-sample masks: ``[1, sum N_b, .]``). Outputs at the blocks of ``table`` (every s x s
    block with a visible input, in the table's order: row-major per sample from
    :func:`greenmim.conv_tables.block_table`, block-major from a Twins plan; ``table.position`` says where);
    masked inputs read as zero. ``weight`` ``[C_out, C_in, s, s]`` (``nn.Conv2d``'s), ``bias`` ``[C_out]`` or None.
    ``algo``: "auto"; "reference" (CPU: the Eigen reference); "fused" (CUDA: the fused
    gather-GEMM kernels of the C ABI instead of a gather and cuBLAS)."""
    if not isinstance(table, BlockTable):
        raise GreenmimError(f"greenmim: block conv: the table must be a greenmim.conv_tables.BlockTable, got "
                                     f"{type(table).__name__}")
    check_devices("block conv", x, block_table=table.gather, weight=weight, bias=bias)
    if weight.dim() == 4 and weight.shape[2] != table.stride:
        raise GreenmimError(f"greenmim: block conv: a {weight.shape[2]}x{weight.shape[3]} kernel with a "
                                     f"table of stride {table.stride}")
    check_table_values(table)
    if x.dim() == 3 and x.shape[1] != table.num_inputs:    # every path: the table indexes x's token axis
        raise GreenmimError(f"greenmim: block conv: the features have {x.shape[1]} tokens, the block table "
                                     f"{table.num_inputs}: a table of another stage or mask?")
    if table.reshape and algo == "auto":
        cb.check_block(x, table.gather, weight, bias)
        return _reshape_block_conv(x, table, weight, bias)
    if _torch_cpu(x, algo):
        cb.check_block(x, table.gather, weight, bias)
        return _torch_block_conv(x, table, weight, bias)
    return _dispatch.call("block_conv_fwd", _autocast(x), table.gather, weight, bias, algo == "fused")


def _reshape_block_conv(x: Tensor, table: BlockTable, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """A block conv whose table is a reshape (``table.reshape``: Twins plans' block-major tokens,
    whole blocks): output n's inputs are tokens ``n*s*s ..`` in Morton order, so the conv is one
    GEMM over a view of x, ``W'`` ``[C_out, s*s*C_in]`` with its taps in that order; autograd
    gives dx as a view of one GEMM and dW as another. Any device and dtype, autocast as F.linear."""
    B, N, C = x.shape
    s = table.stride
    dev = x.device.type
    # F.linear's operand dtype: autocast's where it casts (it leaves float64 alone), else x's
    ac = torch.is_autocast_enabled(dev) and x.dtype != torch.float64
    dt = torch.get_autocast_dtype(dev) if ac else x.dtype
    return F.linear(x.reshape(B, table.num_outputs, s * s * C), cb.w_prime(weight, dt, morton=True),
                    bias if bias is None or ac else bias.to(dt))


def _torch_block_conv(x: Tensor, table: BlockTable, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The CPU path in torch's kernels: gather the blocks (a zero row for masked inputs), one GEMM
    (MKL) with the weight as ``[C_out, s*s*C_in]``; autograd gives the backward."""
    B, N, C = x.shape
    idx = table.gather.reshape(-1).long()
    if table.holes:
        x = torch.cat([x, x.new_zeros((B, 1, C))], 1)
        idx = torch.where(idx < 0, torch.full_like(idx, N), idx)
    a = x.index_select(1, idx).view(B, table.gather.shape[0], -1)
    w = cb.w_prime(weight, x.dtype)
    return F.linear(a, w, bias.to(x.dtype) if bias is not None else None)
