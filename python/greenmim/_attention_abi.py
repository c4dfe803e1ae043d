"""The attention and partition calls into the C ABIs with torch tensors (``greenmim::ops``'
implementations sit on this layer; ``_conv_abi.py`` is its twin for the convs).

- CPU tensors (float32/float64): the CPU reference (libgreenmim_host).
- CUDA tensors (float32/float16/bfloat16): the kernels (libgreenmim_cuda) on torch's current
  stream; device workspace comes from torch's caching allocator (the library never allocates).
- With ``emulate_cuda(True)`` CPU tensors take the CUDA path instead, through the kernels built
  for the CPU emulator (libgreenmim_emu): slow, for testing the CUDA path without a GPU.
  Which path a tensor takes, streams and workspace: ``_device.py``.

This file only checks, converts and calls: the arithmetic is in the compiled library.
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import _abi_views, _lib
from ._device import call_with_workspace, device_buffer, emulate_cuda, emulating, uses_kernels  # noqa: F401
from ._device import kernel_lib as _kernel_lib, rows as _rows, stream as _stream
from ._lib import GreenmimError


class Index(NamedTuple):
    """One stage partition as the library reads it: the four int32 index tensors of a
    :class:`greenmim.mask_plan.StagePartition` and the attention's geometry. The custom ops' schemas carry
    the tensors as one ``Tensor[]`` argument (a schema takes tensors and scalars, not objects);
    :meth:`of` rebuilds this from them, and everything below the ops takes it whole."""
    gather: torch.Tensor
    scatter: torch.Tensor
    slot_window: torch.Tensor
    slot_coord: torch.Tensor
    group_size: int
    window: int = 0
    scale: float = 1.0
    known: Optional["KnownIndex"] = None   # set by of(): these tensors passed the index checks before

    @staticmethod
    def tensors(part) -> List[torch.Tensor]:
        """The op argument for a partition (anything with the four index attributes)."""
        return [part.gather, part.scatter, part.slot_window, part.slot_coord]

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor], group_size: int, window: int = 0, scale: float = 1.0) -> "Index":
        if len(tensors) != 4:
            raise GreenmimError(f"greenmim: a partition is 4 index tensors (gather, scatter, slot_window, "
                                f"slot_coord), got {len(tensors)}")
        gs = int(group_size)
        return cls(*tensors, gs, int(window), float(scale), known_index(tensors, gs))

    def op_args(self) -> tuple:
        """``(index, group_size, window, scale)``, as the attention ops' schemas take them."""
        return list(self[:4]), self.group_size, self.window, self.scale


# ---- index tensors that passed their checks ---------------------------------------------------------
# Every op call checks the partition's four index tensors (dtype, rank, device, contiguity,
# lengths) and writes their C view: about 10 us of host time per call, the same answer for every
# block of a stage and for the backward. An index tensor set that passed is remembered (keyed by
# its gather tensor, dropped when that tensor dies) with its C view's values, and a call with the
# same four tensor objects at the same versions (torch's in-place counter: every in-place op,
# resize_ and set_ included, bumps it; autograd's saved-tensor check uses the same guard) on the
# same device skips the index-only checks. Anything else takes the full checks, so the same inputs
# are refused with the same messages.

