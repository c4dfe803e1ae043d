//! \file windows.hpp
//! The windows of the visible tokens of a stage: the window of each token, the window sizes w_i
//! that the planner groups, and the window lists (`window_list`, CSR) that partition.hpp turns
//! into partition indices. The window math itself (ids, shifted geometry) is geometry.hpp's.
//!
//! Two token axes are supported (see partition_types.hpp):
//!   - shared mask (the paper): N = visible tokens of ONE sample, the same indices serve the batch;
//!     `build_windows(geometry, coords, list)`;
//!   - per-sample flat layout: N = all visible tokens of all samples concatenated (cu_seqlens
//!     style), windows of sample b are numbered `b * windows_per_sample + local id`;
//!     `build_windows_per_sample(geometry, cu_seqlens, coords, list)`. Coordinates may be ANY set of
//!     grid positions (a DynamicViT-style keep set works as well as a mask-unit aligned mask).
//! The builders write into temporaries and swap them into the output only on success.
//!
//! **A reference builder.** The product path builds every stage and shift of an encoder in one
//! pass, into one arena: encoder_plan.hpp (Twins: twins_plan.hpp), over
//! detail/window_partitioners.hpp. This header builds one stage at a time with full validation;
//! it is the reference the encoder planner is tested against (test/test_encoder_plan.cpp), and
//! what the CLI, the benchmarks and `greenmim.testing` use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "config.hpp"
#include "geometry.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

//! Window id of every visible token (packed coordinates) under geometry `g`.
//! Fails with `out_of_range` if a coordinate lies outside the grid. O(n).
inline status token_windows(const window_geometry& g, span<const index_t> coords, span<index_t> out) {
  if (!g.valid()) return status::invalid_argument;
  if (out.size() != coords.size()) return status::shape_mismatch;
  for (std::int64_t i = 0; i < coords.size(); ++i) {
    const index_t h = coord_h(coords[i]), w = coord_w(coords[i]);
    if (coords[i] < 0 || !g.contains(h, w)) return status::out_of_range;
    out[i] = g.window_id(h, w);
  }
  return status::success;
}

//! Number of visible tokens in each window (`sizes.size() == g.num_windows()`), windows in
//! row-major order; zero for fully masked windows. O(n + windows).
inline status window_sizes(const window_geometry& g, span<const index_t> coords, span<index_t> sizes) {
  if (!g.valid()) return status::invalid_argument;
  if (sizes.size() != g.num_windows()) return status::shape_mismatch;
  for (auto& s : sizes) s = 0;
  for (std::int64_t i = 0; i < coords.size(); ++i) {
    const index_t h = coord_h(coords[i]), w = coord_w(coords[i]);
    if (coords[i] < 0 || !g.contains(h, w)) return status::out_of_range;
    ++sizes[g.window_id(h, w)];
  }
  return status::success;
}

//! Convenience returning the sizes by value (throws on error).
inline std::vector<index_t> window_sizes(const window_geometry& g, span<const index_t> coords) {
  check(g.valid() ? status::success : status::invalid_argument, "window geometry");
  std::vector<index_t> s(static_cast<size_t>(g.num_windows()));
  check(window_sizes(g, coords, span<index_t>(s)), "window_sizes");
  return s;
}


//! Windows of visible tokens in CSR form.
//!
//! Window i holds the tokens `tokens[offsets[i] .. offsets[i+1])`, strictly ascending. With one
//! shared mask window i is geometry window id i (so `sizes()` equals `window_sizes`); with the
//! per-sample layout window i is window `i % windows_per_sample()` of sample
//! `i / windows_per_sample()`. `coords[t]` is the packed (`pack_coord`) absolute (h, w) of token
//! t of the token axis, within its own sample's grid. A valid list (`validate_window_list`) puts
//! every token of [0, num_tokens) in exactly one window, the window its coordinate falls in.
struct window_list {
  window_geometry geometry{};       //!< grid, window and shift of the stage (per sample)
  index_t num_samples = 1;          //!< B of the per-sample layout; 1 for a shared mask
  index_t num_tokens = 0;           //!< N: length of the token axis
  std::vector<index_t> offsets{0};  //!< [num_windows()+1] CSR offsets into `tokens`
  std::vector<index_t> tokens;      //!< [N] token indices, window by window, ascending within one
  std::vector<index_t> coords;      //!< [N] packed (h, w) of each token of the token axis

