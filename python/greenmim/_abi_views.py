"""C views for the ABIs: a tensor's view (``tensor``), a partition's (``partition``), and the
kernels' argument structs written in one call (``Packer`` over ``tensor_fields`` /
``partition_fields``), the per-call host time of the ops' eager path. The struct classes and
their load-time layout check live in ``_lib``."""
from __future__ import annotations

import ctypes
import struct
from ctypes import c_double, c_float, c_int32, c_int64, c_size_t, c_void_p
from typing import Optional

import torch

from ._lib import GreenmimError, Partition, Tensor


# An empty tensor may have no storage (data_ptr() 0), but a null data pointer means "absent" to
# the C ABIs (no lse, no bias): its view points here instead, at 16 real bytes nobody reads.
_EMPTY = (ctypes.c_longlong * 2)()


def tensor(t: Optional[torch.Tensor]) -> Tensor:
    """A view of ``t`` for the C ABI (a null view for None). Strides are torch's, in elements."""
    v = Tensor()
    if t is None:
        return v
    if t.dim() > 4:
        raise GreenmimError(f"greenmim: tensors of rank <= 4 only, got shape {tuple(t.shape)}")
    v.data = t.data_ptr() or (ctypes.addressof(_EMPTY) if t.numel() == 0 else 0)
    n = v.rank = t.dim()
    v.extent[:n] = t.shape       # slice assignments: one ctypes call each, not one per dimension
    v.stride[:n] = t.stride()
    return v


# ---- argument structs in one call (the ops' per-call host time) ----------------------------------
# Filling a struct field by field costs a ctypes call per field: about 2.6 us per tensor view on
# the CI CPU, 20-30 us per attention call. A Packer writes a whole struct with one
# ``struct.pack_into`` from a flat tuple of its leaf values, in the ctypes class's own layout
# (the format is derived from the class's field offsets, which check_layouts holds to the C
# library's): about 1 us per tensor view. tensor_fields / partition_fields give a view's values.

_UNSIGNED = {4: "I", 8: "Q"}    # standard-size codes: struct's "P" and "N" exist in native mode only
_LEAF_CODES = {c_int32: "i", c_int64: "q", c_double: "d", c_float: "f",
               c_void_p: _UNSIGNED[ctypes.sizeof(c_void_p)], c_size_t: _UNSIGNED[ctypes.sizeof(c_size_t)]}


def _leaf_format(cls, base: int, out: list) -> None:
    """Appends (offset, code) for every leaf of ctypes struct ``cls`` placed at ``base``."""
    for name, typ in cls._fields_:
        off = base + getattr(cls, name).offset
        if isinstance(typ, type) and issubclass(typ, ctypes.Structure):
            _leaf_format(typ, off, out)
        elif isinstance(typ, type) and issubclass(typ, ctypes.Array):
            step = ctypes.sizeof(typ._type_)
            out.extend((off + i * step, _LEAF_CODES[typ._type_]) for i in range(typ._length_))
        else:
            out.append((off, _LEAF_CODES[typ]))


class Packer:
    """Writes a ctypes struct of class ``cls`` in one ``struct.pack_into`` call: ``new(*values)``
    returns a fresh instance with every leaf (depth first, arrays element by element, in field
    order) set from ``values``; padding is zero."""

    def __init__(self, cls):
        leaves: list = []
        _leaf_format(cls, 0, leaves)
        fmt, pos = "=", 0                       # explicit padding: the offsets are ctypes' own
        for off, code in leaves:
            if off < pos:
                raise GreenmimError(f"greenmim: Packer: overlapping fields in {cls.__name__}")
            fmt += "x" * (off - pos) + code
            pos = off + struct.calcsize("=" + code)
        fmt += "x" * (ctypes.sizeof(cls) - pos)
        self.cls, self.struct = cls, struct.Struct(fmt)
        if self.struct.size != ctypes.sizeof(cls):
            raise GreenmimError(f"greenmim: Packer: {cls.__name__} is {ctypes.sizeof(cls)} bytes, its format "
                                f"{self.struct.size}")
        self._pack_into = self.struct.pack_into

    def new(self, *values):
        a = self.cls()
        self._pack_into(a, 0, *values)
        return a


_ZEROS = (0, 0, 0, 0)
NULL_TENSOR = (0, 0) + _ZEROS + _ZEROS        # tensor_fields(None): a null view


def tensor_fields(t: Optional[torch.Tensor]) -> tuple:
    """The 10 leaf values of :func:`tensor`'s view of ``t`` (data, rank, extents, strides), for a
    :class:`Packer`; the same refusals as :func:`tensor`."""
    if t is None:
        return NULL_TENSOR
    n = t.dim()
    if n > 4:
        raise GreenmimError(f"greenmim: tensors of rank <= 4 only, got shape {tuple(t.shape)}")
    data = t.data_ptr() or (ctypes.addressof(_EMPTY) if t.numel() == 0 else 0)
    if n == 4:
        return (data, 4, *t.shape, *t.stride())
    z = _ZEROS[n:]
    return (data, n, *t.shape, *z, *t.stride(), *z)


def partition_fields(ix, slot_coord: bool = True) -> tuple:
    """The 7 leaf values of :func:`partition`'s view, for a :class:`Packer`."""
    gs = ix.group_size
    return (ix.gather.data_ptr(), ix.scatter.data_ptr(), ix.slot_window.data_ptr(),
            ix.slot_coord.data_ptr() if slot_coord else 0, gs, ix.gather.numel() // gs if gs > 0 else 0,
            ix.scatter.numel())


def partition(ix, slot_coord: bool = True) -> Partition:
    """The C view of a partition (``ix``: anything with gather, scatter, slot_window, slot_coord
    int32 tensors and group_size; the copy kernels read no slot_coord)."""
    p = Partition()
    p.gather, p.scatter, p.slot_window = ix.gather.data_ptr(), ix.scatter.data_ptr(), ix.slot_window.data_ptr()
    p.slot_coord = ix.slot_coord.data_ptr() if slot_coord else None
    p.group_size = ix.group_size
    p.num_groups = ix.gather.numel() // ix.group_size if ix.group_size > 0 else 0
    p.num_tokens = ix.scatter.numel()
    return p
