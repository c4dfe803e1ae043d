"""greenmim's differentiable ops, registered as torch custom ops.

Each primitive is a ``torch.library.custom_op`` with a fake (shape-only) twin, and autograd is
registered on the forward op with ``torch.library.register_autograd`` (the FlashAttention
pattern), so ``torch.compile(fullgraph=True)`` traces models that use them with no graph break.
In plain eager mode the same implementations and formulas run without the dispatcher
(``_dispatch.py``: the custom op's dispatch cost more host time than the kernels).

Public functions:
- ``group_window_attention(q, k, v, bias_table, partition, window=None, scale=None)``: q, k, v
  ``[B, N, heads, head_dim]`` (strided views of a packed qkv welcome: they are read in place);
- ``group_window_attention_packed(qkv, bias_table, partition, ...)``: the ``[B, N, 3, heads,
  head_dim]`` qkv projection itself; its backward writes one packed gradient;
- ``partition_tokens(x, partition)`` / ``unpartition_tokens(y, partition)``: ``[B, N, C] <->
  [B, num_groups * G, C]``, each other's adjoint.
``partition`` is a :class:`greenmim.mask_plan.StagePartition` (from :func:`greenmim.plan_masks`).
The sparse convs (``block_conv``, ``submanifold_depthwise_conv`` for any odd k,
``submanifold_depthwise_conv3x3``) are named here too (implemented in conv_ops.py).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _attention_abi, _cpu_attention, _device, _dispatch
from ._device import check_devices
from ._lib import GreenmimError

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_autograd"):
    raise ImportError(f"greenmim needs PyTorch >= 2.4 (torch.library.custom_op); this is torch {torch.__version__}")

_LIB = _dispatch.LIB


Index = _attention_abi.Index


def _check_partition_device(where: str, x: Tensor, part) -> None:
    """``part``: a StagePartition, an Index, or an op's ``index`` list (the four index tensors).
    Index tensors that passed the ops' index checks before, unchanged, are on one device
    (_attention_abi.known_index): one comparison then does."""
    tensors = Index.tensors(part) if hasattr(part, "gather") else list(part)
    known = None
    if not torch.compiler.is_compiling():   # dynamo would guard on the cache (a recompile per step)
        known = part.known if type(part) is Index else \
            (_attention_abi.known_index(tensors, None) if len(tensors) == 4 else None)
    if known is not None and known.device == x.device:
        return
    check_devices(where, x, **dict(zip(Index._fields, tensors)))


def _grads(*leading: Optional[Tensor], scalars: int) -> Tuple:
    """An op backward's return, shaped as the op's inputs: the gradients of the inputs before the
    index, four Nones for the index list, a None for each scalar after it."""
    return (*leading, [None] * 4) + (None,) * scalars


# ---- attention ----------------------------------------------------------------------------------
# Schemas: (features..., bias, index: the partition's four tensors, group_size, window, scale, algo).

@_dispatch.op("attention_fwd")
def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], index: List[Tensor], group_size: int,
                   window: int, scale: float, algo: str) -> Tuple[Tensor, Tensor]:
    return _attention_fwd_ix(q, k, v, bias, Index.of(index, group_size, window, scale), algo)


def _attention_fwd_ix(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], ix: Index,
                      algo: str) -> Tuple[Tensor, Tensor]:
    _attention_abi.check_inputs(q, k, v, bias, ix)
    return _attention_abi.attention_fwd(q, k, v, bias, ix, algo)


@_attention_fwd.register_fake
def _(q, k, v, bias, index, group_size, window, scale, algo):
    check_devices("attention forward", q, k=k, v=v, bias_table=bias)
    _check_partition_device("attention forward", q, index)
    B, N, H, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((B, N, H), dtype=_attention_abi.lse_dtype(q))


@_dispatch.op("attention_bwd")
def _attention_bwd(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, bias: Optional[Tensor],
                   index: List[Tensor], group_size: int, window: int, scale: float, algo: str,
                   need_dbias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _attention_bwd_ix(d_o, q, k, v, o, lse, bias, Index.of(index, group_size, window, scale), algo, need_dbias)


def _attention_bwd_ix(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, bias: Optional[Tensor],
                      ix: Index, algo: str, need_dbias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    shape = q.shape
    dq, dk, dv = q.new_empty(shape), q.new_empty(shape), q.new_empty(shape)     # (new_empty: q's dtype, device)
    db = _attention_abi.attention_bwd(d_o, q, k, v, o, lse, bias, ix, dq, dk, dv, need_dbias, algo)
    return dq, dk, dv, db if db is not None else q.new_empty((0,))


def _fake_dbias(bias: Optional[Tensor], like: Tensor, need: bool) -> Tensor:
    """d(bias) as the backward ops return it: float32 (float64 for float64 CPU inputs), or an
    empty tensor when not requested."""
    if bias is None or not need:
        return like.new_empty((0,))
    wide = like.device.type == "cpu" and like.dtype == torch.float64
    return bias.new_empty(bias.shape, dtype=like.dtype if wide else torch.float32)


@_attention_bwd.register_fake
def _(d_o, q, k, v, o, lse, bias, index, group_size, window, scale, algo, need_dbias):
    check_devices("attention backward", q, d_o=d_o, k=k, v=v, o=o, lse=lse, bias_table=bias)
    _check_partition_device("attention backward", q, index)
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), _fake_dbias(bias, q, need_dbias)


def _save_index(ctx, index: List[Tensor], meta: Tuple, *tensors: Optional[Tensor]) -> None:
    ctx.save_for_backward(*tensors, *index)
    ctx.num_saved, ctx.meta = len(tensors), meta


def _saved(ctx) -> Tuple[tuple, List[Tensor]]:
    saved = ctx.saved_tensors
    return saved[:ctx.num_saved], list(saved[ctx.num_saved:])


def _fwd_setup(ctx, inputs, output):
    q, k, v, bias, index, *meta = inputs
    _save_index(ctx, index, tuple(meta), q, k, v, *output, bias)
    ctx.bias_grad = bias is not None and ctx.needs_input_grad[3]


def _fwd_backward(ctx, d_o, d_lse):
    (q, k, v, o, lse, bias), index = _saved(ctx)
    dq, dk, dv, db = _dispatch.call("attention_bwd", d_o, q, k, v, o, lse, bias, index, *ctx.meta, ctx.bias_grad)
    return _grads(dq, dk, dv, db.to(bias.dtype) if ctx.bias_grad else None, scalars=4)


_dispatch.register_autograd("attention_fwd", _fwd_backward, _fwd_setup)


def _unchanged(ix: Index) -> Index:
    """A fast-path Function's Index in its backward, its index tensors at the versions its forward
    read (``ix.known``): the check (and the message) autograd gives saved tensors, which these are
    not (the Function keeps ``ix`` on its context: no saving and unpacking of four tensors, no
    second lookup of their entry)."""
    for t, version in zip(ix[:4], ix.known.versions):
        if t._version != version:
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{t.type()} {list(t.shape)}] is at version {t._version}; expected version {version} instead. "
                f"Hint: enable anomaly detection to find the operation that failed to compute its gradient, with "
                f"torch.autograd.set_detect_anomaly(True).")
    return ix


class _AttentionFn(torch.autograd.Function):
    """attention_fwd on the fast path (_dispatch.call_indexed): _fwd_setup's and _fwd_backward's
    formulas, the checked Index kept whole on the context. Its one output is the attention's
    (what the public function returns); the log-sum-exp is saved as an intermediate (seen by
    saved-tensor hooks and checkpointing as before; a double backward meets the custom op's error
    anyway)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, ix, algo):
        o, lse = _attention_fwd_ix(q, k, v, bias, ix, algo)
        ctx.save_for_backward(q, k, v, o, lse, bias)
        ctx.ix, ctx.algo, ctx.bias_grad = ix, algo, bias is not None and ctx.needs_input_grad[3]
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, lse, bias = ctx.saved_tensors
        dq, dk, dv, db = _dispatch.call_indexed("attention_bwd", (d_o, q, k, v, o, lse, bias),
                                                _unchanged(ctx.ix), ctx.algo, ctx.bias_grad)
        return dq, dk, dv, db.to(bias.dtype) if ctx.bias_grad else None, None, None