class KnownIndex:
    """Four index tensors (weakly held) that passed :func:`index_valid`, and their facts."""
    __slots__ = ("refs", "versions", "device", "group_size", "slots", "tokens", "fields", "copy_fields", "plain",
                 "__weakref__")

    def __init__(self, tensors: Sequence[torch.Tensor], group_size: int):
        key = id(tensors[0])                     # the entry goes when its gather tensor does
        self.refs = (weakref.ref(tensors[0], lambda _, k=key: _known.pop(k, None)),) + \
            tuple(weakref.ref(t) for t in tensors[1:])
        self.versions = tuple(t._version for t in tensors)
        self.device, self.group_size = tensors[0].device, group_size
        self.slots, self.tokens = tensors[0].numel(), tensors[1].numel()
        ix = Index(*tensors, group_size)
        self.fields = _abi_views.partition_fields(ix)                      # the C view, as _abi_views.partition()
        self.copy_fields = _abi_views.partition_fields(ix, slot_coord=False)
        # plain tensors that no functorch wrapper holds (the eager fast path's condition, _dispatch._plain)
        self.plain = all(type(t) in (torch.Tensor, torch.nn.Parameter) and
                         not torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


_known: Dict[int, KnownIndex] = {}


def known_index(tensors: Sequence[torch.Tensor], group_size: Optional[int]) -> Optional[KnownIndex]:
    """The entry of these four index tensors if they are unchanged since they passed (and
    ``group_size``, unless None, is the one they passed with); else None. Its ``device`` is theirs:
    a caller compares it with the features'."""
    e = _known.get(id(tensors[0]))
    if e is None or (group_size is not None and e.group_size != group_size):
        return None
    r, v = e.refs, e.versions
    g, sc, sw, co = tensors
    if r[0]() is not g or r[1]() is not sc or r[2]() is not sw or r[3]() is not co or \
            g._version != v[0] or sc._version != v[1] or sw._version != v[2] or co._version != v[3]:
        return None
    return e


def remember_index(tensors: Sequence[torch.Tensor], group_size: int) -> Optional[KnownIndex]:
    """Remembers four index tensors that pass :func:`index_valid` (and returns the entry), else None."""
    if len(tensors) != 4 or not index_valid(tensors, group_size) or any(t.is_inference() for t in tensors):
        return None                 # (inference tensors keep no version counter: never remembered)
    e = KnownIndex(tensors, group_size)
    _known[id(tensors[0])] = e
    return e


def index_valid(tensors: Sequence[torch.Tensor], group_size: int) -> bool:
    """Whether the index-only conditions of every op's checks hold: four contiguous 1-D int32
    tensors on one device, gather, slot_window and slot_coord of one length, which group_size
    (> 0) divides."""
    g = tensors[0]
    dev, n = g.device, g.numel()
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.device != dev or \
                not t.is_contiguous() or (i != 1 and t.numel() != n):
            return False
    return group_size > 0 and n % group_size == 0


def check_inputs(q, k, v, bias, ix: Index) -> None:
    """Python-side checks that give a clear exception before any library call."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        for n, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 4:
                raise GreenmimError(f"greenmim: {n} must be [B, N, heads, head_dim], got shape {tuple(t.shape)}")
    shape = q.shape
    if shape != k.shape or shape != v.shape:
        raise GreenmimError(f"greenmim: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise GreenmimError(f"greenmim: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise GreenmimError("greenmim: q, k, v are on different devices")
    gather, scatter, slot_window, slot_coord, group_size, window = ix[:6]
    known = ix.known or remember_index(ix[:4], group_size)
    if known is not None and known.device == q.device:
        _check_attention_rest(q, shape[1], shape[2], bias, window, known.tokens)   # the index passed
        return
    for n, t in zip(ix._fields, ix[:4]):
        if t.dtype != torch.int32 or t.dim() != 1:
            raise GreenmimError(f"greenmim: {n} must be a 1-D int32 tensor, got {t.dtype} of shape {tuple(t.shape)}")
        if t.device != q.device:
            raise GreenmimError(f"greenmim: {n} is on {t.device}, q on {q.device}")
        if not t.is_contiguous():
            raise GreenmimError(f"greenmim: {n} must be contiguous")
    if group_size <= 0 or gather.numel() % group_size != 0:
        raise GreenmimError(f"greenmim: group_size {group_size} does not divide the {gather.numel()} slots")
    if scatter.numel() != q.shape[1]:
        raise GreenmimError(f"greenmim: the partition covers {scatter.numel()} tokens, q has N = {q.shape[1]}: "
                            f"indices of another stage or mask?")
    if slot_window.numel() != gather.numel() or slot_coord.numel() != gather.numel():
        raise GreenmimError("greenmim: gather, slot_window and slot_coord must have the same length")
    _check_attention_rest(q, q.shape[1], q.shape[2], bias, window, None)


def check_packed_inputs(qkv: torch.Tensor, bias, ix: Index) -> bool:
    """check_inputs(*qkv.unbind(2), bias, ix) for a ``[B, N, 3, H, D]`` qkv whose index tensors
    passed before (``ix.known``) on qkv's device, without making the views (three views of one
    tensor pass every q, k, v check): True when it checked, False when the caller must run
    check_inputs on the views."""
    known = ix.known
    if known is None or known.device != qkv.device:
        return False
    _check_attention_rest(qkv, qkv.shape[1], qkv.shape[3], bias, ix.window, known.tokens)
    return True


def _check_attention_rest(q, N: int, H: int, bias, window: int, tokens: Optional[int]) -> None:
    """check_inputs after the index tensors' own checks, for queries ``q`` (or the packed qkv) of
    N tokens and H heads: the tokens (``tokens``: the index's count, None: checked already), the
    bias table, the dtype."""
    if tokens is not None and tokens != N:
        raise GreenmimError(f"greenmim: the partition covers {tokens} tokens, q has N = {N}: "
                            f"indices of another stage or mask?")
    if bias is not None:
        if bias.dim() != 2 or bias.shape[1] != H:
            raise GreenmimError(f"greenmim: bias table must be [(2p-1)^2, heads={H}], got {tuple(bias.shape)}")
        if bias.shape[0] != (2 * window - 1) ** 2:
            raise GreenmimError(f"greenmim: bias table has {bias.shape[0]} rows, window {window} needs "
                                f"{(2 * window - 1) ** 2}")
        if bias.device != q.device:
            raise GreenmimError(f"greenmim: bias table is on {bias.device}, q on {q.device}")
    check_dtype(q)


def check_dtype(x: torch.Tensor, where: str = "") -> None:
    """The dtypes of the path ``x`` takes: the kernels fp32/fp16/bf16, the CPU reference fp32/fp64."""
    at = f"greenmim: {where}: " if where else "greenmim: "
    if uses_kernels(x):
        if x.dtype not in _lib.GM_DTYPES:
            raise GreenmimError(f"{at}the CUDA kernels take float32, float16 or bfloat16, got {x.dtype}")
    elif x.dtype not in (torch.float32, torch.float64):
        raise GreenmimError(f"{at}on the CPU the reference runs float32 and float64, got {x.dtype} "
                            f"(fp16/bf16 run on CUDA)")


def lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _bias_f32(bias: Optional[torch.Tensor], q: torch.Tensor) -> Optional[torch.Tensor]:
    """The kernels take the bias table in float32 (autocast may hand a float32 parameter). The
    library reads only its memory: a table already in the wanted dtype (and contiguous, for the
    kernels) is passed as it is (``detach().to().contiguous()`` would return a view of the same
    memory, for a few us of host time)."""
    if bias is None:
        return None
    if uses_kernels(q):
        return _bias_kernels(bias)
    return bias if bias.dtype == q.dtype else bias.detach().to(q.dtype)


def _bias_kernels(bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """_bias_f32 on the kernels' path (the caller knows it is on it)."""
    if bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()):
        return bias
    return bias.detach().to(torch.float32).contiguous()


