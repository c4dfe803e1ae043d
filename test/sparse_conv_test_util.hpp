// Shared helpers of the sparse-conv tests (test_sparse_conv*.cpp, reference/test_conv*.cpp): random
// token sets, random values, and the definition of a table entry by brute force.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include <greenmim/sparse_conv.hpp>

namespace gm_sc_test {

//! Any subset of an h x w grid, row-major: each site kept with probability `keep`.
inline std::vector<greenmim::index_t> random_coords(std::mt19937& g, greenmim::index_t h, greenmim::index_t w,
                                                   double keep) {
  std::bernoulli_distribution d(keep);
  std::vector<greenmim::index_t> c;
  for (greenmim::index_t i = 0; i < h; ++i)
    for (greenmim::index_t j = 0; j < w; ++j)
      if (d(g)) c.push_back(greenmim::pack_coord(i, j));
  return c;
}

//! `n` standard normal values (drawn as doubles, then converted).
template <class T>
std::vector<T> randn(std::mt19937& g, std::size_t n) {
  std::normal_distribution<double> d;
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(g));
  return v;
}

//! The definition, by brute force over coordinates (no position map): the token of the sample
//! [first, + coords.size()) at (h, w), or pad_index.
inline greenmim::index_t find_token(const std::vector<greenmim::index_t>& coords, greenmim::index_t first,
                                    greenmim::index_t h, greenmim::index_t w) {
  for (std::size_t i = 0; i < coords.size(); ++i)
    if (greenmim::coord_h(coords[i]) == h && greenmim::coord_w(coords[i]) == w)
      return first + static_cast<greenmim::index_t>(i);
  return greenmim::pad_index;
}

}  // namespace gm_sc_test
