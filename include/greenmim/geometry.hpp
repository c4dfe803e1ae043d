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
  GREENMIM_HOST_DEVICE constexpr bool valid() const {
    return height > 0 && width > 0 && window > 0 && shift >= 0 && shift < window;
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

}  // namespace greenmim
