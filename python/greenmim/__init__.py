"""greenmim for PyTorch: attention on the visible tokens of masked images (GreenMIM, NeurIPS 2022).

    import greenmim
    model = greenmim.create_model("swin_base_patch4_window7_224")          # a visible-token encoder
    plan = model.plan(greenmim.random_masks(), device="cuda")  # one 7x7 mask shared by the batch
    loss = model(images, plan).float().pow(2).mean()          # visible tokens only

The top level holds what a user needs (``__all__``): the model registry (``create_model``,
``model_names``: GreenMIM models and encoders), the three model classes, mask plans, the two
attention ops, checkpoint loading and the error type. The rest lives in its module:
``greenmim.ops`` (every op, Twins' sparse convs too), ``greenmim.conv_tables`` (the convs'
tables), ``greenmim.mask_plan`` / ``greenmim.twins_plan`` (plan types), ``greenmim.swin`` /
``swinv2`` / ``twins`` / ``mim`` (layers and factories), ``greenmim.testing`` (per-stage builders).
The names this package exported before stay here for one release, with a DeprecationWarning.

See docs/pytorch.md. Needs PyTorch >= 2.4; the compiled parts are plain shared libraries called
through ctypes (no extension built against torch).
"""
import importlib
import warnings

from ._lib import GreenmimError
from ._device import emulate_cuda
from .mask_plan import MaskPlan, clear_cache, group_capacity, plan_masks, random_masks
from .ops import group_window_attention, group_window_attention_packed
from .twins_plan import TwinsPlan, TwinsPlanSpec, plan_twins
from .swin import VisibleSwinTransformer
from .swinv2 import VisibleSwinTransformerV2
from .twins import VisibleTwins
from .convnextv2 import VisibleConvNeXtV2
from . import checkpoint, ops, testing  # noqa: F401  (greenmim.ops, greenmim.testing)
from .checkpoint import load_pretrained
from .layers import set_activation_recompute
from .mim import GreenMIM, create_model, model_names

__version__ = "0.1.0"
__all__ = [
    "GreenmimError", "create_model", "model_names", "GreenMIM", "VisibleSwinTransformer", "VisibleSwinTransformerV2",
    "VisibleTwins", "VisibleConvNeXtV2", "plan_masks", "MaskPlan", "random_masks", "group_capacity", "plan_twins", "TwinsPlan",
    "TwinsPlanSpec", "group_window_attention", "group_window_attention_packed", "load_pretrained",
    "set_activation_recompute", "emulate_cuda", "clear_cache",
]

# Names exported before the surface was narrowed: name -> (module, attribute there). They work for
# one release and warn (tests/test_surface.py checks both).
_MOVED = {
    **{n: ("mask_plan", n) for n in ("StagePartition", "StagePlan")},
    **{n: ("testing", n) for n in ("stage_partition", "merge_indices", "window_geometry")},
    **{n: ("ops", n) for n in ("partition_tokens", "unpartition_tokens")},
    **{n: ("ops", n) for n in ("block_conv", "submanifold_depthwise_conv3x3")},
    **{n: ("conv_tables", n) for n in ("BlockTable", "NeighborTable", "block_table", "neighbor_table")},
    "TwinsStagePlan": ("twins_plan", "TwinsStagePlan"),
    "released_group_attention": ("released", "released_group_attention"),
    **{n: ("swin", n) for n in ("GroupWindowAttention", "PatchMerging", "swin_base_patch4_window7_224",
                                "swin_large_patch4_window7_224")},
    **{n: ("swinv2", n) for n in ("GroupWindowAttentionV2", "swinv2_base_window8_256", "swinv2_base_window16_256",
                                  "swinv2_large_window12_192")},
    **{n: ("twins", n) for n in ("twins_svt_small", "twins_svt_base", "twins_svt_large")},
    **{n: ("mim", n) for n in (
        "green_mim_swin_base_patch4_dec512b1", "green_mim_swin_base_patch4_win14_dec512b1",
        "green_mim_swin_large_patch4_win14_dec512b1", "green_mim_swin_base_patch4_window6_192_dec512b1",
        "green_mim_swin_large_patch4_window6_192_dec512b1", "green_mim_swinv2_base_window8_256_dec512b1",
        "green_mim_swinv2_base_window16_256_dec512b1", "green_mim_swinv2_large_window12_192_dec512b1",
        "green_mim_swin_tiny_patch4_dec512b1", "green_mim_swin_nano_patch4_dec128b1",
        "green_mim_twins_large_patch4_dec512b1", "green_mim_twins_nano_patch4_dec128b1")},
}


def __getattr__(name: str):
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'greenmim' has no attribute {name!r}")
    module, attr = moved
    factory = module == "mim" or attr.startswith(("swin", "twins_svt"))
    hint = f'greenmim.create_model("{attr}")' if factory else f"greenmim.{module}.{attr}"
    warnings.warn(f"greenmim.{name} is deprecated: use {hint}; this alias goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(f".{module}", __name__), attr)


def __dir__():
    return sorted(set(globals()) | set(_MOVED))