def _args(struct, q, tensors: dict, ix: Index):
    """One argument struct for either ABI: the kernels' (dtype code, algo set by the caller) or the
    host reference's (float32/float64). The kernels' calls use the Packers below instead."""
    a = struct()
    a.dtype = _lib.GM_DTYPES[q.dtype] if struct is not _lib.HostAttentionArgs else \
        (_lib.GMH_FLOAT64 if q.dtype == torch.float64 else _lib.GMH_FLOAT32)
    for name, t in tensors.items():
        setattr(a, name, _abi_views.tensor(t))
    a.part = _abi_views.partition(ix)
    a.window, a.scale = ix.window, ix.scale
    return a


# The kernels' argument structs, each written in one call (_abi_views.Packer: the eager step's host time)
_FWD, _BWD, _COPY = _abi_views.Packer(_lib.FwdArgs), _abi_views.Packer(_lib.BwdArgs), _abi_views.Packer(_lib.PartitionArgs)
_tf = _abi_views.tensor_fields


def _part_fields(ix: Index, slot_coord: bool = True) -> tuple:
    """The partition's C view: remembered with its checked index tensors, else made now."""
    e = ix.known or known_index(ix[:4], ix.group_size)
    if e is None:
        return _abi_views.partition_fields(ix, slot_coord)
    return e.fields if slot_coord else e.copy_fields


