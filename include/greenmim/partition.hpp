//! \file partition.hpp
//! Partition indices: from a plan and a window list (windows.hpp) to the gather/scatter/slot
//! arrays of partition_types.hpp, their checks, and host gather/scatter of token features
//! `[B, N, C] <-> [B, n_g*G, C]`. Both token axes of windows.hpp (shared mask, per-sample flat
//! layout) are supported. Every builder writes its result into temporaries and swaps them into the
//! output only on success: on failure the output is left as it was.
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
#include <type_traits>
#include <utility>
#include <vector>

#include "config.hpp"
#include "geometry.hpp"
#include "partition_types.hpp"
#include "plan.hpp"
#include "status.hpp"
#include "view.hpp"
#include "windows.hpp"

namespace greenmim {

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

}  // namespace detail

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
