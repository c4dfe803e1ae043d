//! \file planner/bounds.hpp
//! Lower bounds on the number of groups of capacity G any packing of the items needs. A plan
//! with group size G and n groups costs cost(G, n), and costs are nondecreasing, so
//! cost(G, bins_lower_bound(G)) bounds every plan at that G; the sweep (sweep.hpp) takes the
//! least over G for the a-priori bound on any plan, and tightens it a posteriori.
//! Part of planner.hpp.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../config.hpp"
#include "histogram.hpp"

namespace greenmim {
namespace detail {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

//! Lower bound on the number of bins of capacity g >= maxw for the items of `h`: the
//! Martello-Toth L2 bound (>= ceil(S/g); O(distinct sizes) from the histogram) and, when
//! `dual_feasible` (small inputs), the Fekete-Schepers bounds u^(k), k = 1..10 (O(10 * distinct)).
//! Tested never above the exact minimum (brute force, test/test_planner.cpp).
inline index_t bins_lower_bound(const size_histogram& h, index_t g, bool dual_feasible) {
  const std::int64_t l1 = ceil_div(h.total, g);
  if (2 * static_cast<std::int64_t>(h.maxw) <= g) return static_cast<index_t>(l1);
  const std::int64_t n = h.n_items(), half = g / 2;
  // L2 = max over k of j1 + j2 + ceil(max(rest, 0) / g) = ceil(max over k of X_k / g) with
  // X_k = (j1 + j2) * g + max(rest, 0): one division instead of one per k
  std::int64_t best = 0;
  auto eval = [&](std::int64_t k) {
    const std::int64_t j1 = n - h.cnt_le(g - k);
    const std::int64_t j2 = h.cnt_le(g - k) - h.cnt_le(half);
    const std::int64_t s2 = h.sum_le(g - k) - h.sum_le(half);
    const std::int64_t s3 = h.sum_le(half) - h.sum_le(k - 1);
    const std::int64_t rest = s3 - (j2 * g - s2);
    best = std::max(best, (j1 + j2) * g + std::max<std::int64_t>(rest, 0));
  };
  eval(0);
  for (index_t v : h.distinct) {
    if (v > half) break;
    eval(v);
  }
  std::int64_t lb = std::max(l1, ceil_div(best, g));
  // Fekete-Schepers dual feasible functions u^(k), k = 1..10: an item w counts w/g when g
  // divides (k+1)w, else floor((k+1)w/g)/k; no group holds more than 1, so
  // ceil(sum of the counts) groups are needed. Exact in integers: ceil((A*k + B*g) / (g*k)).
  // Skipped for large batches, whose gaps are already tiny and whose time is tighter.
  for (std::int64_t k = 1; k <= (dual_feasible ? 10 : 0); ++k) {
    std::int64_t A = 0, B = 0;
    for (index_t v : h.distinct) {
      const std::int64_t c = h.cnt_le(v) - h.cnt_le(v - 1), t = (k + 1) * v;
      if (t % g == 0) A += c * v;
      else B += c * (t / g);
    }
    lb = std::max(lb, ceil_div(A * k + B * g, g * k));
  }
  return static_cast<index_t>(lb);
}

}  // namespace detail
}  // namespace greenmim