  //! Number of windows (all samples). O(1).
  index_t num_windows() const { return static_cast<index_t>(offsets.size()) - 1; }
  //! Windows per sample (the geometry's window count).
  index_t windows_per_sample() const { return geometry.num_windows(); }
  //! Tokens of window `i`, ascending. Precondition: 0 <= i < num_windows().
  span<const index_t> window(index_t i) const {
    return span<const index_t>(tokens.data() + offsets[i], offsets[i + 1] - offsets[i]);
  }
  //! Number of tokens of window `i` (w_i). Precondition: 0 <= i < num_windows().
  index_t size(index_t i) const { return offsets[i + 1] - offsets[i]; }
  //! All window sizes, the planner's input. O(num_windows).
  std::vector<index_t> sizes() const {
    std::vector<index_t> s(offsets.size() > 0 ? offsets.size() - 1 : 0);
    for (size_t i = 0; i < s.size(); ++i) s[i] = offsets[i + 1] - offsets[i];
    return s;
  }
  //! Empties the list (no window, no token); keeps the geometry. O(1) amortized.
  void clear() {
    num_tokens = 0;
    num_samples = 1;
    offsets.assign(1, 0);
    tokens.clear();
    coords.clear();
  }
};

namespace detail {

inline bool fits_index(std::int64_t n) { return n >= 0 && n <= std::numeric_limits<index_t>::max(); }

//! Coordinate inside the geometry's grid (the packed value itself must be non-negative).
inline bool coord_in_grid(const window_geometry& g, index_t packed) {
  return packed >= 0 && g.contains(coord_h(packed), coord_w(packed));
}

//! Counting sort of tokens into windows; `wid[t]` is the (global) window of token t.
inline void bucket_tokens(const std::vector<index_t>& wid, index_t num_windows, window_list& l) {
  l.offsets.assign(static_cast<size_t>(num_windows) + 1, 0);
  for (index_t w : wid) ++l.offsets[static_cast<size_t>(w) + 1];
  for (index_t i = 0; i < num_windows; ++i) l.offsets[i + 1] += l.offsets[i];
  std::vector<index_t> cursor(l.offsets.begin(), l.offsets.end() - 1);
  l.tokens.assign(wid.size(), 0);
  for (size_t t = 0; t < wid.size(); ++t) l.tokens[cursor[wid[t]]++] = static_cast<index_t>(t);
}

}  // namespace detail

//! Checks a window list: geometry valid (`invalid_argument`); `offsets` of size
//! `num_samples * windows_per_sample() + 1`, starting at 0, non-decreasing, ending at
//! `tokens.size()`, and `coords.size() == num_tokens` (`shape_mismatch`); every token index in
//! [0, N) and every coordinate inside the grid and inside the window that lists it
//! (`out_of_range`); no token listed twice and every token listed (`not_covered`); tokens strictly
//! ascending within a window and no two tokens of a window at the same coordinate
//! (`invalid_argument`). O(N + num_windows), O(N log w) when coordinates are not row-major.
inline status validate_window_list(const window_list& l) {
  const window_geometry& g = l.geometry;
  if (!g.valid() || l.num_samples < 0 || l.num_tokens < 0) return status::invalid_argument;
  const std::int64_t nw = static_cast<std::int64_t>(l.num_samples) * g.num_windows();
  if (!detail::fits_index(nw)) return status::overflow;
  if (static_cast<std::int64_t>(l.offsets.size()) != nw + 1) return status::shape_mismatch;
  if (static_cast<std::int64_t>(l.coords.size()) != l.num_tokens) return status::shape_mismatch;
  if (l.offsets[0] != 0 || static_cast<std::int64_t>(l.offsets[nw]) != static_cast<std::int64_t>(l.tokens.size()))
    return status::shape_mismatch;
  for (std::int64_t i = 0; i < nw; ++i)
    if (l.offsets[i + 1] < l.offsets[i]) return status::shape_mismatch;
  const index_t wps = g.num_windows();
  std::vector<std::uint8_t> seen(static_cast<size_t>(l.num_tokens), 0);
  std::vector<index_t> scratch;
  for (index_t i = 0; i < static_cast<index_t>(nw); ++i) {
    const span<const index_t> win = l.window(i);
    bool coords_ascending = true;
    for (std::int64_t k = 0; k < win.size(); ++k) {
      const index_t t = win[k];
      if (t < 0 || t >= l.num_tokens) return status::out_of_range;
      if (seen[t]) return status::not_covered;
      seen[t] = 1;
      if (k > 0 && win[k - 1] >= t) return status::invalid_argument;
      const index_t c = l.coords[t];
      if (!detail::coord_in_grid(g, c)) return status::out_of_range;
      if (g.window_id(coord_h(c), coord_w(c)) != i % wps) return status::out_of_range;
      if (k > 0 && l.coords[win[k - 1]] >= c) coords_ascending = false;
    }
    if (!coords_ascending) {  // duplicate coordinates? (row-major masks never get here)
      scratch.clear();
      for (index_t t : win) scratch.push_back(l.coords[t]);
      std::sort(scratch.begin(), scratch.end());
      if (std::adjacent_find(scratch.begin(), scratch.end()) != scratch.end()) return status::invalid_argument;
    }
  }
  if (static_cast<std::int64_t>(l.tokens.size()) != l.num_tokens) return status::not_covered;
  return status::success;
}

