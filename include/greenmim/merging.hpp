//! \file merging.hpp
//! Patch merging of visible tokens (stage i -> i+1): gather indices of each 2x2 block of visible
//! tokens in Swin's concatenation order and the next stage's visible coordinates.
//!
//! Output token j of stage i+1 at (h, w) concatenates the stage-i tokens
//! `gather4[4j + k]`, k = 0..3, at (2h + merge_dh(k), 2w + merge_dw(k)), i.e.
//! x0 = (2h, 2w), x1 = (2h+1, 2w), x2 = (2h, 2w+1), x3 = (2h+1, 2w+1), as `torch.cat([x0, x1, x2,
//! x3], -1)` in Swin's PatchMerging; then LayerNorm(4C) and Linear(4C -> 2C) follow (not here).
//! A 2x2 block must be all visible or all masked (guaranteed by a 32 px mask unit); anything else
//! is refused with `status::misaligned`.
//!
//! **A reference builder.** The product path builds every stage and shift of an encoder in one
//! pass, into one arena: encoder_plan.hpp (Twins: twins_plan.hpp), over
//! detail/window_partitioners.hpp. This header builds one stage at a time with full validation;
//! it is the reference the encoder planner is tested against (test/test_encoder_plan.cpp), and
//! what the CLI, the benchmarks and `greenmim.testing` use.
#pragma once

#include <cstdint>
#include <vector>

#include "config.hpp"
#include "geometry.hpp"
#include "partition.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

namespace detail {

//! Merges one sample; token indices of `coords[i]` are `first + i`. Appends to g4/next.
//! `grid` is scratch of height*width entries, all pad_index on entry and on return.
inline status merge_one(index_t height, index_t width, span<const index_t> coords, index_t first,
                        std::vector<index_t>& grid, std::vector<index_t>& g4, std::vector<index_t>& next) {
  status st = status::success;
  std::int64_t placed = 0;
  for (; placed < coords.size(); ++placed) {
    const index_t c = coords[placed];
    const index_t h = coord_h(c), w = coord_w(c);
    if (c < 0 || h >= height || w >= width) { st = status::out_of_range; break; }
    index_t& cell = grid[static_cast<std::int64_t>(h) * width + w];
    if (cell != pad_index) { st = status::invalid_argument; break; }  // two tokens at one coordinate
    cell = first + static_cast<index_t>(placed);
  }
  if (st == status::success) {
    for (index_t bh = 0; bh < height / 2 && st == status::success; ++bh)
      for (index_t bw = 0; bw < width / 2; ++bw) {
        index_t part[4];
        int visible = 0;
        for (index_t k = 0; k < 4; ++k) {
          part[k] = grid[static_cast<std::int64_t>(2 * bh + merge_dh(k)) * width + 2 * bw + merge_dw(k)];
          visible += part[k] != pad_index;
        }
        if (visible == 0) continue;
        if (visible != 4) { st = status::misaligned; break; }
        g4.insert(g4.end(), part, part + 4);
        next.push_back(pack_coord(bh, bw));
      }
  }
  for (std::int64_t i = 0; i < placed; ++i)  // restore the scratch grid
    grid[static_cast<std::int64_t>(coord_h(coords[i])) * width + coord_w(coords[i])] = pad_index;
  return st;
}

inline status check_merge_grid(index_t height, index_t width) {
  if (height <= 0 || width <= 0 || height > 32767 || width > 32767) return status::invalid_argument;
  if (height % 2 != 0 || width % 2 != 0) return status::invalid_argument;
  return status::success;
}

}  // namespace detail

//! Patch-merging indices of one token set on a `height x width` grid (both even): `coords` are the
//! stage-i visible coordinates (packed, any order, typically row-major), token t = `coords[t]`.
//! Writes `gather4` [N_next * 4] (token indices into the stage-i axis, Swin order, see the file
//! comment) and `next_coords` [N_next] (packed stage-(i+1) coordinates, row-major). Fails with
//! `invalid_argument` (odd or non-positive grid, two tokens at one coordinate), `out_of_range`
//! (coordinate outside the grid), `misaligned` (a 2x2 block partly visible), `overflow`; outputs
//! untouched on failure. O(height * width + N).
inline status merge_indices(index_t height, index_t width, span<const index_t> coords,
                            std::vector<index_t>& gather4, std::vector<index_t>& next_coords) {
  if (status s = detail::check_merge_grid(height, width); s != status::success) return s;
  if (!detail::fits_index(coords.size())) return status::overflow;
  std::vector<index_t> grid(static_cast<size_t>(height) * width, pad_index), g4, next;
  g4.reserve(static_cast<size_t>(coords.size()));
  next.reserve(static_cast<size_t>(coords.size() / 4));
  if (status s = detail::merge_one(height, width, coords, 0, grid, g4, next); s != status::success) return s;
  gather4.swap(g4);
  next_coords.swap(next);
  return status::success;
}

