//! \file planner/knapsack.hpp
//! Subset sum (0-1 knapsack with value = weight), the building block of the paper's grouping, in
//! two forms that make identical decisions:
//!  - `knapsack_table`: the appendix's `Knapsack(g_s, Phi)` ported literally, O(n*G) time and
//!    memory; kept as the reference.
//!  - `knapsack_bitset`: prefix reachability bitsets, O(n*G/64). Its reconstruction walks the
//!    items from last to first and skips an item whenever the running sum is reachable without
//!    it, which is exactly the table's test `res == K[i-1][w]` (see docs/planner.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#endif

#include "../config.hpp"
#include "../view.hpp"

namespace greenmim {

namespace detail {
//! Leading zeros of a nonzero 64-bit word.
inline int clz64(std::uint64_t x) {
#if defined(_MSC_VER) && !defined(__clang__)
  unsigned long i;
  _BitScanReverse64(&i, x);
  return 63 - static_cast<int>(i);
#else
  return __builtin_clzll(x);
#endif
}
}  // namespace detail

//! The appendix DP, literally: fills `table` ((n+1) x (G+1)) bottom-up, then walks back from
//! item n to 1. Writes the chosen positions of `phi` in increasing order to `chosen` and returns
//! their sum (the largest subset sum <= G). Items larger than G are never chosen; zero-size items
//! never are either. Preconditions: phi[i] >= 0, G >= 0. O(n*G) time and memory.
inline std::int64_t knapsack_table(span<const index_t> phi, index_t g, std::vector<index_t>& chosen,
                                   std::vector<index_t>& table) {
  chosen.clear();
  const std::int64_t n = phi.size();
  const std::int64_t cols = static_cast<std::int64_t>(g) + 1;
  table.assign(static_cast<size_t>((n + 1) * cols), 0);
  auto K = [&](std::int64_t i, std::int64_t w) -> index_t& { return table[static_cast<size_t>(i * cols + w)]; };
  for (std::int64_t i = 0; i <= n; ++i) {
    for (std::int64_t w = 0; w <= g; ++w) {
      if (i == 0 || w == 0)
        K(i, w) = 0;
      else if (phi[i - 1] <= w)
        K(i, w) = std::max<index_t>(phi[i - 1] + K(i - 1, w - phi[i - 1]), K(i - 1, w));
      else
        K(i, w) = K(i - 1, w);
    }
  }
  index_t res = K(n, g);
  const std::int64_t total = res;
  std::int64_t w = g;
  for (std::int64_t i = n; i > 0; --i) {
    if (res <= 0) break;
    if (res == K(i - 1, w)) continue;  // this window is not included
    chosen.push_back(static_cast<index_t>(i - 1));
    res -= phi[i - 1];
    w -= phi[i - 1];
  }
  std::reverse(chosen.begin(), chosen.end());
  return total;
}

namespace detail {
inline bool test_bit(const std::uint64_t* row, std::int64_t b) { return (row[b >> 6] >> (b & 63)) & 1u; }
//! dst = src | (src << shift), over `words` words, bits above `top` cleared.
inline void or_shifted(const std::uint64_t* src, std::uint64_t* dst, std::int64_t words, std::int64_t shift,
                       std::uint64_t top_mask) {
  const std::int64_t q = shift >> 6;
  const int r = static_cast<int>(shift & 63);
  for (std::int64_t j = 0; j < words; ++j) {
    std::uint64_t v = src[j];
    const std::int64_t s = j - q;
    if (s >= 0) {
      v |= src[s] << r;
      if (r != 0 && s >= 1) v |= src[s - 1] >> (64 - r);
    }
    dst[j] = v;
  }
  dst[words - 1] &= top_mask;
}
inline std::int64_t highest_bit(const std::uint64_t* row, std::int64_t words) {
  for (std::int64_t j = words - 1; j >= 0; --j)
    if (row[j]) return j * 64 + 63 - detail::clz64(row[j]);
  return -1;
}
}  // namespace detail

//! Bitset form of `knapsack_table`: same result and the same chosen positions, in O(n*G/64)
//! time and O(n*G/64) words of `rows`. Preconditions: phi[i] >= 0, G >= 0.
inline std::int64_t knapsack_bitset(span<const index_t> phi, index_t g, std::vector<index_t>& chosen,
                                    std::vector<std::uint64_t>& rows) {
  chosen.clear();
  const std::int64_t n = phi.size();
  const std::int64_t bits = static_cast<std::int64_t>(g) + 1;  // sums 0..G
  const std::int64_t words = (bits + 63) >> 6;
  const std::uint64_t top_mask = (bits & 63) ? ((std::uint64_t{1} << (bits & 63)) - 1) : ~std::uint64_t{0};
  rows.resize(static_cast<size_t>((n + 1) * words));
  std::uint64_t* r0 = rows.data();
  std::fill(r0, r0 + words, 0);
  r0[0] = 1;  // the empty sum
  for (std::int64_t i = 1; i <= n; ++i) {
    const std::uint64_t* prev = r0 + (i - 1) * words;
    std::uint64_t* cur = r0 + i * words;
    const index_t w = phi[i - 1];
    if (w > g) {
      std::copy(prev, prev + words, cur);
    } else {
      detail::or_shifted(prev, cur, words, w, top_mask);
    }
  }
  std::int64_t res = detail::highest_bit(r0 + n * words, words);
  const std::int64_t total = res;
  for (std::int64_t i = n; i > 0; --i) {
    if (res <= 0) break;
    if (detail::test_bit(r0 + (i - 1) * words, res)) continue;  // reachable without item i-1
    chosen.push_back(static_cast<index_t>(i - 1));
    res -= phi[i - 1];
  }
  std::reverse(chosen.begin(), chosen.end());
  return total;
}

}  // namespace greenmim