//! Windows of the visible tokens of one shared mask: token t has packed coordinate `coords[t]`
//! (any order, e.g. row-major as `visible_coords` emits them); window i of `out` is geometry window
//! id i (`window_geometry::window_id`), so `out.sizes()` equals `window_sizes(g, coords)`; works
//! for plain and shifted geometries. Fails with `invalid_argument` (bad geometry, two tokens at one
//! coordinate), `out_of_range` (coordinate outside the grid), `overflow`. O(N + num_windows).
inline status build_windows(const window_geometry& g, span<const index_t> coords, window_list& out) {
  if (!g.valid()) return status::invalid_argument;
  if (!detail::fits_index(coords.size())) return status::overflow;
  window_list l;
  l.geometry = g;
  l.num_samples = 1;
  l.num_tokens = static_cast<index_t>(coords.size());
  l.coords.assign(coords.begin(), coords.end());
  std::vector<index_t> wid(static_cast<size_t>(coords.size()));
  for (std::int64_t t = 0; t < coords.size(); ++t) {
    if (!detail::coord_in_grid(g, coords[t])) return status::out_of_range;
    wid[t] = g.window_id(coord_h(coords[t]), coord_w(coords[t]));
  }
  detail::bucket_tokens(wid, g.num_windows(), l);
  if (status s = validate_window_list(l); s != status::success) return s;  // duplicate coordinates
  out = std::move(l);
  return status::success;
}

//! Per-sample flat layout: sample b owns tokens [cu_seqlens[b], cu_seqlens[b+1]) of the
//! concatenated `coords` (each sample its own visible set: a per-sample mask or an arbitrary keep
//! set); the token axis is the flattened (sample, token) axis and window `b * g.num_windows() + id`
//! holds the tokens of sample b in geometry window id. `cu_seqlens` has B+1 entries, starts at 0,
//! is non-decreasing and ends at `coords.size()` (`shape_mismatch`). Other failures as
//! `build_windows`. O(N + B * num_windows).
inline status build_windows_per_sample(const window_geometry& g, span<const index_t> cu_seqlens,
                                       span<const index_t> coords, window_list& out) {
  if (!g.valid()) return status::invalid_argument;
  if (cu_seqlens.size() < 1) return status::shape_mismatch;
  if (!detail::fits_index(coords.size())) return status::overflow;
  const std::int64_t batch = cu_seqlens.size() - 1;
  if (cu_seqlens[0] != 0 || cu_seqlens[batch] != coords.size()) return status::shape_mismatch;
  for (std::int64_t b = 0; b < batch; ++b)
    if (cu_seqlens[b + 1] < cu_seqlens[b]) return status::shape_mismatch;
  const std::int64_t nw = batch * g.num_windows();
  if (!detail::fits_index(nw) || !detail::fits_index(batch)) return status::overflow;
  window_list l;
  l.geometry = g;
  l.num_samples = static_cast<index_t>(batch);
  l.num_tokens = static_cast<index_t>(coords.size());
  l.coords.assign(coords.begin(), coords.end());
  std::vector<index_t> wid(static_cast<size_t>(coords.size()));
  for (index_t b = 0; b < static_cast<index_t>(batch); ++b)
    for (index_t t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t) {
      if (!detail::coord_in_grid(g, coords[t])) return status::out_of_range;
      wid[t] = b * g.num_windows() + g.window_id(coord_h(coords[t]), coord_w(coords[t]));
    }
  detail::bucket_tokens(wid, static_cast<index_t>(nw), l);
  if (status s = validate_window_list(l); s != status::success) return s;
  out = std::move(l);
  return status::success;
}

//! Turns a per-sample keep mask `keep` of shape [batch, height, width] (row-major, nonzero =
//! kept; any pattern, e.g. a DynamicViT keep set) into the inputs of `build_windows_per_sample`:
//! `cu_seqlens` [batch+1] and packed `coords`, row-major within each sample. Fails with
//! `invalid_argument` (non-positive or > 32767 sides, negative batch), `shape_mismatch`
//! (`keep.size() != batch*height*width`), `overflow`. O(batch * height * width).
inline status keep_mask_coords(span<const std::uint8_t> keep, index_t batch, index_t height, index_t width,
                               std::vector<index_t>& cu_seqlens, std::vector<index_t>& coords) {
  if (batch < 0 || height <= 0 || width <= 0 || height > 32767 || width > 32767)
    return status::invalid_argument;
  const std::int64_t hw = static_cast<std::int64_t>(height) * width;
  if (keep.size() != batch * hw) return status::shape_mismatch;
  if (!detail::fits_index(batch * hw)) return status::overflow;
  std::vector<index_t> cu(static_cast<size_t>(batch) + 1, 0), c;
  for (index_t b = 0; b < batch; ++b) {
    for (index_t h = 0; h < height; ++h)
      for (index_t w = 0; w < width; ++w)
        if (keep[b * hw + static_cast<std::int64_t>(h) * width + w]) c.push_back(pack_coord(h, w));
    cu[b + 1] = static_cast<index_t>(c.size());
  }
  cu_seqlens.swap(cu);
  coords.swap(c);
  return status::success;
}

}  // namespace greenmim