//! Per-sample flat layout: sample b owns tokens [cu_seqlens[b], cu_seqlens[b+1]) of `coords`;
//! `gather4` indexes that flattened axis, `next_cu_seqlens` [B+1] / `next_coords` describe the
//! stage-(i+1) flattened axis (sample-major, row-major within a sample). `cu_seqlens` must start
//! at 0, be non-decreasing and end at `coords.size()` (`shape_mismatch`); other failures as
//! `merge_indices`. Outputs untouched on failure. O(B + height * width + N).
inline status merge_indices_per_sample(index_t height, index_t width, span<const index_t> cu_seqlens,
                                       span<const index_t> coords, std::vector<index_t>& gather4,
                                       std::vector<index_t>& next_cu_seqlens,
                                       std::vector<index_t>& next_coords) {
  if (status s = detail::check_merge_grid(height, width); s != status::success) return s;
  if (cu_seqlens.size() < 1) return status::shape_mismatch;
  if (!detail::fits_index(coords.size())) return status::overflow;
  const std::int64_t batch = cu_seqlens.size() - 1;
  if (cu_seqlens[0] != 0 || cu_seqlens[batch] != coords.size()) return status::shape_mismatch;
  for (std::int64_t b = 0; b < batch; ++b)
    if (cu_seqlens[b + 1] < cu_seqlens[b]) return status::shape_mismatch;
  std::vector<index_t> grid(static_cast<size_t>(height) * width, pad_index), g4, next;
  std::vector<index_t> cu(static_cast<size_t>(batch) + 1, 0);
  for (std::int64_t b = 0; b < batch; ++b) {
    const span<const index_t> sample = coords.subspan(cu_seqlens[b], cu_seqlens[b + 1] - cu_seqlens[b]);
    if (status s = detail::merge_one(height, width, sample, cu_seqlens[b], grid, g4, next); s != status::success)
      return s;
    cu[b + 1] = static_cast<index_t>(next.size());
  }
  gather4.swap(g4);
  next_cu_seqlens.swap(cu);
  next_coords.swap(next);
  return status::success;
}

//! Host reference of the merge gather: `y[b, j, k*C + c] = x[b, gather4[4j + k], c]`. x is
//! `[B, N, C]`, y is `[B, N_next, 4C]` with N_next = gather4.size() / 4. Fails with
//! `shape_mismatch` (extents, gather4 not a multiple of 4), `out_of_range` (an index outside
//! [0, N)), `invalid_argument` (x and y overlap); y untouched on failure. O(B * N_next * 4C).
template <class T>
status merge_tokens(span<const index_t> gather4, tensor_view<const detail::nondeduced_t<T>, 3> x,
                    tensor_view<T, 3> y) {
  if (gather4.size() % 4 != 0) return status::shape_mismatch;
  const std::int64_t n_next = gather4.size() / 4, C = x.extent[2];
  if (y.extent[0] != x.extent[0] || y.extent[1] != n_next || y.extent[2] != 4 * C) return status::shape_mismatch;
  if (detail::overlaps(x, y)) return status::invalid_argument;
  for (std::int64_t i = 0; i < gather4.size(); ++i)
    if (gather4[i] < 0 || gather4[i] >= x.extent[1]) return status::out_of_range;
  for (std::int64_t b = 0; b < x.extent[0]; ++b)
    for (std::int64_t j = 0; j < n_next; ++j)
      for (std::int64_t k = 0; k < 4; ++k)
        for (std::int64_t c = 0; c < C; ++c) y(b, j, k * C + c) = x(b, gather4[4 * j + k], c);
  return status::success;
}

}  // namespace greenmim
