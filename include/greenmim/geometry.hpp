//! \file geometry.hpp
//! The index math shared by the CPU reference and the CUDA kernels: window ids (plain and
//! shifted, non-cyclic), relative-position indices, and the block-diagonal mask predicate.
//! Everything here is `GREENMIM_HOST_DEVICE constexpr`, allocation- and exception-free, so the
//! reference loops call these functions and each kernel thread calls the very same code.
#pragma once

#include "config.hpp"

namespace greenmim {

//! Window geometry of one stage: token grid `height x width`, window `p x p`, shift `shift`
//! (0 or p/2 in Swin). Use `make_window_geometry` to apply Swin's rule for small stages.
struct window_geometry {
  index_t height = 0;
  index_t width = 0;
  index_t window = 7;
  index_t shift = 0;

  //! Offset added to a coordinate before dividing by p (the released code's non-cyclic shift).
  GREENMIM_HOST_DEVICE constexpr index_t offset() const { return (window - shift) % window; }
  //! Number of windows along the height (resp. width): border windows are smaller when shifted.
  GREENMIM_HOST_DEVICE constexpr index_t windows_h() const { return (height - 1 + offset()) / window + 1; }
  GREENMIM_HOST_DEVICE constexpr index_t windows_w() const { return (width - 1 + offset()) / window + 1; }
  GREENMIM_HOST_DEVICE constexpr index_t num_windows() const { return windows_h() * windows_w(); }
  //! Row-major window id of the token at (h, w).
  GREENMIM_HOST_DEVICE constexpr index_t window_id(index_t h, index_t w) const {
    return ((h + offset()) / window) * windows_w() + (w + offset()) / window;
  }
  //! Number of relative-position buckets: the bias table has shape `((2p-1)^2, heads)`.
  GREENMIM_HOST_DEVICE constexpr index_t bias_table_rows() const { return (2 * window - 1) * (2 * window - 1); }
  GREENMIM_HOST_DEVICE constexpr bool contains(index_t h, index_t w) const {
    return h >= 0 && h < height && w >= 0 && w < width;
  }
  //! Positive sides up to 32767 (what `pack_coord` addresses; keeps the window count and the
  //! window-id math inside index_t), 0 <= shift < window <= 32767.
  GREENMIM_HOST_DEVICE constexpr bool valid() const {
    return height > 0 && width > 0 && height <= 32767 && width <= 32767 && window > 0 && window <= 32767 &&
           shift >= 0 && shift < window;
  }
};

//! Swin's rule: when the grid is no larger than the window, one window covering it and no shift.
GREENMIM_HOST_DEVICE constexpr window_geometry make_window_geometry(index_t height, index_t width,
                                                                     index_t window, index_t shift) {
  window_geometry g{height, width, window, shift};
  const index_t m = height < width ? height : width;
  if (m <= window) {
    g.window = m;
    g.shift = 0;
  }
  return g;
}

//! Relative-position index of the pair (a, b) from absolute coordinates, into a
//! `((2p-1)^2, heads)` table: `((h_a - h_b) + p - 1) * (2p - 1) + ((w_a - w_b) + p - 1)`.
//! Only meaningful when a and b share a window (|dh|, |dw| < p).
GREENMIM_HOST_DEVICE constexpr index_t rel_pos_index(index_t ha, index_t wa, index_t hb, index_t wb,
                                                     index_t p) {
  return ((ha - hb) + p - 1) * (2 * p - 1) + ((wa - wb) + p - 1);
}

//! Block-diagonal predicate on per-slot window ids: a query slot may attend a key slot iff both
//! are real tokens (id >= 0) of the same window.
GREENMIM_HOST_DEVICE constexpr bool attends(index_t window_q, index_t window_k) {
  return window_q >= 0 && window_q == window_k;
}

//! Packs (h, w) into one int32 (h in the high 16 bits); grids up to 32767 per side.
GREENMIM_HOST_DEVICE constexpr index_t pack_coord(index_t h, index_t w) { return (h << 16) | (w & 0xFFFF); }
GREENMIM_HOST_DEVICE constexpr index_t coord_h(index_t packed) { return packed >> 16; }
GREENMIM_HOST_DEVICE constexpr index_t coord_w(index_t packed) { return packed & 0xFFFF; }

//! Relative-position index of the slot pair (q, k) of one group from the per-slot window ids and
//! packed coordinates (`slot_window`, `slot_coord` of partition_types.hpp): `rel_pos_index` when
//! `attends(window_q, window_k)`, else `pad_index` (-1): pairs across windows or on padding have
//! no bucket (the additive mask removes them; the dense bias stores 0 there, as released).
GREENMIM_HOST_DEVICE constexpr index_t slot_rel_pos_index(index_t window_q, index_t window_k,
                                                          index_t coord_q, index_t coord_k, index_t p) {
  return attends(window_q, window_k)
             ? rel_pos_index(coord_h(coord_q), coord_w(coord_q), coord_h(coord_k), coord_w(coord_k), p)
             : pad_index;
}

//! Swin's patch-merging concatenation order: part k in {0, 1, 2, 3} of the 2x2 block of output
//! token (h, w) is the input token (2h + merge_dh(k), 2w + merge_dw(k)), i.e. (0,0), (1,0), (0,1),
//! (1,1) (x0, x1, x2, x3 of `PatchMerging`).
GREENMIM_HOST_DEVICE constexpr index_t merge_dh(index_t k) { return k & 1; }
GREENMIM_HOST_DEVICE constexpr index_t merge_dw(index_t k) { return k >> 1; }

}  // namespace greenmim
