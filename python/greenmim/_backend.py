"""Where each op runs, and the calls into the C ABIs with torch tensors.

- CPU tensors (float32/float64): the CPU reference (libgreenmim_host).
- CUDA tensors (float32/float16/bfloat16): the kernels (libgreenmim_cuda) on torch's current
  stream; device workspace comes from torch's caching allocator (the library never allocates).
- With ``emulate_cuda(True)`` CPU tensors take the CUDA path instead, through the kernels built
  for the CPU emulator (libgreenmim_emu): slow, for testing the CUDA path without a GPU.

This file only checks, converts and calls: the arithmetic is in the compiled library.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import _lib
from ._lib import GreenmimError

_state = threading.local()


@contextlib.contextmanager
def emulate_cuda(enabled: bool = True):
    """Within this context CPU tensors run the CUDA kernels on the CPU emulator (tests only)."""
    old = getattr(_state, "emulate", False)
    _state.emulate = enabled
    try:
        yield
    finally:
        _state.emulate = old


def emulating() -> bool:
    return getattr(_state, "emulate", False)


def uses_kernels(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" or (t.device.type == "cpu" and emulating())


def _kernel_lib(t: torch.Tensor):
    return _lib.kernels(emulated=t.device.type != "cuda")


def _stream(t: torch.Tensor) -> Optional[int]:
    if t.device.type == "cuda":
        return torch.cuda.current_stream(t.device).cuda_stream
    return None


def device_buffer(nbytes: int, like: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """Scratch memory from torch's allocator (the library never allocates), and its first
    256-byte aligned address (CUB and the backward's workspace want that alignment)."""
    buf = torch.empty(int(nbytes) + 256, dtype=torch.uint8, device=like.device)
    return buf, (buf.data_ptr() + 255) & ~255


def call_with_workspace(lib, fn: str, a, like: torch.Tensor, what: str) -> None:
    """Calls the kernels' ``fn(args, workspace, bytes, stream)`` with the workspace that
    ``fn_workspace_size`` asks for (CUB's two-phase temporary storage), on ``like``'s device."""
    size = ctypes.c_size_t(0)
    _lib.kernel_check(lib, getattr(lib, fn + "_workspace_size")(ctypes.byref(a), ctypes.byref(size)), what)
    ws, ws_ptr = device_buffer(size.value, like)
    _lib.kernel_check(lib, getattr(lib, fn)(ctypes.byref(a), ws_ptr, size.value, _stream(like)), what)
    del ws   # torch reuses the block only for work queued after this call on the same stream


def _rows(t: torch.Tensor) -> torch.Tensor:
    """The kernels need a unit-stride last dimension; anything else is copied once."""
    return t if t.stride(-1) == 1 else t.contiguous()


class Index(NamedTuple):
    """One stage partition as the library reads it: the four int32 index tensors of a
    :class:`greenmim.StagePartition` and the attention's geometry. The custom ops' schemas carry
    the tensors as one ``Tensor[]`` argument (a schema takes tensors and scalars, not objects);
    :meth:`of` rebuilds this from them, and everything below the ops takes it whole."""
    gather: torch.Tensor
    scatter: torch.Tensor
    slot_window: torch.Tensor
    slot_coord: torch.Tensor
    group_size: int
    window: int = 0
    scale: float = 1.0

    @staticmethod
    def tensors(part) -> List[torch.Tensor]:
        """The op argument for a partition (anything with the four index attributes)."""
        return [part.gather, part.scatter, part.slot_window, part.slot_coord]

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor], group_size: int, window: int = 0, scale: float = 1.0) -> "Index":
        if len(tensors) != 4:
            raise GreenmimError(f"greenmim: a partition is 4 index tensors (gather, scatter, slot_window, "
                                f"slot_coord), got {len(tensors)}")
        return cls(*tensors, int(group_size), int(window), float(scale))

    def op_args(self) -> tuple:
        """``(index, group_size, window, scale)``, as the attention ops' schemas take them."""
        return list(self[:4]), self.group_size, self.window, self.scale


