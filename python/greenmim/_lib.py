"""ctypes bindings of greenmim's two C ABIs.

- ``greenmim_host.h`` (libgreenmim_host.so): planner, index builders, CPU reference attention.
- ``kernels.h`` (libgreenmim_cuda.so, or libgreenmim_emu.so: the same kernel sources on the CPU
  emulator of kernels/emu: ``greenmim.emulate_cuda()`` runs the CUDA path on CPU tensors).

Nothing here is compiled against torch, so one build serves every torch version. The libraries
are looked up in ``$GREENMIM_LIB_DIR``, then next to this file (``_libs/``, where ``pip install``
puts them), then in the source tree's ``build/lib``.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import struct
import threading
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t, c_void_p
from typing import Dict, Optional, Tuple

import torch


class GreenmimError(RuntimeError):
    """A call into greenmim was refused; the message is the library's own reason."""


# ---- struct layouts, checked against the libraries' own tables (gm_abi_layout, gmh_abi_layout) ---

_ABI_STRUCTS: Dict[str, type] = {}  # C struct name -> its ctypes class


def abi_struct(*c_names: str):
    """Class decorator: the ctypes class declares the C structs ``c_names`` (``gm_*`` of
    kernels.h, ``gmh_*`` of greenmim_host.h). Each library's layout table is checked against
    every class declared for it when the library is loaded: a new struct is this one line."""
    def register(cls):
        for n in c_names:
            _ABI_STRUCTS[n] = cls
        return cls
    return register


class _AbiEntry(ctypes.Structure):
    """gm_abi_entry / gmh_abi_entry: struct `name`, and its `field` (NULL: the struct itself)."""
    _fields_ = [("name", c_char_p), ("field", c_char_p), ("offset", c_size_t), ("size", c_size_t)]


def _layout_table(lib: ctypes.CDLL, fn: str) -> Dict[str, Tuple[int, Dict[str, Tuple[int, int]]]]:
    """A library's layout table: struct -> (sizeof, {field: (offset, size)})."""
    f = getattr(lib, fn)
    f.restype, f.argtypes = POINTER(_AbiEntry), [POINTER(c_size_t)]
    n = c_size_t()
    entries = f(ctypes.byref(n))
    table: Dict[str, Tuple[int, Dict[str, Tuple[int, int]]]] = {}
    for i in range(n.value):
        e = entries[i]
        name = e.name.decode()
        if e.field is None:
            table[name] = (e.size, {})
        else:
            table[name][1][e.field.decode()] = (e.offset, e.size)
    return table


def check_layouts(table, prefix: str, what: str, structs: Optional[Dict[str, type]] = None) -> None:
    """Refuses (GreenmimError naming the struct and the field) any ctypes class registered for a
    struct named ``prefix*`` whose fields, offsets, sizes or total size differ from ``table``."""
    structs = _ABI_STRUCTS if structs is None else structs
    for cname, cls in sorted(structs.items()):
        if not cname.startswith(prefix):
            continue
        where = f"greenmim: {what} and greenmim/_lib.py disagree on struct {cname} ({cls.__name__})"
        if cname not in table:
            raise GreenmimError(f"{where}: the library has no such struct; rebuild it")
        size, fields = table[cname]
        ours = {f: (getattr(cls, f).offset, getattr(cls, f).size) for f, *_ in cls._fields_}
        for f, (off, sz) in fields.items():
            if f not in ours:
                raise GreenmimError(f"{where}: field {f} (offset {off}, {sz} bytes) is missing in Python")
            if ours[f] != (off, sz):
                raise GreenmimError(f"{where}: field {f} is at offset {off}, {sz} bytes in C, "
                                    f"offset {ours[f][0]}, {ours[f][1]} bytes in Python")
        for f in ours:
            if f not in fields:
                raise GreenmimError(f"{where}: field {f} is not in the C struct")
        if ctypes.sizeof(cls) != size:
            raise GreenmimError(f"{where}: {size} bytes in C, {ctypes.sizeof(cls)} in Python")


@abi_struct("gm_tensor", "gmh_tensor")
class Tensor(ctypes.Structure):
    """gm_tensor / gmh_tensor: data, rank, extents and strides in elements (rank <= 4)."""
    _fields_ = [("data", c_void_p), ("rank", c_int32), ("extent", c_int64 * 4), ("stride", c_int64 * 4)]