_dispatch.indexed("attention_fwd", _attention_fwd_ix, _AttentionFn)
_dispatch.indexed("attention_bwd", _attention_bwd_ix)


# Packed qkv: reads the [B, N, 3, H, D] projection in place, writes one packed gradient.
@_dispatch.op("attention_packed_fwd")
def _attention_packed_fwd(qkv: Tensor, bias: Optional[Tensor], index: List[Tensor], group_size: int, window: int,
                          scale: float, algo: str) -> Tuple[Tensor, Tensor]:
    return _attention_packed_fwd_ix(qkv, bias, Index.of(index, group_size, window, scale), algo)


def _attention_packed_fwd_ix(qkv: Tensor, bias: Optional[Tensor], ix: Index, algo: str) -> Tuple[Tensor, Tensor]:
    fields = _packed_kernel_fields(qkv)
    if fields is not None and _attention_abi.check_packed_inputs(qkv, bias, ix):
        return _attention_abi.attention_packed_fwd(qkv, bias, ix, algo, fields)
    q, k, v = _split_packed(qkv)
    _attention_abi.check_inputs(q, k, v, bias, ix)
    return _attention_abi.attention_fwd(q, k, v, bias, ix, algo)


def _packed_kernel_fields(qkv: Tensor) -> Optional[tuple]:
    """On the kernels, the C views of ``qkv.unbind(2)`` made without the views (_attention_abi.packed_fields:
    the packed ops' host time); None elsewhere, or for a qkv the unbind path refuses or copies."""
    if qkv.dim() != 5 or qkv.shape[2] != 3 or not _attention_abi.uses_kernels(qkv):
        return None
    return _attention_abi.packed_fields(qkv)


