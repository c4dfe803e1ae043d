//! \file windows.hpp
//! Window partition of visible tokens: the window of each token and the window sizes w_i that
//! the planner groups.
#pragma once

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

}  // namespace greenmim
