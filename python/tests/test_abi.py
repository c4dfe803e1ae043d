"""The ctypes declarations of _lib.py agree with the C ABIs' own layout tables (gm_abi_layout,
gmh_abi_layout), and a declaration that does not is refused naming the struct and the field."""
import ctypes
import os
import pathlib

import pytest

from greenmim import _lib
from greenmim._lib import GreenmimError


def _lib_dir():
    return pathlib.Path(os.environ.get("GREENMIM_LIB_DIR", pathlib.Path(__file__).resolve().parents[2] / "build/lib"))


def test_host_layout_matches_and_covers_every_host_struct():
    table = _lib._layout_table(_lib.host(), "gmh_abi_layout")   # host() already checked it
    declared = {n for n in _lib._ABI_STRUCTS if n.startswith("gmh_")}
    assert declared and declared <= set(table)


@pytest.mark.parametrize("name", ["greenmim_emu", "greenmim_cuda"])
def test_kernel_libraries_export_the_abi_and_match(name):
    if not (_lib_dir() / f"lib{name}.so").exists():
        pytest.skip(f"lib{name}.so not built")
    lib = ctypes.CDLL(str(_lib_dir() / f"lib{name}.so"))
    for f in ("gm_attention_fwd", "gm_attention_bwd", "gm_partition_tokens", "gm_build_partition",
              "gm_depthwise_conv_fwd", "gm_block_conv_bwd", "gm_last_refusal"):
        assert hasattr(lib, f), f"lib{name}.so does not export {f}"
    table = _lib._layout_table(lib, "gm_abi_layout")
    _lib.check_layouts(table, "gm_", name)
    assert {n for n in _lib._ABI_STRUCTS if n.startswith("gm_")} <= set(table)


def test_a_wrong_declaration_is_refused_naming_struct_and_field():
    table = _lib._layout_table(_lib.host(), "gmh_abi_layout")

    class Swapped(ctypes.Structure):   # two fields of gmh_stage_info in the wrong order
        _fields_ = [(n, t) for n, t in _lib.StageInfo._fields_]
        _fields_[0], _fields_[1] = _fields_[1], _fields_[0]

    with pytest.raises(GreenmimError, match=r"gmh_stage_info.*field (group_size|num_groups) is at offset"):
        _lib.check_layouts(table, "gmh_", "test", {"gmh_stage_info": Swapped})

    class Missing(ctypes.Structure):   # a field forgotten
        _fields_ = [f for f in _lib.StageArgs._fields_ if f[0] != "max_group_size"]

    with pytest.raises(GreenmimError, match=r"gmh_stage_args.*field max_group_size .*missing in Python"):
        _lib.check_layouts(table, "gmh_", "test", {"gmh_stage_args": Missing})

    class Extra(ctypes.Structure):     # a field the C struct does not have
        _fields_ = list(_lib.Tensor._fields_) + [("padding", ctypes.c_int32)]

    with pytest.raises(GreenmimError, match=r"gmh_tensor.*field padding is not in the C struct"):
        _lib.check_layouts(table, "gmh_", "test", {"gmh_tensor": Extra})
