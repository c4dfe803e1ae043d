"""Calls into the C ABIs for the convolutions on visible tokens (Twins), with torch tensors.

- CPU tensors (float32/float64): the Eigen reference of reference/conv.hpp (libgreenmim_host).
- CUDA tensors (float32/float16/bfloat16): the kernels of kernels.h (depthwise_conv.cu,
  block_conv.cu) on torch's current stream; weights, biases and their gradients float32. The
  block conv by default runs as a gather of x's rows and cuBLAS GEMMs instead (``_gemm_path``:
  1.3-3.1x faster forwards than its fused kernels, 1.5-2.3x forward + backward, on an H200:
  docs/perf/NVIDIA_H200_2026-11-26e/); ``fused`` asks for the kernels.
- ``emulate_cuda()``: CPU tensors through the kernels on the CPU emulator (libgreenmim_emu).

Tables are int32 tensors on the features' device: the k x k neighbour table ``[N, k*k]`` (k odd:
the weight's; the kernels take k up to 7, the reference up to 15) and the
block table ``[N_next, s*s]`` (-1 = a masked input, read as zero). This file checks, converts and
calls; the arithmetic is in the libraries.
"""
from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi_views, _lib
from ._attention_abi import check_dtype
from ._device import call_with_workspace, uses_kernels
from ._device import kernel_lib as _kernel_lib, rows as _rows, stream as _stream
from ._lib import GreenmimError


def grad_dtype(x: Tensor) -> torch.dtype:
    """Weight and bias gradients: float64 for float64 inputs (the CPU reference), else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_table(where: str, x: Tensor, table: Tensor, rows: Optional[int], row: int, what: str) -> None:
    if table.dtype != torch.int32 or table.dim() != 2 or not table.is_contiguous():
        raise GreenmimError(f"greenmim: {where}: the {what} must be a contiguous 2-D int32 tensor, got {table.dtype} "
                            f"of shape {tuple(table.shape)}")
    if table.device != x.device:
        raise GreenmimError(f"greenmim: {where}: the {what} is on {table.device}, the features on {x.device}: plans and "
                            f"tensors must share a device")
    if table.shape[1] != row or (rows is not None and table.shape[0] != rows):
        want = f"[{rows if rows is not None else 'N_next'}, {row}]"
        raise GreenmimError(f"greenmim: {where}: the {what} is {tuple(table.shape)}, the features need {want}: a table "
                            f"of another stage or mask?")


def _check_features(where: str, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    if x.dim() != 3:
        raise GreenmimError(f"greenmim: {where}: features must be [B, N, C], got shape {tuple(x.shape)}")
    for n, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise GreenmimError(f"greenmim: {where}: {n} is on {t.device}, the features on {x.device}")
    check_dtype(x, where)
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise GreenmimError(f"greenmim: {where}: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")


def check_depthwise(x: Tensor, nbr: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    """A k x k depthwise conv's arguments (k odd, from the weight): weight [C, 1, k, k] and a
    neighbour table [N, k*k] of x's N tokens; a table of another k or another mask is refused."""
    k = weight.shape[-1] if weight.dim() == 4 else 0
    where = f"depthwise conv {k}x{k}" if k else "depthwise conv"
    _check_features(where, x, weight, bias)
    C = x.shape[2]
    if weight.dim() != 4 or tuple(weight.shape[:3]) != (C, 1, k) or k % 2 == 0:
        raise GreenmimError(f"greenmim: {where}: weight must be [C, 1, k, k] = [{C}, 1, k, k] with k odd (a depthwise "
                            f"Conv2d's), got {tuple(weight.shape)}")
    if nbr.dim() == 2 and nbr.shape[1] != k * k:
        r = round(nbr.shape[1] ** 0.5)
        raise GreenmimError(f"greenmim: {where}: a {k}x{k} weight with a {r}x{r} neighbour table "
                            f"{tuple(nbr.shape)}: build the table with kernel={k}")
    _check_table(where, x, nbr, x.shape[1], k * k, "neighbour table")


