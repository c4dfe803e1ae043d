//! \file partition.hpp
//! Partition indices: from visible-token coordinates to windows (`window_list`), from a plan and a
//! window list to the gather/scatter/slot arrays of partition_types.hpp, and host gather/scatter of
//! token features `[B, N, C] <-> [B, n_g*G, C]`.
//!
//! Two token axes are supported (see partition_types.hpp):
//!   - shared mask (the paper): N = visible tokens of ONE sample, the same indices serve the batch;
//!     `build_windows(geometry, coords, list)`;
//!   - per-sample flat layout: N = all visible tokens of all samples concatenated (cu_seqlens
//!     style), windows of sample b are numbered `b * windows_per_sample + local id`;
//!     `build_windows_per_sample(geometry, cu_seqlens, coords, list)`. Coordinates may be ANY set of
//!     grid positions (a DynamicViT-style keep set works as well as a mask-unit aligned mask).
//!
//! Every builder writes its result into temporaries and swaps them into the output only on
//! success: on failure the output is left as it was.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "config.hpp"
#include "geometry.hpp"
#include "partition_types.hpp"
#include "plan.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

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

//! The released code's rule: a stage with at most `2 * p * p` visible tokens skips grouping and
//! runs one masked attention over all of them ('masking' mode, `build_single_group`). O(1).
constexpr bool use_masking_mode(std::int64_t num_tokens, index_t window) {
  return num_tokens <= 2 * static_cast<std::int64_t>(window) * window;
}