def packed_fields(qkv: torch.Tensor) -> Optional[Tuple[tuple, tuple, tuple]]:
    """The C views of ``qkv.unbind(2)`` (q, k, v of a ``[B, N, 3, H, D]`` projection), made without
    the three torch views (unbind costs more host time than the views' values); None where the
    kernels would copy them first (a last dimension of stride != 1: _rows)."""
    B, N, _, H, D = qkv.shape
    s0, s1, s2, s3, s4 = qkv.stride()
    if s4 != 1:
        return None
    p, step = qkv.data_ptr(), s2 * qkv.element_size()
    return tuple((p + i * step, 4, B, N, H, D, s0, s1, s3, s4) for i in range(3))


def attention_fwd(q, k, v, bias, ix: Index, algo: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    if uses_kernels(q):
        return _kernel_fwd(q, q.shape, lambda: (_tf(_rows(q)), _tf(_rows(k)), _tf(_rows(v))), bias, ix, algo)
    B, N, H, D = q.shape
    o = q.new_empty((B, N, H, D))
    lse = q.new_empty((B, N, H), dtype=lse_dtype(q))
    if o.numel() == 0:
        return o, lse
    t = dict(q=q, k=k, v=v, o=o, lse=lse, bias_table=_bias_f32(bias, q))
    a = _args(_lib.HostAttentionArgs, q, t, ix)
    _lib.host_check(_lib.host().gmh_attention_fwd(ctypes.byref(a)), "attention forward")
    return o, lse


def attention_packed_fwd(qkv, bias, ix: Index, algo: str, qkv_fields: tuple) -> Tuple[torch.Tensor, torch.Tensor]:
    """attention_fwd(*qkv.unbind(2), ...) on the kernels, from :func:`packed_fields` of qkv."""
    B, N, _, H, D = qkv.shape
    return _kernel_fwd(qkv, (B, N, H, D), lambda: qkv_fields, bias, ix, algo)


def _kernel_fwd(like, shape, qkv_fields, bias, ix: Index, algo: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """The kernels' forward for queries of ``shape`` [B, N, H, D] in ``like``'s dtype and device;
    ``qkv_fields()``: the C views of q, k, v (called once the outputs are known to be non-empty)."""
    B, N, H, D = shape
    o = like.new_empty((B, N, H, D))
    lse = like.new_empty((B, N, H), dtype=lse_dtype(like))
    if o.numel() == 0:
        return o, lse
    lib = _kernel_lib(like)
    qf, kf, vf = qkv_fields()
    a = _FWD.new(_lib.GM_DTYPES[like.dtype], *qf, *kf, *vf, *_tf(o), *_tf(lse), *_tf(_bias_kernels(bias)),
                 *_part_fields(ix), ix.window, ix.scale, _lib.GM_ALGOS[algo])
    _lib.kernel_check(lib, lib.gm_attention_fwd(ctypes.byref(a), _stream(like)), "attention forward")
    return o, lse


def attention_bwd(d_o, q, k, v, o, lse, bias, ix: Index, dq, dk, dv, need_dbias: bool,
                  algo: str = "auto") -> Optional[torch.Tensor]:
    """Writes dq, dk, dv (tensors of q's shape, any strides with a unit last one) and returns
    d(bias table) (float32 on the kernels, q's dtype on the CPU) or None."""
    if uses_kernels(q):
        return _kernel_bwd(q, q.shape, lambda: (_tf(_rows(q)), _tf(_rows(k)), _tf(_rows(v)), _tf(dq), _tf(dk),
                                                _tf(dv)), d_o, o, lse, bias, ix, need_dbias, algo)
    dbias = None
    if bias is not None and need_dbias:
        dbias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device)
    if q.numel() == 0:
        return dbias
    t = dict(q=q, k=k, v=v, o=o, d_o=_rows(d_o), lse=lse, bias_table=_bias_f32(bias, q), dq=dq, dk=dk, dv=dv,
             d_bias_table=dbias)
    a = _args(_lib.HostAttentionArgs, q, t, ix)
    _lib.host_check(_lib.host().gmh_attention_bwd(ctypes.byref(a)), "attention backward")
    return dbias


def attention_packed_bwd(d_o, qkv, o, lse, bias, ix: Index, qkv_fields: tuple, dqkv_fields: tuple,
                         need_dbias: bool, algo: str) -> Optional[torch.Tensor]:
    """attention_bwd on the kernels from :func:`packed_fields` of qkv and of the gradient dqkv."""
    B, N, _, H, D = qkv.shape
    return _kernel_bwd(qkv, (B, N, H, D), lambda: qkv_fields + dqkv_fields, d_o, o, lse, bias, ix, need_dbias,
                       algo)


def _kernel_bwd(like, shape, fields, d_o, o, lse, bias, ix: Index, need_dbias: bool, algo: str
                ) -> Optional[torch.Tensor]:
    """The kernels' backward; ``fields()``: the C views of q, k, v, dq, dk, dv."""
    dbias = None
    if bias is not None and need_dbias:
        dbias = torch.zeros(bias.shape, dtype=torch.float32, device=like.device)
    B, N, H, D = shape
    if B * N * H * D == 0:
        return dbias
    lib = _kernel_lib(like)
    qf, kf, vf, dqf, dkf, dvf = fields()
    a = _BWD.new(_lib.GM_DTYPES[like.dtype], *qf, *kf, *vf, *_tf(_rows(o)), *_tf(_rows(d_o)), *_tf(lse),
                 *_tf(_bias_kernels(bias)), *dqf, *dkf, *dvf, *_tf(dbias), *_part_fields(ix), ix.window,
                 ix.scale, _lib.GM_ALGOS[algo])
    call_with_workspace(lib, "gm_attention_bwd", a, like, "attention backward")
    return dbias


# partitioning copies rows: any 2- or 4-byte element type goes as the float type of its size
_BY_SIZE = {2: _lib.GM_DTYPES[torch.float16], 4: _lib.GM_DTYPES[torch.float32]}


def _partition_call(fn: str, x: torch.Tensor, y: torch.Tensor, ix: Index):
    lib = _kernel_lib(x)
    dtype = _lib.GM_DTYPES.get(x.dtype)
    if dtype is None:
        dtype = _BY_SIZE.get(x.element_size(), -1)
    if dtype < 0:
        raise GreenmimError(f"greenmim: partition on the kernels takes 2- or 4-byte elements, got {x.dtype}")
    a = _COPY.new(dtype, *_tf(x), *_tf(y), *_part_fields(ix, slot_coord=False))
    _lib.kernel_check(lib, getattr(lib, fn)(ctypes.byref(a), _stream(x)), fn)


def partition_tokens(x, ix: Index) -> torch.Tensor:
    B, N, C = x.shape
    y = x.new_empty((B, ix.gather.numel(), C))
    if uses_kernels(x) and y.numel() > 0:
        _partition_call("gm_partition_tokens", _rows(x), y, ix)
        return y
    idx = ix.gather.long()
    real = (idx >= 0).view(1, -1, 1)
    return torch.where(real, x.index_select(1, idx.clamp(min=0)), torch.zeros((), dtype=x.dtype, device=x.device))


def unpartition_tokens(y, ix: Index) -> torch.Tensor:
    B, S, C = y.shape
    if uses_kernels(y) and y.numel() > 0 and ix.scatter.numel() > 0:
        x = y.new_empty((B, ix.scatter.numel(), C))
        _partition_call("gm_unpartition_tokens", x, _rows(y), ix)
        return x
    return y.index_select(1, ix.scatter.long())