def check_block(x: Tensor, gather: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    where = "block conv"
    _check_features(where, x, weight, bias)
    if weight.dim() != 4 or weight.shape[2] != weight.shape[3] or weight.shape[1] != x.shape[2]:
        raise GreenmimError(f"greenmim: {where}: weight must be [C_out, C_in = {x.shape[2]}, s, s], got "
                            f"{tuple(weight.shape)}")
    s = weight.shape[2]
    _check_table(where, x, gather, None, s * s, f"block table (stride {s})")


def _weights(t: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    """Weights as the library takes them: float32 on the kernels, x's dtype on the reference. The
    library reads only their memory: a weight already so (and contiguous) is passed as it is."""
    if t is None:
        return None
    dt = torch.float32 if uses_kernels(x) else x.dtype
    if t.dtype == dt and t.is_contiguous():
        return t                # detach().to().contiguous() would be a view of this memory
    return t.detach().to(dt).contiguous()


def _host_args(x: Tensor, table: Tensor, size: int, residual: bool, **tensors) -> _lib.HostConvArgs:
    a = _lib.HostConvArgs()
    a.dtype = _lib.GMH_FLOAT64 if x.dtype == torch.float64 else _lib.GMH_FLOAT32
    a.x = _abi_views.tensor(x)
    for name, t in tensors.items():
        setattr(a, name, _abi_views.tensor(t))
    a.table, a.table_size = table.data_ptr() if table.numel() else None, table.numel()
    a.size, a.residual = size, int(residual)
    return a


# The kernels' argument structs, each written in one call (_abi_views.Packer: the eager step's host time)
_DW, _BC = _abi_views.Packer(_lib.DepthwiseConvArgs), _abi_views.Packer(_lib.BlockConvArgs)
_tf, _NULL = _abi_views.tensor_fields, _abi_views.NULL_TENSOR


def _ptr(t: Optional[Tensor]) -> int:
    return t.data_ptr() if t is not None else 0


def depthwise_fwd(x: Tensor, nbr: Tensor, weight: Tensor, bias: Optional[Tensor], residual: bool) -> Tensor:
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    k = weight.shape[-1]
    w, b = _weights(weight, x).view(-1, k * k), _weights(bias, x)
    if uses_kernels(x):
        lib = _kernel_lib(x)
        a = _DW.new(_lib.GM_DTYPES[x.dtype], *_tf(_rows(x)), *_tf(y), *_NULL, *_NULL, nbr.data_ptr(), k, w.data_ptr(),
                    _ptr(b), 0, 0, int(residual))
        _lib.kernel_check(lib, lib.gm_depthwise_conv_fwd(ctypes.byref(a), _stream(x)), "depthwise conv forward")
    else:
        a = _host_args(x, nbr, k, residual, y=y, weight=w, bias=b)
        _lib.host_check(_lib.host().gmh_depthwise_conv_fwd(ctypes.byref(a)), "depthwise conv forward")
    return y


def _grads(x: Tensor, weight: Tensor, need_dw: bool, need_db: bool,
           written: bool = False) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """dweight and dbias buffers: zeros, or uninitialised where the kernels will write every
    element (``written``: they store their sums, they do not accumulate; a memset launch less)."""
    dt = grad_dtype(x)
    new = x.new_empty if written else x.new_zeros      # on x's device (Tensor.new_*: less host time)
    dw = new(weight.shape, dtype=dt) if need_dw else None
    db = new((weight.shape[0],), dtype=dt) if need_db else None
    return dw, db


def depthwise_bwd(dy: Tensor, x: Tensor, nbr: Tensor, weight: Tensor, residual: bool, need_dw: bool,
                  need_db: bool) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    dx = x.new_empty(x.shape)
    dw, db = _grads(x, weight, need_dw, need_db, written=uses_kernels(x) and x.numel() > 0)
    if x.numel() == 0:
        return dx, dw, db
    k = weight.shape[-1]
    w = _weights(weight, x).view(-1, k * k)
    dwk = dw.view(-1, k * k) if dw is not None else None
    if uses_kernels(x):
        lib = _kernel_lib(x)
        a = _DW.new(_lib.GM_DTYPES[x.dtype], *_tf(_rows(x)), *_NULL, *_tf(_rows(dy)), *_tf(dx), nbr.data_ptr(), k,
                    w.data_ptr(), 0, _ptr(dwk), _ptr(db), int(residual))
        call_with_workspace(lib, "gm_depthwise_conv_bwd", a, x, "depthwise conv backward")
    else:
        a = _host_args(x, nbr, k, residual, dy=dy, dx=dx, weight=w, dweight=dwk, dbias=db)
        _lib.host_check(_lib.host().gmh_depthwise_conv_bwd(ctypes.byref(a)), "depthwise conv backward")
    return dx, dw, db


def _gemm_path(x: Tensor, fused: bool) -> bool:
    """The block conv on real CUDA tensors, unless the fused kernels are asked for: the blocks'
    rows gathered by the library's row copy (gm_partition_tokens) and cuBLAS GEMMs (torch.mm);
    dx scattered back by gm_unpartition_tokens. The fused gather-GEMM kernels ran at 15-25% of
    cuBLAS's rate on the same GEMMs in the forward (H200, 2026-11-26); the gather costs one pass
    over x."""
    return x.device.type == "cuda" and not fused


def _w_prime_view(w4: Tensor, morton: bool) -> Tensor:
    """``w4`` ``[C_out, C_in, s, s]`` as a view in W''s element order, ``[C_out, taps.., C_in]``:
    the taps row-major, or in Morton order (a view and a permute of the bit axes). Writable when
    ``w4`` is: the weight's gradient is written through it."""
    Co, C, s, _ = w4.shape
    w = w4.permute(0, 2, 3, 1)                                       # [C_out, i, j, C_in]
    b = s.bit_length() - 1
    if morton and b > 1:                                             # 2x2: Morton order is row-major
        w = w.reshape(Co, *([2] * b), *([2] * b), C)                 # a view: i's bits, then j's, high first
        w = w.permute(0, *(d for k in range(b) for d in (1 + k, 1 + b + k)), 1 + 2 * b)
    return w


class _WPrime(torch.autograd.Function):
    """W' from the weight in one copy (permute and cast), and the weight's gradient back in one
    copy: autograd's own backward of the copy made two (the cast to the weight's dtype in W''s
    order, then AccumulateGrad's clone into the weight's layout). The gradient takes the weight's
    memory format, contiguous or channels_last (``model.to(memory_format=torch.channels_last)``),
    which AccumulateGrad would otherwise clone it into. A channels_last weight also makes both
    copies nearly contiguous: W' and the weight then both keep C_in innermost."""

    @staticmethod
    def forward(weight: Tensor, dtype: torch.dtype, morton: bool) -> Tensor:
        Co, C, s, _ = weight.shape
        out = torch.empty((Co, s * s * C), dtype=dtype, device=weight.device)
        w = _w_prime_view(weight, morton)
        out.view(w.shape).copy_(w)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        weight, _, morton = inputs
        ctx.shape, ctx.wdtype, ctx.morton = weight.shape, weight.dtype, morton
        ctx.channels_last = not weight.is_contiguous() and weight.is_contiguous(memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx, g: Tensor):
        fmt = torch.channels_last if ctx.channels_last else torch.contiguous_format  # the weight's layout
        gw = torch.empty(ctx.shape, dtype=ctx.wdtype, device=g.device, memory_format=fmt)
        v = _w_prime_view(gw, ctx.morton)
        v.copy_(g.reshape(v.shape))
        return gw, None, None


def w_prime(weight: Tensor, dtype: Optional[torch.dtype] = None, morton: bool = False) -> Tensor:
    """W' [C_out, s*s*C_in] in ``dtype`` (default: the weight's): column p*C_in + c holds
    weight[o, c, tap p], the taps row-major, or with ``morton`` (s a power of two) in Morton order,
    tap (i, j)'s bits interleaved i_{b-1} j_{b-1} .. i_0 j_0 (a view and a permute of the bit axes:
    no index tensor, so CUDA graphs capture it). One copy that permutes and casts (a cast, then a
    permuting reshape, would be two kernels); differentiable in ``weight``, whose gradient comes
    back in one copy too, in the weight's memory format (``_WPrime``)."""
    return _WPrime.apply(weight, dtype or weight.dtype, morton)


def _copy_rows(fn: str, x: Tensor, y: Tensor, index: Tensor, group_size: int) -> None:
    """The library's row copies between x [B, N, C] (tokens) and y [B, S, C] (slots):
    gm_partition_tokens, y[b, r] = x[b, index[r]]; gm_unpartition_tokens, x[b, t] = y[b, index[t]];
    an index out of range gives a zero row (16-byte vectors where rows allow)."""
    if x.dtype != y.dtype:     # the copy moves bytes: another dtype would be read as this one
        raise GreenmimError(f"greenmim: block conv: row copy between {x.dtype} and {y.dtype}")
    lib = _kernel_lib(x)
    a = _lib.PartitionArgs()
    a.dtype = _lib.GM_DTYPES[x.dtype]
    a.x, a.y = _abi_views.tensor(x), _abi_views.tensor(y)
    p = _lib.Partition()
    p.gather = p.scatter = p.slot_window = index.data_ptr()   # the copies read the one of their direction
    p.slot_coord = None
    p.group_size, p.num_groups, p.num_tokens = group_size, y.shape[1] // group_size, x.shape[1]
    a.part = p
    _lib.kernel_check(lib, getattr(lib, fn)(ctypes.byref(a), _stream(x)), fn)


def _holes(gather: Tensor) -> bool:
    """Whether some block is partly visible (-1 entries): torch's gathers only (a host sync)."""
    return bool((gather < 0).any())


def _gathered(x: Tensor, gather: Tensor) -> Tensor:
    """A [B * N_next, s*s*C_in]: row b * N_next + n holds x[b, gather[n, p], :] for p = 0 .. s*s-1,
    zero where gather is -1: the library's row gather on the kernels (zeros for -1 entries, no
    sync), else torch's index_select (CPU tensors: the tests' float64 path)."""
    B, N, C = x.shape
    if uses_kernels(x):
        a = torch.empty((B, gather.numel(), C), dtype=x.dtype, device=x.device)
        _copy_rows("gm_partition_tokens", _rows(x), a, gather, gather.shape[1])
    else:
        idx = gather.reshape(-1)
        if _holes(gather):
            valid = idx >= 0
            a = x.index_select(1, torch.where(valid, idx, torch.zeros_like(idx)))
            a.mul_(valid.view(1, -1, 1).to(a.dtype))
        else:
            a = x.index_select(1, idx)
    return a.view(B * gather.shape[0], -1)


def _scatter_of(gather: Tensor, num_tokens: int) -> Tensor:
    """int32 [N]: the slot (n * s*s + p) that holds each token, -1 for a token in no block. Holes
    are sent to distinct rows past N, so every target is unique (deterministic)."""
    idx = gather.reshape(-1)
    S = idx.numel()
    slots = torch.arange(S, dtype=torch.int32, device=idx.device)
    target = torch.where(idx >= 0, idx, slots + num_tokens)
    inv = torch.full((num_tokens + S,), -1, dtype=torch.int32, device=idx.device)
    return inv.scatter_(0, target.long(), slots)[:num_tokens]


_MM_OUT_DTYPE: dict = {}   # device type -> whether torch.mm takes out_dtype there


def _mm_float32(a: Tensor, b: Tensor) -> Tensor:
    """a @ b in float32 (16-bit inputs: cuBLAS's fp32 output where torch has mm's out_dtype, else
    the inputs widened); float64 stays float64 (the CPU reference's precision)."""
    if a.dtype in (torch.float32, torch.float64):
        return torch.mm(a, b)
    dev = a.device.type
    if _MM_OUT_DTYPE.get(dev, True):
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_DTYPE[dev] = True
            return out
        except (TypeError, NotImplementedError):   # not this torch or device; an OOM is raised
            _MM_OUT_DTYPE[dev] = False
    return torch.mm(a.float(), b.float())


def _no_autocast(x: Tensor):
    """The GEMMs run in x's dtype whatever autocast region the op is called (or differentiated) in."""
    return torch.autocast(x.device.type, enabled=False)


def _block_fwd_gemm(x: Tensor, gather: Tensor, weight: Tensor, bias: Optional[Tensor], y: Tensor) -> None:
    """y = A W'^T + bias in x's dtype (cuBLAS: fp32 sums; the bias rounded to x's dtype first; fp32
    inputs follow torch's TF32 setting, torch.backends.cuda.matmul.allow_tf32)."""
    with _no_autocast(x):
        a, w = _gathered(x, gather), w_prime(weight.detach(), x.dtype)
        y2 = y.view(-1, weight.shape[0])
        if bias is not None:
            torch.addmm(bias.detach().to(x.dtype), a, w.t(), out=y2)
        else:
            torch.mm(a, w.t(), out=y2)


def _block_bwd_gemm(dy: Tensor, x: Tensor, gather: Tensor, weight: Tensor, dx: Tensor,
                    dw: Optional[Tensor], db: Optional[Tensor]) -> None:
    B, N, C = x.shape
    Co, s, Nn = weight.shape[0], weight.shape[2], gather.shape[0]
    with _no_autocast(x):
        dy2 = dy.to(x.dtype).reshape(B * Nn, Co)
        da = torch.mm(dy2, w_prime(weight.detach(), x.dtype)).view(B, Nn * s * s, C)
        if uses_kernels(x):             # every row of dx written: its slot's row of dA, or zeros
            _copy_rows("gm_unpartition_tokens", dx, da, _scatter_of(gather, N), s * s)
        else:                           # torch (CPU): dA's rows added to zeros; -1 entries' rows dropped
            idx = gather.reshape(-1)
            valid = idx >= 0
            dx.zero_().index_add_(1, torch.where(valid, idx, torch.zeros_like(idx)),
                                  da * valid.view(1, -1, 1).to(da.dtype))
        if dw is not None:
            dw.copy_(_mm_float32(dy2.t(), _gathered(x, gather)).view(Co, s, s, C).permute(0, 3, 1, 2))
        if db is not None:
            db.copy_(dy2.sum(0, dtype=db.dtype))


def block_fwd(x: Tensor, gather: Tensor, weight: Tensor, bias: Optional[Tensor], fused: bool = False) -> Tensor:
    B, s = x.shape[0], weight.shape[2]
    y = x.new_empty((B, gather.shape[0], weight.shape[0]))
    if y.numel() == 0:
        return y
    if x.shape[1] == 0 or x.shape[2] == 0:       # every input masked or no channel: the bias alone
        return y.copy_((bias if bias is not None else y.new_zeros(())).to(y.dtype).expand(y.shape))
    if _gemm_path(x, fused):
        _block_fwd_gemm(x, gather, weight, bias, y)
        return y
    w, b = _weights(weight, x), _weights(bias, x)
    if uses_kernels(x):
        lib = _kernel_lib(x)
        a = _BC.new(_lib.GM_DTYPES[x.dtype], *_tf(_rows(x)), *_tf(y), *_NULL, *_NULL, gather.data_ptr(), s,
                    w.data_ptr(), _ptr(b), 0, 0)
        call_with_workspace(lib, "gm_block_conv_fwd", a, x, "block conv forward")
    else:
        a = _host_args(x, gather, s, False, y=y, weight=w, bias=b)
        _lib.host_check(_lib.host().gmh_block_conv_fwd(ctypes.byref(a)), "block conv forward")
    return y


def block_bwd(dy: Tensor, x: Tensor, gather: Tensor, weight: Tensor, need_dw: bool,
              need_db: bool, fused: bool = False) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    dx = x.new_empty(x.shape)   # overwritten (0 for tokens in no block)
    dw, db = _grads(x, weight, need_dw, need_db, written=uses_kernels(x) and dy.numel() > 0 and x.numel() > 0)
    if dy.numel() == 0 or x.numel() == 0:
        dx.zero_()
        if db is not None and dy.numel():
            db.copy_(dy.to(db.dtype).sum((0, 1)))
        return dx, dw, db
    if _gemm_path(x, fused):
        _block_bwd_gemm(dy, x, gather, weight, dx, dw, db)
        return dx, dw, db
    w = _weights(weight, x)
    if uses_kernels(x):
        lib = _kernel_lib(x)
        a = _BC.new(_lib.GM_DTYPES[x.dtype], *_tf(_rows(x)), *_NULL, *_tf(_rows(dy)), *_tf(dx), gather.data_ptr(),
                    weight.shape[2], w.data_ptr(), 0, _ptr(dw), _ptr(db))
        call_with_workspace(lib, "gm_block_conv_bwd", a, x, "block conv backward")
    else:
        a = _host_args(x, gather, weight.shape[2], False, dy=dy, dx=dx, weight=w, dweight=dw, dbias=db)
        _lib.host_check(_lib.host().gmh_block_conv_bwd(ctypes.byref(a)), "block conv backward")
    return dx, dw, db