@_attention_packed_fwd.register_fake
def _(qkv, bias, index, group_size, window, scale, algo):
    check_devices("attention forward", qkv, bias_table=bias)
    _check_partition_device("attention forward", qkv, index)
    B, N, _, H, D = qkv.shape
    return qkv.new_empty((B, N, H, D)), qkv.new_empty((B, N, H), dtype=_attention_abi.lse_dtype(qkv))


@_dispatch.op("attention_packed_bwd")
def _attention_packed_bwd(d_o: Tensor, qkv: Tensor, o: Tensor, lse: Tensor, bias: Optional[Tensor],
                          index: List[Tensor], group_size: int, window: int, scale: float, algo: str,
                          need_dbias: bool) -> Tuple[Tensor, Tensor]:
    ix = Index.of(index, group_size, window, scale)
    return _attention_packed_bwd_ix(d_o, qkv, o, lse, bias, ix, algo, need_dbias)


def _attention_packed_bwd_ix(d_o: Tensor, qkv: Tensor, o: Tensor, lse: Tensor, bias: Optional[Tensor], ix: Index,
                             algo: str, need_dbias: bool) -> Tuple[Tensor, Tensor]:
    fields = _packed_kernel_fields(qkv)
    if fields is not None:                 # the kernels, without the six unbind views
        dqkv = qkv.new_empty(qkv.shape)
        db = _attention_abi.attention_packed_bwd(d_o, qkv, o, lse, bias, ix, fields, _attention_abi.packed_fields(dqkv),
                                           need_dbias, algo)
        return dqkv, db if db is not None else qkv.new_empty((0,))
    q, k, v = _split_packed(qkv)
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    dq, dk, dv = dqkv.unbind(2)
    db = _attention_abi.attention_bwd(d_o, q, k, v, o, lse, bias, ix, dq, dk, dv, need_dbias, algo)
    return dqkv, db if db is not None else qkv.new_empty((0,))


@_attention_packed_bwd.register_fake
def _(d_o, qkv, o, lse, bias, index, group_size, window, scale, algo, need_dbias):
    check_devices("attention backward", qkv, d_o=d_o, o=o, lse=lse, bias_table=bias)
    _check_partition_device("attention backward", qkv, index)
    return qkv.new_empty(qkv.shape), _fake_dbias(bias, qkv, need_dbias)