@abi_struct("gm_partition", "gmh_partition")
class Partition(ctypes.Structure):
    """gm_partition / gmh_partition."""
    _fields_ = [("gather", c_void_p), ("scatter", c_void_p), ("slot_window", c_void_p), ("slot_coord", c_void_p),
                ("group_size", c_int32), ("num_groups", c_int32), ("num_tokens", c_int32)]


@abi_struct("gm_window_geometry")
class WindowGeometry(ctypes.Structure):
    """gm_window_geometry (passed by value)."""
    _fields_ = [("height", c_int32), ("width", c_int32), ("window", c_int32), ("shift", c_int32)]


@abi_struct("gmh_stage_args")
class StageArgs(ctypes.Structure):
    _fields_ = [("visible", c_void_p), ("num_masks", c_int32), ("height", c_int32), ("width", c_int32),
                ("window", c_int32), ("shift", c_int32), ("strategy", c_int32), ("group_size", c_int32),
                ("channels", c_int32), ("max_group_size", c_int32)]


@abi_struct("gmh_stage_info")
class StageInfo(ctypes.Structure):
    _fields_ = [("group_size", c_int32), ("num_groups", c_int32), ("num_tokens", c_int32), ("num_windows", c_int32),
                ("window", c_int32), ("shift", c_int32), ("budget_exhausted", c_int32),
                ("cost", c_double), ("lower_bound", c_double), ("plan_us", c_double)]


@abi_struct("gmh_attention_args")
class HostAttentionArgs(ctypes.Structure):
    _fields_ = [("dtype", c_int32)] + [(n, Tensor) for n in
                                       ("q", "k", "v", "o", "lse", "d_o", "dq", "dk", "dv", "bias_table", "d_bias_table")] + \
               [("part", Partition), ("window", c_int32), ("scale", c_double)]


