"""Which path a tensor takes and what every call into the kernels needs: the emulator switch, the
kernels' library for a tensor, torch's current stream, device scratch memory from torch's
allocator, unit-stride rows, and the device check every op makes first. The attention
(``_attention_abi.py``) and the conv (``_conv_abi.py``) calls share them from here.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Optional, Tuple

import torch
from torch import Tensor

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
    return t.is_cuda or (t.is_cpu and emulating())       # (is_cpu: device.type == "cpu" without a device object)


def kernel_lib(t: torch.Tensor):
    return _lib.kernels(emulated=not t.is_cuda)


# torch's current stream as the raw cudaStream_t: torch.cuda.current_stream() builds a Stream
# object per call (a few us of host time per op); the raw getter (what inductor's generated code
# calls) returns the handle alone. The public call stays the fallback for a torch without it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(t: torch.Tensor) -> Optional[int]:
    if t.is_cuda:
        return _raw_stream(t.get_device()) if _raw_stream is not None else \
            torch.cuda.current_stream(t.device).cuda_stream
    return None


def device_buffer(nbytes: int, like: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """Scratch memory from torch's allocator (the library never allocates), and its first
    256-byte aligned address (CUB and the backward's workspace want that alignment)."""
    buf = like.new_empty((int(nbytes) + 256,), dtype=torch.uint8)
    return buf, (buf.data_ptr() + 255) & ~255


def call_with_workspace(lib, fn: str, a, like: torch.Tensor, what: str) -> None:
    """Calls the kernels' ``fn(args, workspace, bytes, stream)`` with the workspace that
    ``fn_workspace_size`` asks for (CUB's two-phase temporary storage), on ``like``'s device."""
    size = ctypes.c_size_t(0)
    _lib.kernel_check(lib, getattr(lib, fn + "_workspace_size")(ctypes.byref(a), ctypes.byref(size)), what)
    ws, ws_ptr = device_buffer(size.value, like)
    _lib.kernel_check(lib, getattr(lib, fn)(ctypes.byref(a), ws_ptr, size.value, stream(like)), what)
    del ws   # torch reuses the block only for work queued after this call on the same stream


def rows(t: torch.Tensor) -> torch.Tensor:
    """The kernels need a unit-stride last dimension; anything else is copied once."""
    return t if t.stride(-1) == 1 else t.contiguous()


def check_devices(where: str, like: Tensor, **tensors: Optional[Tensor]) -> None:
    """Every tensor on ``like``'s device. A plan on another device must not reach the ops: with one
    input on "meta", torch would run their shape-only fakes and return uninitialised memory."""
    device = like.device
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise GreenmimError(
                f"greenmim: {where}: {name} is on {t.device}, the features on {like.device}: plans and "
                f"tensors must share a device (plan.to({str(like.device)!r}), or plan_masks(..., device=...))")
