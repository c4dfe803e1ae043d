"""greenmim for PyTorch: attention on the visible tokens of masked images (GreenMIM, NeurIPS 2022).

    import greenmim
    model = greenmim.swin_base_patch4_window7_224()
    plan = model.plan(greenmim.random_masks(), device="cuda")  # one 7x7 mask shared by the batch
    loss = model(images, plan).float().pow(2).mean()          # visible tokens only

See docs/pytorch.md. Needs PyTorch >= 2.4; the compiled parts are plain shared libraries called
through ctypes (no extension built against torch).
"""
from ._lib import GreenmimError
from ._backend import emulate_cuda
from .indices import (MaskPlan, StagePartition, StagePlan, clear_cache, group_capacity, merge_indices, plan_masks,
                      random_masks, stage_partition, window_geometry)
from .ops import (group_window_attention, group_window_attention_packed, partition_tokens, unpartition_tokens)
from .conv_tables import BlockTable, NeighborTable, block_table, neighbor_table
from .conv_ops import block_conv, submanifold_depthwise_conv3x3
from .twins_plan import TwinsPlan, TwinsPlanSpec, TwinsStagePlan, plan_twins
from .twins import VisibleTwins, twins_svt_base, twins_svt_large, twins_svt_small
from .released import released_group_attention
from .swin import (GroupWindowAttention, PatchMerging, VisibleSwinTransformer, swin_base_patch4_window7_224,
                   swin_large_patch4_window7_224)
from .swinv2 import (GroupWindowAttentionV2, VisibleSwinTransformerV2, swinv2_base_window8_256,
                     swinv2_base_window16_256, swinv2_large_window12_192)
from . import checkpoint
from .checkpoint import load_pretrained
from .layers import set_activation_recompute
from .mim import (GreenMIM, create_model, green_mim_swin_base_patch4_dec512b1, green_mim_swin_base_patch4_win14_dec512b1,
                  green_mim_swin_base_patch4_window6_192_dec512b1, green_mim_swin_large_patch4_win14_dec512b1,
                  green_mim_swin_large_patch4_window6_192_dec512b1, green_mim_swin_nano_patch4_dec128b1,
                  green_mim_swin_tiny_patch4_dec512b1, green_mim_swinv2_base_window16_256_dec512b1,
                  green_mim_twins_large_patch4_dec512b1, green_mim_twins_nano_patch4_dec128b1,
                  green_mim_swinv2_base_window8_256_dec512b1, green_mim_swinv2_large_window12_192_dec512b1, model_names)

__version__ = "0.1.0"
__all__ = [
    "GreenmimError", "emulate_cuda", "MaskPlan", "StagePartition", "StagePlan", "clear_cache", "group_capacity",
    "merge_indices",
    "plan_masks", "random_masks", "stage_partition", "window_geometry", "group_window_attention",
    "group_window_attention_packed", "partition_tokens", "unpartition_tokens", "released_group_attention",
    "GroupWindowAttention", "PatchMerging", "VisibleSwinTransformer", "swin_base_patch4_window7_224",
    "swin_large_patch4_window7_224", "GroupWindowAttentionV2", "VisibleSwinTransformerV2", "swinv2_base_window8_256",
    "swinv2_base_window16_256", "swinv2_large_window12_192", "GreenMIM", "create_model", "model_names", "load_pretrained",
    "set_activation_recompute",
    "green_mim_swin_base_patch4_dec512b1", "green_mim_swin_base_patch4_win14_dec512b1",
    "green_mim_swin_large_patch4_win14_dec512b1", "green_mim_swin_base_patch4_window6_192_dec512b1",
    "green_mim_swin_large_patch4_window6_192_dec512b1", "green_mim_swinv2_base_window8_256_dec512b1",
    "green_mim_swinv2_base_window16_256_dec512b1", "green_mim_swinv2_large_window12_192_dec512b1",
    "green_mim_swin_tiny_patch4_dec512b1", "green_mim_swin_nano_patch4_dec128b1",
    "green_mim_twins_large_patch4_dec512b1", "green_mim_twins_nano_patch4_dec128b1",
    "BlockTable", "NeighborTable", "block_table", "neighbor_table", "block_conv", "submanifold_depthwise_conv3x3",
    "TwinsPlan", "TwinsPlanSpec", "TwinsStagePlan", "plan_twins", "VisibleTwins", "twins_svt_small", "twins_svt_base",
    "twins_svt_large",
]