@abi_struct("gm_attention_fwd_args")
class FwdArgs(ctypes.Structure):
    """gm_attention_fwd_args."""
    _fields_ = [("dtype", c_int32), ("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor), ("lse", Tensor),
                ("bias_table", Tensor), ("part", Partition), ("window", c_int32), ("scale", c_float),
                ("algo", c_int32)]


@abi_struct("gm_attention_bwd_args")
class BwdArgs(ctypes.Structure):
    """gm_attention_bwd_args."""
    _fields_ = [("dtype", c_int32)] + [(n, Tensor) for n in
                                       ("q", "k", "v", "o", "d_o", "lse", "bias_table", "dq", "dk", "dv", "d_bias_table")] + \
               [("part", Partition), ("window", c_int32), ("scale", c_float), ("algo", c_int32)]


@abi_struct("gm_partition_args")
class PartitionArgs(ctypes.Structure):
    """gm_partition_args."""
    _fields_ = [("dtype", c_int32), ("x", Tensor), ("y", Tensor), ("part", Partition)]


@abi_struct("gmh_range")
class Range(ctypes.Structure):
    """gmh_range: int32 entries [offset, offset + size) of an encoder plan's arena."""
    _fields_ = [("offset", c_int64), ("size", c_int64)]


@abi_struct("gmh_plan_partition")
class PlanPartition(ctypes.Structure):
    """gmh_plan_partition."""
    _fields_ = [("group_size", c_int32), ("num_groups", c_int32), ("num_windows", c_int32), ("window", c_int32),
                ("shift", c_int32), ("budget_exhausted", c_int32), ("cost", c_double), ("lower_bound", c_double),
                ("plan_us", c_double)] + [(n, Range) for n in
                                          ("gather", "scatter", "slot_window", "slot_coord")]


@abi_struct("gmh_plan_stage")
class PlanStage(ctypes.Structure):
    """gmh_plan_stage."""
    _fields_ = [("height", c_int32), ("width", c_int32), ("num_tokens", c_int32), ("reserved", c_int32),
                ("part", PlanPartition * 2)] + [(n, Range) for n in ("position", "merge", "cu_seqlens", "unit_rank")]


GMH_MAX_STAGES = 8


@abi_struct("gmh_encoder_args")
class EncoderArgs(ctypes.Structure):
    """gmh_encoder_args."""
    _fields_ = [("visible", c_void_p)] + [(n, c_int32) for n in (
        "num_masks", "mask_height", "mask_width", "per_sample", "grid", "window", "num_stages", "embed_dim",
        "strategy", "group_size", "max_group_size")]


@abi_struct("gmh_encoder_info")
class EncoderInfo(ctypes.Structure):
    """gmh_encoder_info."""
    _fields_ = [("num_stages", c_int32), ("num_masks", c_int32), ("arena_size", c_int64), ("build_us", c_double),
                ("stage", PlanStage * GMH_MAX_STAGES)]


@abi_struct("gmh_twins_stage")
class TwinsStage(ctypes.Structure):
    """gmh_twins_stage."""
    _fields_ = [(n, c_int32) for n in ("height", "width", "num_tokens", "num_keys", "max_tokens", "max_keys", "uniform",
                                       "key_holes", "embed_holes", "reshape")] + \
               [("lsa", PlanPartition)] + [(n, Range) for n in ("position", "cu_seqlens", "neighbors", "keys",
                                                                "key_cu_seqlens", "query_slot", "key_gather", "embed",
                                                                "unit_rank")]


@abi_struct("gmh_twins_args")
class TwinsArgs(ctypes.Structure):
    """gmh_twins_args."""
    _fields_ = [("visible", c_void_p)] + [(n, c_int32) for n in (
        "num_masks", "mask_height", "mask_width", "per_sample", "grid", "num_stages")] + \
        [(n, c_int32 * GMH_MAX_STAGES) for n in ("window", "sr_ratio", "channels")] + \
        [(n, c_int32) for n in ("strategy", "group_size", "max_group_size")]


@abi_struct("gmh_twins_info")
class TwinsInfo(ctypes.Structure):
    """gmh_twins_info."""
    _fields_ = [("num_stages", c_int32), ("num_masks", c_int32), ("arena_size", c_int64), ("build_us", c_double),
                ("stage", TwinsStage * GMH_MAX_STAGES)]


@abi_struct("gmh_conv_table_args")
class ConvTableArgs(ctypes.Structure):
    """gmh_conv_table_args."""
    _fields_ = [("visible", c_void_p)] + [(n, c_int32) for n in ("num_masks", "height", "width", "per_sample", "kind",
                                                                  "size")]


@abi_struct("gmh_conv_table_info")
class ConvTableInfo(ctypes.Structure):
    """gmh_conv_table_info."""
    _fields_ = [(n, c_int32) for n in ("num_inputs", "num_outputs", "row", "holes")]


@abi_struct("gmh_conv_args")
class HostConvArgs(ctypes.Structure):
    """gmh_conv_args."""
    _fields_ = [("dtype", c_int32)] + [(n, Tensor) for n in ("x", "y", "dy", "dx", "weight", "bias", "dweight",
                                                             "dbias")] + \
               [("table", c_void_p), ("table_size", c_int64), ("size", c_int32), ("residual", c_int32)]


@abi_struct("gm_depthwise_conv_args")
class DepthwiseConvArgs(ctypes.Structure):
    """gm_depthwise_conv_args."""
    _fields_ = [("dtype", c_int32)] + [(n, Tensor) for n in ("x", "y", "dy", "dx")] + \
               [("nbr", c_void_p), ("kernel", c_int32), ("weight", c_void_p), ("bias", c_void_p), ("dweight", c_void_p),
                ("dbias", c_void_p), ("residual", c_int32)]


@abi_struct("gm_block_conv_args")
class BlockConvArgs(ctypes.Structure):
    """gm_block_conv_args."""
    _fields_ = [("dtype", c_int32)] + [(n, Tensor) for n in ("x", "y", "dy", "dx")] + \
               [("gather", c_void_p), ("stride", c_int32), ("weight", c_void_p), ("bias", c_void_p),
                ("dweight", c_void_p), ("dbias", c_void_p)]


GMH_NEIGHBOR_TABLE, GMH_BLOCK_TABLE = 0, 1
GMH_FLOAT32, GMH_FLOAT64 = 0, 3
GM_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
GM_ALGOS = {"auto": 0, "simt": 1, "mma": 2}
STRATEGIES = {"fast": 0, "paper": 1, "per-window": 2, "single": 3}
_KERNELS_ABI_VERSION = 2
_HOST_ABI_VERSION = 5


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


# ---- loading -------------------------------------------------------------------------------------

def _candidate_dirs():
    env = os.environ.get("GREENMIM_LIB_DIR")
    if env:
        yield pathlib.Path(env)
    here = pathlib.Path(__file__).resolve().parent
    yield here / "_libs"
    yield here.parent.parent / "build" / "lib"


def _find(name: str) -> Optional[pathlib.Path]:
    for d in _candidate_dirs():
        p = d / f"lib{name}.so"
        if p.exists():
            return p
    return None


_lock = threading.Lock()
_libs: dict = {}


def _load(name: str, what: str) -> ctypes.CDLL:
    with _lock:
        if name in _libs:
            return _libs[name]
        path = _find(name)
        if path is None:
            dirs = ", ".join(str(d) for d in _candidate_dirs())
            raise GreenmimError(
                f"greenmim: lib{name}.so ({what}) not found in {dirs}. Build it with "
                f"`cmake --build build --target greenmim_python_libs` or install the package with "
                f"`pip install ./python`; GREENMIM_LIB_DIR overrides the search.")
        lib = ctypes.CDLL(str(path))
        _libs[name] = lib
        return lib


def host() -> ctypes.CDLL:
    """The host library (planner, indices, CPU reference), loaded once."""
    if "host" in _libs:
        return _libs["host"]
    lib = _load("greenmim_host", "planner, index builders and CPU reference")
    lib.gmh_abi_version.restype = c_int32
    if lib.gmh_abi_version() != _HOST_ABI_VERSION:
        raise GreenmimError(f"greenmim: libgreenmim_host.so has ABI {lib.gmh_abi_version()}, "
                            f"this package expects {_HOST_ABI_VERSION}: rebuild it")
    check_layouts(_layout_table(lib, "gmh_abi_layout"), "gmh_", "libgreenmim_host.so")
    lib.gmh_last_error.restype = c_char_p
    lib.gmh_stage_build.argtypes = [POINTER(StageArgs), POINTER(c_void_p)]
    lib.gmh_stage_info_get.argtypes = [c_void_p, POINTER(StageInfo)]
    lib.gmh_stage_copy.argtypes = [c_void_p] + [c_void_p] * 6
    lib.gmh_stage_free.argtypes = [c_void_p]
    lib.gmh_stage_free.restype = None
    lib.gmh_window_geometry.argtypes = [c_int32] * 4 + [POINTER(c_int32)] * 3
    lib.gmh_plan_table.argtypes = [c_void_p, c_int32, c_int32, c_int32, c_int32, c_int32, c_void_p, c_void_p,
                                   POINTER(StageInfo)]
    lib.gmh_fast_path_max_group.argtypes = [c_int32]
    lib.gmh_fast_path_max_group.restype = c_int32
    lib.gmh_merge_indices.argtypes = [c_void_p, c_int32, c_int32, c_int32, c_void_p, c_int64, POINTER(c_int64)]
    lib.gmh_encoder_planner_create.argtypes = [POINTER(c_void_p)]
    lib.gmh_encoder_planner_destroy.argtypes = [c_void_p]
    lib.gmh_encoder_planner_destroy.restype = None
    lib.gmh_encoder_plan_prepare.argtypes = [c_void_p, POINTER(EncoderArgs), POINTER(EncoderInfo)]
    lib.gmh_encoder_plan_write.argtypes = [c_void_p, c_void_p]
    lib.gmh_attention_fwd.argtypes = [POINTER(HostAttentionArgs)]
    lib.gmh_attention_bwd.argtypes = [POINTER(HostAttentionArgs)]
    lib.gmh_twins_planner_create.argtypes = [POINTER(c_void_p)]
    lib.gmh_twins_planner_destroy.argtypes = [c_void_p]
    lib.gmh_twins_planner_destroy.restype = None
    lib.gmh_twins_plan_prepare.argtypes = [c_void_p, POINTER(TwinsArgs), POINTER(TwinsInfo)]
    lib.gmh_twins_plan_write.argtypes = [c_void_p, c_void_p]
    lib.gmh_conv_table_build.argtypes = [POINTER(ConvTableArgs), POINTER(c_void_p), POINTER(ConvTableInfo)]
    lib.gmh_conv_table_copy.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p]
    lib.gmh_conv_table_free.argtypes = [c_void_p]
    lib.gmh_conv_table_free.restype = None
    for f in ("gmh_depthwise_conv_fwd", "gmh_depthwise_conv_bwd", "gmh_block_conv_fwd", "gmh_block_conv_bwd"):
        getattr(lib, f).argtypes = [POINTER(HostConvArgs)]
    _libs["host"] = lib
    return lib