namespace detail {

template <class T>
struct nondeduced { using type = T; };
template <class T>
using nondeduced_t = typename nondeduced<T>::type;

inline bool fits_index(std::int64_t n) { return n >= 0 && n <= std::numeric_limits<index_t>::max(); }

//! Coordinate inside the geometry's grid (the packed value itself must be non-negative).
inline bool coord_in_grid(const window_geometry& g, index_t packed) {
  return packed >= 0 && g.contains(coord_h(packed), coord_w(packed));
}

//! [lo, hi] byte range touched by a strided view (empty view: lo > hi).
template <class T, int Rank>
void byte_range(const tensor_view<T, Rank>& v, std::uintptr_t& lo, std::uintptr_t& hi) {
  if (v.numel() == 0) { lo = 1; hi = 0; return; }
  std::int64_t mn = 0, mx = 0;
  for (int i = 0; i < Rank; ++i) {
    const std::int64_t d = (v.extent[i] - 1) * v.stride[i];
    if (d < 0) mn += d; else mx += d;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(v.data);
  lo = base + static_cast<std::uintptr_t>(mn * static_cast<std::int64_t>(sizeof(T)));
  hi = base + static_cast<std::uintptr_t>(mx * static_cast<std::int64_t>(sizeof(T))) + sizeof(T) - 1;
}

template <class A, int RA, class B, int RB>
bool overlaps(const tensor_view<A, RA>& a, const tensor_view<B, RB>& b) {
  std::uintptr_t alo, ahi, blo, bhi;
  byte_range(a, alo, ahi);
  byte_range(b, blo, bhi);
  if (alo > ahi || blo > bhi) return false;
  return alo <= bhi && blo <= ahi;
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

//! Per-sample flat layout (issue 5): sample b owns tokens [cu_seqlens[b], cu_seqlens[b+1]) of the
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

//! Builds the partition indices of `p` over the windows of `l` (plan window indices are window
//! indices of `l`). Layout (partition_types.hpp): group g owns slots [g*G, (g+1)*G); its windows in
//! plan order, each window's tokens ascending, padding at the end (gather = slot_window =
//! `pad_index`, slot_coord = 0). Fails with the status of `validate_window_list`, of
//! `validate_plan` against `l.sizes()` (`not_covered`: a non-empty window in no group, a window in
//! two groups, an empty window in a group, wrong fills; `size_exceeds_group`; `out_of_range`), or
//! `overflow` (n_g * G does not fit index_t). `out` is untouched on failure.
//! O(N + n_g*G + num_windows).
inline status build_partition(const plan& p, const window_list& l, partition_indices& out) {
  if (status s = validate_window_list(l); s != status::success) return s;
  const std::vector<index_t> sizes = l.sizes();
  if (status s = validate_plan(span<const index_t>(sizes), p); s != status::success) return s;
  const index_t ng = p.num_groups();
  const index_t G = p.group_size > 0 ? p.group_size : 0;  // validate_plan: G > 0 when ng > 0
  const std::int64_t slots = static_cast<std::int64_t>(ng) * G;
  if (!detail::fits_index(slots)) return status::overflow;
  partition_indices r;
  r.group_size = G;
  r.num_groups = ng;
  r.num_tokens = l.num_tokens;
  r.gather.assign(static_cast<size_t>(slots), pad_index);
  r.slot_window.assign(static_cast<size_t>(slots), pad_index);
  r.slot_coord.assign(static_cast<size_t>(slots), 0);
  r.scatter.assign(static_cast<size_t>(l.num_tokens), pad_index);
  for (index_t g = 0; g < ng; ++g) {
    index_t slot = g * G;
    for (index_t w : p.group(g))
      for (index_t t : l.window(w)) {
        r.gather[slot] = t;
        r.scatter[t] = slot;
        r.slot_window[slot] = w;
        r.slot_coord[slot] = l.coords[t];
        ++slot;
      }
  }
  out = std::move(r);
  return status::success;
}

//! The released code's 'masking' mode (see `use_masking_mode`): one group holding every token in
//! its ORIGINAL token order (identity gather/scatter), slot_window[t] = the window of token t,
//! slot_coord[t] = coords[t]. `group_size` 0 means G = N (no padding, as released); a larger G
//! pads the tail (e.g. to a multiple of a kernel tile); G < N fails with `size_exceeds_group`.
//! With N = 0 and group_size 0 the result has no group. Other failures as
//! `validate_window_list`; `out` untouched on failure. O(N + G + num_windows).
inline status build_single_group(const window_list& l, partition_indices& out, index_t group_size = 0) {
  if (status s = validate_window_list(l); s != status::success) return s;
  if (group_size < 0) return status::invalid_argument;
  const index_t N = l.num_tokens;
  const index_t G = group_size == 0 ? N : group_size;
  if (G < N) return status::size_exceeds_group;
  partition_indices r;
  r.group_size = G;
  r.num_groups = G > 0 ? 1 : 0;
  r.num_tokens = N;
  r.gather.assign(static_cast<size_t>(G), pad_index);
  r.slot_window.assign(static_cast<size_t>(G), pad_index);
  r.slot_coord.assign(static_cast<size_t>(G), 0);
  r.scatter.assign(static_cast<size_t>(N), 0);
  for (index_t t = 0; t < N; ++t) {
    r.gather[t] = t;
    r.scatter[t] = t;
    r.slot_coord[t] = l.coords[t];
  }
  for (index_t w = 0; w < l.num_windows(); ++w)
    for (index_t t : l.window(w)) r.slot_window[t] = w;
  out = std::move(r);
  return status::success;
}

//! Checks partition indices held in a view: non-negative sizes, n_g*G fits index_t, non-null
//! arrays where sizes are positive (`invalid_argument`); every gather entry in [-1, N) and every
//! scatter entry in [0, n_g*G) (`out_of_range`); gather[scatter[t]] == t for every token, i.e. the
//! two are inverse permutations on real tokens and no token reads a padding slot; a slot is padding
//! (gather == -1) iff its slot_window is -1 (`not_covered`). O(n_g*G + N).
inline status validate_partition(const partition_view& p) {
  if (p.group_size < 0 || p.num_groups < 0 || p.num_tokens < 0) return status::invalid_argument;
  const std::int64_t slots = static_cast<std::int64_t>(p.group_size) * p.num_groups;
  if (!detail::fits_index(slots)) return status::overflow;
  if (slots > 0 && (!p.gather || !p.slot_window || !p.slot_coord)) return status::invalid_argument;
  if (p.num_tokens > 0 && !p.scatter) return status::invalid_argument;
  for (std::int64_t s = 0; s < slots; ++s) {
    if (p.gather[s] < pad_index || p.gather[s] >= p.num_tokens) return status::out_of_range;
    if (p.slot_window[s] < pad_index) return status::out_of_range;
  }
  for (index_t t = 0; t < p.num_tokens; ++t)
    if (p.scatter[t] < 0 || p.scatter[t] >= slots) return status::out_of_range;
  for (index_t t = 0; t < p.num_tokens; ++t)
    if (p.gather[p.scatter[t]] != t) return status::not_covered;
  // Real slots = N (each token has its own slot, checked above); the others must be padding.
  std::int64_t real = 0;
  for (std::int64_t s = 0; s < slots; ++s) {
    if ((p.gather[s] == pad_index) != (p.slot_window[s] == pad_index)) return status::not_covered;
    real += p.gather[s] != pad_index;
  }
  if (real != p.num_tokens) return status::not_covered;
  return status::success;
}

//! Owning form: also checks that the vectors have the sizes the counts imply (`shape_mismatch`).
inline status validate_partition(const partition_indices& p) {
  if (p.group_size < 0 || p.num_groups < 0 || p.num_tokens < 0) return status::invalid_argument;
  const std::int64_t slots = static_cast<std::int64_t>(p.group_size) * p.num_groups;
  if (!detail::fits_index(slots)) return status::overflow;
  const auto sz = [](const std::vector<index_t>& v) { return static_cast<std::int64_t>(v.size()); };
  if (sz(p.gather) != slots || sz(p.slot_window) != slots || sz(p.slot_coord) != slots ||
      sz(p.scatter) != p.num_tokens)
    return status::shape_mismatch;
  return validate_partition(make_partition_view(p));
}

//! Partition (group) token features: `y[b, s, :] = x[b, gather[s], :]` for real slots and
//! `pad_value` for padding slots. x is `[B, N, C]`, y is `[B, n_g*G, C]` (any strides; they must
//! not overlap). With the per-sample layout B = 1. Fails with `shape_mismatch` (extents),
//! `invalid_argument` (x and y overlap), or the status of `validate_partition`; y untouched on
//! failure. The backward of partition is `unpartition_tokens` of the gradient (padding gradients
//! are dropped). O(n_g*G*(B*C + 1) + N).
template <class T>
status partition_tokens(const partition_view& p, tensor_view<const detail::nondeduced_t<T>, 3> x,
                        tensor_view<T, 3> y, detail::nondeduced_t<T> pad_value = T{}) {
  const std::int64_t slots = static_cast<std::int64_t>(p.group_size) * p.num_groups;
  if (x.extent[0] != y.extent[0] || x.extent[2] != y.extent[2] || x.extent[1] != p.num_tokens ||
      y.extent[1] != slots)
    return status::shape_mismatch;
  if (detail::overlaps(x, y)) return status::invalid_argument;
  if (status s = validate_partition(p); s != status::success) return s;
  const std::int64_t C = y.extent[2];
  const bool rows = C > 0 && x.stride[2] == 1 && y.stride[2] == 1;  // unit-stride channels: copy rows
  for (std::int64_t b = 0; b < y.extent[0]; ++b)
    for (std::int64_t s = 0; s < slots; ++s) {
      const index_t t = p.gather[s];
      if (rows) {
        T* dst = &y(b, s, 0);
        if (t == pad_index)
          std::fill_n(dst, C, pad_value);
        else
          std::copy_n(&x(b, t, 0), C, dst);
      } else if (t == pad_index) {
        for (std::int64_t c = 0; c < C; ++c) y(b, s, c) = pad_value;
      } else {
        for (std::int64_t c = 0; c < C; ++c) y(b, s, c) = x(b, t, c);
      }
    }
  return status::success;
}

//! Owning-index overload (also checks vector sizes, `shape_mismatch`).
template <class T>
status partition_tokens(const partition_indices& p, tensor_view<const detail::nondeduced_t<T>, 3> x,
                        tensor_view<T, 3> y, detail::nondeduced_t<T> pad_value = T{}) {
  if (status s = validate_partition(p); s != status::success) return s;
  return partition_tokens<T>(make_partition_view(p), x, y, pad_value);
}

//! Unpartition (ungroup): `x[b, t, :] = y[b, scatter[t], :]`; padding slots of y are never read,
//! so whatever attention wrote there cannot leak into real tokens. y is `[B, n_g*G, C]`, x is
//! `[B, N, C]`; `unpartition(partition(x)) == x` bit-exactly. Failures as `partition_tokens`; x
//! untouched on failure. O(B*N*C + n_g*G).
template <class T>
status unpartition_tokens(const partition_view& p, tensor_view<const detail::nondeduced_t<T>, 3> y,
                          tensor_view<T, 3> x) {
  const std::int64_t slots = static_cast<std::int64_t>(p.group_size) * p.num_groups;
  if (x.extent[0] != y.extent[0] || x.extent[2] != y.extent[2] || x.extent[1] != p.num_tokens ||
      y.extent[1] != slots)
    return status::shape_mismatch;
  if (detail::overlaps(x, y)) return status::invalid_argument;
  if (status s = validate_partition(p); s != status::success) return s;
  const std::int64_t C = x.extent[2];
  const bool rows = C > 0 && x.stride[2] == 1 && y.stride[2] == 1;
  for (std::int64_t b = 0; b < x.extent[0]; ++b)
    for (index_t t = 0; t < p.num_tokens; ++t) {
      const index_t s = p.scatter[t];
      if (rows)
        std::copy_n(&y(b, s, 0), C, &x(b, t, 0));
      else
        for (std::int64_t c = 0; c < C; ++c) x(b, t, c) = y(b, s, c);
    }
  return status::success;
}

//! Owning-index overload (also checks vector sizes, `shape_mismatch`).
template <class T>
status unpartition_tokens(const partition_indices& p, tensor_view<const detail::nondeduced_t<T>, 3> y,
                          tensor_view<T, 3> x) {
  if (status s = validate_partition(p); s != status::success) return s;
  return unpartition_tokens<T>(make_partition_view(p), y, x);
}

}  // namespace greenmim