def _split_packed(qkv: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise GreenmimError(f"greenmim: qkv must be [B, N, 3, heads, head_dim], got {tuple(qkv.shape)}")
    return qkv.unbind(2)


def _packed_setup(ctx, inputs, output):
    qkv, bias, index, *meta = inputs
    _save_index(ctx, index, tuple(meta), qkv, *output, bias)
    ctx.bias_grad = bias is not None and ctx.needs_input_grad[1]


def _packed_backward(ctx, d_o, d_lse):
    (qkv, o, lse, bias), index = _saved(ctx)
    dqkv, db = _dispatch.call("attention_packed_bwd", d_o, qkv, o, lse, bias, index, *ctx.meta, ctx.bias_grad)
    return _grads(dqkv, db.to(bias.dtype) if ctx.bias_grad else None, scalars=4)


_dispatch.register_autograd("attention_packed_fwd", _packed_backward, _packed_setup)


class _AttentionPackedFn(torch.autograd.Function):
    """attention_packed_fwd on the fast path: _packed_setup's and _packed_backward's formulas, the
    checked Index kept whole on the context and one output (as _AttentionFn)."""

    @staticmethod
    def forward(ctx, qkv, bias, ix, algo):
        o, lse = _attention_packed_fwd_ix(qkv, bias, ix, algo)
        ctx.save_for_backward(qkv, o, lse, bias)
        ctx.ix, ctx.algo, ctx.bias_grad = ix, algo, bias is not None and ctx.needs_input_grad[1]
        return o

    @staticmethod
    def backward(ctx, d_o):
        qkv, o, lse, bias = ctx.saved_tensors
        dqkv, db = _dispatch.call_indexed("attention_packed_bwd", (d_o, qkv, o, lse, bias), _unchanged(ctx.ix),
                                          ctx.algo, ctx.bias_grad)
        return dqkv, db.to(bias.dtype) if ctx.bias_grad else None, None, None


_dispatch.indexed("attention_packed_fwd", _attention_packed_fwd_ix, _AttentionPackedFn)
_dispatch.indexed("attention_packed_bwd", _attention_packed_bwd_ix)


# ---- partition / unpartition ----------------------------------------------------------------------
# Schemas: (features, index: the partition's four tensors, group_size).

def _check_tokens(x: Tensor, ix: Index, slots_axis: bool) -> None:
    if x.dim() != 3:
        raise GreenmimError(f"greenmim: features must be [B, tokens, C], got {tuple(x.shape)}")
    known = ix.known or _attention_abi.remember_index(ix[:4], ix.group_size)
    if known is not None and known.device == x.device:     # the index passed its checks: the row count
        want = known.slots if slots_axis else known.tokens
        if x.shape[1] != want:
            what = "slots (num_groups * G)" if slots_axis else "tokens"
            raise GreenmimError(f"greenmim: features have {x.shape[1]} rows, the partition has {want} {what}")
        return
    for n, t in (("gather", ix.gather), ("scatter", ix.scatter)):
        if t.dtype != torch.int32 or t.dim() != 1 or t.device != x.device:
            raise GreenmimError(f"greenmim: {n} must be a 1-D int32 tensor on {x.device}")
    want = ix.gather.numel() if slots_axis else ix.scatter.numel()
    if x.shape[1] != want:
        what = "slots (num_groups * G)" if slots_axis else "tokens"
        raise GreenmimError(f"greenmim: features have {x.shape[1]} rows, the partition has {want} {what}")
    if ix.group_size <= 0 or ix.gather.numel() % ix.group_size:
        raise GreenmimError(f"greenmim: group_size {ix.group_size} does not divide {ix.gather.numel()} slots")


@_dispatch.op("partition")
def _partition(x: Tensor, index: List[Tensor], group_size: int) -> Tensor:
    _check_partition_device("partition", x, index)
    ix = Index.of(index, group_size)
    _check_tokens(x, ix, slots_axis=False)
    return _attention_abi.partition_tokens(x, ix)


@_partition.register_fake
def _(x, index, group_size):
    _check_partition_device("partition", x, index)
    return x.new_empty((x.shape[0], index[0].shape[0], x.shape[2]))


@_dispatch.op("unpartition")
def _unpartition(y: Tensor, index: List[Tensor], group_size: int) -> Tensor:
    _check_partition_device("unpartition", y, index)
    ix = Index.of(index, group_size)
    _check_tokens(y, ix, slots_axis=True)
    return _attention_abi.unpartition_tokens(y, ix)


@_unpartition.register_fake
def _(y, index, group_size):
    _check_partition_device("unpartition", y, index)
    return y.new_empty((y.shape[0], index[1].shape[0], y.shape[2]))


def _index_setup(ctx, inputs, output):
    _, index, group_size = inputs
    _save_index(ctx, index, (group_size,))


def _partition_backward(ctx, grad):
    _, index = _saved(ctx)
    return _grads(_dispatch.call("unpartition", grad, index, *ctx.meta), scalars=1)


def _unpartition_backward(ctx, grad):
    _, index = _saved(ctx)
    return _grads(_dispatch.call("partition", grad, index, *ctx.meta), scalars=1)


_dispatch.register_autograd("partition", _partition_backward, _index_setup)
_dispatch.register_autograd("unpartition", _unpartition_backward, _index_setup)


# ---- public API -----------------------------------------------------------------------------------

def _resolve(q: Tensor, part, window: Optional[int], scale: Optional[float]) -> Index:
    """The partition with the attention's window and scale, as the library reads it."""
    w = part.window if window is None else int(window)
    s = float(q.shape[-1]) ** -0.5 if scale is None else float(scale)
    tensors = Index.tensors(part)
    known = None if torch.compiler.is_compiling() else _attention_abi.known_index(tensors, part.group_size)
    return Index(*tensors, part.group_size, w, s, known)


def _autocast(*ts: Tensor) -> List[Tensor]:
    """Under CUDA autocast, float32 inputs run in the autocast dtype (as F.linear's outputs do)."""
    t0 = ts[0]
    if t0.is_cuda and t0.dtype == torch.float32 and torch.is_autocast_enabled():
        dt = torch.get_autocast_gpu_dtype()
        return [t.to(dt) for t in ts]
    return list(ts)


def _torch_cpu(t: Tensor, algo: str) -> bool:
    """Eager CPU tensors with algo "auto" run in torch's batched kernels (_cpu_attention.py).
    Under torch.compile they take the custom op, opaque as on CUDA (a small graph, quick to
    compile; its CPU kernel is the reference)."""
    return algo == "auto" and t.is_cpu and not _device.emulating() and \
        not torch.compiler.is_compiling()


def group_window_attention(q: Tensor, k: Tensor, v: Tensor, bias_table: Optional[Tensor], partition,
                           window: Optional[int] = None, scale: Optional[float] = None,
                           algo: str = "auto") -> Tensor:
    """Grouped window attention on visible tokens: ``[B, N, heads, head_dim] -> [B, N, heads, head_dim]``.

    Each token attends the tokens of its own window (cross-window and padding pairs are skipped
    exactly), with the relative-position bias ``bias_table[(2p-1)^2, heads]`` (None: no bias).
    Differentiable in q, k, v and bias_table. ``scale`` defaults to ``head_dim ** -0.5``;
    ``window`` to the partition's (after Swin's small-stage rule). ``algo``: "auto", "simt" or
    "mma" (CUDA only; see kernels.h). On CPU "auto" runs torch's batched matmuls (the output of
    a window with a NaN or inf is computed again exactly) and "reference" the Eigen reference."""
    ix = _resolve(q, partition, window, scale)
    check_devices("attention", q, k=k, v=v, bias_table=bias_table)
    _check_partition_device("attention", q, ix)
    if _torch_cpu(q, algo):
        _attention_abi.check_inputs(q, k, v, bias_table, ix)
        o = _cpu_attention.attention(q, k, v, bias_table, partition, ix.window, ix.scale)
        if _cpu_attention.finite(o):     # else: the exact path isolates the NaN or inf
            return o
    algo = "auto" if algo == "reference" else algo
    q, k, v = _autocast(q, k, v)
    return _dispatch.forward_indexed("attention_fwd", (q, k, v, bias_table), ix, algo)


def group_window_attention_packed(qkv: Tensor, bias_table: Optional[Tensor], partition,
                                  window: Optional[int] = None, scale: Optional[float] = None,
                                  algo: str = "auto") -> Tensor:
    """As :func:`group_window_attention` on the packed ``[B, N, 3, heads, head_dim]`` projection
    (``qkv(x).view(B, N, 3, heads, head_dim)``): no copy in, one packed gradient out."""
    ix = _resolve(qkv, partition, window, scale)
    check_devices("attention", qkv, bias_table=bias_table)
    _check_partition_device("attention", qkv, ix)
    if _torch_cpu(qkv, algo):
        q, k, v = _split_packed(qkv)
        _attention_abi.check_inputs(q, k, v, bias_table, ix)
        o = _cpu_attention.attention_packed(qkv, bias_table, partition, ix.window, ix.scale)
        if _cpu_attention.finite(o):     # else: the exact path isolates the NaN or inf
            return o
    algo = "auto" if algo == "reference" else algo
    (qkv,) = _autocast(qkv)
    return _dispatch.forward_indexed("attention_packed_fwd", (qkv, bias_table), ix, algo)


def partition_tokens(x: Tensor, partition) -> Tensor:
    """Groups token features ``[B, N, C] -> [B, num_groups * G, C]`` (padding rows zero)."""
    _check_partition_device("partition", x, partition)
    return _dispatch.call("partition", x, Index.tensors(partition), partition.group_size)


def unpartition_tokens(y: Tensor, partition) -> Tensor:
    """Ungroups ``[B, num_groups * G, C] -> [B, N, C]`` (padding rows are never read)."""
    _check_partition_device("unpartition", y, partition)
    return _dispatch.call("unpartition", y, Index.tensors(partition), partition.group_size)


# Every op under greenmim.ops: Twins' sparse convs live in conv_ops.py (their tables, backends and
# routes), and are named here too.
from .conv_ops import block_conv, submanifold_depthwise_conv, submanifold_depthwise_conv3x3  # noqa: E402,F401