def host_check(rc: int, where: str) -> None:
    if rc != 0:
        msg = host().gmh_last_error().decode(errors="replace")
        raise GreenmimError(f"greenmim: {where}: {msg}")


def _setup_kernels(lib: ctypes.CDLL, name: str) -> ctypes.CDLL:
    lib.gm_kernels_abi_version.restype = c_int
    if lib.gm_kernels_abi_version() != _KERNELS_ABI_VERSION:
        raise GreenmimError(f"greenmim: {name} has kernels ABI {lib.gm_kernels_abi_version()}, "
                            f"this package expects {_KERNELS_ABI_VERSION}: rebuild it")
    check_layouts(_layout_table(lib, "gm_abi_layout"), "gm_", f"lib{name}.so")
    lib.gm_last_refusal.restype = c_char_p
    for f, a in (("gm_attention_fwd", FwdArgs), ("gm_attention_bwd_workspace_size", BwdArgs),
                 ("gm_partition_tokens", PartitionArgs), ("gm_unpartition_tokens", PartitionArgs)):
        getattr(lib, f).restype = c_int
    lib.gm_attention_fwd.argtypes = [POINTER(FwdArgs), c_void_p]
    lib.gm_attention_bwd_workspace_size.argtypes = [POINTER(BwdArgs), POINTER(c_size_t)]
    lib.gm_attention_bwd.argtypes = [POINTER(BwdArgs), c_void_p, c_size_t, c_void_p]
    lib.gm_attention_bwd.restype = c_int
    lib.gm_partition_tokens.argtypes = [POINTER(PartitionArgs), c_void_p]
    lib.gm_unpartition_tokens.argtypes = [POINTER(PartitionArgs), c_void_p]
    lib.gm_select_visible.argtypes = [c_void_p, POINTER(c_size_t), c_void_p, c_int32, c_int32, c_int32, c_void_p,
                                      c_void_p, c_void_p]
    lib.gm_select_visible.restype = c_int
    lib.gm_token_windows.argtypes = [c_void_p, c_void_p, c_int32, c_int32, WindowGeometry, c_void_p, c_void_p,
                                     c_void_p, c_void_p]
    lib.gm_token_windows.restype = c_int
    lib.gm_build_partition.argtypes = [c_void_p, POINTER(c_size_t), c_void_p, c_void_p, c_int32, c_void_p, c_int32,
                                       c_void_p, c_void_p, c_int32, c_int32, c_void_p, c_void_p, c_void_p,
                                       c_void_p, c_void_p]
    lib.gm_build_partition.restype = c_int
    # the depthwise forward takes no workspace; the depthwise backward and both block convs do
    # (fn_workspace_size, then fn(args, workspace, bytes, stream))
    lib.gm_depthwise_conv_fwd.argtypes = [POINTER(DepthwiseConvArgs), c_void_p]
    lib.gm_depthwise_conv_fwd.restype = c_int
    for f, a in (("gm_depthwise_conv_bwd", DepthwiseConvArgs), ("gm_block_conv_fwd", BlockConvArgs),
                 ("gm_block_conv_bwd", BlockConvArgs)):
        getattr(lib, f).argtypes = [POINTER(a), c_void_p, c_size_t, c_void_p]
        getattr(lib, f).restype = c_int
        getattr(lib, f + "_workspace_size").argtypes = [POINTER(a), POINTER(c_size_t)]
        getattr(lib, f + "_workspace_size").restype = c_int
    return lib


def kernels(emulated: bool = False) -> ctypes.CDLL:
    """The kernels' C ABI: libgreenmim_cuda.so, or with ``emulated`` the CPU-emulated build."""
    key = "emu" if emulated else "cuda"
    if key in _libs:
        return _libs[key]
    name = "greenmim_emu" if emulated else "greenmim_cuda"
    lib = _setup_kernels(_load(name, "CUDA kernels" + (" on the CPU emulator" if emulated else "")), name)
    _libs[key] = lib
    return lib


_CUDA_ERRORS = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 98: "cudaErrorInvalidDeviceFunction",
                209: "cudaErrorNoKernelImageForDevice", 719: "cudaErrorLaunchFailure"}


def kernel_check(lib: ctypes.CDLL, rc: int, where: str) -> None:
    if rc != 0:
        reason = lib.gm_last_refusal().decode(errors="replace")
        name = _CUDA_ERRORS.get(rc, f"cudaError {rc}")
        raise GreenmimError(f"greenmim: {where}: {reason or name} ({name})")
