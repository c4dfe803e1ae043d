//! \file attention_mask.hpp
//! Block-diagonal masks and relative-position indices of grouped (partitioned) tokens.
//!
//! Compact form: the per-slot window id IS `partition_indices::slot_window` (pad = -1); slot q may
//! attend slot k iff `attends(slot_window[q], slot_window[k])` (geometry.hpp). A kernel reads that
//! array and `slot_coord` and never needs the dense forms below, which serve the CPU reference,
//! tests and frameworks that want an explicit additive mask / bias (the released code's path).
//!
//! Conventions (the released GreenMIM code's and Swin's):
//!   - additive mask `[n_g, G, G]`: 0 where q and k are real tokens of one window, `masked_value`
//!     elsewhere (across windows and on every pair touching padding). The released value is -100
//!     (`released_mask_value`); -infinity is allowed, but then a padding query row is entirely
//!     -inf and its softmax is NaN: kernels must skip padded rows (they are never unpartitioned).
//!   - relative-position index `[n_g, G, G]` into the `((2p-1)^2, heads)` bias table:
//!     `((h_q - h_k) + p - 1) * (2p - 1) + ((w_q - w_k) + p - 1)` from absolute coordinates for
//!     pairs that attend, `rel_pos_none` (-1) for all other pairs (no bucket).
//!   - dense bias `[n_g, heads, G, G]`: `table[index, head]` for pairs that attend, 0 elsewhere (the
//!     released code zeroes them; they are masked anyway).
#pragma once

#include <cstdint>

#include "config.hpp"
#include "geometry.hpp"
#include "partition.hpp"
#include "partition_types.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

//! The released code's additive mask value (finite, so padded rows stay NaN-free).
constexpr float released_mask_value = -100.0f;

//! Relative-position index stored for pairs that do not attend (across windows or padding).
constexpr index_t rel_pos_none = pad_index;

//! Dense additive block-diagonal mask: `out(g, i, j) = 0` if `attends(slot_window[g*G+i],
//! slot_window[g*G+j])`, else `masked_value` (-100 as released, or -infinity). `out` is
//! `[n_g, G, G]` (any strides). Fails with `shape_mismatch` or the status of `validate_partition`;
//! `out` untouched on failure. The result is symmetric. O(n_g * G^2).
template <class T>
status build_attention_mask(const partition_view& p, tensor_view<T, 3> out,
                            detail::nondeduced_t<T> masked_value = T(released_mask_value)) {
  const index_t G = p.group_size;
  if (out.extent[0] != p.num_groups || out.extent[1] != G || out.extent[2] != G)
    return status::shape_mismatch;
  if (status s = validate_partition(p); s != status::success) return s;
  for (index_t g = 0; g < p.num_groups; ++g) {
    const index_t* sw = p.slot_window + static_cast<std::int64_t>(g) * G;
    for (index_t i = 0; i < G; ++i)
      for (index_t j = 0; j < G; ++j) out(g, i, j) = attends(sw[i], sw[j]) ? T(0) : masked_value;
  }
  return status::success;
}

//! Owning-index overload (also checks vector sizes, `shape_mismatch`).
template <class T>
status build_attention_mask(const partition_indices& p, tensor_view<T, 3> out,
                            detail::nondeduced_t<T> masked_value = T(released_mask_value)) {
  if (status s = validate_partition(p); s != status::success) return s;
  return build_attention_mask<T>(make_partition_view(p), out, masked_value);
}

//! Largest window p whose relative-position indices, up to (2p-1)^2 - 1, fit index_t.
constexpr index_t max_rel_pos_window = 23170;

