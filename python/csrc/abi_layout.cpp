//! \file abi_layout.cpp
//! gmh_abi_layout: the layout table of greenmim_host.h's structs, which the Python package checks
//! its ctypes classes against when it loads the library (python/greenmim/_lib.py). A struct added
//! to the header is one line here (and one `@abi_struct` line on its ctypes class).
#include "greenmim_host.h"

#include <greenmim/detail/abi_table.hpp>

namespace {
const gmh_abi_entry layout[] = {
    GREENMIM_ABI_STRUCT(gmh_tensor, data, rank, extent, stride)
    GREENMIM_ABI_STRUCT(gmh_partition, gather, scatter, slot_window, slot_coord, group_size, num_groups, num_tokens)
    GREENMIM_ABI_STRUCT(gmh_stage_args, visible, num_masks, height, width, window, shift, strategy, group_size,
                        channels, max_group_size)
    GREENMIM_ABI_STRUCT(gmh_stage_info, group_size, num_groups, num_tokens, num_windows, window, shift,
                        budget_exhausted, cost, lower_bound, plan_us)
    GREENMIM_ABI_STRUCT(gmh_attention_args, dtype, q, k, v, o, lse, d_o, dq, dk, dv, bias_table, d_bias_table, part,
                        window, scale)
    GREENMIM_ABI_STRUCT(gmh_range, offset, size)
    GREENMIM_ABI_STRUCT(gmh_plan_partition, group_size, num_groups, num_windows, window, shift, budget_exhausted, cost,
                        lower_bound, plan_us, gather, scatter, slot_window, slot_coord)
    GREENMIM_ABI_STRUCT(gmh_plan_stage, height, width, num_tokens, reserved, part, position, merge, cu_seqlens,
                        unit_rank)
    GREENMIM_ABI_STRUCT(gmh_encoder_args, visible, num_masks, mask_height, mask_width, per_sample, grid, window,
                        num_stages, embed_dim, strategy, group_size, max_group_size)
    GREENMIM_ABI_STRUCT(gmh_encoder_info, num_stages, num_masks, arena_size, build_us, stage)
    GREENMIM_ABI_STRUCT(gmh_twins_stage, height, width, num_tokens, num_keys, max_tokens, max_keys, uniform, key_holes,
                        embed_holes, reshape, lsa, position, cu_seqlens, neighbors, keys, key_cu_seqlens, query_slot,
                        key_gather, embed, unit_rank)
    GREENMIM_ABI_STRUCT(gmh_twins_args, visible, num_masks, mask_height, mask_width, per_sample, grid, num_stages,
                        window, sr_ratio, channels, strategy, group_size, max_group_size)
    GREENMIM_ABI_STRUCT(gmh_twins_info, num_stages, num_masks, arena_size, build_us, stage)
    GREENMIM_ABI_STRUCT(gmh_conv_table_args, visible, num_masks, height, width, per_sample, kind, size)
    GREENMIM_ABI_STRUCT(gmh_conv_table_info, num_inputs, num_outputs, row, holes)
    GREENMIM_ABI_STRUCT(gmh_conv_args, dtype, x, y, dy, dx, weight, bias, dweight, dbias, table, table_size, size,
                        residual)
};
}  // namespace

extern "C" const gmh_abi_entry* gmh_abi_layout(size_t* count) {
  if (count != nullptr) *count = sizeof(layout) / sizeof(layout[0]);
  return layout;
}