def check_inputs(q, k, v, bias, ix: Index) -> None:
    """Python-side checks that give a clear exception before any library call."""
    for n, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise GreenmimError(f"greenmim: {n} must be [B, N, heads, head_dim], got shape {tuple(t.shape)}")
    if q.shape != k.shape or q.shape != v.shape:
        raise GreenmimError(f"greenmim: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise GreenmimError(f"greenmim: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise GreenmimError("greenmim: q, k, v are on different devices")
    gather, scatter, slot_window, slot_coord, group_size, window, _ = ix
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
    if bias is not None:
        if bias.dim() != 2 or bias.shape[1] != q.shape[2]:
            raise GreenmimError(f"greenmim: bias table must be [(2p-1)^2, heads={q.shape[2]}], got {tuple(bias.shape)}")
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
    """The kernels take the bias table in float32 (autocast may hand a float32 parameter)."""
    if bias is None:
        return None
    if uses_kernels(q):
        return bias.detach().to(torch.float32).contiguous()
    return bias.detach().to(q.dtype)


def _args(struct, q, tensors: dict, ix: Index):
    """One argument struct for either ABI: the kernels' (dtype code, algo set by the caller) or the
    host reference's (float32/float64)."""
    a = struct()
    a.dtype = _lib.GM_DTYPES[q.dtype] if struct is not _lib.HostAttentionArgs else \
        (_lib.GMH_FLOAT64 if q.dtype == torch.float64 else _lib.GMH_FLOAT32)
    for name, t in tensors.items():
        setattr(a, name, _lib.tensor(t))
    a.part = _lib.partition(ix)
    a.window, a.scale = ix.window, ix.scale
    return a


def attention_fwd(q, k, v, bias, ix: Index, algo: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    B, N, H, D = q.shape
    o = torch.empty((B, N, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, N, H), dtype=lse_dtype(q), device=q.device)
    if o.numel() == 0:
        return o, lse
    if uses_kernels(q):
        lib = _kernel_lib(q)
        t = dict(q=_rows(q), k=_rows(k), v=_rows(v), o=o, lse=lse, bias_table=_bias_f32(bias, q))
        a = _args(_lib.FwdArgs, q, t, ix)
        a.algo = _lib.GM_ALGOS[algo]
        _lib.kernel_check(lib, lib.gm_attention_fwd(ctypes.byref(a), _stream(q)), "attention forward")
    else:
        t = dict(q=q, k=k, v=v, o=o, lse=lse, bias_table=_bias_f32(bias, q))
        a = _args(_lib.HostAttentionArgs, q, t, ix)
        _lib.host_check(_lib.host().gmh_attention_fwd(ctypes.byref(a)), "attention forward")
    return o, lse


def attention_bwd(d_o, q, k, v, o, lse, bias, ix: Index, dq, dk, dv, need_dbias: bool,
                  algo: str = "auto") -> Optional[torch.Tensor]:
    """Writes dq, dk, dv (tensors of q's shape, any strides with a unit last one) and returns
    d(bias table) (float32 on the kernels, q's dtype on the CPU) or None."""
    kernels = uses_kernels(q)
    dbias = None
    if bias is not None and need_dbias:
        dbias = torch.zeros(bias.shape, dtype=torch.float32 if kernels else q.dtype, device=q.device)
    if q.numel() == 0:
        return dbias
    if kernels:
        q, k, v, o = _rows(q), _rows(k), _rows(v), _rows(o)
    t = dict(q=q, k=k, v=v, o=o, d_o=_rows(d_o), lse=lse, bias_table=_bias_f32(bias, q), dq=dq, dk=dk, dv=dv,
             d_bias_table=dbias)
    if kernels:
        lib = _kernel_lib(q)
        a = _args(_lib.BwdArgs, q, t, ix)
        a.algo = _lib.GM_ALGOS[algo]
        call_with_workspace(lib, "gm_attention_bwd", a, q, "attention backward")
    else:
        a = _args(_lib.HostAttentionArgs, q, t, ix)
        _lib.host_check(_lib.host().gmh_attention_bwd(ctypes.byref(a)), "attention backward")
    return dbias


def _partition_call(fn: str, x: torch.Tensor, y: torch.Tensor, ix: Index):
    lib = _kernel_lib(x)
    a = _lib.PartitionArgs()
    # partitioning copies rows: any 2- or 4-byte element type goes as the float type of its size
    by_size = {2: _lib.GM_DTYPES[torch.float16], 4: _lib.GM_DTYPES[torch.float32]}
    a.dtype = _lib.GM_DTYPES.get(x.dtype, by_size.get(x.element_size(), -1))
    if a.dtype < 0:
        raise GreenmimError(f"greenmim: partition on the kernels takes 2- or 4-byte elements, got {x.dtype}")
    a.x, a.y = _lib.tensor(x), _lib.tensor(y)
    a.part = _lib.partition(ix, slot_coord=False)
    _lib.kernel_check(lib, getattr(lib, fn)(ctypes.byref(a), _stream(x)), fn)


def partition_tokens(x, ix: Index) -> torch.Tensor:
    B, N, C = x.shape
    y = torch.empty((B, ix.gather.numel(), C), dtype=x.dtype, device=x.device)
    if uses_kernels(x) and y.numel() > 0:
        _partition_call("gm_partition_tokens", _rows(x), y, ix)
        return y
    idx = ix.gather.long()
    real = (idx >= 0).view(1, -1, 1)
    return torch.where(real, x.index_select(1, idx.clamp(min=0)), torch.zeros((), dtype=x.dtype, device=x.device))


def unpartition_tokens(y, ix: Index) -> torch.Tensor:
    B, S, C = y.shape
    if uses_kernels(y) and y.numel() > 0 and ix.scatter.numel() > 0:
        x = torch.empty((B, ix.scatter.numel(), C), dtype=y.dtype, device=y.device)
        _partition_call("gm_unpartition_tokens", x, _rows(y), ix)
        return x
    return y.index_select(1, ix.scatter.long())