//! Relative-position index per slot pair: `out(g, i, j) = slot_rel_pos_index(...)` with window
//! size `window` (the stage's effective p, `window_geometry::window`), i.e. Swin's formula above
//! on absolute coordinates for pairs that attend and `rel_pos_none` (-1) otherwise.
//! `out` is `[n_g, G, G]`. Fails with `invalid_argument` (window <= 0 or > max_rel_pos_window),
//! `shape_mismatch`, the status
//! of `validate_partition`, or `out_of_range` when two slots of one window lie p or more apart
//! (their index would fall outside the table); `out` untouched on failure. O(n_g * G^2).
inline status build_rel_pos_index(const partition_view& p, index_t window, tensor_view<index_t, 3> out) {
  if (window <= 0 || window > max_rel_pos_window) return status::invalid_argument;
  const index_t G = p.group_size;
  if (out.extent[0] != p.num_groups || out.extent[1] != G || out.extent[2] != G)
    return status::shape_mismatch;
  if (status s = validate_partition(p); s != status::success) return s;
  const index_t rows = (2 * window - 1) * (2 * window - 1);
  for (int pass = 0; pass < 2; ++pass)  // pass 0 checks every index, pass 1 writes
    for (index_t g = 0; g < p.num_groups; ++g) {
      const std::int64_t base = static_cast<std::int64_t>(g) * G;
      const index_t* sw = p.slot_window + base;
      const index_t* sc = p.slot_coord + base;
      for (index_t i = 0; i < G; ++i)
        for (index_t j = 0; j < G; ++j) {
          const index_t r = slot_rel_pos_index(sw[i], sw[j], sc[i], sc[j], window);
          if (pass == 1) {
            out(g, i, j) = r;
          } else if (r != rel_pos_none) {
            const index_t dh = coord_h(sc[i]) - coord_h(sc[j]), dw = coord_w(sc[i]) - coord_w(sc[j]);
            if (dh <= -window || dh >= window || dw <= -window || dw >= window || r < 0 || r >= rows)
              return status::out_of_range;
          }
        }
    }
  return status::success;
}

//! Owning-index overload (also checks vector sizes, `shape_mismatch`).
inline status build_rel_pos_index(const partition_indices& p, index_t window, tensor_view<index_t, 3> out) {
  if (status s = validate_partition(p); s != status::success) return s;
  return build_rel_pos_index(make_partition_view(p), window, out);
}

//! Dense relative-position bias gathered from `table` (`[(2p-1)^2, heads]`, p = `window`):
//! `out(g, h, i, j) = table(index(g, i, j), h)` for pairs that attend, 0 otherwise (as released).
//! `out` is `[n_g, heads, G, G]`. Fails with `invalid_argument` (window <= 0 or > max_rel_pos_window,
//! table and out overlap), `shape_mismatch` (table rows != (2p-1)^2, heads differ, out extents), the status of
//! `validate_partition`, or `out_of_range` as `build_rel_pos_index`; `out` untouched on failure.
//! O(n_g * heads * G^2).
template <class T>
status build_rel_pos_bias(const partition_view& p, index_t window,
                          tensor_view<const detail::nondeduced_t<T>, 2> table, tensor_view<T, 4> out) {
  if (window <= 0 || window > max_rel_pos_window) return status::invalid_argument;
  const index_t G = p.group_size;
  const std::int64_t rows = static_cast<std::int64_t>(2 * window - 1) * (2 * window - 1);
  if (table.extent[0] != rows || out.extent[0] != p.num_groups || out.extent[1] != table.extent[1] ||
      out.extent[2] != G || out.extent[3] != G)
    return status::shape_mismatch;
  if (detail::overlaps(table, out)) return status::invalid_argument;
  if (status s = validate_partition(p); s != status::success) return s;
  // Check every index first (same rule as build_rel_pos_index) so nothing is written on failure.
  for (index_t g = 0; g < p.num_groups; ++g) {
    const std::int64_t base = static_cast<std::int64_t>(g) * G;
    for (index_t i = 0; i < G; ++i)
      for (index_t j = 0; j < G; ++j) {
        const index_t qi = p.slot_coord[base + i], kj = p.slot_coord[base + j];
        if (!attends(p.slot_window[base + i], p.slot_window[base + j])) continue;
        const index_t dh = coord_h(qi) - coord_h(kj), dw = coord_w(qi) - coord_w(kj);
        if (dh <= -window || dh >= window || dw <= -window || dw >= window) return status::out_of_range;
      }
  }
  for (index_t g = 0; g < p.num_groups; ++g) {
    const std::int64_t base = static_cast<std::int64_t>(g) * G;
    const index_t* sw = p.slot_window + base;
    const index_t* sc = p.slot_coord + base;
    for (std::int64_t h = 0; h < out.extent[1]; ++h)
      for (index_t i = 0; i < G; ++i)
        for (index_t j = 0; j < G; ++j) {
          const index_t r = slot_rel_pos_index(sw[i], sw[j], sc[i], sc[j], window);
          out(g, h, i, j) = r == rel_pos_none ? T(0) : T(table(r, h));
        }
  }
  return status::success;
}

//! Owning-index overload (also checks vector sizes, `shape_mismatch`).
template <class T>
status build_rel_pos_bias(const partition_indices& p, index_t window,
                          tensor_view<const detail::nondeduced_t<T>, 2> table, tensor_view<T, 4> out) {
  if (status s = validate_partition(p); s != status::success) return s;
  return build_rel_pos_bias<T>(make_partition_view(p), window, table, out);
}

}  // namespace greenmim
